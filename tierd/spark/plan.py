"""Planning a Spark read of the cold tier: options → manifests → segment ranges (partitions).

Pure Python over :class:`~tierd.spark.storage.ColdStorage` (no pyspark), so every rule here is
unit-tested without a SparkSession:

* **Manifests, not listings.** The broker manifest names topics and queues, each queue manifest
  its segments with size, sealed flag, first/last queue offset and min/max store timestamp. The
  only listings are of the root and of a cluster directory, and only when ``cluster``/``broker``
  are not given (one delimiter listing each, never recursive).
* **Ranges at record boundaries.** A commitlog segment larger than ``max_partition_bytes`` is
  cut into ranges; each cut is a record start read from the cold consume queue (the 20-byte unit
  of the queue offset interpolated for that byte position: one small ranged read per cut, all
  cuts of a plan fetched in one batch). Ranges of uneven records come out uneven — any record
  boundary is a correct cut, so no search is spent making them equal.
* **Pruning that is exact where it is claimed.** :class:`~tierd.spark.filters.Constraints`
  gathers the options and the filters Spark pushes; segments and ranges whose manifest bounds
  cannot match are dropped, and the same constraints are applied to every decoded row, so a
  filter reported to Spark as handled is handled exactly. Open segments may have grown since
  their manifest was written: their last range is unbounded above (offsets, timestamps, bytes).
* **Byte positions of queue offsets** (:func:`record_positions`, :func:`clip_ranges`): a
  streaming micro-batch or the part of a queue a key lookup must scan is cut exactly at record
  starts read from the consume queue, so nothing outside it is read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tierd.drivers.paths import cluster_dir, get_hash, segment_path
from tierd.drivers.segment import FileType
from tierd.errors import CorruptionError, NotFoundError, SegmentNotFoundError
from tierd.format.cq_unit import UNIT_SIZE, unit_location
from tierd.systopics import is_system_topic
from tierd.tiered.manifest import (
    BrokerManifest,
    ManifestSegment,
    QueueManifest,
    broker_manifest_path,
    queue_manifest_path,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from tierd.spark.filters import Constraints
    from tierd.spark.options import ReadOptions
    from tierd.spark.storage import ColdStorage

__all__ = [
    "CqSegment",
    "Queue",
    "SegmentRange",
    "clip_ranges",
    "discover_brokers",
    "load_queues",
    "plan_ranges",
    "record_positions",
    "sort_ranges",
    "split_ranges",
]

_CLUSTER_DIR = re.compile(r"([0-9a-f]{8})_(.+)")


# ----------------------------------------------------------------------------- ranges
@dataclass(frozen=True, slots=True)
class SegmentRange:
    """One partition: bytes ``[start, end)`` of one commitlog segment of one queue, starting at a
    record boundary. ``end=None``: to the segment's end as stored when the task runs (open
    segments keep growing). Bounds are what the manifest knows; None means unknown."""

    cluster: str
    broker: str
    topic: str
    queue_id: int
    #: Cold-tier path of the commitlog segment (relative to the root URL).
    path: str
    base_offset: int
    start: int
    end: int | None
    #: Bytes up to which the manifest promises whole records (``end`` when sealed; for an
    #: unbounded tail, the committed size when the manifest was written).
    promised_end: int
    sealed: bool
    first_queue_offset: int | None
    last_queue_offset: int | None
    min_store_ms: int | None
    max_store_ms: int | None
    #: Rows with a larger queue offset are dropped when read (an unbounded tail read up to an
    #: offset: a streaming micro-batch); None keeps every row.
    max_offset: int | None = None

    @property
    def known_bytes(self) -> int:
        """Bytes the plan knows about (the manifest size for an open tail)."""
        return max(0, self.promised_end - self.start)


@dataclass(frozen=True, slots=True)
class CqSegment:
    """A consume-queue segment of a queue, as its manifest lists it (tag pruning reads it)."""

    path: str
    base_offset: int
    size: int
    sealed: bool


@dataclass(frozen=True, slots=True)
class Queue:
    """One queue of the cold tier as its manifest describes it (plain data)."""

    cluster: str
    broker: str
    #: The topic's id in the broker manifest (what cold index items carry).
    topic_id: int
    manifest: QueueManifest

    @property
    def topic(self) -> str:
        return self.manifest.topic

    @property
    def queue_id(self) -> int:
        return self.manifest.queue_id

    @property
    def key(self) -> str:
        """``cluster/broker/topic/queue id``: unique in a bucket (names hold no ``/``)."""
        return f"{self.cluster}/{self.broker}/{self.topic}/{self.queue_id}"

    def commitlogs(self) -> list[ManifestSegment]:
        segs = (s for s in self.manifest.segments if s.type == "COMMIT_LOG")
        return sorted(segs, key=lambda s: s.base_offset)

    def consume_queues(self) -> list[ManifestSegment]:
        return sorted(
            (s for s in self.manifest.segments if s.type == "CONSUME_QUEUE"), key=lambda s: s.base_offset
        )

    def cq_segments(self) -> tuple[CqSegment, ...]:
        return tuple(
            CqSegment(self.path(FileType.CONSUME_QUEUE, s.base_offset), s.base_offset, s.size, s.sealed)
            for s in self.consume_queues()
        )

    def path(self, file_type: FileType, base_offset: int) -> str:
        return segment_path("", self.cluster, self.broker, self.topic, self.queue_id, file_type, base_offset)

    def unit_request(self, queue_offset: int) -> tuple[str, int, int] | None:
        """The ranged read of queue offset's 20-byte consume-queue unit, if the manifest lists it."""
        pos = queue_offset * UNIT_SIZE
        for s in self.consume_queues():
            if s.base_offset <= pos and pos + UNIT_SIZE <= s.base_offset + s.size:
                rel = self.path(FileType.CONSUME_QUEUE, s.base_offset)
                return rel, pos - s.base_offset, pos - s.base_offset + UNIT_SIZE
        return None

    def segment_range(self, seg: ManifestSegment, is_tail: bool) -> SegmentRange:
        """The whole of commitlog segment ``seg`` as one range."""
        m = self.manifest
        open_tail = not seg.sealed and is_tail
        return SegmentRange(
            cluster=self.cluster,
            broker=self.broker,
            topic=m.topic,
            queue_id=m.queue_id,
            path=self.path(FileType.COMMIT_LOG, seg.base_offset),
            base_offset=seg.base_offset,
            start=0,
            end=None if not seg.sealed else seg.size,
            promised_end=seg.size,
            sealed=seg.sealed,
            first_queue_offset=seg.first_queue_offset
            if seg.first_queue_offset is not None
            else (m.max_offset if open_tail else None),
            last_queue_offset=None if open_tail else seg.last_queue_offset,
            min_store_ms=seg.min_store_timestamp,
            max_store_ms=None if open_tail else seg.max_store_timestamp,
        )


def _parse_manifest(model: type[BrokerManifest] | type[QueueManifest], raw: bytes, where: str) -> Any:
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise CorruptionError(f"manifest {where} is not valid: {str(e).splitlines()[0]}", path=where) from e


def discover_brokers(storage: ColdStorage, opts: ReadOptions) -> list[tuple[str, str, bytes | None]]:
    """(cluster, broker, manifest bytes) to read: the brokers named by the options (manifest not
    read yet: None), else every directory that looks like tierd's (``{md5[:8]}_{cluster}`` with
    a matching hash, holding ``{broker}/MANIFEST.json``). The candidates' manifests are fetched
    together, once: finding one is reading it."""
    if opts.clusters is not None:
        clusters = list(opts.clusters)
    else:
        clusters = []
        for name, _, is_dir in storage.list_dir(""):
            m = _CLUSTER_DIR.fullmatch(name)
            if is_dir and m and m.group(1) == get_hash(m.group(2)):
                clusters.append(m.group(2))
        if not clusters:
            raise NotFoundError(
                f"no tierd cold tier under {opts.url}: expected a directory like "
                f"{cluster_dir('DefaultCluster')}/ (set option path to the backend.url tierd wrote to)",
                path=opts.url,
            )
    found: list[tuple[str, str, bytes | None]] = []
    for cluster in sorted(clusters):
        if opts.brokers is not None:
            found.extend((cluster, b, None) for b in opts.brokers)
            continue
        names = sorted(name for name, _, is_dir in storage.list_dir(cluster_dir(cluster)) if is_dir)
        raws = storage.read_objects([broker_manifest_path(cluster, name) for name in names])
        here = [(cluster, name, raw) for name, raw in zip(names, raws, strict=True) if raw is not None]
        if not here and opts.clusters is not None:
            raise NotFoundError(
                f"option cluster={cluster!r}: no broker manifest under {opts.url}/{cluster_dir(cluster)}/",
                cluster=cluster,
            )
        found.extend(here)
    return found


def load_queues(storage: ColdStorage, opts: ReadOptions, c: Constraints) -> list[Queue]:
    """The manifests of every queue the options and constraints select (broker manifests first,
    then the selected queue manifests, read together)."""
    queues: list[Queue] = []
    seen_topics: set[str] = set()
    for cluster, broker, known in discover_brokers(storage, opts):
        path = broker_manifest_path(cluster, broker)
        try:
            raw = known if known is not None else storage.read_object(path)
        except SegmentNotFoundError as e:
            raise NotFoundError(
                f"no broker manifest at {opts.url}/{path}: check options cluster ({cluster!r}) and "
                f"broker ({broker!r}) against tiered.cluster / tiered.broker of the writer",
                path=path,
            ) from e
        bm: BrokerManifest = _parse_manifest(BrokerManifest, raw, f"{opts.url}/{path}")
        wanted: list[tuple[int, str, int, str]] = []
        for t in bm.topics:
            if is_system_topic(t.name) and (c.topics is None or t.name not in c.topics):
                continue  # the store's bookkeeping: read only when named (tierd.systopics)
            seen_topics.add(t.name)
            if not c.allows_topic(t.name):
                continue
            wanted.extend(
                (t.id, t.name, qid, queue_manifest_path(cluster, broker, t.name, qid))
                for qid in t.queues
                if c.allows_queue(qid)
            )
        for (topic_id, topic, qid, qpath), qraw in zip(
            wanted, storage.read_objects([w[3] for w in wanted]), strict=True
        ):
            if qraw is None:
                raise NotFoundError(
                    f"the broker manifest lists {topic}/{qid} but {opts.url}/{qpath} is missing",
                    path=qpath,
                )
            qm: QueueManifest = _parse_manifest(QueueManifest, qraw, f"{opts.url}/{qpath}")
            queues.append(Queue(cluster, broker, topic_id, qm))
    missing = sorted(set(opts.topics or ()) - seen_topics)
    if missing:
        raise NotFoundError(
            f"option topic: {missing} not found in the cold tier at {opts.url}; "
            f"topics there: {sorted(seen_topics) or 'none'}",
            topics=missing,
        )
    return queues


def record_positions(storage: ColdStorage, wanted: Sequence[tuple[Queue, int]]) -> list[int | None]:
    """Flat commitlog offset where the record of each (queue, queue offset) starts, from the cold
    consume queue: its own unit, or — for the queue's ``max_offset``, the next record to come —
    the end of the previous one. None where the manifest lists neither (one batched read)."""
    requests: list[tuple[str, int, int]] = []
    plan: list[tuple[int, bool] | None] = []  # (index into requests, add the size)
    for q, qo in wanted:
        req = q.unit_request(qo)
        after = False
        if req is None and qo > 0:
            req, after = q.unit_request(qo - 1), True
        if req is None:
            plan.append(None)
            continue
        plan.append((len(requests), after))
        requests.append(req)
    units = storage.read_units(requests)
    out: list[int | None] = []
    for p in plan:
        if p is None:
            out.append(None)
            continue
        flat, size = unit_location(units[p[0]])
        out.append(flat + size if p[1] else flat)
    return out


def clip_ranges(q: Queue, lo: int, hi: int | None, first_qo: int, end_qo: int | None) -> list[SegmentRange]:
    """The commitlog ranges holding flat bytes ``[lo, hi)`` of queue ``q`` (both record starts;
    ``hi`` None: to the end, as stored when read) — the records with queue offsets
    ``[first_qo, end_qo)``. Nothing outside the bytes is read; when ``hi`` is None and ``end_qo``
    is given, rows past it are dropped when read (:attr:`SegmentRange.max_offset`)."""
    out: list[SegmentRange] = []
    segs = q.commitlogs()
    for i, seg in enumerate(segs):
        is_tail = i == len(segs) - 1
        seg_end = None if is_tail and not seg.sealed else seg.base_offset + seg.size
        if (seg_end is not None and seg_end <= lo) or (hi is not None and seg.base_offset >= hi):
            continue
        r = q.segment_range(seg, is_tail)
        start = max(lo, seg.base_offset) - seg.base_offset
        ends_here = is_tail if hi is None else seg_end is None or hi <= seg_end
        end = hi - seg.base_offset if hi is not None and ends_here else r.end
        if end is not None and end <= start:
            continue
        last = r.last_queue_offset
        if ends_here and end_qo is not None:
            last = end_qo - 1
        out.append(
            replace(
                r,
                start=start,
                end=end,
                promised_end=max(start, r.promised_end) if end is None else end,
                first_queue_offset=first_qo if lo >= seg.base_offset else r.first_queue_offset,
                last_queue_offset=last,
                max_offset=end_qo - 1 if end is None and end_qo is not None else None,
            )
        )
    return out


def split_ranges(
    storage: ColdStorage, url: str, pieces: Sequence[tuple[Queue, SegmentRange]], max_bytes: int
) -> list[SegmentRange]:
    """Cut every range larger than ``max_bytes`` (by the bytes its manifest knows) at record
    starts: queue offsets interpolated over its known offsets, their positions read from the
    cold consume queue (all cuts of a plan in one batched read). A range whose offsets or
    consume-queue units are not known stays whole."""
    out: list[SegmentRange] = []
    splits: list[tuple[SegmentRange, list[int], list[tuple[str, int, int]], int | None]] = []
    for q, r in pieces:
        first, last = r.first_queue_offset, r.last_queue_offset
        seg = next(s for s in q.commitlogs() if s.base_offset == r.base_offset)
        if last is None and r.end is None:
            # An open tail: cut what the manifest knows of it; the last piece stays unbounded.
            last = seg.last_queue_offset
        n = math.ceil(r.known_bytes / max_bytes)
        if n <= 1 or first is None or last is None or last <= first:
            out.append(r)
            continue
        count = last - first + 1
        # At most one piece per record: with more pieces than records (a partition smaller than
        # a record) the interpolation reached last + 1, the next segment's first record, whose
        # unit points outside this range — reported as corruption of an intact bucket.
        n = min(n, count)
        cuts = sorted({first + round(count * k / n) for k in range(1, n)} - {first})
        found = [q.unit_request(qo) for qo in cuts]
        reqs = [req for req in found if req is not None]
        if len(reqs) != len(found):  # CQ not (fully) in the manifest: keep the range whole
            out.append(r)
            continue
        splits.append((r, cuts, reqs, seg.max_store_timestamp))
    units = storage.read_units([req for _, _, reqs, _ in splits for req in reqs])
    k = 0
    for r, cuts, reqs, seg_max_ms in splits:
        bounds: list[tuple[int, int]] = []  # (byte position in segment, queue offset)
        for qo, req in zip(cuts, reqs, strict=True):
            flat, size = unit_location(units[k])
            k += 1
            if size == 0:  # a hole (messages lost before tiering): no record starts here
                continue
            pos = flat - r.base_offset
            if size < 0 or pos < r.start or pos >= r.promised_end:
                raise CorruptionError(
                    f"{url}/{req[0]}: consume-queue unit of queue offset {qo} points at flat "
                    f"offset {flat} (size {size}), outside commitlog range {r.path} "
                    f"[{r.base_offset + r.start}, {r.base_offset + r.promised_end})",
                    path=req[0],
                    queue_offset=qo,
                )
            if pos > r.start:
                bounds.append((pos, qo))
        bounds.sort()
        starts: list[tuple[int, int | None]] = [(r.start, r.first_queue_offset), *bounds]
        for j, (at, first_qo) in enumerate(starts):
            nxt = bounds[j] if j < len(bounds) else None
            out.append(
                replace(
                    r,
                    start=at,
                    end=nxt[0] if nxt is not None else r.end,
                    promised_end=nxt[0] if nxt is not None else r.promised_end,
                    # committed when the manifest was written: the manifest's maximum covers it
                    max_store_ms=seg_max_ms if nxt is not None else r.max_store_ms,
                    first_queue_offset=first_qo,
                    last_queue_offset=nxt[1] - 1 if nxt is not None else r.last_queue_offset,
                    max_offset=None if nxt is not None else r.max_offset,
                )
            )
    return out


def plan_ranges(
    storage: ColdStorage, opts: ReadOptions, c: Constraints, queues: Sequence[Queue] | None = None
) -> list[SegmentRange]:
    """Every commitlog range to read, pruned by ``c`` and split to ``opts.max_partition_bytes``
    (``queues``: their manifests if already loaded)."""
    pieces: list[tuple[Queue, SegmentRange]] = []
    for q in load_queues(storage, opts, c) if queues is None else queues:
        cls = q.commitlogs()
        for i, seg in enumerate(cls):
            if not seg.sealed and not opts.include_open_segments:
                continue
            if seg.sealed and seg.size == 0:
                continue
            r = q.segment_range(seg, is_tail=i == len(cls) - 1)
            if c.may_match(r):
                pieces.append((q, r))
    ranges = [r for r in split_ranges(storage, opts.url, pieces, opts.max_partition_bytes) if c.may_match(r)]
    return sort_ranges(ranges)


def sort_ranges(ranges: Iterable[SegmentRange]) -> list[SegmentRange]:
    return sorted(ranges, key=lambda r: (r.cluster, r.broker, r.topic, r.queue_id, r.base_offset, r.start))
