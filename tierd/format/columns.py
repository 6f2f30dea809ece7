"""Records as columns: framing a buffer of records and locating every record's parts, for whole
batches at once (FORMATS §1.1).

This is the columnar side of the record format's one owner: the readers that handle thousands
of records at a time — the tiering dispatcher, the cold key extraction, flat files, the cold
fetcher, Spark — call it instead of walking record bytes themselves, so a position, a width or a
length rule is applied in one place. Single fields come from :mod:`tierd.format.layout`'s column
readers (:func:`~tierd.format.layout.field_column`); whole batches of messages from
:class:`~tierd.format.batch.RecordBatch`. Where the C extension is built the TOTALSIZE chain is
followed in C (:mod:`tierd.format.compiled`), else in Python, with the same result.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final, NamedTuple

import numpy as np

from tierd.errors import CorruptionError, CorruptRecordError
from tierd.format.compiled import records as _compiled
from tierd.format.layout import (
    FIELD_NAMES,
    FIELDS,
    HOST_V4,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    MIN_TAIL,
    PROPERTIES_LENGTH_WIDTH,
    TOPIC_LENGTH_WIDTH,
    field_column,
    field_dtype,
    gather_at,
    header_length,
    host_widths,
    position,
    width,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy.typing as npt

__all__ = [
    "Framing",
    "RecordSpans",
    "decode_field",
    "field_span",
    "frame",
    "gather_ranges",
    "record_spans",
    "store_timestamps",
    "total_size_at",
]

I64 = np.int64
_TOTAL: Final = struct.Struct(">" + FIELDS[FIELD_NAMES.index("total")].code)
_U2: Final = np.dtype(">u2")
_U4: Final = np.dtype(">u4")


# ----------------------------------------------------------------------------- framing
class Framing:
    """Where the records of a buffer start, found by following TOTALSIZE (a chain that cannot
    be vectorised, hence one tight loop over integers and nothing else)."""

    __slots__ = ("consumed", "starts")

    def __init__(self, starts: npt.NDArray[np.int64], consumed: int) -> None:
        self.starts = starts
        #: Bytes covered by complete records; the rest is the head of a record cut by the read.
        self.consumed = consumed


def frame(
    data: bytes | bytearray | memoryview,
    fail: Callable[[int, str], CorruptRecordError],
    max_size: int,
) -> Framing:
    """Starts of the complete records at the head of ``data``. A TOTALSIZE that cannot be a
    record (below :data:`~tierd.format.layout.MIN_RECORD_SIZE`, above ``max_size``) is
    corruption (``fail(position, reason)``); a record running past the end is left for the
    caller (read more, or judge it torn)."""
    lo, hi = MIN_RECORD_SIZE, max_size
    n = len(data)
    if _compiled is not None:
        found = np.empty(n // lo + 1, I64)
        count, consumed, bad, size = _compiled.frame_records(data, found, lo, hi)
        if bad >= 0:
            raise fail(bad, f"total size {size} is not a record size ({lo}..{hi})")
        return Framing(found[:count], consumed)
    unpack = _TOTAL.unpack_from
    last = n - 4
    pos = 0
    starts: list[int] = []
    append = starts.append
    while pos <= last:  # the loop runs once per record: locals only, one comparison chain
        (size,) = unpack(data, pos)
        if not lo <= size <= hi:
            raise fail(pos, f"total size {size} is not a record size ({lo}..{hi})")
        end = pos + size
        if end > n:
            break
        append(pos)
        pos = end
    return Framing(np.array(starts, I64), pos)


def field_span(name: str) -> tuple[int, int]:
    """``(start, end)`` of fixed-header field ``name`` within a record, for the fields before
    BORNHOST (where they are for any host widths): a reader fetching one field of a record it
    has not read, e.g. a segment's first QUEUEOFFSET with one ranged read."""
    if FIELD_NAMES.index(name) >= FIELD_NAMES.index("born_host"):
        raise ValueError(f"{name} moves with the born host's width: read the header first")
    at = position(name, HOST_V4, HOST_V4)
    return at, at + width(name)


def decode_field(name: str, raw: bytes | bytearray | memoryview) -> int:
    """The value of field ``name`` from its bytes (as :func:`field_span` locates them)."""
    return int(np.frombuffer(raw, field_dtype(name), 1)[0])


def total_size_at(data: bytes | bytearray | memoryview, pos: int) -> int:
    """The TOTALSIZE field of the record at ``pos`` (a reader deciding how much more to read)."""
    return int(_TOTAL.unpack_from(data, pos)[0])


# ----------------------------------------------------------------------------- the parts
class RecordSpans(NamedTuple):
    """Where the parts of every record of a batch are, as absolute byte positions (one entry
    per record): ``[body_start, body_start + body_length)`` the body, ``[topic_start,
    topic_end)`` the topic's UTF-8, ``[properties_start, end)`` the properties."""

    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    magic: npt.NDArray[np.int64]
    sys_flag: npt.NDArray[np.int64]
    body_start: npt.NDArray[np.int64]
    body_length: npt.NDArray[np.int64]
    topic_start: npt.NDArray[np.int64]
    topic_end: npt.NDArray[np.int64]
    properties_start: npt.NDArray[np.int64]


def record_spans(records: bytes | bytearray | memoryview, sizes: npt.NDArray[np.int64]) -> RecordSpans:
    """:class:`RecordSpans` of a batch of records laid back to back, ``sizes`` bytes each,
    computed for the whole batch with numpy.

    Only framing is checked (magic, field lengths adding up to TOTALSIZE; not CRCs): a batch
    whose sizes do not cover ``records`` exactly, or a record whose fields do not add up, is a
    :class:`~tierd.errors.CorruptionError` naming the first bad record."""
    n = len(sizes)
    buf = np.frombuffer(records, dtype=np.uint8)
    ends = np.cumsum(sizes, dtype=I64)
    if n == 0 or int(ends[-1]) != len(buf) or int(sizes.min()) < MIN_RECORD_SIZE:
        raise CorruptionError(
            f"record sizes {sizes.tolist()[:8]}... do not frame a batch of {len(buf)} bytes",
            size=len(buf),
        )
    starts = ends - sizes
    last = len(buf) - 1
    magic = field_column(buf, starts, "magic").astype(I64)
    sys_flag = field_column(buf, starts, "sys_flag").astype(I64)
    born, store = host_widths(sys_flag)
    body_start = starts + header_length(born, store)
    # Positions are clipped into the buffer until the record is judged (a bad length read
    # from one record must not make a gather read outside the batch).
    body_len_at = np.minimum(starts + position("body_length", born, store), last - 3)
    body_len = gather_at(buf, body_len_at, _U4).astype(I64)
    v2 = magic == MAGIC_V2
    tpos = np.minimum(body_start + body_len, last - 1)
    topic_len = np.where(v2, gather_at(buf, tpos, _U2).astype(I64), buf[tpos].astype(I64))
    tlen_width = np.where(v2, TOPIC_LENGTH_WIDTH[MAGIC_V2], TOPIC_LENGTH_WIDTH[MAGIC_V1])
    topic_start = body_start + body_len + tlen_width
    topic_end = topic_start + topic_len
    props_start = topic_end + PROPERTIES_LENGTH_WIDTH
    props_len = gather_at(buf, np.clip(topic_end, 0, last - 1), _U2).astype(I64)
    ok = (
        ((magic == MAGIC_V1) | v2)
        & (body_len < 2**31)
        & (body_start + body_len + MIN_TAIL <= ends)
        & (props_start + props_len == ends)
    )
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise CorruptionError(
            f"record {bad} of the batch (at byte {int(starts[bad])}) has inconsistent field lengths",
            index=bad,
        )
    return RecordSpans(
        starts, ends, magic, sys_flag, body_start, body_len, topic_start, topic_end, props_start
    )


def gather_ranges(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """The byte ranges ``[starts, ends)`` of ``buf`` end to end (one fancy index), and where
    each range starts in the result (``len(starts) + 1`` positions)."""
    lens = ends - starts
    at = np.zeros(len(lens) + 1, dtype=I64)
    np.cumsum(lens, out=at[1:])
    src = np.arange(int(at[-1]), dtype=I64) + np.repeat(starts - at[:-1], lens)
    return buf[src], at


def store_timestamps(
    records: bytes | bytearray | memoryview, starts: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """STORETIMESTAMP of every record starting at ``starts`` (its position depends on the
    born host's width, read from each record's sysflag)."""
    buf = np.frombuffer(records, np.uint8)
    sysflag = field_column(buf, starts, "sys_flag")
    stamps: npt.NDArray[np.int64] = field_column(buf, starts, "store_timestamp", sysflag).astype(I64)
    return stamps
