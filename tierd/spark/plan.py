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
* **Pruning that is exact where it is claimed.** :class:`Constraints` gathers the options and the
  filters Spark pushes; segments and ranges whose manifest bounds cannot match are dropped, and
  the same constraints are applied to every decoded row (:func:`row_mask`), so a filter reported
  to Spark as handled is handled exactly. Open segments may have grown since their manifest was
  written: their last range is unbounded above (offsets, timestamps and bytes).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from tierd.errors import CorruptionError, InvalidArgumentError, NotFoundError, SegmentNotFoundError
from tierd.local.consumequeue import UNIT_SIZE
from tierd.tiered.manifest import (
    BrokerManifest,
    ManifestSegment,
    QueueManifest,
    broker_manifest_path,
    queue_manifest_path,
)
from tierd.tiered.paths import cluster_dir, get_hash, segment_path
from tierd.tiered.segment import FileType

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    import numpy as np
    import numpy.typing as npt

    from tierd.spark.storage import ColdStorage

__all__ = [
    "DEFAULT_MAX_PARTITION_BYTES",
    "OPTION_NAMES",
    "Constraints",
    "Interval",
    "ReadOptions",
    "SegmentRange",
    "plan_ranges",
    "row_mask",
]

MiB: Final = 1024 * 1024
#: Default upper bound of one partition's commitlog bytes (like ``spark.sql.files.maxPartitionBytes``).
DEFAULT_MAX_PARTITION_BYTES: Final = 128 * MiB
#: Options the source understands (Spark passes ``path`` for ``.load(path)``).
OPTION_NAMES: Final = frozenset(
    {
        "path",
        "cluster",
        "broker",
        "topic",
        "queue_ids",
        "storage_options",
        "include_open_segments",
        "max_partition_bytes",
    }
)
_SIZE = re.compile(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB, "t": 1024 * 1024 * MiB}
_CLUSTER_DIR = re.compile(r"([0-9a-f]{8})_(.+)")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


# ----------------------------------------------------------------------------- options
def _names(option: str, raw: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in raw.split(","))
    if not raw.strip() or any(not n or "/" in n for n in names):
        raise InvalidArgumentError(
            f"option {option} must be a name or a comma-separated list of names, got {raw!r}",
            option=option,
            value=raw,
        )
    return tuple(dict.fromkeys(names))


def parse_size(option: str, raw: str) -> int:
    """``"134217728"``, ``"128m"``, ``"128MiB"``, ``"1g"`` → bytes (binary units)."""
    m = _SIZE.fullmatch(raw)
    if not m:
        raise InvalidArgumentError(
            f"option {option} must be a size such as 134217728, 128m or 1GiB, got {raw!r}",
            option=option,
            value=raw,
        )
    value = int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if value < 1:
        raise InvalidArgumentError(f"option {option} must be at least 1 byte, got {raw!r}", option=option)
    return value


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The validated options of one ``spark.read.format("tierd")`` — plain, picklable data."""

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    clusters: tuple[str, ...] | None = None
    brokers: tuple[str, ...] | None = None
    topics: tuple[str, ...] | None = None
    queue_ids: tuple[int, ...] | None = None
    include_open_segments: bool = True
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Validate Spark's options (case-insensitive names, string values). Every error names
        the option and the value received."""
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - OPTION_NAMES)
        if unknown:
            raise InvalidArgumentError(
                f"unknown option(s) {unknown} for format 'tierd'; valid options: {sorted(OPTION_NAMES)}",
                options=unknown,
            )
        url = (opts.get("path") or "").strip()
        if not url:
            raise InvalidArgumentError(
                "option path is required: .option('path', 's3://bucket/prefix') or .load('file:///dir')",
                option="path",
            )
        if "://" not in url:
            if not url.startswith("/"):
                raise InvalidArgumentError(
                    f"option path must be a URL (s3://bucket/prefix, file:///abs/dir) or an absolute "
                    f"directory, got {url!r}",
                    option="path",
                    value=url,
                )
            url = "file://" + url
        raw_so = opts.get("storage_options")
        storage: dict[str, Any] = {}
        if raw_so is not None and raw_so.strip():
            try:
                storage = json.loads(raw_so)
            except json.JSONDecodeError as e:
                raise InvalidArgumentError(
                    f"option storage_options must be a JSON object, got invalid JSON ({e.msg} at "
                    f"character {e.pos})",
                    option="storage_options",
                ) from e
            if not isinstance(storage, dict):
                raise InvalidArgumentError(
                    f"option storage_options must be a JSON object, got a {type(storage).__name__}",
                    option="storage_options",
                )
        queue_ids: tuple[int, ...] | None = None
        if opts.get("queue_ids") is not None:
            raw = opts["queue_ids"]
            try:
                queue_ids = tuple(sorted({int(p) for p in raw.split(",")}))
            except ValueError:
                queue_ids = None
            if queue_ids is None or any(q < 0 for q in queue_ids):
                raise InvalidArgumentError(
                    f"option queue_ids must be a comma-separated list of integers >= 0, got {raw!r}",
                    option="queue_ids",
                    value=raw,
                )
        include = True
        if opts.get("include_open_segments") is not None:
            raw = opts["include_open_segments"].strip().lower()
            if raw not in _TRUE | _FALSE:
                raise InvalidArgumentError(
                    "option include_open_segments must be true or false, "
                    f"got {opts['include_open_segments']!r}",
                    option="include_open_segments",
                    value=opts["include_open_segments"],
                )
            include = raw in _TRUE
        max_bytes = DEFAULT_MAX_PARTITION_BYTES
        if opts.get("max_partition_bytes") is not None:
            max_bytes = parse_size("max_partition_bytes", opts["max_partition_bytes"])
        return cls(
            url=url,
            storage_options=storage,
            clusters=_names("cluster", opts["cluster"]) if opts.get("cluster") is not None else None,
            brokers=_names("broker", opts["broker"]) if opts.get("broker") is not None else None,
            topics=_names("topic", opts["topic"]) if opts.get("topic") is not None else None,
            queue_ids=queue_ids,
            include_open_segments=include,
            max_partition_bytes=max_bytes,
        )


# ----------------------------------------------------------------------------- constraints
@dataclass(frozen=True, slots=True)
class Interval:
    """Inclusive integer interval; ``None`` is unbounded on that side."""

    lo: int | None = None
    hi: int | None = None

    def meet(self, other: Interval) -> Interval:
        lo = self.lo if other.lo is None else other.lo if self.lo is None else max(self.lo, other.lo)
        hi = self.hi if other.hi is None else other.hi if self.hi is None else min(self.hi, other.hi)
        return Interval(lo, hi)

    @property
    def empty(self) -> bool:
        return self.lo is not None and self.hi is not None and self.lo > self.hi

    def overlaps(self, lo: int | None, hi: int | None) -> bool:
        """Does ``[lo, hi]`` (None = unknown/unbounded) intersect this interval?"""
        if self.empty:
            return False
        if self.hi is not None and lo is not None and lo > self.hi:
            return False
        return not (self.lo is not None and hi is not None and hi < self.lo)

    def contains(self, v: int) -> bool:
        return (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _micros(v: object) -> int | None:
    """Exact microseconds since the epoch of a Spark timestamp literal; None if it has no zone
    (a naive value's instant depends on the session time zone, so it is not claimed)."""
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return (v - _EPOCH) // dt.timedelta(microseconds=1)
    return None


def _ts_interval(op: str, us: int) -> Interval:
    """Bounds on store_timestamp in *milliseconds* equivalent to ``ts_us <op> us`` where
    ts_us = ms * 1000 — exact integer arithmetic, so claiming the filter is safe."""
    floor, ceil = us // 1000, -(-us // 1000)
    if op == ">=":
        return Interval(ceil, None)
    if op == ">":
        return Interval(floor + 1, None)
    if op == "<=":
        return Interval(None, floor)
    if op == "<":
        return Interval(None, ceil - 1)
    # "=="
    return Interval(us // 1000, us // 1000) if us % 1000 == 0 else Interval(1, 0)


def _int_interval(op: str, v: int) -> Interval:
    return {
        ">=": Interval(v, None),
        ">": Interval(v + 1, None),
        "<=": Interval(None, v),
        "<": Interval(None, v - 1),
        "==": Interval(v, v),
    }[op]


@dataclass(slots=True)
class Constraints:
    """Conjunction of the restrictions of one read: the ``topic``/``queue_ids`` options and the
    filters pushed by Spark. Plain data (pickled to workers with the reader)."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    queue_id: Interval = field(default_factory=Interval)
    queue_offsets: frozenset[int] | None = None
    queue_offset: Interval = field(default_factory=Interval)
    #: store_timestamp bounds in milliseconds.
    store_ms: Interval = field(default_factory=Interval)
    #: Whether any pushed filter was accepted (rows must then be filtered in ``read``).
    row_filters: bool = False

    @classmethod
    def from_options(cls, opts: ReadOptions) -> Constraints:
        return cls(
            topics=frozenset(opts.topics) if opts.topics is not None else None,
            queue_ids=frozenset(opts.queue_ids) if opts.queue_ids is not None else None,
        )

    def push(self, column: str, op: str, value: object) -> bool:
        """Add ``column <op> value`` (op: ``== < <= > >= in``); True if it is now enforced
        exactly (pruning plus :func:`row_mask`), False if Spark must evaluate it."""
        accepted = self._push(column, op, value)
        self.row_filters |= accepted
        return accepted

    def _push(self, column: str, op: str, value: object) -> bool:
        if column == "topic":
            if op == "==" and isinstance(value, str):
                values: frozenset[Any] = frozenset({value})
            elif op == "in" and isinstance(value, tuple | list) and all(isinstance(v, str) for v in value):
                values = frozenset(value)
            else:
                return False
            self.topics = values if self.topics is None else self.topics & values
            return True
        if column in ("queue_id", "queue_offset"):
            if op == "in":
                if not isinstance(value, tuple | list) or not all(_is_int(v) for v in value):
                    return False
                ints = frozenset(int(v) for v in value)
                if column == "queue_id":
                    self.queue_ids = ints if self.queue_ids is None else self.queue_ids & ints
                else:
                    self.queue_offsets = ints if self.queue_offsets is None else self.queue_offsets & ints
                return True
            if not _is_int(value) or op not in ("==", "<", "<=", ">", ">="):
                return False
            iv = _int_interval(op, int(value))  # type: ignore[call-overload]
            if column == "queue_id":
                self.queue_id = self.queue_id.meet(iv)
            else:
                self.queue_offset = self.queue_offset.meet(iv)
            return True
        if column == "store_timestamp":
            us = _micros(value)
            if us is None or op not in ("==", "<", "<=", ">", ">="):
                return False
            self.store_ms = self.store_ms.meet(_ts_interval(op, us))
            return True
        return False

    def allows_topic(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics

    def allows_queue(self, queue_id: int) -> bool:
        return (self.queue_ids is None or queue_id in self.queue_ids) and self.queue_id.contains(queue_id)

    def offset_bounds(self) -> Interval:
        """queue_offset bounds including those implied by an IN list."""
        if self.queue_offsets is None:
            return self.queue_offset
        if not self.queue_offsets:
            return Interval(1, 0)
        return self.queue_offset.meet(Interval(min(self.queue_offsets), max(self.queue_offsets)))

    def may_match(self, r: SegmentRange) -> bool:
        """Can range ``r`` hold a matching row, judging by its manifest bounds?"""
        if not (self.allows_topic(r.topic) and self.allows_queue(r.queue_id)):
            return False
        if not self.offset_bounds().overlaps(r.first_queue_offset, r.last_queue_offset):
            return False
        return self.store_ms.overlaps(r.min_store_ms, r.max_store_ms)


def row_mask(
    c: Constraints, queue_offsets: npt.NDArray[np.int64], store_ms: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_] | None:
    """Rows of one range (one topic and queue, already checked by planning) that satisfy the
    pushed offset and timestamp filters; None when every row does."""
    import numpy as np

    mask: npt.NDArray[np.bool_] | None = None

    def both(m: npt.NDArray[np.bool_]) -> None:
        nonlocal mask
        mask = m if mask is None else mask & m

    for iv, col in ((c.queue_offset, queue_offsets), (c.store_ms, store_ms)):
        if iv.lo is not None:
            both(col >= iv.lo)
        if iv.hi is not None:
            both(col <= iv.hi)
    if c.queue_offsets is not None:
        both(np.isin(queue_offsets, np.fromiter(c.queue_offsets, np.int64, len(c.queue_offsets))))
    return mask


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

    @property
    def known_bytes(self) -> int:
        """Bytes the plan knows about (the manifest size for an open tail)."""
        return max(0, self.promised_end - self.start)


@dataclass(frozen=True, slots=True)
class _Queue:
    cluster: str
    broker: str
    manifest: QueueManifest


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


def _queues(storage: ColdStorage, opts: ReadOptions, c: Constraints) -> list[_Queue]:
    queues: list[_Queue] = []
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
        wanted: list[tuple[str, int, str]] = []
        for t in bm.topics:
            seen_topics.add(t.name)
            if not c.allows_topic(t.name):
                continue
            wanted.extend(
                (t.name, qid, queue_manifest_path(cluster, broker, t.name, qid))
                for qid in t.queues
                if c.allows_queue(qid)
            )
        for (topic, qid, qpath), qraw in zip(
            wanted, storage.read_objects([w[2] for w in wanted]), strict=True
        ):
            if qraw is None:
                raise NotFoundError(
                    f"the broker manifest lists {topic}/{qid} but {opts.url}/{qpath} is missing",
                    path=qpath,
                )
            qm: QueueManifest = _parse_manifest(QueueManifest, qraw, f"{opts.url}/{qpath}")
            queues.append(_Queue(cluster, broker, qm))
    missing = sorted(set(opts.topics or ()) - seen_topics)
    if missing:
        raise NotFoundError(
            f"option topic: {missing} not found in the cold tier at {opts.url}; "
            f"topics there: {sorted(seen_topics) or 'none'}",
            topics=missing,
        )
    return queues


def _segment_ranges(q: _Queue, seg: ManifestSegment, is_tail: bool) -> SegmentRange:
    m = q.manifest
    open_tail = not seg.sealed and is_tail
    return SegmentRange(
        cluster=q.cluster,
        broker=q.broker,
        topic=m.topic,
        queue_id=m.queue_id,
        path=segment_path("", q.cluster, q.broker, m.topic, m.queue_id, FileType.COMMIT_LOG, seg.base_offset),
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


def _cq_unit_request(
    m: QueueManifest, cqs: Sequence[ManifestSegment], cluster: str, broker: str, q: int
) -> tuple[str, int, int] | None:
    pos = q * UNIT_SIZE
    for s in cqs:
        if s.base_offset <= pos and pos + UNIT_SIZE <= s.base_offset + s.size:
            rel = segment_path(
                "", cluster, broker, m.topic, m.queue_id, FileType.CONSUME_QUEUE, s.base_offset
            )
            return rel, pos - s.base_offset, pos - s.base_offset + UNIT_SIZE
    return None


def plan_ranges(storage: ColdStorage, opts: ReadOptions, c: Constraints) -> list[SegmentRange]:
    """Every commitlog range to read, pruned by ``c`` and split to ``opts.max_partition_bytes``."""
    ranges: list[SegmentRange] = []
    # (whole-segment range, cut queue offsets, CQ unit requests)
    splits: list[tuple[SegmentRange, list[int], list[tuple[str, int, int]], int | None]] = []
    for q in _queues(storage, opts, c):
        m = q.manifest
        cls = sorted((s for s in m.segments if s.type == "COMMIT_LOG"), key=lambda s: s.base_offset)
        cqs = [s for s in m.segments if s.type == "CONSUME_QUEUE"]
        for i, seg in enumerate(cls):
            if not seg.sealed and not opts.include_open_segments:
                continue
            if seg.sealed and seg.size == 0:
                continue
            r = _segment_ranges(q, seg, is_tail=i == len(cls) - 1)
            if not c.may_match(r):
                continue
            first, last = seg.first_queue_offset, seg.last_queue_offset
            n = math.ceil(seg.size / opts.max_partition_bytes)
            if n <= 1 or first is None or last is None or last <= first:
                ranges.append(r)
                continue
            count = last - first + 1
            cuts = sorted({first + round(count * k / n) for k in range(1, n)} - {first})
            found = [_cq_unit_request(m, cqs, q.cluster, q.broker, qo) for qo in cuts]
            reqs = [req for req in found if req is not None]
            if len(reqs) != len(found):  # CQ not (fully) in the manifest: keep the segment whole
                ranges.append(r)
                continue
            splits.append((r, cuts, reqs, seg.max_store_timestamp))
    units = storage.read_units([req for _, _, reqs, _ in splits for req in reqs])
    k = 0
    for r, cuts, reqs, seg_max_ms in splits:
        bounds: list[tuple[int, int | None]] = []  # (byte position in segment, queue offset)
        for qo, req in zip(cuts, reqs, strict=True):
            unit = units[k]
            k += 1
            flat, size = int.from_bytes(unit[:8], "big", signed=True), int.from_bytes(unit[8:12], "big")
            pos = flat - r.base_offset
            known_end = r.promised_end
            if size <= 0 or pos <= 0 or pos >= known_end:
                raise CorruptionError(
                    f"{opts.url}/{req[0]}: consume-queue unit of queue offset {qo} points at flat "
                    f"offset {flat} (size {size}), outside commitlog segment {r.path} "
                    f"[{r.base_offset}, {r.base_offset + known_end})",
                    path=req[0],
                    queue_offset=qo,
                )
            bounds.append((pos, qo))
        bounds.sort(key=lambda b: b[0])
        starts: list[tuple[int, int | None]] = [(0, r.first_queue_offset), *bounds]
        for j, (at, first_qo) in enumerate(starts):
            nxt = starts[j + 1] if j + 1 < len(starts) else None
            piece = replace(
                r,
                start=at,
                end=nxt[0] if nxt is not None else r.end,
                promised_end=nxt[0] if nxt is not None else r.promised_end,
                # committed when the manifest was written: the manifest's maximum covers it
                max_store_ms=seg_max_ms if nxt is not None else r.max_store_ms,
                first_queue_offset=first_qo,
                last_queue_offset=(nxt[1] - 1 if nxt[1] is not None else None)
                if nxt is not None
                else r.last_queue_offset,
            )
            if c.may_match(piece):
                ranges.append(piece)
    ranges.sort(key=lambda r: (r.cluster, r.broker, r.topic, r.queue_id, r.base_offset, r.start))
    return ranges


def total_known_bytes(ranges: Iterable[SegmentRange]) -> int:
    return sum(r.known_bytes for r in ranges)
