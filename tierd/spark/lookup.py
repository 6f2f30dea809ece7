"""Planning a key lookup through the cold key index, from the bucket alone.

A read with a key constraint (the ``key`` option, or ``uniq_key = / IN`` pushed) does not scan
the queues. Per broker, the index manifest (``INDEX_MANIFEST.json``, one GET) lists the
uploaded INDEX segments and, per queue, the queue offsets whose keys are certainly in them
(see :mod:`tierd.tiered.index`). Then, per segment and key, the two reads of FORMATS §2.4 —
the 8-byte slot, then that slot's items (all files' slots in one batch, all items in a second)
— give the candidates' flat offsets and sizes; only those records are read, and every row is
checked against the real key (a hash collision costs one record read, never a wrong row).

What the index cannot vouch for is scanned, with the key checked on every row:

* offsets of a queue outside its covered range (messages tiered after the newest uploaded index
  file — up to ``max_file_age`` of them — or before a restart of the writer);
* segments holding messages stored at or before the manifest's ``expired-through`` (their
  items may have been deleted with an expired index file);
* every queue of a broker without an index manifest, and a queue whose covered range's
  consume-queue units the queue manifest does not list.

Scanned and looked-up parts never overlap (hits in scanned segments are dropped), so each
message is read once. An INDEX segment listed but gone (expired since the manifest was read)
counts as expired: messages up to its end timestamp are scanned.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pydantic import ValidationError

from tierd.drivers.paths import index_segment_path
from tierd.errors import CorruptionError, SegmentNotFoundError
from tierd.format.key_hash import index_key, key_hash
from tierd.spark.plan import Queue, clip_ranges, record_positions, sort_ranges, split_ranges
from tierd.spark.sparse import coalesce, span_ranges
from tierd.tiered.index.format import SLOT_SIZE
from tierd.tiered.index.reading import segment_slots, slot_extent, slot_hits, slot_position
from tierd.tiered.manifest import IndexManifest, index_manifest_path

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tierd.spark.filters import Constraints
    from tierd.spark.options import ReadOptions
    from tierd.spark.plan import SegmentRange
    from tierd.spark.storage import ColdStorage
    from tierd.tiered.index.results import IndexHit

__all__ = ["KeyPlan", "plan_key_lookup"]


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """What a key lookup reads: ranges scanned whole, and the exact record spans the index found
    (grouped per partition)."""

    scans: list[SegmentRange]
    lookups: list[list[SegmentRange]]
    #: Index segments consulted and candidates found (for logs and tests).
    index_segments: int
    candidates: int


@dataclass(frozen=True, slots=True)
class _Segment:
    """An INDEX segment to look keys up in."""

    path: str
    begin: int
    slots: int
    count: int
    min_ms: int | None
    end_ms: int


def _manifests(storage: ColdStorage, queues: Sequence[Queue]) -> dict[tuple[str, str], IndexManifest | None]:
    brokers = sorted({(q.cluster, q.broker) for q in queues})
    raws = storage.read_objects([index_manifest_path(c, b) for c, b in brokers])
    out: dict[tuple[str, str], IndexManifest | None] = {}
    for (cluster, broker), raw in zip(brokers, raws, strict=True):
        if raw is None:
            out[(cluster, broker)] = None
            continue
        try:
            out[(cluster, broker)] = IndexManifest.model_validate_json(raw)
        except ValidationError as e:
            where = storage.display(storage.full(index_manifest_path(cluster, broker)))
            raise CorruptionError(
                f"index manifest {where} is not valid: {str(e).splitlines()[0]}", path=where
            ) from e
    return out


def _lookup(
    storage: ColdStorage,
    segments: dict[tuple[str, str], list[_Segment]],
    wanted: Sequence[tuple[str, str, int, int]],
    window: tuple[int, int],
) -> tuple[list[tuple[str, str, IndexHit]], set[tuple[str, str, int]]]:
    """Index hits of each (cluster, broker, topic id, key hash) over the broker's segments whose
    time range meets ``window``: one batch of slot reads, one batch of item reads. Also the
    (cluster, broker, begin) of segments that turned out to be gone."""
    slots: list[tuple[str, str, _Segment, int, int]] = []
    for cluster, broker, topic_id, h in wanted:
        for seg in segments.get((cluster, broker), []):
            if (seg.min_ms is None or seg.min_ms <= window[1]) and seg.end_ms >= window[0]:
                slots.append((cluster, broker, seg, topic_id, h))
    raws = _read_each(
        storage, [(storage.full(s[2].path), slot_position(s[2].slots, s[4]), SLOT_SIZE) for s in slots]
    )
    gone: set[tuple[str, str, int]] = set()
    runs: list[tuple[str, str, _Segment, int, int, int, int]] = []
    for (cluster, broker, seg, topic_id, h), raw in zip(slots, raws, strict=True):
        if raw is None:
            gone.add((cluster, broker, seg.begin))
            continue
        pos, length = slot_extent(raw, seg.slots, seg.count, h, storage.display(storage.full(seg.path)))
        if length:
            runs.append((cluster, broker, seg, topic_id, h, pos, length))
    items = _read_each(storage, [(storage.full(r[2].path), r[5], r[6]) for r in runs])
    hits: list[tuple[str, str, IndexHit]] = []
    for (cluster, broker, seg, topic_id, h, _, _), raw in zip(runs, items, strict=True):
        if raw is None:
            gone.add((cluster, broker, seg.begin))
            continue
        hits.extend((cluster, broker, hit) for hit in slot_hits(raw, seg.begin, h, topic_id, *window))
    return hits, gone


def _read_each(storage: ColdStorage, spans: Sequence[tuple[str, int, int]]) -> list[bytes | None]:
    """Ranged reads ``(full path, start, length)``, concurrently; None for an object that is gone."""
    if not spans:
        return []
    try:
        return list(storage.cat_spans([(p, a, a + n) for p, a, n in spans]))
    except SegmentNotFoundError:
        out: list[bytes | None] = []
        for p, a, n in spans:
            try:
                out.append(storage.cat(p, a, a + n))
            except SegmentNotFoundError:
                out.append(None)
        return out


def plan_key_lookup(
    storage: ColdStorage, opts: ReadOptions, c: Constraints, queues: Sequence[Queue], keys: frozenset[str]
) -> KeyPlan:
    """Ranges to scan and record spans to read for messages with one of ``keys`` in ``queues``."""
    manifests = _manifests(storage, queues)
    segments: dict[tuple[str, str], list[_Segment]] = {}
    for (cluster, broker), m in manifests.items():
        if m is None:
            continue
        segments[(cluster, broker)] = [
            _Segment(
                index_segment_path("", cluster, broker, s.base_offset),
                s.base_offset,
                segment_slots(s.size, s.message_count),
                s.message_count,
                s.min_store_timestamp,
                s.max_store_timestamp if s.max_store_timestamp is not None else s.base_offset,
            )
            for s in m.segments
            if segment_slots(s.size, s.message_count) > 0 and s.message_count > 0
        ]
    window = (
        c.store_ms.lo if c.store_ms.lo is not None else -(2**62),
        c.store_ms.hi if c.store_ms.hi is not None else 2**62,
    )
    topics = sorted({(q.cluster, q.broker, q.topic, q.topic_id) for q in queues})
    wanted = [(cl, br, tid, key_hash(index_key(t, k))) for cl, br, t, tid in topics for k in sorted(keys)]
    hits, gone = _lookup(storage, segments, wanted, window)

    # Per queue: the covered flat range [A, B), and what is certain within it.
    covered: dict[str, tuple[int, int]] = {}
    expired: dict[tuple[str, str], int | None] = {}
    position_reqs: list[tuple[Queue, int]] = []
    for q in queues:
        m = manifests.get((q.cluster, q.broker))
        if m is None:
            continue
        through = m.expired_through
        for seg in segments.get((q.cluster, q.broker), []):
            if (q.cluster, q.broker, seg.begin) in gone:
                through = seg.end_ms if through is None else max(through, seg.end_ms)
        expired[(q.cluster, q.broker)] = through
        cov = next((x for x in m.coverage if x.topic_id == q.topic_id and x.queue_id == q.queue_id), None)
        if cov is None:
            continue
        first = max(cov.first_offset, q.manifest.min_offset)
        end = min(cov.end_offset, q.manifest.max_offset)
        if end <= first:
            continue
        position_reqs += [(q, first), (q, end)]
    positions = record_positions(storage, position_reqs)
    firsts: dict[str, tuple[int, int]] = {}
    for i in range(0, len(position_reqs), 2):
        q, first_qo = position_reqs[i]
        a, b = positions[i], positions[i + 1]
        if a is not None and b is not None and b > a:
            covered[q.key] = (a, b)
            firsts[q.key] = (first_qo, position_reqs[i + 1][1])

    by_queue: dict[tuple[str, str, int, int], list[IndexHit]] = {}
    for cluster, broker, hit in hits:
        by_queue.setdefault((cluster, broker, hit.topic_id, hit.queue_id), []).append(hit)

    scans: list[tuple[Queue, SegmentRange]] = []
    spans: list[SegmentRange] = []
    for q in queues:
        area = covered.get(q.key)
        if area is None:  # nothing certain: scan the queue
            scans += [(q, r) for r in clip_ranges(q, 0, None, q.manifest.min_offset, None)]
            continue
        a, b = area
        first_qo, end_qo = firsts[q.key]
        scans += [(q, r) for r in clip_ranges(q, 0, a, q.manifest.min_offset, first_qo)]
        scans += [(q, r) for r in clip_ranges(q, b, None, end_qo, None)]
        through = expired.get((q.cluster, q.broker))
        queue_hits = by_queue.get((q.cluster, q.broker, q.topic_id, q.queue_id), [])
        for r in clip_ranges(q, a, b, first_qo, end_qo):
            lo, hi = r.base_offset + r.start, r.base_offset + (r.end if r.end is not None else r.promised_end)
            if through is not None and (r.min_store_ms is None or r.min_store_ms <= through):
                scans.append((q, r))  # items of its older messages may be gone with their file
                continue
            found = [
                (h.flat_offset - r.base_offset, h.flat_offset - r.base_offset + h.size)
                for h in queue_hits
                if lo <= h.flat_offset < hi
            ]
            spans += span_ranges(replace(r, end=hi - r.base_offset), coalesce(found))
    if not opts.include_open_segments:  # a snapshot of sealed segments, as a scan would read
        scans = [(q, r) for q, r in scans if r.sealed]
        spans = [r for r in spans if r.sealed]
    scanned = [r for r in split_ranges(storage, opts.url, scans, opts.max_partition_bytes) if c.may_match(r)]
    lookups: list[list[SegmentRange]] = []
    size = 0
    for r in sort_ranges(spans):
        n = (r.end or r.start) - r.start
        if not lookups or size + n > opts.max_partition_bytes:
            lookups.append([])
            size = 0
        lookups[-1].append(r)
        size += n
    return KeyPlan(sort_ranges(scanned), lookups, sum(len(v) for v in segments.values()), len(hits))
