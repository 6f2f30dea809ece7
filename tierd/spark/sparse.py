"""Reading only some records of a commitlog range: the spans a key lookup found in the cold
index, or the records whose consume-queue tag code matches a pushed ``tags`` filter.

Both paths read exact record runs (each span starts and ends on a record boundary), decode them
with the same validation and CRC checks as a full read, and leave the final word to the row
filters (:func:`tierd.spark.filters.property_mask`): a hash collision in the index or in the tag
codes only costs a record read, never a wrong row. Spans closer than :data:`COALESCE_GAP` are
read as one (a few KiB of unwanted records cost less than another request).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Final

import numpy as np

from tierd.errors import CorruptionError
from tierd.format.cq_unit import UNIT_SIZE, decode_units, tags_code
from tierd.spark.decode import read_range

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    import pyarrow as pa

    from tierd.spark.filters import Constraints
    from tierd.spark.plan import CqSegment, SegmentRange
    from tierd.spark.storage import ColdStorage, SegmentSource

__all__ = ["COALESCE_GAP", "coalesce", "read_spans", "read_tagged", "span_ranges"]

#: Spans of one segment closer than this are read as one.
COALESCE_GAP: Final = 64 * 1024


def coalesce(spans: Iterable[tuple[int, int]], gap: int | None = None) -> list[tuple[int, int]]:
    """Sorted, merged ``[start, end)`` spans; spans at most ``gap`` (default
    :data:`COALESCE_GAP`) apart become one."""
    if gap is None:
        gap = COALESCE_GAP
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def span_ranges(r: SegmentRange, spans: Iterable[tuple[int, int]]) -> list[SegmentRange]:
    """``r`` narrowed to each span (positions in its segment, record boundaries)."""
    return [replace(r, start=a, end=b, promised_end=b, max_offset=None) for a, b in spans]


def read_spans(
    storage: ColdStorage, spans: Sequence[SegmentRange], constraints: Constraints | None, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Decode each span; a segment is opened (listed, if open) once for all its spans."""
    sources: dict[str, SegmentSource] = {}
    for r in spans:
        src = sources.get(r.path)
        if src is None:
            assert r.end is not None
            last_end = max(s.end or 0 for s in spans if s.path == r.path)
            sources[r.path] = src = (
                storage.sealed_segment(r.path, last_end) if r.sealed else storage.segment(r.path)
            )
        yield from read_range(storage, r, constraints, schema=schema, source=src)


def _units(storage: ColdStorage, cq: Sequence[CqSegment], first: int, last: int | None) -> np.ndarray:
    """Consume-queue units of queue offsets ``[first, last]`` (``last`` None: as far as stored
    now), read from the segments that hold them."""
    lo = first * UNIT_SIZE
    hi = None if last is None else (last + 1) * UNIT_SIZE
    parts: list[bytes] = []
    expect = lo
    for seg in cq:
        seg_end_known = seg.base_offset + seg.size
        if (hi is not None and seg.base_offset >= hi) or (seg.sealed and seg_end_known <= lo):
            continue
        src = storage.sealed_segment(seg.path, seg.size) if seg.sealed else storage.segment(seg.path)
        seg_end = seg.base_offset + src.size
        if seg_end <= lo:
            continue
        a = max(lo, seg.base_offset) - seg.base_offset
        b = (seg_end if hi is None else min(hi, seg_end)) - seg.base_offset
        b -= (b - a) % UNIT_SIZE  # a unit being written past what is committed
        if seg.base_offset + a != expect:
            raise CorruptionError(
                f"{src.url}: consume-queue units from byte {expect} are missing (this segment starts "
                f"at {seg.base_offset + a})",
                path=src.url,
            )
        if b > a:
            parts.append(src.read(a, b))
            expect = seg.base_offset + b
        if hi is not None and expect >= hi:
            break
    raw = b"".join(parts)
    return decode_units(raw)


def read_tagged(
    storage: ColdStorage,
    r: SegmentRange,
    cq: Sequence[CqSegment],
    tags: Iterable[str],
    constraints: Constraints | None,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch] | None:
    """The records of ``r`` whose consume-queue tag code is one of ``tags``' codes, read alone;
    None when the range's first queue offset is unknown (the caller reads it whole)."""
    if r.first_queue_offset is None:
        return None
    units = _units(storage, cq, r.first_queue_offset, r.last_queue_offset)
    codes = np.array(sorted({tags_code(t) for t in tags}), dtype=np.int64)
    flat = units["offset"].astype(np.int64)
    lo = r.base_offset + r.start
    hi = None if r.end is None else r.base_offset + r.end
    keep = np.isin(units["tags_code"].astype(np.int64), codes) & (flat >= lo)
    if hi is not None:
        keep &= flat < hi
    if r.max_offset is not None:
        qo = r.first_queue_offset + np.arange(len(units), dtype=np.int64)
        keep &= qo <= r.max_offset
    starts = flat[keep] - r.base_offset
    ends = starts + units["size"][keep].astype(np.int64)
    spans = coalesce(zip(starts.tolist(), ends.tolist(), strict=True))
    return read_spans(storage, span_ranges(r, spans), constraints, schema)
