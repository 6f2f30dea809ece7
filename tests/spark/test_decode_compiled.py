"""The compiled Spark decoding (``frame_records`` and ``spark_check`` in
``tierd/format/_batchdecode.c``) against the Python decoder it stands in for: the same framing
and the same columns for good pieces, and every kind of damage refused by the C check, so that
the Python decoder names the bad record exactly as it always did."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest

from tierd.errors import CorruptRecordError
from tierd.format.compiled import spark_functions
from tierd.format.host import encode_host
from tierd.format.properties import encode_properties
from tierd.format.record import (
    POS_BODY_CRC,
    POS_MAGIC,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_ID,
    decode_record,
    encode_record,
    topic_field,
)
from tierd.spark import decode
from tierd.spark.decode import MIN_RECORD_SIZE, decode_records, frame

if TYPE_CHECKING:
    from collections.abc import Callable

QUEUE_ID = 3
FLAT_BASE = 1 << 30
V4_HOST = "10.0.0.2:10911"
V6_HOST = "[2001:db8::7]:10911"


def _props(i: int, kind: str) -> dict[str, str]:
    if kind == "uniform":  # one producer's batch: the same names in the same order
        return {"TAGS": f"t{i % 3}", "KEYS": f"k{i}", "UNIQ_KEY": f"u{i}"}
    return [  # anything goes: no properties, several keys, other names, non-ASCII
        {},
        {"KEYS": f"k{i} g{i % 4}", "x": "ü€𝄞"},
        {"TAGS": "only"},
        {"UNIQ_KEY": f"u{i}", "a": "1", "KEYS": f"k{i}"},
    ][i % 4]


def _piece(
    n: int, *, seed: int, topic: str = "orders", props: str = "uniform", v6_at: frozenset[int] = frozenset()
) -> bytes:
    """``n`` records of queue ``topic``/``QUEUE_ID`` as a segment piece starting at flat offset
    ``FLAT_BASE``; bodies of random sizes (empty ones too); IPv6 store hosts at ``v6_at``."""
    rnd = random.Random(seed)
    magic, topic_part = topic_field(topic.encode())
    out = bytearray()
    for i in range(n):
        body = rnd.randbytes(rnd.choice([0, 1, 17, 300, 1024, 5000]))
        out += encode_record(
            body,
            topic_part,
            magic,
            encode_properties(_props(i, props)),
            QUEUE_ID,
            0,
            100 + i,
            FLAT_BASE + len(out),
            0,
            1_700_000_000_000 + i,
            encode_host(f"10.0.{i % 2}.1:4000"),
            1_700_000_000_005 + i,
            encode_host(V6_HOST if i in v6_at else V4_HOST),
            i % 3,
        )
    return bytes(out)


def _fail(pos: int, reason: str) -> CorruptRecordError:
    return CorruptRecordError(f"corrupt record at {pos}: {reason}", position=pos, reason=reason)


def _decode(
    data: bytes, compiled: bool, monkeypatch: pytest.MonkeyPatch, topic: str = "orders", **kw: Any
) -> Any:
    monkeypatch.setattr(decode, "_COMPILED", spark_functions() if compiled else None)
    framing = frame(data, _fail)
    return decode_records(
        data,
        framing.starts,
        framing.consumed,
        flat_base=FLAT_BASE,
        topic=topic,
        queue_id=QUEUE_ID,
        fail=_fail,
        **kw,
    )


def _check(data: bytes, topic: str = "orders") -> int:
    """What ``spark_check`` says of a whole piece: -1 (all good) or the first record it refuses."""
    ext = spark_functions()
    assert ext is not None
    framing = frame(data, _fail)
    n = len(framing.starts)
    return int(
        ext.spark_check(
            data,
            framing.starts,
            framing.consumed,
            FLAT_BASE,
            topic.encode(),
            QUEUE_ID,
            np.empty(n, decode._ROW),
            pa.allocate_buffer(4 * (n + 1)),
            pa.allocate_buffer(len(data)),
        )
    )


def test_the_compiled_decoding_is_built_and_bound_in_this_checkout() -> None:
    """``make install`` builds the extension; its Spark functions are offered whenever it is."""
    assert decode.COMPILED


@pytest.mark.parametrize(
    ("shape", "kw"),
    [
        ("uniform", {}),
        ("mixed", {"props": "mixed"}),
        ("v2 topic", {"topic": "v2-" + "x" * 200}),
        ("ipv6 hosts", {"v6_at": frozenset({4, 9})}),
    ],
)
def test_compiled_and_python_decoding_give_the_same_columns(
    shape: str, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _piece(40, seed=len(shape), **kw)
    topic = kw.get("topic", "orders")
    # The C check takes every IPv4 piece and refuses the first IPv6 record (Python decodes it).
    assert _check(data, topic) == (4 if "v6_at" in kw else -1)
    compiled = _decode(data, True, monkeypatch, topic)
    python = _decode(data, False, monkeypatch, topic)
    assert compiled.num_rows == 40
    assert compiled.equals(python), shape
    for col in ("body", "queue_offset", "msg_id", "store_host", "born_host", "keys", "properties"):
        assert compiled.column(col).to_pylist() == python.column(col).to_pylist(), col


def test_filters_and_a_selection_of_columns_give_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _piece(30, seed=5)

    def select(qo: np.ndarray, ms: np.ndarray) -> np.ndarray:
        return np.asarray(qo % 3 == 1)

    def select_properties(tags: pa.Array, keys: pa.Array, uniq: pa.Array) -> np.ndarray:
        return np.array([t != "t0" for t in tags.to_pylist()])

    schema = pa.schema([decode.ARROW_SCHEMA.field(n) for n in ("body", "queue_offset", "tags")])
    for kw in ({"select": select}, {"select_properties": select_properties}, {"schema": schema}):
        compiled = _decode(data, True, monkeypatch, **kw)
        python = _decode(data, False, monkeypatch, **kw)
        assert compiled.equals(python), kw
        assert 0 < compiled.num_rows <= 30


def _flip(at: Callable[[bytes, int], int], xor: int = 0x01) -> Callable[[bytearray, int], None]:
    def damage(data: bytearray, start: int) -> None:
        data[at(bytes(data), start)] ^= xor

    return damage


def _body_len_at(data: bytes, start: int) -> int:
    return int.from_bytes(data[start + 84 : start + 88], "big")


DAMAGES: dict[str, Callable[[bytearray, int], None]] = {
    "magic": _flip(lambda d, s: s + POS_MAGIC + 3),
    "body crc field": _flip(lambda d, s: s + POS_BODY_CRC + 3),
    "a body byte": _flip(lambda d, s: s + 88 + _body_len_at(d, s) // 2),
    "queue id": _flip(lambda d, s: s + POS_QUEUE_ID + 3),
    "physical offset": _flip(lambda d, s: s + POS_PHYSICAL_OFFSET + 7),
    "body length": _flip(lambda d, s: s + 87, 0x40),
    "topic length": _flip(lambda d, s: s + 88 + _body_len_at(d, s)),
    "a topic byte": _flip(lambda d, s: s + 88 + _body_len_at(d, s) + 2),
    "properties length": _flip(lambda d, s: s + 88 + _body_len_at(d, s) + 7 + 1),
    "properties not UTF-8": _flip(lambda d, s: s + 88 + _body_len_at(d, s) + 9, 0x80),
    "ipv6 flag without an ipv6 host": _flip(lambda d, s: s + 39, 0x20),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_each_damage_is_refused_by_the_check_and_named_as_in_python(
    damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = bytearray(_piece(12, seed=9))
    starts = frame(bytes(data), _fail).starts
    DAMAGES[damage](data, int(starts[7]))
    bad = bytes(data)
    assert _check(bad) == 7, damage
    errors = []
    for compiled in (True, False):
        with pytest.raises(CorruptRecordError) as err:
            _decode(bad, compiled, monkeypatch)
        errors.append((str(err.value), err.value.detail.get("position")))
    assert errors[0] == errors[1]
    assert errors[0][1] == int(starts[7]), errors[0]


def test_framing_is_the_same_wherever_a_piece_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _piece(25, seed=11)
    for cut in [*range(0, 300, 7), *random.Random(2).sample(range(len(data)), 60), len(data)]:
        got = []
        for compiled in (True, False):
            monkeypatch.setattr(decode, "_COMPILED", spark_functions() if compiled else None)
            f = frame(data[:cut], _fail)
            got.append((f.starts.tolist(), f.consumed))
        assert got[0] == got[1], cut
    for size in (0, 5, MIN_RECORD_SIZE - 1, decode.MAX_RECORD_SIZE + 1, -1):
        bad = _piece(1, seed=1) + size.to_bytes(4, "big", signed=True) + bytes(100)
        messages = []
        for compiled in (True, False):
            monkeypatch.setattr(decode, "_COMPILED", spark_functions() if compiled else None)
            with pytest.raises(CorruptRecordError) as err:
                frame(bad, _fail)
            messages.append(str(err.value))
        assert messages[0] == messages[1]
        assert f"total size {size} " in messages[0]


def test_the_check_never_reads_outside_its_buffer() -> None:
    """Starts and ends that do not fit the buffer are refused, not followed."""
    ext = spark_functions()
    assert ext is not None
    data = _piece(3, seed=3)
    good = frame(data, _fail).starts
    rows, offsets, bodies = np.empty(3, decode._ROW), pa.allocate_buffer(16), pa.allocate_buffer(len(data))

    def check(starts: list[int], end: int) -> int:
        got = ext.spark_check(
            data, np.array(starts, np.int64), end, FLAT_BASE, b"orders", QUEUE_ID, rows, offsets, bodies
        )
        return int(got)

    assert check(good.tolist(), len(data)) == -1
    assert check(good.tolist(), len(data) + 1) == 0  # end past the buffer
    assert check([-1, *good[1:].tolist()], len(data)) == 0
    assert check([0, 1 << 40, int(good[2])], len(data)) == 0  # record 0 would end past record 1's start
    assert check([0, int(good[1]), len(data) - 10], len(data)) == 1
    with pytest.raises(ValueError, match="rows"):  # output buffers too small are an error
        ext.spark_check(data, good, len(data), FLAT_BASE, b"orders", QUEUE_ID, rows[:2], offsets, bodies)


def test_the_spark_check_computes_body_crcs_through_isals_public_crc32() -> None:
    """spark_check calls the bound Python CRC (isal's public ``isal_zlib.crc32``; no C function
    found in isal's shared object) once per body: a wrong one makes it refuse the first record,
    one that raises makes it raise, and bound back the piece passes."""
    from isal import isal_zlib

    from tierd.format import compiled

    assert compiled.records is not None
    assert compiled.records.crc32_function() is isal_zlib.crc32
    data = _piece(10, seed=4)
    bodies: list[bytes] = []

    def counting(body: bytes | bytearray | memoryview) -> int:
        bodies.append(bytes(body))
        return int(isal_zlib.crc32(body))

    def failing(body: bytes | bytearray | memoryview) -> int:
        raise OSError(len(body))

    try:
        compiled.records.bind_crc32(counting)
        assert _check(data) == -1
        assert bodies == [decode_record(data, int(s)).body for s in frame(data, _fail).starts]
        compiled.records.bind_crc32(lambda body: 0)
        assert _check(data) == 0
        compiled.records.bind_crc32(failing)
        with pytest.raises(OSError, match=str(len(bodies[0]))):
            _check(data)
    finally:
        compiled.bind_crc32()
    assert _check(data) == -1
