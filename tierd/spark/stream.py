"""``spark.readStream.format("tierd")``: the cold tier as a streaming source.

**Offsets** are a JSON object ``{"cluster/broker/topic/queue id": next queue offset}`` — what
Spark checkpoints. The latest offsets are the queue manifests' ``max-offset`` (what tiering has
committed, readable now); a micro-batch ``[start, end)`` of a queue is the records with those
queue offsets, and nothing else: its first and last byte positions come from the cold consume
queue (one 20-byte unit each, batched), so a batch reads only what was committed since the
previous one — never an open segment again from its start — and a restart from the checkpoint
replays exactly the same records (no gap, no duplicate).

* ``startingOffsets``: ``latest`` (default), ``earliest``, a timestamp (the first message stored
  at or after it, per queue, found by a binary search over consume-queue units and record
  headers), or ``{"topic": {"queue id": offset}}`` with -2 = earliest and -1 = latest. Used only
  when a query starts without a checkpoint; a queue that appears later starts at its earliest.
* ``maxBytesPerTrigger``: commitlog bytes per micro-batch, shared fairly among the queues with
  new data (water-filling), each queue's end cut at a record boundary found by a binary search
  over its consume queue; every queue with data moves at least one message.
* ``failOnDataLoss`` (default true): offsets a query has not read yet but cold retention
  deleted (the queue's ``min-offset`` moved past them, or a segment vanished between planning
  and reading) fail the query with an error naming the queue and the offsets; false skips them
  with a warning.

Segments sealed between batches are read from their sealed object (:mod:`tierd.spark.storage`
follows a seal); new segments and queues are seen at the next manifest.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)

from tierd.drivers.segment import FileType
from tierd.errors import CorruptionError, NotFoundError
from tierd.format.cq_unit import unit_location
from tierd.format.layout import HOST_V4, HOST_V6, position
from tierd.format.record import store_timestamp_at
from tierd.spark.filters import Constraints
from tierd.spark.plan import clip_ranges, load_queues, record_positions, sort_ranges, split_ranges

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import pyarrow as pa

    from tierd.spark.options import ReadOptions
    from tierd.spark.plan import Queue, SegmentRange
    from tierd.spark.source import Column
    from tierd.spark.storage import ColdStorage

__all__ = ["TierdStreamReader", "data_loss"]

log = logging.getLogger(__name__)
#: Offsets as Spark checkpoints them.
Offsets = dict[str, int]
#: The store time a search gives a hole that no record follows yet (any time is at or before it).
_LATEST = 2**63 - 1
#: Bytes of a record header that hold its store timestamp, whatever the born host's size.
_TS_HEADER = position("store_host", HOST_V6, HOST_V4)


def data_loss(what: str) -> NotFoundError:
    """The error for offsets deleted before the query read them."""
    return NotFoundError(
        f"{what} were deleted from the cold tier (cold retention) before this query read them; "
        "set option failOnDataLoss=false to skip what is gone and go on",
        reason="data_loss",
    )


class TierdStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets from the bucket manifests, micro-batches planned to record boundaries.

    One instance lives in the driver's streaming worker for the whole query (offsets, planning);
    the reads run in another instance on the executors, which needs nothing but the partitions.
    """

    def __init__(self, options: ReadOptions, columns: tuple[Column, ...]) -> None:
        self.options = options
        self.columns = columns
        self.constraints = Constraints.from_options(options)
        #: Trigger.AvailableNow: the offsets to stop at.
        self._target: Offsets | None = None

    # ------------------------------------------------------------------ helpers
    def _storage(self) -> ColdStorage:
        from tierd.spark.storage import open_storage

        return open_storage(self.options.url, self.options.storage_options)

    def _queues(self, storage: ColdStorage) -> list[Queue]:
        return load_queues(storage, self.options, Constraints.from_options(self.options))

    # ------------------------------------------------------------------ offsets
    def initialOffset(self) -> dict[str, Any]:
        storage = self._storage()
        queues = self._queues(storage)
        start = self.options.starting_offsets
        if start.kind == "earliest":
            return {q.key: q.manifest.min_offset for q in queues}
        if start.kind == "latest":
            return {q.key: q.manifest.max_offset for q in queues}
        if start.kind == "timestamp":
            assert start.timestamp_ms is not None
            return offsets_for_time(storage, queues, start.timestamp_ms)
        return _resolve_json(queues, start.per_queue)

    def _latest(self, storage: ColdStorage) -> tuple[list[Queue], Offsets]:
        queues = self._queues(storage)
        latest = {q.key: q.manifest.max_offset for q in queues}
        if self._target is not None:
            latest = {k: min(v, self._target[k]) for k, v in latest.items() if k in self._target}
        return queues, latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        storage = self._storage()
        queues, latest = self._latest(storage)
        end: Offsets = {k: int(v) for k, v in start.items()}
        pending: list[tuple[Queue, int, int]] = []
        for q in queues:
            if q.key not in latest:
                continue
            if q.key not in end:  # a queue seen for the first time starts at its earliest
                end[q.key] = q.manifest.min_offset
                continue
            s, e = end[q.key], latest[q.key]
            if e > s:
                pending.append((q, max(s, q.manifest.min_offset), e))
        if isinstance(limit, ReadMaxBytes) and pending:
            end.update(budget_ends(storage, pending, limit.max_bytes))
        else:
            end.update({q.key: e for q, _, e in pending})
        return end

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_bytes_per_trigger
        return ReadMaxBytes(n) if n is not None else ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._latest(self._storage())[1]

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {q.key: q.manifest.max_offset for q in self._queues(self._storage())}

    # ------------------------------------------------------------------ micro-batches
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        from tierd.spark.source import TierdPartition

        storage = self._storage()
        queues = {q.key: q for q in self._queues(storage)}
        wanted: list[tuple[Queue, int, int]] = []
        for key, e in sorted(end.items()):
            s = int(start.get(key, e))
            if e <= s:
                continue
            q = queues.get(key)
            if q is None:
                self._lost(f"queue {key} (offsets [{s}, {e}), no longer in the bucket's manifests)")
                continue
            if s < q.manifest.min_offset:
                self._lost(f"queue offsets [{s}, {q.manifest.min_offset}) of {key}")
                s = q.manifest.min_offset
            if s < e:
                wanted.append((q, s, e))
        pos = record_positions(storage, [x for q, s, e in wanted for x in ((q, s), (q, e))])
        pieces: list[tuple[Queue, SegmentRange]] = []
        for i, (q, s, e) in enumerate(wanted):
            lo, hi = pos[2 * i], pos[2 * i + 1]
            if lo is None:
                raise CorruptionError(
                    f"queue {q.key}: the manifest lists no consume-queue unit for offset {s} "
                    f"(readable offsets [{q.manifest.min_offset}, {q.manifest.max_offset}))",
                    queue=q.key,
                    offset=s,
                )
            pieces += [(q, r) for r in clip_ranges(q, lo, hi, s, e)]
        ranges = sort_ranges(
            split_ranges(storage, self.options.url, pieces, self.options.max_partition_bytes)
        )
        source = storage.credentials_source()
        return [TierdPartition([r], credentials=source, stream=True) for r in ranges]

    def _lost(self, what: str) -> None:
        if self.options.fail_on_data_loss:
            raise data_loss(what)
        log.warning("skipping %s: deleted by cold retention before this query read them", what)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from tierd.spark.source import read_partition

        return read_partition(self.options, self.constraints, self.columns, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, data in the bucket."""


# ----------------------------------------------------------------------------- startingOffsets
def _resolve_json(queues: Sequence[Queue], per_queue: dict[str, dict[int, int]] | Any) -> Offsets:
    """Per-queue startingOffsets → offsets. Names are a topic, ``broker/topic`` or
    ``cluster/broker/topic``; a name that matches nothing, a topic held by several brokers named
    without its broker, or a selected queue without an offset is an error."""
    names: dict[str, list[Queue]] = {}
    for q in queues:
        for name in (q.topic, f"{q.broker}/{q.topic}", f"{q.cluster}/{q.broker}/{q.topic}"):
            names.setdefault(name, []).append(q)
    out: Offsets = {}
    for name, offsets in per_queue.items():
        matched = names.get(name)
        if not matched:
            raise NotFoundError(
                f"option startingOffsets names {name!r}, which is not a selected topic here; "
                f"topics: {sorted({q.topic for q in queues}) or 'none'}",
                option="startingOffsets",
            )
        brokers = sorted({(q.cluster, q.broker) for q in matched})
        if len(brokers) > 1:
            raise NotFoundError(
                f"option startingOffsets: topic {name!r} is on several brokers "
                f"({', '.join(f'{c}/{b}' for c, b in brokers)}); name it as broker/topic",
                option="startingOffsets",
            )
        for q in matched:
            if q.queue_id in offsets:
                off = offsets[q.queue_id]
                out[q.key] = (
                    q.manifest.min_offset if off == -2 else q.manifest.max_offset if off == -1 else off
                )
        unknown = sorted(set(offsets) - {q.queue_id for q in matched})
        if unknown:
            raise NotFoundError(
                f"option startingOffsets: {name!r} has no queue(s) {unknown}; queues: "
                f"{sorted(q.queue_id for q in matched)}",
                option="startingOffsets",
            )
    missing = sorted(q.key for q in queues if q.key not in out)
    if missing:
        raise NotFoundError(
            f"option startingOffsets gives no offset for {missing}: give one for every queue read "
            "(-2 = earliest, -1 = latest), or narrow the read with options topic / queue_ids",
            option="startingOffsets",
        )
    return out


def _store_times(storage: ColdStorage, probes: Sequence[tuple[Queue, int]]) -> list[int]:
    """Store timestamp (ms) of the record at each (queue, offset): its consume-queue unit, then
    the head of the record (two batched reads).

    A hole — a unit of size 0, for a message lost before it was tiered — has no record of its
    own: it takes the time of the record its unit points at (the next one), or the latest time
    possible when none follows it yet. Either way the search may answer the hole's offset, and
    a read from there simply starts at the next record."""
    units: list[tuple[str, int, int]] = []
    for q, qo in probes:
        req = q.unit_request(qo)
        if req is None:
            raise CorruptionError(f"queue {q.key}: no consume-queue unit for offset {qo}", queue=q.key)
        units.append(req)
    heads: list[tuple[str, int, int]] = []
    out = [_LATEST] * len(probes)
    at_head: list[int] = []  # index into out of each head read
    for i, ((q, _qo), raw) in enumerate(zip(probes, storage.read_units(units), strict=True)):
        flat, size = unit_location(raw)
        segs = q.commitlogs()
        if size == 0 and (not segs or flat >= segs[-1].base_offset + segs[-1].size):
            continue  # a hole at the end of what is stored: no later record yet
        seg = next(s for s in reversed(segs) if s.base_offset <= flat)
        at = flat - seg.base_offset
        heads.append((q.path(FileType.COMMIT_LOG, seg.base_offset), at, at + _TS_HEADER))
        at_head.append(i)
    for i, raw in zip(at_head, storage.read_units(heads), strict=True):
        out[i] = store_timestamp_at(raw, 0)
    return out


def offsets_for_time(storage: ColdStorage, queues: Sequence[Queue], ts_ms: int) -> Offsets:
    """Per queue, the first offset whose store timestamp is at or after ``ts_ms`` (store times
    grow with the offset; a binary search, one batched round of reads per step over all
    queues); the queue's ``max-offset`` when there is none yet."""
    out: Offsets = {}
    lo: dict[str, int] = {}
    hi: dict[str, int] = {}
    by_key = {q.key: q for q in queues}
    for q in queues:
        m = q.manifest
        out[q.key] = m.max_offset
        if m.max_offset <= m.min_offset:
            continue
        # Narrow with the manifest: segments that end before the time hold no answer.
        a = m.min_offset
        for seg in q.commitlogs():
            ended = seg.sealed and seg.max_store_timestamp is not None and seg.max_store_timestamp < ts_ms
            if ended and seg.last_queue_offset is not None:
                a = max(a, seg.last_queue_offset + 1)
        lo[q.key], hi[q.key] = a, m.max_offset  # answer in [lo, hi]; hi = none found
    while True:
        probes = [(by_key[k], (lo[k] + hi[k]) // 2) for k in lo if lo[k] < hi[k]]
        if not probes:
            break
        for (q, mid), t in zip(probes, _store_times(storage, probes), strict=True):
            if t >= ts_ms:
                hi[q.key] = mid
            else:
                lo[q.key] = mid + 1
    out.update(lo)
    return out


# ----------------------------------------------------------------------------- maxBytesPerTrigger
def _fair_shares(needs: dict[str, int], budget: int) -> dict[str, int]:
    """Water-filling: every queue gets what it needs or an equal share of what is left."""
    out: dict[str, int] = {}
    left = budget
    ordered = sorted(needs.items(), key=lambda kv: kv[1])
    for i, (key, need) in enumerate(ordered):
        share = left // (len(ordered) - i)
        out[key] = min(need, share)
        left -= out[key]
    return out


def budget_ends(storage: ColdStorage, pending: Sequence[tuple[Queue, int, int]], max_bytes: int) -> Offsets:
    """End offsets so that the commitlog bytes of ``[start, end)`` over all queues stay within
    ``max_bytes`` (each queue with data moves at least one message)."""
    pos = record_positions(storage, [x for q, s, e in pending for x in ((q, s), (q, e))])
    needs: dict[str, int] = {}
    starts: dict[str, int] = {}
    for i, (q, _s, _e) in enumerate(pending):
        a, b = pos[2 * i], pos[2 * i + 1]
        if a is None or b is None:
            raise CorruptionError(
                f"queue {q.key}: consume-queue units missing from its manifest", queue=q.key
            )
        needs[q.key], starts[q.key] = b - a, a
    shares = _fair_shares(needs, max_bytes)
    ends = {q.key: e for q, _, e in pending}
    # Binary search per queue for the largest end whose bytes fit the share (at least s + 1).
    lo = {q.key: s + 1 for q, s, e in pending if shares[q.key] < needs[q.key]}
    hi = {q.key: e for q, s, e in pending if q.key in lo}
    by_key = {q.key: q for q, _, _ in pending}
    while True:
        probes = [(by_key[k], (lo[k] + hi[k] + 1) // 2) for k in lo if lo[k] < hi[k]]
        if not probes:
            break
        for (q, mid), at in zip(probes, record_positions(storage, probes), strict=True):
            if at is not None and at - starts[q.key] <= shares[q.key]:
                lo[q.key] = mid
            else:
                hi[q.key] = mid - 1
    ends.update(lo)
    return ends
