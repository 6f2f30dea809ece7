"""Cold reads: one consume-queue range read, one commitlog range read, and a read-ahead cache.

A miss at queue offset ``o`` loads a *batch*: up to ``read_ahead_count`` units from ``o`` (never
past the committed end), then ONE ranged read of the flat commitlog covering them, cut at
``read_ahead_size`` bytes but always at least one message. Messages are decoded lazily from the
batch bytes, each CRC-checked and cross-checked against its unit — a corrupt record is an error,
never data.

The :class:`ReadAheadCache` holds batches, bounded in **bytes** (``cache_max_bytes``) with idle
expiry (``cache_expire``); concurrent readers of the same batch share one backend read.

A *filtered* read (:meth:`ColdFetcher.read_filtered`, a tag subscription) skips what does not
match before fetching it: it reads the consume-queue range, matches the units' tags codes, and
fetches only the commitlog byte ranges of candidate records — neighbours closer than
``tiered.filter_read_gap`` bytes share one ranged read, so a dense match still costs one read
per batch while a rare tag costs little more than its own records.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tierd.consumption.subscription import MAX_SCAN_UNITS
from tierd.errors import CorruptionError, CorruptRecordError, LostMessagesError, TierdError
from tierd.format.batch import RecordBatch
from tierd.format.cq_unit import UNIT_SIZE
from tierd.tiered.bufferpool import BufferPool

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tierd.config import TieredConfig
    from tierd.consumption.subscription import TagFilter
    from tierd.format.message_ext import MessageExt
    from tierd.tiered.flatmessage import FlatMessageFile

log = logging.getLogger(__name__)
#: Background batch loads at once (across queues): enough to keep a few sequential readers ahead
#: without turning a scan of many queues into a burst of backend reads.
MAX_PREFETCHES = 4
#: Batches a sequential reader keeps loaded or loading beyond the one it is in (fewer when the
#: cache cannot hold them). Two keep the backend busy without a gap: the next batch's request
#: goes out as soon as the previous one has arrived, not when the reader reaches it (a backend
#: that takes longer per batch than decoding would otherwise idle while the reader decodes).
READ_AHEAD_DEPTH = 2
#: A batch takes the rest of its commitlog segment when that rest exceeds ``read_ahead_size`` by
#: at most 1/TAIL_SHARE of it (instead of leaving a sliver for a read of its own).
TAIL_SHARE = 8
#: A sequential reader's consume-queue reads take this many times ``read_ahead_count`` units.
SEQUENTIAL_UNIT_READ = 4
#: Bytes a cached unit takes (flat offset, size, tags code: three int64).
UNIT_ROW_BYTES = 24
#: Messages decoded between two turns of the event loop: a default batch (``read_ahead_count``)
#: at once — about 5 ms of decoding, the longest the loop waits. Turning it every 1,024 messages
#: cost a cold consume ~10 % more CPU and ~10 % of its speed (docs/performance.md, P3): each turn
#: let a prefetch's receive cut into the decode, and neither went faster for it.
DECODE_SLICE = 4096
#: Smallest budget of the consume-queue unit cache (an eighth of ``tiered.cache_max_bytes``).
UNIT_CACHE_MIN = 1 << 20
#: Queues whose last read position is remembered (oldest forgotten first).
SEQUENTIAL_QUEUES = 4096
#: Reads of at least this many messages decode with the cyclic garbage collector paused.
GC_PAUSE_MIN = 256
#: Commitlog range reads one filtered read keeps in flight at once.
FILTER_FETCHES = 32
QueueKey = tuple[str, int]
Units = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


@contextlib.contextmanager
def gc_paused(count: int) -> Iterator[None]:
    """Pause the cyclic garbage collector while ``count`` messages are built (when at least
    :data:`GC_PAUSE_MIN`). Thousands of new objects in a row make it run over and over (and
    now and then over everything alive) — measured at ~20 % of a cold consume. Messages hold no
    cycles, so pausing loses nothing; it runs afterwards. Nested pauses are no-ops, and a
    collector the application disabled stays disabled."""
    if count < GC_PAUSE_MIN or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(slots=True)
class ColdBatch:
    """Consecutive messages of one queue as read from the cold tier."""

    topic: str
    queue_id: int
    first: int  # queue offset of the first message
    flat_offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    #: Commitlog bytes from flat_offsets[0]: a view of ``buffer`` (messages copy out of it).
    data: bytes | memoryview
    last_access: float = field(default=0.0)
    #: Column-wise decoder over ``data``, built on first access.
    records: RecordBatch | None = field(default=None)
    #: Consume-queue tags codes of the messages (filtered reads match on them without decoding).
    tags_codes: npt.NDArray[np.int64] | None = field(default=None)
    #: The pooled receive buffer ``data`` views (given back to the pool when the cache drops
    #: the batch; reused only once nothing views it — see :mod:`tierd.tiered.bufferpool`).
    buffer: bytearray | None = field(default=None)

    @property
    def end(self) -> int:
        return self.first + len(self.sizes)

    @property
    def nbytes(self) -> int:
        # data (its whole buffer) + offsets/sizes + the decoder's columns once built (15 int64
        # per record)
        held = len(self.buffer) if self.buffer is not None else len(self.data)
        return held + self.sizes.nbytes * 2 + len(self.sizes) * 15 * 8

    def message(self, queue_offset: int) -> MessageExt:
        return self.messages(queue_offset, queue_offset + 1)[0]

    def messages(self, start: int, stop: int) -> list[MessageExt]:
        """Messages ``[start, stop)`` of the batch, each CRC-checked and checked to be exactly
        the one its consume-queue unit names (queue, offset, size, topic). A bad record ends
        the list early (the messages before it are good); a bad record at ``start`` raises
        :class:`~tierd.errors.CorruptRecordError`."""
        with gc_paused(stop - start):
            return self._messages(start, stop)

    def _messages(self, start: int, stop: int) -> list[MessageExt]:
        if self.records is None:
            self.records = RecordBatch(self.data, self.flat_offsets - self.flat_offsets[0], self.sizes)
        topic, queue_id, first = self.topic, self.queue_id, self.first
        fast = self.records.queue_messages(start - first, stop - first, topic, queue_id, first)
        if fast is not None:
            return fast
        # Message by message: slower, and names exactly what is wrong with which record.
        decode = self.records.message
        sizes = self.sizes
        out: list[MessageExt] = []
        for queue_offset in range(start, stop):
            i = queue_offset - first
            try:
                msg = decode(i)
            except CorruptRecordError as e:
                if out:
                    return out  # the good messages before it; the next read starts at the bad one
                raise CorruptRecordError(
                    f"cold record {topic}/{queue_id} offset {queue_offset} (flat commitlog offset "
                    f"{int(self.flat_offsets[i])}) is corrupt: {e}",
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=queue_offset,
                ) from e
            if (
                msg.queue_offset != queue_offset
                or msg.topic != topic
                or msg.queue_id != queue_id
                or msg.size != sizes[i]
            ):
                if out:
                    return out
                raise CorruptRecordError(
                    f"cold record at flat offset {int(self.flat_offsets[i])} is {msg.topic}/{msg.queue_id} "
                    f"offset {msg.queue_offset}, but the consume queue says {topic}/{queue_id} "
                    f"offset {queue_offset}",
                    queue_offset=queue_offset,
                )
            out.append(msg)
        return out


def _abandon(task: asyncio.Task[SpanRead]) -> None:
    """Cancel an early read nobody will use; its failure, if it already failed, is nobody's
    error (the batch is read, or reported, the normal way): retrieved so asyncio does not log
    it as never retrieved."""
    task.cancel()
    task.add_done_callback(lambda t: None if t.cancelled() else t.exception())


@dataclass(frozen=True, slots=True)
class SpanRead:
    """A commitlog read received into a pooled buffer: ``got`` bytes from flat offset ``start``
    in ``data`` (a view of ``buffer``). An early read (:meth:`ColdFetcher._read_early`) is one
    started before the units of its batch were known."""

    start: int
    got: int
    buffer: bytearray
    data: memoryview


class _Unreadable(Exception):
    """A filtered read met a record it cannot read at queue ``offset``: it ends there (internal
    control flow, never leaves this module)."""

    def __init__(self, offset: int, error: CorruptRecordError) -> None:
        super().__init__(offset)
        self.offset = offset
        self.error = error


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    backend_reads: int = 0
    evictions: int = 0
    #: Batches loaded ahead of a sequential reader.
    prefetches: int = 0
    #: Filtered reads: messages skipped on their tags code without being fetched.
    filter_skipped: int = 0
    #: Filtered reads: messages fetched because their tags code matched, whose tag did not.
    filter_collisions: int = 0
    #: Commitlog reads started with a queue's consume-queue read (see ColdFetcher._read_early),
    #: and how many of them held the batch.
    early_reads: int = 0
    early_hits: int = 0


class ReadAheadCache:
    """Batches by (queue, first offset), LRU within a byte budget, idle expiry."""

    def __init__(
        self,
        max_bytes: int,
        expire_seconds: float,
        pool: BufferPool | None = None,
        *,
        passed_max_bytes: int | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.expire = expire_seconds
        #: Where the receive buffers of dropped batches go back to.
        self.pool = pool
        #: Bytes of batches a reader has read to their end that stay cached (for readers behind
        #: it); the oldest passed beyond that are dropped, their buffers reused for the next
        #: loads. None: no bound but ``max_bytes``.
        self.passed_max_bytes = passed_max_bytes
        self._passed: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self.passed_bytes = 0
        self._batches: OrderedDict[tuple[str, int, int], ColdBatch] = OrderedDict()
        self._starts: dict[QueueKey, list[int]] = {}
        #: Batches being loaded now, by (topic, queue, first offset): one load per batch.
        self.inflight: dict[tuple[str, int, int], asyncio.Future[ColdBatch]] = {}
        self.bytes = 0
        self.stats = CacheStats()

    def find(self, key: QueueKey, offset: int) -> ColdBatch | None:
        starts = self._starts.get(key)
        if not starts:
            return None
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            return None
        batch = self._batches.get((*key, starts[i]))
        if batch is None or offset >= batch.end:
            return None
        batch.last_access = time.monotonic()
        self._batches.move_to_end((*key, starts[i]))
        return batch

    def put(self, batch: ColdBatch) -> None:
        if batch.nbytes > self.max_bytes:
            return  # larger than the whole budget: serve it, do not keep it
        k = (batch.topic, batch.queue_id, batch.first)
        if k in self._batches:
            return
        batch.last_access = time.monotonic()
        self._batches[k] = batch
        bisect.insort(self._starts.setdefault((batch.topic, batch.queue_id), []), batch.first)
        self.bytes += batch.nbytes
        self._shrink()

    def passed(self, batch: ColdBatch) -> None:
        """A reader has read ``batch`` to its end. It stays cached for readers behind (another
        group, a retry) while the batches passed since hold at most ``passed_max_bytes``; older
        ones are dropped now instead of when the whole cache is full, so a sequential consume
        receives into the buffers of what it consumed rather than into new memory (each new
        page costs a fault — docs/performance.md, P3)."""
        k = (batch.topic, batch.queue_id, batch.first)
        if self.passed_max_bytes is None or self._batches.get(k) is not batch:
            return
        if k in self._passed:
            self._passed.move_to_end(k)  # passed again (a reader behind): keep it longer
            return
        self._passed[k] = batch.nbytes
        self.passed_bytes += batch.nbytes
        while self.passed_bytes > self.passed_max_bytes:
            self._drop(next(iter(self._passed)))

    def _drop(self, k: tuple[str, int, int]) -> None:
        batch = self._batches.pop(k)
        self.bytes -= batch.nbytes
        self.passed_bytes -= self._passed.pop(k, 0)
        if self.pool is not None and batch.buffer is not None:
            self.pool.release(batch.buffer)
        starts = self._starts[(k[0], k[1])]
        starts.remove(k[2])
        if not starts:
            del self._starts[(k[0], k[1])]
        self.stats.evictions += 1

    def _shrink(self) -> None:
        # Batches are kept in order of last access (every access moves its batch to the end), so
        # the idle ones are at the front: stop at the first that is not (no scan of all of them
        # per put — a filtered replay puts thousands of small batches).
        now = time.monotonic()
        while self._batches:
            k, oldest = next(iter(self._batches.items()))
            if now - oldest.last_access <= self.expire and self.bytes <= self.max_bytes:
                break
            self._drop(k)

    @property
    def batch_count(self) -> int:
        """Batches held now (a metric)."""
        return len(self._batches)

    def invalidate(self, key: QueueKey) -> None:
        for first in list(self._starts.get(key, [])):
            self._drop((*key, first))


class UnitCache:
    """Consume-queue units read beyond the batch they were read for, per queue (LRU, byte
    bound). A sequential reader then pays one consume-queue read per ``read_ahead_count``
    messages, not one per batch. Committed units never change, so entries need no validation;
    :meth:`invalidate` drops a queue's (topic deleted)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._units: OrderedDict[QueueKey, tuple[int, Units]] = OrderedDict()

    def take(self, key: QueueKey, offset: int) -> Units | None:
        """Units (flat offsets, sizes, tags codes) from ``offset`` on, if this queue's cached
        run covers it."""
        entry = self._units.get(key)
        if entry is None:
            return None
        first, (flat, sizes, codes) = entry
        if not first <= offset < first + len(flat):
            return None
        self._units.move_to_end(key)
        at = offset - first
        return flat[at:], sizes[at:], codes[at:]

    def put(self, key: QueueKey, first: int, units: Units) -> None:
        self.invalidate(key)
        nbytes = sum(a.nbytes for a in units)
        if nbytes > self.max_bytes:
            return
        self._units[key] = (first, units)
        self.bytes += nbytes
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._units.popitem(last=False)
            self.bytes -= sum(a.nbytes for a in dropped)

    def invalidate(self, key: QueueKey) -> None:
        entry = self._units.pop(key, None)
        if entry is not None:
            self.bytes -= sum(a.nbytes for a in entry[1])


def trusted_units(
    ff: FlatMessageFile, offset: int, flat: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> int:
    """How many of the consume-queue units read from queue ``offset`` (their flat commitlog
    offsets and sizes) a read may use: those up to the first that cannot be right — it points
    outside the committed commitlog (a damaged unit, or a commitlog that lost its tail), or it
    does not start where the unit before it ends (units of one queue tile its commitlog; a hole
    is a size-0 unit at the next record's offset). So one damaged unit costs its own message:
    the messages before it are read, and the next read starts at it and reports it — before, the
    whole batch around it was refused. Raises :class:`~tierd.errors.CorruptRecordError` naming
    the unit when it is the first (a wrong offset inside the commitlog is caught when its record
    is decoded and checked against the unit)."""
    cl = ff.commitlog
    lo, hi = cl.min_offset, cl.commit_offset
    ends = flat + sizes
    bad = (flat < lo) | (sizes < 0) | (ends > hi)
    bad[1:] |= flat[1:] != ends[:-1]
    if not bad[0]:
        return int(np.argmax(bad)) if bad.any() else len(flat)
    start, end = int(flat[0]), int(ends[0])
    raise CorruptRecordError(
        f"cold consume-queue unit {ff.topic}/{ff.queue_id} offset {offset} is damaged or its record is "
        f"lost: it names flat commitlog bytes [{start}, {end}), the committed commitlog is "
        f"[{lo}, {hi})",
        topic=ff.topic,
        queue_id=ff.queue_id,
        queue_offset=offset,
        flat_offset=start,
        size=int(sizes[0]),
        committed=[lo, hi],
    )


def pool_bytes(cfg: TieredConfig) -> int:
    """Idle receive buffers a fetcher keeps, and the batches already read to their end it keeps
    cached: each enough for a sequential reader's batches in flight and ahead
    (:data:`READ_AHEAD_DEPTH` + 2 of ``read_ahead_size``), at most a quarter of the cache
    budget."""
    return min(cfg.cache_max_bytes // 4, (READ_AHEAD_DEPTH + 2) * cfg.read_ahead_size)


class ColdFetcher:
    def __init__(self, cfg: TieredConfig) -> None:
        self.cfg = cfg
        kept = pool_bytes(cfg)
        self.pool = BufferPool(kept, cfg.cache_expire)
        self.cache = ReadAheadCache(cfg.cache_max_bytes, cfg.cache_expire, self.pool, passed_max_bytes=kept)
        self.units = UnitCache(max(UNIT_CACHE_MIN, cfg.cache_max_bytes // 8))
        self._prefetching: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Where the last read of each queue ended: a read starting there is sequential.
        self._sequential: dict[QueueKey, int] = {}

    async def read(self, ff: FlatMessageFile, offset: int, max_count: int) -> list[MessageExt]:
        """Messages from ``offset`` (which must be committed cold), at most ``max_count``; fewer
        at the committed end, where the batch ends, or before a corrupt record (the caller
        continues from there). Raises when the record at ``offset`` itself cannot be read."""
        key = (ff.topic, ff.queue_id)
        out: list[MessageExt] = []
        damaged = False
        while not damaged and len(out) < max_count and offset < ff.max_offset:
            sequential = self._sequential.get(key) == offset
            batch = self.cache.find(key, offset)
            if batch is None:
                self.cache.stats.misses += 1
                try:
                    batch = await self._load_shared(ff, offset, ahead=sequential)
                except TierdError:
                    if not out:
                        raise
                    break  # return what was read; the next read starts here and reports it
            else:
                self.cache.stats.hits += 1
            stop = min(batch.end, offset + max_count - len(out))
            if sequential or stop > (batch.first + batch.end) // 2:
                self._read_ahead(ff, batch)
            # In slices of DECODE_SLICE, yielding to the loop in between: a prefetch in flight
            # keeps receiving while a long read decodes (one thread, so no fight for the GIL),
            # and other tasks wait at most one slice. The collector stays paused over all the
            # slices, not per slice: each re-enable made it collect the slices' new messages —
            # still alive in ``out`` — pushing them to an older generation, and enough of those
            # trigger full collections (three per 256 MiB consume, ~15 % of it). The loop's other
            # tasks allocate few objects meanwhile.
            with gc_paused(stop - offset):
                for a in range(offset, stop, DECODE_SLICE):
                    if a > offset:
                        await asyncio.sleep(0)
                    end = min(stop, a + DECODE_SLICE)
                    try:
                        got = batch.messages(a, end)
                    except CorruptRecordError:
                        if not out:
                            raise
                        got = []
                    out.extend(got)
                    if len(got) < end - a:  # a bad record: the good ones before it, then stop
                        stop, damaged = a + len(got), True
                        break
            if stop == batch.end:
                self.cache.passed(batch)
            offset = stop
        if out:
            self._sequential[key] = offset
            if len(self._sequential) > SEQUENTIAL_QUEUES:
                self._sequential.pop(next(iter(self._sequential)))
        return out

    async def read_filtered(
        self, ff: FlatMessageFile, offset: int, max_count: int, tags: TagFilter
    ) -> tuple[list[MessageExt], int]:
        """Messages of the subscription ``tags`` from ``offset`` (committed cold), at most
        ``max_count``, and the offset to continue from (one past the last unit examined; at most
        :data:`MAX_SCAN_UNITS` units are). Units whose tags code does not match are never
        fetched; candidates are fetched in coalesced ranges (:meth:`_plan`) and kept only when
        their decoded tag matches. Batches already in the read-ahead cache are filtered there."""
        out: list[MessageExt] = []
        try:
            return out, await self._read_filtered(ff, offset, max_count, tags, out)
        except _Unreadable as bad:
            if bad.offset == offset:
                raise bad.error from None
            return out, bad.offset  # the good ones first; the next read starts at the bad one

    async def _read_filtered(
        self, ff: FlatMessageFile, offset: int, max_count: int, tags: TagFilter, out: list[MessageExt]
    ) -> int:
        key = (ff.topic, ff.queue_id)
        end = min(ff.max_offset, offset + MAX_SCAN_UNITS)
        pos = offset
        while pos < end and len(out) < max_count:
            batch = self.cache.find(key, pos)
            if batch is not None and batch.tags_codes is not None:
                self.cache.stats.hits += 1
                stop = min(batch.end, end)
                codes = batch.tags_codes[pos - batch.first : stop - batch.first]
                done = self._collect(batch, pos + np.flatnonzero(tags.unit_mask(codes)), tags, out, max_count)
                pos = stop if done is None else done
                continue
            self.cache.stats.misses += 1
            flat, sizes, codes = await self._scan(ff, pos, end)
            try:
                k = trusted_units(ff, pos, flat, sizes)
            except CorruptRecordError as e:
                raise _Unreadable(pos, e) from e
            flat, sizes, codes = flat[:k], sizes[:k], codes[:k]
            hits = np.flatnonzero(tags.unit_mask(codes))
            chosen = self._plan(ff, flat[hits], flat[hits] + sizes[hits], max_count - len(out))
            # Units after the last range read now serve the next read (no second CQ read).
            stop_i = int(hits[chosen[-1][1] - 1]) + 1 if chosen and chosen[-1][1] < len(hits) else len(flat)
            if stop_i < len(flat):
                self.units.put(key, pos + stop_i, (flat[stop_i:], sizes[stop_i:], codes[stop_i:]))
            spans = [(int(hits[ha]), int(hits[hb - 1]) + 1) for ha, hb in chosen]
            self.cache.stats.filter_skipped += stop_i - sum(b - a for a, b in spans)
            batches = await self._fetch_spans(ff, pos, (flat, sizes, codes), spans)
            done = None
            for got, (ha, hb) in zip(batches, chosen, strict=True):
                done = self._collect(got, pos + hits[ha:hb], tags, out, max_count)
                if done is not None:
                    break
            pos = pos + stop_i if done is None else done
        return pos

    async def _fetch_spans(
        self, ff: FlatMessageFile, pos: int, units: Units, spans: list[tuple[int, int]]
    ) -> list[ColdBatch]:
        """The batches of ``units[a:b]`` for each span (queue offsets from ``pos``): from the
        cache when it holds them, else one ranged read each, :data:`FILTER_FETCHES` at once."""
        key = (ff.topic, ff.queue_id)
        gate = asyncio.Semaphore(FILTER_FETCHES)

        async def fetch(a: int, b: int) -> ColdBatch:
            cached = self.cache.find(key, pos + a)
            if cached is not None and cached.end >= pos + b and cached.tags_codes is not None:
                return cached
            async with gate:
                got = await self._fetch(ff, pos + a, (units[0][a:b], units[1][a:b], units[2][a:b]))
            self.cache.put(got)
            return got

        return list(await asyncio.gather(*(fetch(a, b) for a, b in spans)))

    async def _scan(self, ff: FlatMessageFile, pos: int, end: int) -> Units:
        """Units from ``pos`` (before ``end``) for a filtered read: the queue's cached run, or
        one consume-queue read (within one CQ segment) of up to :data:`MAX_SCAN_UNITS` units."""
        cached = self.units.take((ff.topic, ff.queue_id), pos)
        if cached is not None:
            n = min(len(cached[0]), end - pos)
            return cached[0][:n], cached[1][:n], cached[2][:n]
        cq_end = ff.consumequeue.segment_end(pos * UNIT_SIZE) // UNIT_SIZE
        budget = max(1, self.units.max_bytes // (2 * UNIT_ROW_BYTES))
        units = await ff.read_units(pos, min(end - pos, max(1, cq_end - pos), budget))
        self.cache.stats.backend_reads += 1
        if not len(units):
            raise CorruptionError(f"cold consume queue {ff.topic}/{ff.queue_id} returned no unit at {pos}")
        return (
            units["offset"].astype(np.int64),
            units["size"].astype(np.int64),
            units["tags_code"].astype(np.int64),
        )

    def _plan(
        self, ff: FlatMessageFile, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], need: int
    ) -> list[tuple[int, int]]:
        """Group candidate records (their commitlog ``starts``/``ends``, ascending) into ranges
        read with one request each: ``[ha, hb)`` index spans of candidates. Neighbours join while
        the bytes between them are at most ``tiered.filter_read_gap``; a range spans what an
        unfiltered batch may (:meth:`_limit`: ``read_ahead_size``, cut at the commitlog segment
        end; at least one record). Planning stops at the range holding the ``need``-th
        candidate."""
        out: list[tuple[int, int]] = []
        if not len(starts):
            return out
        breaks = np.flatnonzero(starts[1:] - ends[:-1] > self.cfg.filter_read_gap) + 1
        bounds = [0, *breaks.tolist(), len(starts)]
        covered = 0
        for lo, hi in itertools.pairwise(bounds):
            a = lo
            while a < hi:
                limit = int(starts[a]) + self._limit(ff, starts[a:])
                k = max(1, int(np.searchsorted(ends[a:hi], limit, side="right")))
                out.append((a, a + k))
                covered += k
                a += k
                if covered >= need:
                    return out
        return out

    def _collect(
        self,
        batch: ColdBatch,
        candidates: npt.NDArray[np.int64],
        tags: TagFilter,
        out: list[MessageExt],
        max_count: int,
    ) -> int | None:
        """Decode ``candidates`` (queue offsets in ``batch``, ascending; runs of consecutive ones
        at once) and append those whose tag matches to ``out``. Returns the offset after the
        message that filled ``out`` to ``max_count``, else None."""
        if not len(candidates):
            return None
        for run in np.split(candidates, np.flatnonzero(np.diff(candidates) != 1) + 1):
            first, last = int(run[0]), int(run[-1]) + 1
            try:
                msgs = batch.messages(first, last)
            except CorruptRecordError as e:
                raise _Unreadable(first, e) from e
            done = self._take(msgs, tags, out, max_count)
            if done is not None:
                return done
            if len(msgs) < last - first:  # the record after these is bad: its error, its offset
                bad = first + len(msgs)
                try:
                    batch.messages(bad, bad + 1)
                except CorruptRecordError as e:
                    raise _Unreadable(bad, e) from e
        return None

    def _take(
        self, msgs: list[MessageExt], tags: TagFilter, out: list[MessageExt], max_count: int
    ) -> int | None:
        for msg in msgs:
            if not tags.matches(msg):
                self.cache.stats.filter_collisions += 1
                continue
            out.append(msg)
            if len(out) >= max_count:
                return msg.queue_offset + 1
        return None

    def _read_ahead(self, ff: FlatMessageFile, current: ColdBatch) -> None:
        """Keep the batches after ``current`` (the reader's) loaded, up to
        :data:`READ_AHEAD_DEPTH` of them (as many as the cache holds beside ``current``, counted
        at its size): start loading the first that is neither cached nor in flight. Called for
        a reader that continues where its last read ended or is past the middle of a batch (it
        reads sequentially), and again each time a background load completes — so the next
        request goes out while the reader still decodes, and round trips overlap decoding."""
        key = (ff.topic, ff.queue_id)
        depth = min(READ_AHEAD_DEPTH, self.cache.max_bytes // max(1, current.nbytes) - 1)
        if depth < 1:
            return  # a loaded-ahead batch would evict the reader's own (or not be kept at all)
        off = current.end
        for _ in range(depth):
            if off >= ff.max_offset or (*key, off) in self._inflight:
                return  # the end, or a load whose completion continues from there
            batch = self.cache.find(key, off)
            if batch is None:
                self._prefetch(ff, off)
                return
            off = batch.end

    def _prefetch(self, ff: FlatMessageFile, offset: int) -> None:
        """Start loading the batch at ``offset`` in the background (at most
        :data:`MAX_PREFETCHES` at once, across queues)."""
        if self._closed or len(self._prefetching) >= MAX_PREFETCHES:
            return
        task = asyncio.get_running_loop().create_task(self._prefetch_one(ff, offset))
        self._prefetching.add(task)
        task.add_done_callback(self._prefetching.discard)

    async def aclose(self) -> None:
        """Cancel background loads (the store is closing); none start after this."""
        self._closed = True
        while self._prefetching:
            tasks = list(self._prefetching)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.pool.clear()

    async def _prefetch_one(self, ff: FlatMessageFile, offset: int) -> None:
        key = (ff.topic, ff.queue_id)
        # Two read-aheads scheduled before either ran (the reader's and a completed load's) can
        # ask for the same batch, or the reader can start loading it first: then this one joins
        # that load (or finds the batch cached) instead of loading it again, and is not counted
        # as a load — but still keeps the read-ahead going once the batch is there.
        joined = (*key, offset) in self._inflight
        try:
            if joined or self.cache.find(key, offset) is None:
                await self._load_shared(ff, offset, ahead=True)
                if not joined:
                    self.cache.stats.prefetches += 1
        except Exception as e:  # the reader that needs this batch loads it again and sees the error
            log.debug("prefetch of %s/%d at %d failed: %s", ff.topic, ff.queue_id, offset, e)
            return
        pos = self._sequential.get(key)
        reader = None if pos is None else self.cache.find(key, pos)
        if reader is not None:  # a sequential reader: keep the batches after its own coming
            self._read_ahead(ff, reader)

    async def _load_shared(self, ff: FlatMessageFile, offset: int, *, ahead: bool = False) -> ColdBatch:
        k = (ff.topic, ff.queue_id, offset)
        fut = self._inflight.get(k)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[k] = fut
        try:
            batch = await self._load(ff, offset, ahead)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved: the waiters re-raise it
            raise
        finally:
            self._inflight.pop(k, None)
        fut.set_result(batch)
        self.cache.put(batch)
        return batch

    @property
    def _inflight(self) -> dict[tuple[str, int, int], asyncio.Future[ColdBatch]]:
        return self.cache.inflight

    def _limit(self, ff: FlatMessageFile, flat: npt.NDArray[np.int64]) -> int:
        """Bytes the batch starting at ``flat[0]`` may span: ``read_ahead_size``, cut at the end
        of its commitlog segment (one backend read per batch) — or stretched to that end when
        at most ``read_ahead_size / TAIL_SHARE`` would be left: a separate read for a segment's
        last few records costs a whole round trip (object stores charge per request, and their
        latency is per request too)."""
        start = int(flat[0])
        to_end = ff.commitlog.segment_end(start) - start
        size = self.cfg.read_ahead_size
        return to_end if to_end <= size + size // TAIL_SHARE else min(size, to_end)

    def _align(
        self,
        ff: FlatMessageFile,
        flat: npt.NDArray[np.int64],
        ends: npt.NDArray[np.int64],
        n: int,
        limit: int,
    ) -> int:
        """Records of a batch of at most ``n`` (``ends``: their ends relative to ``flat[0]``;
        ``limit``: the bytes a batch may span), fitted to the stored objects: cut at the last
        object boundary inside the batch if there is one; else, when the batch lies inside one
        object whose rest holds at most half as many records again (and fits ``limit``),
        stretched to that object's end.

        An object store holds an open segment as chunk objects (one per commit, ~4 MiB); a
        batch of ``read_ahead_count`` records rarely matches one, so without this every batch
        of a sequential read takes the tail of one chunk and the head of the next — two ranged
        GETs per batch, twice the requests of reading the objects. Fitted, each batch starts
        where an object does and each object is read with one request."""
        start = int(flat[0])
        bounds = ff.commitlog.object_bounds(start, start + int(ends[n - 1]))
        if bounds:
            k = int(np.searchsorted(ends[:n], bounds[-1] - start, side="right"))
            return k if k >= 1 else n
        m = min(len(ends), n + n // 2)
        if m <= n:
            return n
        seg_end = ff.commitlog.segment_end(start)
        later = ff.commitlog.object_bounds(start + int(ends[n - 1]), start + int(ends[m - 1]) + 1)
        if later:
            end = later[0] - start
        elif start + int(ends[m - 1]) == seg_end and ff.commitlog.object_bounds(
            ff.commitlog.segment_start(start), seg_end
        ):
            end = seg_end - start  # the last object of a segment stored as several
        else:
            return n
        k = int(np.searchsorted(ends[:m], end, side="right"))
        fits = k > n and int(ends[k - 1]) == end and end <= limit
        return k if fits and bool(np.all(np.diff(ends[n - 1 : k]) > 0)) else n  # never over a hole

    def _unit_span(self, ff: FlatMessageFile, first: int, count: int, stop: int) -> int:
        """Units a consume-queue read from ``first`` takes: ``count``, stretched to the end of
        the stored object it ends in — a chunk boundary the driver knows of, or ``stop`` (where
        the segment or the committed bytes end) — when that end is at most
        :data:`SEQUENTIAL_UNIT_READ` times ``read_ahead_count`` units (and a quarter of the unit
        cache) away. Units are 20 bytes: the rest of an object costs little next to the request
        a later read of it would; a sequential consume then reads each consume-queue object
        once, and a random reader reads at most a few hundred KiB of units."""
        span = min(
            self.cfg.read_ahead_count * SEQUENTIAL_UNIT_READ, self.units.max_bytes // (4 * UNIT_ROW_BYTES)
        )
        limit = min(stop, first + max(count, span))
        if first + count >= limit:
            return count
        want = (first + count) * UNIT_SIZE
        ends = [*ff.consumequeue.object_bounds(want - 1, limit * UNIT_SIZE), limit * UNIT_SIZE]
        end = next(b for b in ends if b >= want) // UNIT_SIZE
        return end - first if end == stop or end < limit else count

    async def _units(self, ff: FlatMessageFile, offset: int, ahead: bool) -> Units:
        """Units from ``offset`` enough for one batch: the cached run left by the previous
        batch, extended by consume-queue reads (each within one CQ segment) until they span
        the batch's byte limit, reach ``read_ahead_count`` units or the committed end. A batch
        is thus never cut short by where a unit read or a CQ segment happened to end; units
        beyond it are cached for the next batch, so the consume queue is still read once per
        ``read_ahead_count`` units.

        ``ahead``: a sequential reader's load — its unit reads take
        :data:`SEQUENTIAL_UNIT_READ` times as many units (within the unit cache's budget), so
        it pays one consume-queue round trip per several batches."""
        key = (ff.topic, ff.queue_id)
        want = self.cfg.read_ahead_count
        read = want
        if ahead:
            read = max(want, min(want * SEQUENTIAL_UNIT_READ, self.units.max_bytes // (4 * UNIT_ROW_BYTES)))
        cached = self.units.take(key, offset)
        flats, sizes, codes = ([cached[0]], [cached[1]], [cached[2]]) if cached is not None else ([], [], [])
        have = len(cached[0]) if cached is not None else 0
        # A sequential load reads half a batch more when it can: enough to see where the stored
        # object its batch ends in ends (see _align).
        enough = want + want // 2 if ahead else want
        while have < enough and offset + have < ff.max_offset:
            if have and int(flats[-1][-1] + sizes[-1][-1] - flats[0][0]) >= self._limit(ff, flats[0]):
                break  # they cover a whole batch
            nxt = offset + have
            cq_end = ff.consumequeue.segment_end(nxt * UNIT_SIZE) // UNIT_SIZE
            stop = min(ff.max_offset, max(nxt + 1, cq_end))
            units = await ff.read_units(nxt, self._unit_span(ff, nxt, min(read, stop - nxt), stop))
            self.cache.stats.backend_reads += 1
            if not len(units):
                raise CorruptionError(
                    f"cold consume queue {ff.topic}/{ff.queue_id} returned no unit at {nxt}"
                )
            flats.append(units["offset"].astype(np.int64))
            sizes.append(units["size"].astype(np.int64))
            codes.append(units["tags_code"].astype(np.int64))
            have += len(units)
        if len(flats) == 1:
            return flats[0], sizes[0], codes[0]
        return np.concatenate(flats), np.concatenate(sizes), np.concatenate(codes)

    async def _load(self, ff: FlatMessageFile, offset: int, ahead: bool = False) -> ColdBatch:
        key = (ff.topic, ff.queue_id)
        early = self._read_early(ff, offset) if self.units.take(key, offset) is None else None
        try:
            units = await self._plan_batch(ff, offset, ahead)
        except BaseException:
            if early is not None:
                _abandon(early)
            raise
        return await self._fetch(ff, offset, units, early)

    def _read_early(self, ff: FlatMessageFile, offset: int) -> asyncio.Task[SpanRead] | None:
        """Start reading the commitlog object a batch at ``offset`` most likely is, before its
        consume-queue units arrive — when the segment metadata alone tells where it starts:
        ``offset`` is the first queue offset of a commitlog segment (a queue's start, as a
        consumer reading from the beginning asks for). Then the two reads of a queue's first
        batch overlap instead of waiting one for the other. The guess is one stored object (its
        end known from the driver, no request), at most half of ``read_ahead_size``; it is used
        only if the units then name a batch inside it, and every record is still checked
        against its unit. None when nothing is known."""
        cl = ff.commitlog
        start = next(
            (s.base_offset for s in cl.segments if cl.first_queue_offset(s.base_offset) == offset), None
        )
        if start is None or start >= cl.commit_offset:
            return None
        bounds = cl.object_bounds(start, start + self.cfg.read_ahead_size // 2 + 1)
        if not bounds:
            return None
        length = bounds[0] - start
        self.cache.stats.backend_reads += 1
        self.cache.stats.early_reads += 1
        return asyncio.get_running_loop().create_task(self._read_span(ff, start, length))

    async def _read_span(self, ff: FlatMessageFile, start: int, length: int) -> SpanRead:
        buffer = self.pool.acquire(length)
        data = memoryview(buffer)[:length]
        try:
            got = await ff.read_commitlog_into(start, data)
        except BaseException:
            data.release()
            self.pool.release(buffer)
            raise
        return SpanRead(start, got, buffer, data)

    async def _plan_batch(self, ff: FlatMessageFile, offset: int, ahead: bool) -> Units:
        """The units of the batch at ``offset``: read, cut at ``read_ahead_count``, the byte
        limit, a hole and the stored objects' bounds; units beyond it are cached."""
        key = (ff.topic, ff.queue_id)
        flat, sizes, codes = await self._units(ff, offset, ahead)
        k = trusted_units(ff, offset, flat, sizes)
        flat, sizes, codes = flat[:k], sizes[:k], codes[:k]
        if sizes[0] == 0:  # size-0 units: messages lost before they were tiered (a hole)
            kept = np.flatnonzero(sizes)
            count = int(kept[0]) if len(kept) else len(sizes)
            raise LostMessagesError(
                f"{ff.topic}/{ff.queue_id} queue offsets {offset}..{offset + count - 1} were lost to "
                "damage in the hot commitlog before they were tiered (quarantined)",
                topic=ff.topic,
                queue_id=ff.queue_id,
                first=offset,
                count=count,
            )
        ends = flat + sizes - flat[0]
        limit = self._limit(ff, flat)
        n = min(self.cfg.read_ahead_count, max(1, int(np.searchsorted(ends, limit, side="right"))))
        if not sizes[:n].all():
            n = int(np.argmin(sizes[:n] != 0))  # the batch ends before a hole
        n = self._align(ff, flat, ends, n, limit)
        if n < len(flat):  # units read beyond this batch serve the next one (no second CQ read)
            self.units.put(key, offset + n, (flat[n:], sizes[n:], codes[n:]))
        return flat[:n], sizes[:n], codes[:n]

    async def _fetch(
        self,
        ff: FlatMessageFile,
        offset: int,
        units: Units,
        early: asyncio.Task[SpanRead] | None = None,
    ) -> ColdBatch:
        """The batch of consecutive ``units`` (queue offsets from ``offset``): ONE ranged read
        of the commitlog bytes they cover, checked to be contiguous and complete — or the
        ``early`` read, when it holds them (see :meth:`_read_early`)."""
        flat, sizes, codes = units
        n = len(flat)
        if np.any(flat[1:n] != flat[: n - 1] + sizes[: n - 1]):
            if early is not None:
                _abandon(early)
            raise CorruptionError(
                f"cold consume queue {ff.topic}/{ff.queue_id} units from {offset} are not "
                "contiguous in the commitlog",
                offset=offset,
            )
        length = int(flat[-1] + sizes[-1] - flat[0])
        read = await self._early_result(early, int(flat[0]), length)
        if read is None:
            read = await self._read_span(ff, int(flat[0]), length)
            self.cache.stats.backend_reads += 1
        if read.got != length:
            raise CorruptionError(
                f"short cold commitlog read for {ff.topic}/{ff.queue_id}: wanted {length} "
                f"bytes at {int(flat[0])}, got {read.got}"
            )
        return ColdBatch(
            ff.topic, ff.queue_id, offset, flat, sizes, read.data, tags_codes=codes, buffer=read.buffer
        )

    async def _early_result(
        self, early: asyncio.Task[SpanRead] | None, start: int, length: int
    ) -> SpanRead | None:
        """The early read cut to ``[start, start + length)`` when it read that range whole; else
        None (its buffer goes back to the pool and the caller reads the batch itself — a failed
        early read is only a wasted request)."""
        if early is None:
            return None
        try:
            read = await early
        except asyncio.CancelledError:
            if not early.cancelled():
                _abandon(early)
                raise  # we are being cancelled, not the early read
            return None
        except Exception as e:
            log.debug("early commitlog read at %d failed; reading the batch again: %s", start, e)
            return None
        if read.start == start and read.got >= length:
            self.cache.stats.early_hits += 1
            return SpanRead(start, length, read.buffer, read.data[:length])
        read.data.release()
        self.pool.release(read.buffer)
        return None
