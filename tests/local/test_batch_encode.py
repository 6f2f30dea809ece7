"""The C encoder (tierd/format/_encode.c, in tierd.format._records) against the Python paths it
replaces.

``Preparer.prepare`` hands every ``put_batch`` to the C encoder, which checks the messages and
writes the records into one buffer — any shape: tags, properties, explicit queue ids, several
topics, flags, born hosts and timestamps, v2 topics, IPv6 hosts, keys or none; the commitlog
stamps each record's offsets and store timestamp under its lock. Its records must be byte for
byte what :func:`~tierd.format.record.encode_record` makes of the same fields (the Python
fallback's records), with the same columns and index keys, and every batch a rule rejects must
be declined (None), so that the general loop raises its precise, typed error.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierd import BlockingMessageStore, Message
from tierd.errors import InvalidPropertiesError
from tierd.format.host import encode_host
from tierd.format.key_hash import key_hash, key_hashes
from tierd.format.properties import MAX_PROPERTIES_LENGTH
from tierd.format.record import crc32, encode_record, place_record
from tierd.local import prepare as prepare_module
from tierd.local.dispatch import DispatchBatch
from tierd.local.prepare import EncodedBatch, PreparedBatch, stamp
from tierd.local.validation import build_properties

from .test_prepare import MAX_BODY, OK, keyed_batches, preparer
from .test_single_put import expected_record

if TYPE_CHECKING:
    from tierd.local.prepare import PreparedOne, Preparer

NOW = 1_700_000_000_123
STORE_TS = 1_700_000_000_456


def test_the_c_encoder_is_built_and_bound_in_this_checkout() -> None:
    """``pip install -e .`` builds the extension here: a checkout where it silently fell back to
    Python must fail, not run at half the speed."""
    from tierd.format.compiled import records

    assert prepare_module.ACCELERATED
    assert records is not None
    assert records.encode is not None


def encode(p: Preparer, msgs: list[Message]) -> EncodedBatch | None:
    return p._encode(msgs, NOW)


def reference(
    p: Preparer, msgs: list[Message], enc: EncodedBatch, qoffs: list[int], first_phys: int
) -> bytes:
    """What the record encoder makes of ``msgs`` in the queues ``enc`` chose, laid out from
    ``first_phys`` with queue offsets ``qoffs``."""
    out = []
    phys = first_phys
    for i, m in enumerate(msgs):
        magic, topic_part = p._topic(m.topic)
        rec = encode_record(
            m.body,
            topic_part,
            magic,
            build_properties(m.keys, m.tags, m.properties),
            int(enc.queue_ids[i]),
            m.flag,
            qoffs[i],
            phys,
            0,
            NOW if m.born_timestamp is None else m.born_timestamp,
            p.store_host if m.born_host is None else encode_host(m.born_host),
            STORE_TS,
            p.store_host,
        )
        out.append(rec)
        phys += len(rec)
    return b"".join(out)


def check_against_python(msgs: list[Message], store_host: str = "127.0.0.1:10911") -> EncodedBatch:
    """The C batch, stamped, against the record encoder, and its columns against the general
    loop's (twin preparers in the same round-robin state)."""
    fast, general = preparer(store_host), preparer(store_host)
    enc = encode(fast, msgs)
    want = general._prepare_general(msgs, NOW)
    assert enc is not None
    qoffs = np.zeros(len(msgs), np.int64)
    for g, (_, idx) in enumerate(enc.groups):
        qoffs[idx] = 17 * g + np.arange(len(idx))
    assert stamp(enc.records, 0, qoffs, 4096, STORE_TS) == len(enc.records)
    assert bytes(enc.records) == reference(fast, msgs, enc, qoffs.tolist(), 4096)
    assert enc.sizes.tolist() == want.sizes.tolist()
    assert enc.index_hashes.tolist() == key_hashes(want.index_keys).tolist()
    assert enc.index_messages == want.index_messages
    assert enc.queue_ids.tolist() == want.queue_ids.tolist()
    assert enc.tags_codes.tolist() == want.tags_codes.tolist()
    assert [(k, idx.tolist()) for k, idx in enc.groups] == [(k, idx.tolist()) for k, idx in want.groups]
    return enc


TEXT = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x01\x02"), min_size=1, max_size=8
)
HOSTS = st.sampled_from([None, "10.0.0.1:1", "[::1]:7", "[fe80::2]:65535"])


@st.composite
def any_batches(draw: st.DrawFn) -> list[Message]:
    """Batches of every shape the store accepts: 1-3 topics (a v2 one among them), explicit
    queue ids or none, tags, user properties (UNIQ_KEY and TAGS among them), flags, born hosts
    (IPv4, IPv6) and timestamps, keys or none, per message."""
    topics = draw(st.lists(st.sampled_from(["a", "b", "v" * 130]), min_size=1, max_size=3, unique=True))
    n = draw(st.integers(1, 12))
    out = []
    for _ in range(n):
        tags = draw(st.one_of(st.none(), TEXT))
        props = draw(st.dictionaries(st.sampled_from(["p", "q", "UNIQ_KEY", "ключ"]), TEXT, max_size=3))
        if tags is None and draw(st.booleans()):
            props["TAGS"] = draw(TEXT)
        keys = draw(st.lists(TEXT.filter(lambda k: " " not in k), max_size=2))
        out.append(
            Message(
                topic=draw(st.sampled_from(topics)),
                body=draw(st.binary(max_size=64)),
                queue_id=draw(st.one_of(st.none(), st.integers(0, 63))),
                keys=keys if draw(st.booleans()) else tuple(keys),
                tags=tags,
                properties=props,
                flag=draw(st.integers(-(2**31), 2**31 - 1)),
                born_host=draw(HOSTS),
                born_timestamp=draw(st.one_of(st.none(), st.integers(0, 2**63 - 1))),
            )
        )
    return out


@given(msgs=any_batches(), store_host=st.sampled_from(["127.0.0.1:10911", "[2001:db8::1]:10911"]))
def test_batches_of_every_shape_are_byte_identical(msgs: list[Message], store_host: str) -> None:
    """The C encoder takes every shape, and writes what the record encoder (the Python
    fallback's records) writes, with the same columns, groups and index keys."""
    check_against_python(msgs, store_host)


@given(msgs=keyed_batches(max_body=300))
def test_batches_with_keys_are_byte_identical(msgs: list[Message]) -> None:
    """Any keys (non-ASCII included, several per message), any bodies (empty included)."""
    check_against_python(msgs)


@pytest.mark.parametrize("n", [1, 2, 1000])
def test_batches_without_keys_are_byte_identical(n: int) -> None:
    enc = check_against_python([Message(topic="t", body=b"%d" % i) for i in range(n)])
    assert len(enc.index_hashes) == 0
    assert enc.index_messages == []


def test_many_interleaved_groups_keep_their_messages_and_first_seen_order() -> None:
    """The encoder finds each message's (topic, queue id) group through a small cache of the
    batch's groups compared by text, then orders the messages by group: 150 groups (more than
    the cache holds, so groups share and evict its slots), equal topics as distinct objects,
    interleaved at random — each group must hold exactly its messages, in message order, the
    groups in first-seen order, as the general loop has them."""
    rng = np.random.default_rng(31)
    topics = [f"t{t}" for t in range(50)]
    picks = rng.integers(0, 150, 3000)
    msgs = [
        Message(topic="".join(topics[g // 3]), body=b"%d" % i, queue_id=int(g % 3), keys=(f"k{i}",))
        for i, g in enumerate(picks)
    ]
    enc = check_against_python(msgs)
    assert len(enc.groups) == len(set(picks.tolist()))
    for (topic, qid), idx in enc.groups:
        assert all(msgs[j].topic == topic and msgs[j].queue_id == qid for j in idx.tolist())


def test_the_benchmarked_shape_and_a_v2_topic() -> None:
    enc = check_against_python(
        [Message(topic="bench", body=bytes(1024), keys=(f"key-{i}",)) for i in range(1000)]
    )
    assert enc.index_hashes[:2].tolist() == [key_hash("bench#key-0"), key_hash("bench#key-1")]
    check_against_python([Message(topic="x" * 130, body=b"v2", keys=("é", "ключ"))] * 3)


def test_sizes_at_the_limits_are_accepted_and_one_byte_more_is_declined() -> None:
    """The largest body and the largest KEYS property still take the C path; one byte more of
    either is declined, and ``prepare`` raises the general loop's error."""
    longest = "k" * (MAX_PROPERTIES_LENGTH - len("KEYS\x01\x02"))
    check_against_python([Message(topic="t", body=bytes(MAX_BODY), keys=(longest,))] * 2)
    check_against_python([Message(topic="t", body=b"", keys=("é" * ((len(longest) - 2) // 2), "a"))])
    assert encode(preparer(), [Message(topic="t", body=bytes(MAX_BODY + 1), keys=("k",))]) is None
    too_long = Message(topic="t", body=b"", keys=(longest + "k",))
    assert encode(preparer(), [too_long]) is None
    with pytest.raises(InvalidPropertiesError, match="32767"):
        preparer().prepare([too_long], NOW)


class Sub(Message):
    __slots__ = ()


class KeyTuple(tuple[str, ...]):
    pass


class KeyStr(str):
    pass


@pytest.mark.parametrize(
    "other",
    [
        Message(topic="u", body=b"x", keys=("k",)),  # a second topic
        Message(topic="t", body=b"x"),  # keys on some messages only
        Message(topic="t", body=b"x", keys=("k",), queue_id=1),
        Message(topic="t", body=b"x", keys=("k",), tags="a"),
        Message(topic="t", body=b"x", keys=("k",), properties={"p": "v"}),
        Message(topic="t", body=b"x", keys=("k",), flag=3),
        Message(topic="t", body=b"x", keys=("k",), born_host="10.0.0.1:1"),
        Message(topic="t", body=b"x", keys=("k",), born_timestamp=5),
    ],
)
def test_shapes_the_plain_path_declined_are_encoded_in_c(other: Message) -> None:
    for batch in ([OK, other, OK], [other, OK]):
        check_against_python(batch)


@pytest.mark.parametrize(
    "other",
    [
        Message(topic="t", body=bytearray(b"x"), keys=("k",)),  # type: ignore[arg-type]
        Message(topic="t", body=b"x", keys=KeyTuple(("k",))),
        Message(topic="t", body=b"x", keys=(KeyStr("k"),)),
        Message(topic="t", body=b"x", keys={"k"}),  # type: ignore[arg-type]
        Message(topic="t", body=b"x", keys=("k",), flag=True),
        Sub(topic="t", body=b"x", keys=("k",)),
    ],
)
def test_values_of_other_types_are_left_to_the_python_paths(other: Message) -> None:
    """Subclasses and other types run Python code or convert: the general loop takes them."""
    for batch in ([OK, other, OK], [other, OK]):
        assert encode(preparer(), batch) is None
        assert isinstance(preparer().prepare(batch, NOW), PreparedBatch)


def test_a_key_that_is_not_utf8_is_left_to_the_python_paths() -> None:
    """A lone surrogate cannot be encoded: declined, so the Python paths refuse it with their
    typed error naming the key."""
    bad = Message(topic="t", body=b"x", keys=("\udcff",))
    assert encode(preparer(), [OK, bad]) is None
    with pytest.raises(InvalidPropertiesError, match="surrogate"):
        preparer().prepare([OK, bad], NOW)


def test_values_equal_to_the_defaults_are_plain_on_both_paths() -> None:
    """``flag=False`` and an empty ``dict`` equal the defaults: the Python plain path takes them,
    so the C path does too, with the same records."""
    msgs = [OK, Message(topic="t", body=b"y", keys=("k",), flag=0, properties={})]
    assert preparer()._prepare_plain(msgs, NOW) is not None
    check_against_python(msgs)


class Watched(dict[str, str]):
    """A mapping whose comparison is Python code (it could change the batch under the encoder)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Watched.compared += 1
        return super().__eq__(other)

    __hash__ = None


def test_mappings_whose_comparison_runs_python_code_take_the_python_path() -> None:
    """An empty mapping proxy equals the default, but a proxy compares the mapping it wraps,
    which may be anything: the C encoder declines it without comparing, and the Python path
    takes the batch, with the same records."""
    proxy = Message(topic="t", body=b"y", keys=("k",), properties=MappingProxyType(Watched()))
    assert encode(preparer(), [OK, proxy]) is None
    assert Watched.compared == 0
    batch = preparer().prepare([OK, proxy], NOW)
    assert isinstance(batch, PreparedBatch)
    assert Watched.compared > 0  # the Python plain path compared it
    same = check_against_python([OK, Message(topic="t", body=b"y", keys=("k",))])
    assert batch.sizes.tolist() == same.sizes.tolist()


@pytest.mark.parametrize(
    "bad",
    [
        Message(topic="t", body=b"x", keys=("has space",)),
        Message(topic="t", body=b"x", keys=("",)),
        Message(topic="t", body=b"x", keys=("a\x01",)),
        Message(topic="t", body=b"x", keys=("a\x02",)),
        Message(topic="t", body=b"x", keys=(7,)),  # type: ignore[arg-type]
        Message(topic="t", body=b"x", keys="abc"),
    ],
)
def test_batches_a_rule_rejects_are_declined(bad: Message) -> None:
    """(``prepare`` then raises the general loop's error: tests/local/test_prepare.py.)"""
    assert encode(preparer(), [bad, bad]) is None
    assert encode(preparer(), [OK, bad]) is None


def test_an_invalid_topic_raises_the_general_loops_error() -> None:
    from tierd.errors import InvalidTopicError

    with pytest.raises(InvalidTopicError, match="bad topic"):
        preparer().prepare([Message(topic="bad topic", body=b"x", keys=("k",))], NOW)


def test_stamp_refuses_records_beyond_the_buffer() -> None:
    enc = encode(preparer(), [OK, OK])
    assert enc is not None
    half = int(enc.sizes[0])
    one, two = np.zeros(1, np.int64), np.zeros(2, np.int64)
    assert stamp(enc.records, half, one, 0, 0) == len(enc.records)
    with pytest.raises(ValueError, match="do not fit"):
        stamp(enc.records, half, two, 0, 0)
    with pytest.raises(ValueError, match="do not fit"):
        stamp(enc.records, len(enc.records) - 10, one, 0, 0)


@pytest.mark.parametrize("accelerated", [True, False])
def test_batches_through_the_store_are_byte_identical_across_file_rolls(
    store: BlockingMessageStore, accelerated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~1.3 MB of plain batches through 256 KiB files, with the C encoder and without it (the
    pure-Python fallback of a build without a compiler): every record as the encoder makes it,
    every key queryable."""
    if not accelerated:
        monkeypatch.setattr(prepare_module, "_encoder", None)
    sizes = [0, 1, 700, 5000, 30_000]
    msgs = [
        [
            Message(topic="t", body=bytes([b]) * sizes[(b + i) % len(sizes)], keys=(f"k{b}-{i}",))
            for i in range(7)
        ]
        for b in range(60)
    ]
    prepared = store.hot.preparer.prepare(msgs[0], NOW)
    assert isinstance(prepared, EncodedBatch if accelerated else PreparedBatch)
    results = [(m, r) for batch in msgs for m, r in zip(batch, store.put_batch(batch), strict=True)]
    cl = store.hot.commitlog
    assert len(cl.files.files) >= 4  # the rolls happened, some inside a batch
    for m, res in results:
        want = expected_record(m, res, store)
        assert cl.read_bytes(res.commitlog_offset, len(want)) == want
    assert store.hot.wait_dispatched(10)
    for m, res in results[::13]:
        assert [x.commitlog_offset for x in store.query("t", m.keys[0])] == [res.commitlog_offset]


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40))
def test_the_c_key_hash_is_the_key_indexs_hash(key: str) -> None:
    """MurmurHash3 in C against ``mmh3`` for every length (the tail cases) and any text."""
    from tierd.format.compiled import records

    assert records.key_hash(key.encode()) == key_hash(key)


def test_dispatch_merges_hashed_batches_with_keyed_ones() -> None:
    """A reput round may take a C-encoded batch (hashes), single puts and a Python-prepared
    batch (keys) at once: one hash column in commitlog order, each entry on its message."""
    p = preparer()
    enc = p._encode([Message(topic="t", body=b"x", keys=("a", "b")), OK], NOW)
    py = p._prepare_general([Message(topic="t", body=b"y", keys=("c",), tags="g")], NOW)
    assert enc is not None
    qoffs, phys = np.arange(2, dtype=np.int64), np.array([0, 100], np.int64)
    single = (("t", 1), 0, 200, 100, 0, STORE_TS, key_hash("t#s"), 300)
    merged = DispatchBatch.merge(
        [
            DispatchBatch.from_prepared(enc, qoffs, phys, STORE_TS, 200),
            single,
            DispatchBatch.from_prepared(py, qoffs[:1], np.array([300], np.int64), STORE_TS, 400),
        ]
    )
    assert merged.index_hashes is not None
    assert merged.index_hashes.tolist() == key_hashes(["t#a", "t#b", "t#k", "t#s", "t#c"]).tolist()
    assert merged.index_messages == [0, 0, 1, 2, 3]
    keyed = DispatchBatch.merge([single, DispatchBatch.from_prepared(py, qoffs[:1], phys[:1], STORE_TS, 400)])
    assert keyed.index_hashes is not None  # single puts come hashed: the Python batch's keys are hashed too
    assert keyed.index_hashes.tolist() == key_hashes(["t#s", "t#c"]).tolist()
    assert keyed.index_messages == [0, 1]


def test_a_batch_beyond_the_buffer_limit_is_written_from_its_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C path copies the bodies into one buffer; past the limit the Python path takes the
    batch, so memory never holds a huge batch twice."""
    msgs = [Message(topic="t", body=bytes(100), keys=("k",))] * 10
    total = 10 * (88 + 100 + 2 + 2 + len("KEYS\x01k\x02"))
    monkeypatch.setattr(prepare_module, "ENCODE_BUFFER_LIMIT", total)
    assert isinstance(preparer().prepare(msgs, NOW), EncodedBatch)
    monkeypatch.setattr(prepare_module, "ENCODE_BUFFER_LIMIT", total - 1)
    assert isinstance(preparer().prepare(msgs, NOW), PreparedBatch)


# ----------------------------------------------------------------------------- the single put
def single_records(p: Preparer, m: Message, place: Any, at: int) -> tuple[bytes, PreparedOne]:
    """``m`` through ``p.prepare_one`` (or, for ``place_record``, the Python fallback), placed at
    ``at`` with queue offset 5 and :data:`STORE_TS` — the bytes and the prepared tuple."""
    one = p.prepare_one(m, NOW) if place is not place_record else p._prepare_one_python(m, NOW, None)
    buf = bytearray(at + one[5] + 8)
    place(buf, at, one[1], 5, 4096, STORE_TS, one[4])
    return bytes(buf[at : at + one[5]]), one


@given(msgs=any_batches(), store_host=st.sampled_from(["127.0.0.1:10911", "[2001:db8::1]:10911"]))
def test_single_puts_of_every_shape_are_the_batch_encoders_records(
    msgs: list[Message], store_host: str
) -> None:
    """A single put goes through the same encoder as a batch (no second writer of the layout):
    its record, placed, is the C batch encoder's record of the same message, stamped alike, and
    the Python fallback (``encode_record`` + ``place_record``) writes the same bytes, with the
    same queue, tags code and index hashes."""
    for m in msgs:
        fast, fallback, batch = preparer(store_host), preparer(store_host), preparer(store_host)
        got, one = single_records(fast, m, prepare_module.place, 3)
        want, py = single_records(fallback, m, place_record, 0)
        assert got == want
        assert one == py
        enc = encode(batch, [m])
        assert enc is not None
        stamp(enc.records, 0, np.array([5], np.int64), 4096, STORE_TS)
        assert got == bytes(enc.records)
        assert one[0] == enc.groups[0][0]
        assert one[2] == int(enc.tags_codes[0])
        hashes = one[3] if isinstance(one[3], tuple) else (one[3],)
        assert list(hashes) == enc.index_hashes.tolist()
        assert one[5] == int(enc.sizes[0])


def test_the_single_put_takes_the_c_encoder_and_declines_like_a_batch() -> None:
    """The C encoder writes the single put's record; values of other types and broken rules are
    left to the Python path (its typed error, or the conversion), as for a batch."""
    assert prepare_module._encoder is not None
    p = preparer()
    m = Message(topic="t", body=b"x", keys=("k",), tags="a", queue_id=2)
    entry = p._topic("t")
    assert (
        prepare_module._encoder.encode_one(m, "t", entry, None, p._limits, p.store_host, NOW, None)
        is not None
    )
    for other in (
        Message(topic="t", body=bytearray(b"x"), keys=("k",)),  # type: ignore[arg-type]
        Message(topic="t", body=b"x", keys=("has space",)),
        Message(topic="t", body=b"x", queue_id=64),
        Message(topic="t", body=bytes(MAX_BODY + 1)),
        Message(topic="t", body=b"x", keys=("k",), flag=True),
    ):
        assert (
            prepare_module._encoder.encode_one(other, "t", entry, None, p._limits, p.store_host, NOW, None)
            is None
        )
    converted = p.prepare_one(Message(topic="t", body=bytearray(b"x")), NOW)  # type: ignore[arg-type]
    assert converted[0] == ("t", 0)
    assert p.prepare_one(OK, NOW)[0] == ("t", 1)  # the round-robin moved once for the declined one
    assert converted[1] == preparer().prepare_one(Message(topic="t", body=b"x"), NOW)[1]
    with pytest.raises(InvalidPropertiesError):
        p.prepare_one(Message(topic="t", body=b"x", keys=("has space",)), NOW)


def test_place_refuses_a_record_beyond_the_buffer() -> None:
    one = preparer().prepare_one(OK, NOW)
    for place in (prepare_module.place, place_record):
        with pytest.raises(ValueError, match="does not fit"):
            place(bytearray(one[5] - 1), 0, one[1], 0, 0, 0, one[4])


def test_the_encoder_and_decoder_share_one_crc_hookup() -> None:
    """Both compute body CRCs through the one bound Python callable — isal's public
    ``isal_zlib.crc32`` — with the same values as the Python encoder: rebound to a counting
    wrapper, the encoder and the decoder each call it once per body."""
    from isal import isal_zlib

    from tierd.format import compiled
    from tierd.format.batch import RecordBatch

    assert compiled.records is not None
    assert compiled.records.crc32_function() is isal_zlib.crc32
    msgs = [Message(topic="t", body=bytes([i]) * 300, keys=("k",)) for i in range(4)]
    seen: list[bytes] = []

    def counting(data: bytes | bytearray | memoryview) -> int:
        seen.append(bytes(data))
        return crc32(data)

    try:
        compiled.records.bind_crc32(counting)
        enc = check_against_python(msgs)
        assert seen == [m.body for m in msgs]  # the encoder: one call per body
        starts = np.concatenate([[0], np.cumsum(enc.sizes)[:-1]]).astype(np.int64)
        got = RecordBatch(memoryview(enc.records), starts, enc.sizes).queue_messages(
            0, 4, "t", int(enc.queue_ids[0]), 17 * 0
        )
        assert got is not None
        assert [m.body for m in got] == [m.body for m in msgs]
        assert seen == [m.body for m in msgs] * 2  # and the decoder
    finally:
        compiled.bind_crc32()
    assert compiled.records.crc32_function() is isal_zlib.crc32
    check_against_python(msgs)


def test_a_single_put_with_its_own_queue_id_reuses_the_topics_key_tuple() -> None:
    """A new ``(topic, queue id)`` tuple per put lives until the dispatcher takes the record,
    and every such survivor brings the collector's next full pass (over the whole heap of the
    application) closer: the encoder hands back the topic's cached tuple instead. Queue ids
    past the topic's queue count, and a key list that is not the topic's, still get a new
    tuple of the right value."""
    assert prepare_module._encoder is not None
    p = preparer()
    first = p.prepare_one(Message(topic="t", body=b"x", queue_id=3), NOW)[0]
    second = p.prepare_one(Message(topic="t", body=b"y", queue_id=3), NOW)[0]
    assert first == ("t", 3)
    assert first is second
    beyond = p.default_queues + 1
    assert p.prepare_one(Message(topic="t", body=b"x", queue_id=beyond), NOW)[0] == ("t", beyond)
    entry = p._topic("t")
    encode_one = prepare_module._encoder.encode_one
    foreign = [("u", q) for q in range(8)]
    got = encode_one(
        Message(topic="t", body=b"x", queue_id=3), "t", entry, None, p._limits, p.store_host, NOW, foreign
    )
    assert got is not None
    assert got[0] == ("t", 3)
    assert got[0] is not foreign[3]
    shifted = [("t", q + 1) for q in range(8)]
    got = encode_one(
        Message(topic="t", body=b"x", queue_id=3), "t", entry, None, p._limits, p.store_host, NOW, shifted
    )
    assert got is not None
    assert got[0] == ("t", 3)
    huge = [("t", 2**70)] * 8
    got = encode_one(
        Message(topic="t", body=b"x", queue_id=3), "t", entry, None, p._limits, p.store_host, NOW, huge
    )
    assert got is not None
    assert got[0] == ("t", 3)
