"""The C batch decoder (tierd/format/_decode.c, in tierd.format._records) against the Python one
it replaces.

Both decode records ``[a, b)`` of a cold batch into ``MessageExt``s or return None; for every
batch, well-formed or damaged, they must return the same thing. The Python decoder stays the
reference (and the fallback where no compiler was there at install time).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import tracemalloc
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tierd.format import batch as batch_module
from tierd.format.batch import RecordBatch
from tierd.format.host import encode_host
from tierd.format.message_ext import MessageExt
from tierd.format.properties import encode_properties
from tierd.format.record import HEADER_V4, POS_BODY_CRC, decode_record, encode_record, topic_field

QUEUE_ID = 3
FIRST = 40
#: Stored 8-byte hosts; the last one's port field is negative (read back as "1.2.3.4:-1").
HOSTS = (
    *(encode_host(h) for h in ("10.0.0.2:10911", "192.168.1.7:5555", "0.0.0.0:0", "255.255.255.255:65535")),
    bytes([1, 2, 3, 4, 255, 255, 255, 255]),
)


def test_the_c_decoder_is_built_and_bound_in_this_checkout() -> None:
    """``pip install -e .`` builds the extension here (gcc and Python headers are part of the
    setup): a checkout where it silently fell back to Python must fail, not run 4x slower."""
    from tierd.format import compiled

    assert batch_module.ACCELERATED
    assert compiled.records is not None
    assert compiled.records.decode_queue is not None
    from isal import isal_zlib

    assert compiled.records.crc32_function() is isal_zlib.crc32  # the one CRC hookup: isal's public API


def test_one_c_extension_built_with_warnings_as_errors() -> None:
    """One extension module under tierd/format, every C source of tierd in it, compiled with
    -Werror; no C source or stub of the old modules left."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).parents[2]
    mods = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    assert [m["name"] for m in mods] == ["tierd.format._records"]
    assert "-Werror" in mods[0]["extra-compile-args"]
    assert sorted(mods[0]["sources"]) == sorted(str(p.relative_to(root)) for p in root.glob("tierd/**/*.c"))
    assert sorted(p.name for p in root.glob("tierd/**/*.pyi")) == ["_records.pyi"]


@dataclass
class Shape:
    """One generated batch: each record's parts, then how the whole is damaged."""

    topic: str
    bodies: list[bytes]
    props: list[bytes]
    born: list[bytes]
    store: list[bytes]
    ints: list[tuple[int, int, int, int, int, int]]  # flag, sysflag, born ts, store ts, reconsume, prepared
    damage: str
    at: int


prop_text = st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), max_size=12)
raw_props = st.one_of(
    st.dictionaries(prop_text, prop_text, max_size=3).map(encode_properties),
    st.just(b""),
    st.binary(max_size=12),  # often not UTF-8
)
DAMAGES = (
    "none",
    "crc",
    "body",
    "props_utf8",
    "truncated",
    "queue_id",
    "topic",
    "offset",
    "total",
    "magic",
    "size",
    "ipv6",
)


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    n = draw(st.integers(1, 24))
    topic = draw(
        st.one_of(
            st.sampled_from(["tq", "", "é-topic", "t" * 127, "v2-" + "x" * 200, "日本" * 50]),
            st.text(st.characters(exclude_categories=["Cs"]), max_size=40),
        )
    )
    body_size = st.one_of(st.integers(0, 64), st.integers(0, 3000), st.sampled_from([0, 1024, 70_000]))
    bodies = [
        draw(st.binary(min_size=s, max_size=s)) if s < 200 else bytes([s % 251]) * s
        for s in draw(st.lists(body_size, min_size=n, max_size=n))
    ]
    props = draw(st.lists(raw_props, min_size=n, max_size=n))
    one_host = draw(st.booleans())
    hosts = st.sampled_from(HOSTS[:1] if one_host else HOSTS)
    born = draw(st.lists(hosts, min_size=n, max_size=n))
    store = draw(st.lists(hosts, min_size=n, max_size=n))
    small = st.integers(0, 3)
    wide = st.one_of(small, st.integers(-(2**63), 2**63 - 1))
    flag = st.one_of(small, st.integers(-(2**31), 2**31 - 1))
    sysflag = st.sampled_from([0, 1, 2, 4, 8, 12, 0x40, -(2**31)])
    ints = draw(st.lists(st.tuples(flag, sysflag, wide, wide, flag, wide), min_size=n, max_size=n))
    return Shape(
        topic, bodies, props, born, store, ints, draw(st.sampled_from(DAMAGES)), draw(st.integers(0, n - 1))
    )


def build(shape: Shape) -> tuple[bytearray, np.ndarray, np.ndarray]:
    """The batch's bytes, starts and sizes, damaged as the shape says."""
    magic, part = topic_field(shape.topic.encode())
    records: list[bytes] = []
    for i, body in enumerate(shape.bodies):
        flag, sysflag, born_ts, store_ts, reconsume, prepared = shape.ints[i]
        records.append(
            encode_record(
                body=body,
                topic_part=part,
                magic=magic,
                properties=shape.props[i],
                queue_id=QUEUE_ID,
                flag=flag,
                queue_offset=FIRST + i,
                physical_offset=1_000_000 + sum(map(len, records)),
                sys_flag=sysflag,
                born_timestamp=born_ts,
                born_host=shape.born[i],
                store_timestamp=store_ts,
                store_host=shape.store[i],
                reconsume_times=reconsume,
                prepared_transaction_offset=prepared,
            )
        )
    at = shape.at
    if shape.damage in ("queue_id", "topic", "offset", "ipv6"):
        other = {"queue_id": QUEUE_ID + 1, "offset": FIRST + at + 1}
        m, p = topic_field((shape.topic + "x").encode()) if shape.damage == "topic" else (magic, part)
        records[at] = encode_record(
            body=shape.bodies[at],
            topic_part=p,
            magic=m,
            properties=shape.props[at],
            queue_id=other.get("queue_id", QUEUE_ID) if shape.damage == "queue_id" else QUEUE_ID,
            flag=0,
            queue_offset=other["offset"] if shape.damage == "offset" else FIRST + at,
            physical_offset=0,
            sys_flag=0,
            born_timestamp=0,
            born_host=encode_host("[::1]:5") if shape.damage == "ipv6" else HOSTS[0],
            store_timestamp=0,
            store_host=HOSTS[0],
        )
    sizes = np.array([len(r) for r in records], np.int64)
    starts = np.cumsum(sizes) - sizes
    data = bytearray(b"".join(records))
    s = int(starts[at])
    if shape.damage == "crc":
        data[s + POS_BODY_CRC + 3] ^= 0x10
    elif shape.damage == "body" and shape.bodies[at]:
        data[s + HEADER_V4] ^= 0x01
    elif shape.damage == "props_utf8":
        if shape.props[at]:  # its last byte: never valid UTF-8
            data[s + int(sizes[at]) - 1] = 0xFF
    elif shape.damage == "truncated":
        del data[len(data) - 1 - at :]
    elif shape.damage == "total":
        data[s + 3] ^= 0x01
    elif shape.damage == "magic":
        data[s + 7] ^= 0x40
    elif shape.damage == "size":
        sizes[at] += 1 if at % 2 else -1
    return data, starts, sizes


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def fields(messages: list[MessageExt] | None) -> list[list[tuple[type, object]]] | None:
    """Every field of every message with its type (an ``int`` field must be an ``int``)."""
    if messages is None:
        return None
    names = [f.name for f in dataclasses.fields(MessageExt)]
    return [[(type(getattr(m, k)), getattr(m, k)) for k in names] for m in messages]


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(shapes(), st.data(), st.booleans())
def test_c_and_python_decoders_return_the_same(shape: Shape, data: st.DataObject, view: bool) -> None:
    """For any batch and range: the same messages (field by field, types included), or both
    None. Where they decode, the single-record decoder agrees too."""
    raw, starts, sizes = build(shape)
    n = len(sizes)
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a, n))
    source: bytes | memoryview = memoryview(raw) if view else bytes(raw)
    fast = RecordBatch(source, starts, sizes).queue_messages(a, b, shape.topic, QUEUE_ID, FIRST)
    slow = RecordBatch(bytes(raw), starts, sizes).python_queue_messages(a, b, shape.topic, QUEUE_ID, FIRST)
    assert fields(fast) == fields(slow)
    event(f"{shape.damage}: {'decoded' if fast is not None else 'refused'}")
    if shape.damage == "none" and all(_utf8(p) for p in shape.props[a:b]):
        assert fast is not None
    if fast is not None:
        whole = bytes(raw)
        expected = [
            decode_record(whole, int(starts[i]), limit=int(starts[i] + sizes[i])) for i in range(a, b)
        ]
        assert fast == expected
        assert [m.properties for m in fast] == [m.properties for m in expected]


@pytest.mark.parametrize("damage", [d for d in DAMAGES if d != "none"])
def test_each_damage_makes_both_decoders_refuse_the_batch(damage: str) -> None:
    """A table of the damages above, each at record 2 of 5: both decoders refuse the whole
    range; a range before record 2 still decodes where only that record's content is bad."""
    shape = Shape(
        "tq",
        [b"x" * 10, b"", b"body", b"\x00" * 1024, b"y"],
        [b"KEYS\x01k\x02", b"", "é\x01ü\x02".encode(), b"A\x01B", b""],
        [HOSTS[0]] * 5,
        [HOSTS[1]] * 5,
        [(0, 0, 7, 9, 0, 0)] * 5,
        damage,
        2,
    )
    raw, starts, sizes = build(shape)
    assert RecordBatch(memoryview(raw), starts, sizes).queue_messages(0, 5, "tq", QUEUE_ID, FIRST) is None
    assert RecordBatch(bytes(raw), starts, sizes).python_queue_messages(0, 5, "tq", QUEUE_ID, FIRST) is None
    if damage in ("crc", "body", "props_utf8"):
        before = RecordBatch(memoryview(raw), starts, sizes).queue_messages(0, 2, "tq", QUEUE_ID, FIRST)
        assert before is not None
        assert [m.queue_offset for m in before] == [FIRST, FIRST + 1]


def good_batch(n: int = 64) -> tuple[bytearray, np.ndarray, np.ndarray]:
    shape = Shape(
        "refcount-topic",
        [bytes([i]) * (i * 13) for i in range(n)],
        [encode_properties({"KEYS": f"k{i}"}) for i in range(n)],
        [HOSTS[i % 2] for i in range(n)],
        [HOSTS[0]] * n,
        [(0, 0, 7 + i // 8, 9, 0, 0) for i in range(n)],
        "none",
        0,
    )
    return build(shape)


def test_decoding_and_dropping_batches_keeps_reference_counts_and_memory_flat() -> None:
    """10,000 decodes (good batches, and batches refused at every position, which free a part-
    built list) leave the shared objects' reference counts where they were and the traced
    memory flat: no reference leaked, none dropped twice."""
    raw, starts, sizes = good_batch()
    bad = bytearray(raw)
    bad[int(starts[40]) + POS_BODY_CRC] ^= 0x01
    topic = "".join(["refcount-", "topic"])  # an object of its own, not an interned constant
    queue_id = 10**6  # not a cached small int
    view = memoryview(raw)
    before = (sys.getrefcount(topic), sys.getrefcount(queue_id), sys.getrefcount(MessageExt))

    def decode_all(rounds: int) -> None:
        for i in range(rounds):
            records = RecordBatch(view if i % 2 else memoryview(bad), starts, sizes)
            got = records.queue_messages(0, 64, topic, 3, FIRST)
            assert (got is None) == (i % 2 == 0)
            records.queue_messages(0, 40, topic, 3, FIRST)  # the part before the bad record

    decode_all(200)  # warm caches (host names, interned ints) before measuring
    tracemalloc.start()
    try:
        decode_all(2_000)  # what tracing itself allocates settles here
        gc.collect()
        settled = tracemalloc.get_traced_memory()[0]
        decode_all(8_000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - settled
    finally:
        tracemalloc.stop()
    # A leak grows with the rounds: one host string per decode alone would be ~0.5 MB here.
    assert grown < 64 * 1024, f"{grown} bytes more held after 8,000 more decodes"
    assert (sys.getrefcount(topic), sys.getrefcount(queue_id), sys.getrefcount(MessageExt)) == before
    # The view can be released: the decoder gave back every buffer export it took.
    view.release()


def test_c_built_messages_are_left_out_of_the_cyclic_collector() -> None:
    """The decoder untracks the messages it builds (their fields cannot form cycles): the
    collector's young pass after each batch no longer scans 4,096 objects for nothing. They
    still behave as any message: properties parse on access, fields can be set."""
    raw, starts, sizes = good_batch(8)
    got = RecordBatch(memoryview(raw), starts, sizes).queue_messages(0, 8, "refcount-topic", QUEUE_ID, FIRST)
    assert got is not None
    assert not any(gc.is_tracked(m) for m in got)
    assert got[3].properties == {"KEYS": "k3"}
    assert got[3].keys == ("k3",)
    got[3].body = b"changed"
    assert got[3] != got[2]
    assert gc.is_tracked(MessageExt("t", 0, 0, b"", b"", 0, 0, "a:1", "a:1", 0, 0))  # __init__ as before


def test_bind_refuses_a_class_it_cannot_fill() -> None:
    """The decoder fills slots by offset: a class whose slots are not exactly MessageExt's
    fields is refused (TypeError, then the Python decoder is used), and a refused bind leaves
    the working binding in place."""
    from tierd.format.compiled import records

    @dataclass(slots=True)
    class Missing:
        topic: str

    @dataclass(slots=True)
    class Extra:
        topic: str
        extra: int

    names = [f.name for f in dataclasses.fields(MessageExt)]
    annotations = {k: object for k in names}
    extra_cls: type = dataclass(slots=True)(
        type("Extra", (), {"__annotations__": {**annotations, "more": object}})
    )
    dict_cls = type("WithDict", (), {k: None for k in names})
    for cls in (Missing, Extra, extra_cls, dict_cls, int):
        with pytest.raises(TypeError):
            records.bind_decoder(cls, True)
    raw, starts, sizes = good_batch(4)
    got = RecordBatch(memoryview(raw), starts, sizes).queue_messages(0, 4, "refcount-topic", QUEUE_ID, FIRST)
    assert got is not None
    assert type(got[0]) is MessageExt


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=400),
    st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)), max_size=8),
    st.one_of(st.just(FIRST), st.integers(-(2**63), 2**63 - 1)),
    st.booleans(),
)
def test_the_c_decoder_never_reads_outside_its_buffer(
    raw: bytes, ranges: list[tuple[int, int]], first: int, real_records: bool
) -> None:
    """Starts, sizes and offsets the framing check would never let through — negative, past
    the end, overflowing — over garbage or over real records: the C functions answer (False,
    None or messages) and never read outside the buffer (a crash here ends the test run)."""
    from tierd.format.compiled import records

    if real_records:
        data, starts, sizes = good_batch(3)
        raw = bytes(data)
        ranges = [*zip(starts.tolist(), sizes.tolist(), strict=True), *ranges]
    starts = np.array([s for s, _ in ranges], np.int64)
    sizes = np.array([n for _, n in ranges], np.int64)
    topic = "refcount-topic"
    checked = records.check_queue(raw, starts, sizes, topic.encode(), QUEUE_ID, first)
    assert checked in (True, False)
    got = records.decode_queue(raw, starts, sizes, 0, len(ranges), topic, topic.encode(), QUEUE_ID, first)
    assert got is None or len(got) == len(ranges)
    with pytest.raises(ValueError, match="not inside"):
        records.decode_queue(raw, starts, sizes, 0, len(ranges) + 1, topic, topic.encode(), QUEUE_ID, first)
    with pytest.raises(TypeError, match="int64"):
        records.check_queue(raw, starts.astype(np.int32), sizes, topic.encode(), QUEUE_ID, first)
