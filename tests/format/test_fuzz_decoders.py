"""The C extension's decoders fed random bytes and damaged records: no crash, only typed errors.

Every decoder entry point of ``tierd.format._records`` reads bytes that come from disk or a
bucket, so damage must end in a clean answer — a :class:`~tierd.errors.CorruptionError`, None,
False — never a read outside the buffer, a crash or an untyped exception. The inputs are valid
batches mutated the ways storage damages them (bit flips, truncation, length fields set to
extremes) and plain random bytes. ``make test-sanitizers`` runs this file against a build under
AddressSanitizer and UBSan, where an out-of-bounds read or undefined behaviour aborts the run.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierd.errors import CorruptRecordError, TierdError
from tierd.format import compiled
from tierd.format.batch import RecordBatch
from tierd.format.columns import Framing, frame
from tierd.format.host import encode_host
from tierd.format.layout import header_length, position
from tierd.format.properties import encode_properties
from tierd.format.record import encode_record, topic_field
from tierd.spark.decode import decode_records

if TYPE_CHECKING:
    import pyarrow as pa

QUEUE_ID = 2
FIRST = 7
MAX_RECORD = 1 << 20
HOST = encode_host("10.0.0.1:10911")
HOST6 = encode_host("[2001:db8::1]:10911")
#: Values a damaged length field takes: zero, negative, just off, the widest of each width.
EXTREMES = (0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, -(1 << 31), 0xFFFFFFFF)
LENGTH_FIELDS = ("total", "body_length")


def _fail(pos: int, reason: str) -> CorruptRecordError:
    return CorruptRecordError(f"corrupt record at {pos}: {reason}", position=pos, reason=reason)


@st.composite
def batches(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    """A valid batch: consecutive records of one queue, v1 or v2 topic, some IPv6 hosts."""
    topic = draw(st.sampled_from(["orders", "T" * 200]))
    magic, topic_part = topic_field(topic.encode())
    records = []
    for i in range(draw(st.integers(1, 4))):
        props = draw(
            st.dictionaries(st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "a"]), st.text("abc ", max_size=6))
        )
        records.append(
            encode_record(
                draw(st.binary(max_size=40)),
                topic_part,
                magic,
                encode_properties(props),
                QUEUE_ID,
                0,
                FIRST + i,
                i * 100,
                0,
                1_700_000_000_000,
                draw(st.sampled_from([HOST, HOST6])),
                1_700_000_000_000,
                HOST,
            )
        )
    return topic, records


@st.composite
def damaged(draw: st.DrawFn) -> tuple[str, bytes, list[int], list[int]]:
    """A batch, its record starts and sizes, then damaged: bit flips, a length field (TOTALSIZE,
    BODYLENGTH, topic or properties length) set to an extreme, a truncation — or random bytes."""
    topic, records = draw(batches())
    starts = np.cumsum([0, *map(len, records)])[:-1].tolist()
    sizes = list(map(len, records))
    if draw(st.booleans()) and draw(st.booleans()):
        return topic, draw(st.binary(min_size=0, max_size=600)), starts, sizes
    data = bytearray(b"".join(records))
    for _ in range(draw(st.integers(0, 3))):
        bit = draw(st.integers(0, len(data) * 8 - 1))
        data[bit // 8] ^= 1 << (bit % 8)
    if draw(st.booleans()):
        i = draw(st.integers(0, len(records) - 1))
        value = draw(st.sampled_from(EXTREMES))
        field = draw(st.sampled_from([*LENGTH_FIELDS, "topic_length", "properties_length"]))
        if field in LENGTH_FIELDS:
            at = starts[i] + position(field, len(HOST), len(HOST))  # IPv4 positions, as stored
            struct.pack_into(">I", data, at, value & 0xFFFFFFFF)
        else:  # from the record's end: the properties length sits before the properties
            at = starts[i] + draw(st.integers(header_length(len(HOST), len(HOST)), sizes[i] - 2))
            struct.pack_into(">H", data, at, value & 0xFFFF)
    if draw(st.booleans()):
        del data[draw(st.integers(0, len(data))) :]
    return topic, bytes(data), starts, sizes


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _framed(data: bytes) -> Framing | CorruptRecordError:
    try:
        return frame(data, _fail, MAX_RECORD)
    except CorruptRecordError as e:
        return e


def _spark_rows(topic: str, data: bytes) -> pa.RecordBatch | TierdError | None:
    framing = _framed(data)
    if isinstance(framing, CorruptRecordError):
        return framing
    if not len(framing.starts):
        return None
    try:
        rows = decode_records(
            data[: framing.consumed],
            framing.starts,
            framing.consumed,
            flat_base=0,
            topic=topic,
            queue_id=QUEUE_ID,
            fail=_fail,
        )
    except TierdError as e:
        return e
    assert rows.num_rows == len(framing.starts)
    return rows


@SETTINGS
@given(damaged())
def test_framing_ends_in_records_or_a_typed_error(case: tuple[str, bytes, list[int], list[int]]) -> None:
    """``frame_records`` (the TOTALSIZE chain) on damaged bytes: complete records inside the
    buffer, or CorruptRecordError naming a position inside it."""
    _, data, _, _ = case
    framing = _framed(data)
    if isinstance(framing, CorruptRecordError):
        assert 0 <= framing.detail["position"] < len(data)
    else:
        assert 0 <= framing.consumed <= len(data)
        assert all(0 <= s < framing.consumed for s in framing.starts.tolist())


@SETTINGS
@given(damaged(), st.booleans())
def test_queue_decoder_answers_none_or_messages(
    case: tuple[str, bytes, list[int], list[int]], oob: bool
) -> None:
    """``check_queue`` and ``decode_queue`` on damaged bytes, with the batch's starts and sizes
    (or ones pointing outside the buffer): messages whose bodies are inside the data, or None
    — what the Python decoder answers."""
    topic, data, starts, sizes = case
    if oob:
        starts = [s + len(data) for s in starts]
        sizes = [EXTREMES[8]] * len(sizes)
    batch = RecordBatch(data, np.array(starts, np.int64), np.array(sizes, np.int64))
    got = batch.queue_messages(0, len(starts), topic, QUEUE_ID, FIRST)
    if got is not None:
        assert [m.queue_offset for m in got] == list(range(FIRST, FIRST + len(starts)))
        assert all(m.body in data for m in got)
    assert batch.python_queue_messages(0, len(starts), topic, QUEUE_ID, FIRST) == got


@SETTINGS
@given(damaged())
def test_spark_decoder_answers_rows_or_a_typed_error(case: tuple[str, bytes, list[int], list[int]]) -> None:
    """``frame_records`` then ``spark_check`` (the Spark decoder) on damaged bytes: every
    framed record as a row, or a CorruptRecordError naming a position inside the data."""
    topic, data, _, _ = case
    got = _spark_rows(topic, data)
    if isinstance(got, TierdError):
        assert isinstance(got, CorruptRecordError)
        assert 0 <= got.detail["position"] < len(data)


@pytest.mark.parametrize("seed", range(4))
def test_raw_entry_points_never_read_outside_the_buffer(seed: int) -> None:
    """The C functions themselves with starts and sizes anywhere — negative, past the end,
    overflowing when added — and random bytes: False, None or a (count, ...) tuple, never a
    crash (under the sanitizer build, never a read outside the buffer)."""
    assert compiled.records is not None
    rng = np.random.default_rng(seed)
    ext = compiled.records
    for _ in range(300):
        data = rng.bytes(int(rng.integers(0, 300)))
        n = int(rng.integers(1, 5))
        pick = rng.choice([0, 1, 2], size=(2, n))
        near = rng.integers(-8, len(data) + 8, size=(2, n))
        wild = rng.choice(np.array([-(1 << 63), -1, 1 << 31, (1 << 63) - 1], np.int64), size=(2, n))
        starts, sizes = np.where(pick == 2, wild, near).astype(np.int64)
        assert ext.check_queue(data, starts, sizes, b"orders", QUEUE_ID, FIRST) in (True, False)
        assert ext.decode_queue(data, starts, sizes, 0, n, "orders", b"orders", QUEUE_ID, FIRST) in (None,)
        found = np.empty(len(data) // 4 + 1, np.int64)
        count, consumed, bad, _ = ext.frame_records(data, found, 4, MAX_RECORD)
        assert 0 <= count <= len(found)
        assert 0 <= consumed <= len(data)
        assert bad < len(data)
