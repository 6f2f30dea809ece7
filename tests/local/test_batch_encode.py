"""The C plain-batch encoder (tierd/local/_batchencode.c) against the Python paths it replaces.

For the usual ``put_batch`` — one topic, keys, nothing else — ``Preparer.prepare`` hands the
messages to the C encoder, which checks them and writes the records into one buffer; the
commitlog stamps each record's queue id, offsets and store timestamp under its lock. Its records
must be byte for byte what :func:`~tierd.format.record.encode_record` makes of the same fields,
with the same index keys, and every batch the Python plain path would not take must be declined
(None), so that the general loop raises its precise, typed error.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierd import BlockingMessageStore, Message
from tierd.errors import InvalidPropertiesError
from tierd.format.key_hash import key_hash, key_hashes
from tierd.format.properties import MAX_PROPERTIES_LENGTH
from tierd.format.record import encode_record
from tierd.local import prepare as prepare_module
from tierd.local.dispatch import DispatchBatch
from tierd.local.prepare import EncodedBatch, PreparedBatch, stamp
from tierd.local.validation import build_properties

from .test_prepare import MAX_BODY, OK, keyed_batches, preparer
from .test_single_put import expected_record

if TYPE_CHECKING:
    from tierd.local.prepare import Preparer

NOW = 1_700_000_000_123
STORE_TS = 1_700_000_000_456


def test_the_c_encoder_is_built_and_bound_in_this_checkout() -> None:
    """``pip install -e .`` builds the extension here: a checkout where it silently fell back to
    Python must fail, not run at half the speed."""
    from tierd.local import _batchencode

    assert prepare_module.ACCELERATED
    assert _batchencode.encode_plain is not None


def encode(p: Preparer, msgs: list[Message]) -> EncodedBatch | None:
    return p._encode_plain(msgs, NOW)


def reference(p: Preparer, msgs: list[Message], qid: int, first_qoff: int, first_phys: int) -> bytes:
    """What the record encoder makes of ``msgs`` laid out from ``first_phys``."""
    out = []
    phys = first_phys
    for i, m in enumerate(msgs):
        magic, topic_part = p._topic(m.topic)
        rec = encode_record(
            m.body,
            topic_part,
            magic,
            build_properties(m.keys, m.tags, m.properties),
            qid,
            0,
            first_qoff + i,
            phys,
            0,
            NOW,
            p.store_host,
            STORE_TS,
            p.store_host,
        )
        out.append(rec)
        phys += len(rec)
    return b"".join(out)


def check_against_python(msgs: list[Message]) -> EncodedBatch:
    """The C batch, stamped, against the record encoder, and its columns against the general
    loop's (twin preparers in the same round-robin state)."""
    fast, general = preparer(), preparer()
    enc = encode(fast, msgs)
    want = general._prepare_general(msgs, NOW)
    assert enc is not None
    assert stamp(enc.records, 0, len(msgs), enc.queue_id, 17, 4096, STORE_TS) == len(enc.records)
    assert bytes(enc.records) == reference(fast, msgs, enc.queue_id, 17, 4096)
    assert enc.sizes.tolist() == want.sizes.tolist()
    assert enc.index_hashes.tolist() == key_hashes(want.index_keys).tolist()
    assert enc.index_messages == want.index_messages
    assert enc.queue_ids.tolist() == want.queue_ids.tolist()
    assert enc.tags_codes.tolist() == want.tags_codes.tolist()
    assert [(k, idx.tolist()) for k, idx in enc.groups] == [(k, idx.tolist()) for k, idx in want.groups]
    return enc


@given(msgs=keyed_batches(max_body=300))
def test_batches_with_keys_are_byte_identical(msgs: list[Message]) -> None:
    """Any keys (non-ASCII included, several per message), any bodies (empty included)."""
    check_against_python(msgs)


@pytest.mark.parametrize("n", [1, 2, 1000])
def test_batches_without_keys_are_byte_identical(n: int) -> None:
    enc = check_against_python([Message(topic="t", body=b"%d" % i) for i in range(n)])
    assert len(enc.index_hashes) == 0
    assert enc.index_messages == []


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
        Message(topic="t", body=bytearray(b"x"), keys=("k",)),  # type: ignore[arg-type]
        Message(topic="t", body=b"x", keys=KeyTuple(("k",))),
        Message(topic="t", body=b"x", keys=(KeyStr("k"),)),
        Message(topic="t", body=b"x", keys={"k"}),  # type: ignore[arg-type]
        Sub(topic="t", body=b"x", keys=("k",)),
    ],
)
def test_any_other_shape_is_declined_as_the_python_plain_path_declines_it(other: Message) -> None:
    for batch in ([OK, other, OK], [other, OK]):
        assert encode(preparer(), batch) is None
        assert preparer()._prepare_plain(batch, NOW) is None


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
    msgs = [OK, Message(topic="t", body=b"y", keys=("k",), flag=False, properties={})]
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
    assert stamp(enc.records, half, 1, 0, 0, 0, 0) == len(enc.records)
    with pytest.raises(ValueError, match="do not fit"):
        stamp(enc.records, half, 2, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="do not fit"):
        stamp(enc.records, len(enc.records) - 10, 1, 0, 0, 0, 0)


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
    from tierd.local import _batchencode

    assert _batchencode.key_hash(key.encode()) == key_hash(key)


def test_dispatch_merges_hashed_batches_with_keyed_ones() -> None:
    """A reput round may take a C-encoded batch (hashes), single puts and a Python-prepared
    batch (keys) at once: one hash column in commitlog order, each entry on its message."""
    p = preparer()
    enc = p._encode_plain([Message(topic="t", body=b"x", keys=("a", "b")), OK], NOW)
    py = p._prepare_general([Message(topic="t", body=b"y", keys=("c",), tags="g")], NOW)
    assert enc is not None
    qoffs, phys = np.arange(2, dtype=np.int64), np.array([0, 100], np.int64)
    single = (("t", 1), 0, 200, 100, 0, STORE_TS, "t#s", 300)
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
    assert keyed.index_hashes is None
    assert keyed.index_keys == ["t#s", "t#c"]


def test_a_batch_beyond_the_buffer_limit_is_written_from_its_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C path copies the bodies into one buffer; past the limit the Python path takes the
    batch, so memory never holds a huge batch twice."""
    msgs = [Message(topic="t", body=bytes(100), keys=("k",))] * 10
    total = 10 * (88 + 100 + 2 + 2 + len("KEYS\x01k\x02"))
    monkeypatch.setattr(prepare_module, "ENCODE_BUFFER_LIMIT", total)
    assert isinstance(preparer().prepare(msgs, NOW), EncodedBatch)
    monkeypatch.setattr(prepare_module, "ENCODE_BUFFER_LIMIT", total - 1)
    assert isinstance(preparer().prepare(msgs, NOW), PreparedBatch)
