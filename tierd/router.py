"""Read routing across the two tiers (DESIGN "Read path", docs/reading.md).

Statuses are computed over the *merged* offset range of both tiers (the cold tier usually reaches
further back, the hot tier further forward). Which tier serves a read follows the read policy;
offsets not yet committed cold are always served hot, and a cold read error falls back to the hot
store when it still has the offset (counted in :attr:`TierRouter.fallbacks`). A corrupt hot record
is served from the cold tier's copy (:attr:`TierRouter.corrupt_served_cold`). Without a good copy
the read stops before the bad message: ``FOUND`` never has a gap, and ``next_offset`` never
passes a message the consumer did not get (``OFFSET_FOUND_NULL`` with ``next_offset`` = it) —
except a *hole*, messages known lost to quarantined damage (docs/hot-store.md), which a read
starting at it reports with ``OFFSET_FOUND_NULL`` and ``next_offset`` after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Literal

from tierd.errors import InvalidArgumentError, LostMessagesError, TierdError
from tierd.format.record import decode_record
from tierd.local.store import (
    MAX_GET_BYTES,
    MAX_GET_COUNT,
    READ_YOUR_WRITES_WAIT,
    QueryBudget,
    byte_bounded_count,
)
from tierd.local.validation import check_queue, check_topic
from tierd.message import GetResult, GetStatus, ReadPolicy
from tierd.tiered.fetcher import ColdFetcher

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.consumption.subscription import TagFilter
    from tierd.format.message_ext import MessageExt
    from tierd.local.store import HotStore, QueueRange
    from tierd.tiered.flatmessage import FlatMessageFile
    from tierd.tiered.flatstore import QueueDamage
    from tierd.tiered.service import TieringService

log = logging.getLogger(__name__)
#: Per-message read problems remembered as already logged.
LOGGED_MAX = 4096


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 8 << 30


class TierRouter:
    def __init__(self, cfg: TierdConfig, hot: HotStore, tiering: TieringService | None) -> None:
        self.cfg = cfg
        self.hot = hot
        self.tiering = tiering
        self.fetcher = ColdFetcher(cfg.tiered)
        #: NOT_IN_MEM: commitlog bytes behind the write position assumed to be in page cache.
        self.hot_window_bytes = int(_physical_memory() * cfg.tiered.memory_ratio)
        self.fallbacks = 0
        #: Reads of a corrupt hot record answered with the cold tier's copy (a metric).
        self.corrupt_served_cold = 0
        self.reads = {"hot": 0, "cold": 0}
        #: Records key queries read back from the cold tier (hits checked against their record).
        self.query_cold_reads = 0
        #: Wait for the hot store's dispatch thread in the calling thread instead of a worker
        #: thread: set by the blocking facade without a cold tier, which runs no event loop.
        self.waits_in_place = False
        self._logged: dict[tuple[str, int, int], None] = {}

    def cold_file(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        t = self.tiering
        if t is None or not t.ready.is_set():
            return None
        ff = t.flat.get(topic, queue_id)
        return ff if ff is not None and ff.max_offset > ff.min_offset else None

    def damage(self, topic: str, queue_id: int) -> QueueDamage | None:
        """The queue's cold damage found by the last load (a fenced queue), if any."""
        t = self.tiering
        if t is None or not t.ready.is_set():
            return None
        d = t.flat.damaged.get((topic, queue_id))
        return d if d is not None and d.lost else None

    def _unloaded(self, topic: str, queue_id: int) -> QueueDamage | None:
        """The damage of a queue the cold tier could not load at all: its history
        ``[first, end)`` is known only from metadata, and no flat file serves any of it."""
        d = self.damage(topic, queue_id)
        return d if d is not None and d.meta is not None else None

    def bounds(self, topic: str, queue_id: int, *, readable: bool = False) -> tuple[bool, int, int]:
        """(queue known?, min offset, max offset) over both tiers, without waiting. The hot max
        offset counts every offset acknowledged to a producer (read-your-writes); ``readable``:
        only what the hot store has dispatched (a read's bounds, after :meth:`_caught_up`)."""
        hot = self.hot.queue_range if readable else self.hot.acknowledged_range
        cq = hot(topic, queue_id)
        ff = self.cold_file(topic, queue_id)
        # A queue the cold tier could not load keeps its history in the range: without it, the
        # hot tier alone would answer OFFSET_TOO_SMALL there, and a consumer would follow that
        # past every lost message as if retention had removed them.
        unloaded = self._unloaded(topic, queue_id) if ff is None else None
        if cq is None and ff is None and unloaded is None:
            return False, 0, 0
        los = [cq.min_offset] if cq is not None and cq.max_offset > cq.min_offset else []
        his = [cq.max_offset] if cq is not None else []
        if ff is not None:
            los.append(ff.min_offset)
            his.append(ff.max_offset)
        if unloaded is not None:
            los.append(unloaded.first)
            his.append(unloaded.end)
        hi = max(his)
        return True, (min(los) if los else hi), hi

    async def _caught_up(self, key: tuple[str, int] | None) -> None:
        """Read-your-writes without blocking the event loop: when offsets acknowledged in queue
        ``key`` (None: in any queue) are not dispatched yet, wait for the hot store's dispatch
        thread in a worker thread, at most READ_YOUR_WRITES_WAIT seconds, then NotReadyError
        (naming the dispatch thread's error). Returns at once, not suspending, when caught up."""
        if not self.hot.dispatch_pending(key):
            return
        what = "reading " + (f"{key[0]}/{key[1]}" if key is not None else "the key index")
        if self.waits_in_place:
            self.hot.require_dispatched(READ_YOUR_WRITES_WAIT, what)
        else:
            await asyncio.to_thread(self.hot.require_dispatched, READ_YOUR_WRITES_WAIT, what)

    async def caught_up(self) -> None:
        """Wait (bounded, as :meth:`_caught_up`) until everything acknowledged is dispatched: a
        lookup by position or key then sees what producers were just told is stored."""
        await self._caught_up(None)

    def _in_hot(self, topic: str, queue_id: int, offset: int) -> QueueRange | None:
        """The hot queue's readable range if it holds ``offset`` now, else None."""
        cq = self.hot.queue_range(topic, queue_id)
        return cq if cq is not None and cq.min_offset <= offset < cq.max_offset else None

    def _serve_cold(self, policy: ReadPolicy, topic: str, queue_id: int, offset: int) -> bool:
        """Whether the cold tier serves a read at ``offset``. Every policy reads an offset that
        only the cold tier holds from there — DISABLE included: a hot-only answer
        (``OFFSET_TOO_SMALL``) would send a consumer past that history. Policies differ in
        when the cold tier also serves what the hot tier holds."""
        ff = self.cold_file(topic, queue_id)
        if ff is None or not ff.min_offset <= offset < ff.max_offset:
            return False
        if policy is ReadPolicy.FORCE:
            return True
        if self._in_hot(topic, queue_id, offset) is None:
            return True
        if policy is ReadPolicy.NOT_IN_MEM:
            pos = self.hot.position(topic, queue_id, offset)
            if pos is not None:
                return self.hot.end_position - pos > self.hot_window_bytes
        return False

    async def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        policy: ReadPolicy,
        tags: TagFilter | None = None,
        max_bytes: int | None = None,
    ) -> GetResult:
        check_topic(topic)
        check_queue(queue_id, self.cfg.store.max_queues)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidArgumentError(f"offset must be a non-negative integer, got {offset!r}")
        if not isinstance(max_count, int) or isinstance(max_count, bool) or max_count < 1:
            raise InvalidArgumentError(f"max_count must be a positive integer, got {max_count!r}")
        max_count = min(max_count, MAX_GET_COUNT)
        if tags is not None and tags.matches_all:
            tags = None
        await self._caught_up((topic, queue_id))
        known, lo, hi = self.bounds(topic, queue_id, readable=True)
        if not known:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, (), 0, 0, 0, "hot")
        if hi == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, (), 0, lo, hi, "hot")
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, (), lo, lo, hi, "hot")
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, (), offset, lo, hi, "hot")
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, (), hi, lo, hi, "hot")
        lost = self._lost_at(topic, queue_id, offset)
        if (
            lost is not None
            and self.cold_file(topic, queue_id) is None
            and self._in_hot(topic, queue_id, offset) is None
        ):
            return self._lost_result(topic, queue_id, offset, lo, hi, lost)
        cold_failed = False
        if self._serve_cold(policy, topic, queue_id, offset):
            ff = self.cold_file(topic, queue_id)
            assert ff is not None
            try:
                msgs, nxt = await self._read_cold(ff, offset, max_count, tags)
            except LostMessagesError as e:  # a known hole: say so, and where the queue goes on
                return GetResult(GetStatus.OFFSET_FOUND_NULL, (), offset + e.count, lo, hi, "cold")
            except TierdError as e:
                self.fallbacks += 1
                cold_failed = True
                if self._in_hot(topic, queue_id, offset) is None:
                    self._log_once(
                        logging.ERROR,
                        (topic, queue_id, offset),
                        "cold read of %s/%d at %d failed and the hot store no longer has it: %s",
                        topic,
                        queue_id,
                        offset,
                        e,
                    )
                    # An error status that does not move the consumer past the message.
                    return GetResult(GetStatus.OFFSET_FOUND_NULL, (), offset, lo, hi, "cold", lost)
                self._log_once(
                    logging.WARNING,
                    (topic, queue_id, offset),
                    "cold read of %s/%d at %d failed (%s); served from the hot store",
                    topic,
                    queue_id,
                    offset,
                    e,
                )
            else:
                self.reads["cold"] += 1
                msgs, nxt = _byte_bounded(msgs, nxt, max_bytes)
                status = GetStatus.FOUND if msgs else GetStatus.NO_MATCHED_MESSAGE
                return GetResult(status, tuple(msgs), nxt, lo, hi, "cold")
        self.reads["hot"] += 1
        limit = MAX_GET_BYTES if max_bytes is None else min(max_bytes, MAX_GET_BYTES)
        r = self.hot.get(topic, queue_id, offset, max_count, tags, limit, wait=False)
        if r.unreadable is not None and not cold_failed:
            left = max_count - len(r.messages)
            copy, nxt = await self._cold_copy(topic, queue_id, r.unreadable, left, tags)
            if nxt > r.unreadable:  # the cold tier has it: the read goes on there
                source = "hot" if r.messages else "cold"
                both, nxt = _byte_bounded([*r.messages, *copy], nxt, max_bytes)
                status = GetStatus.FOUND if both else GetStatus.NO_MATCHED_MESSAGE
                return GetResult(status, tuple(both), nxt, lo, hi, source)
        return GetResult(r.status, r.messages, r.next_offset, lo, hi, "hot")

    def _lost_at(self, topic: str, queue_id: int, offset: int) -> tuple[int, int] | None:
        """``(first, end)`` of the queue's range lost to cold damage when it holds ``offset``."""
        d = self.damage(topic, queue_id)
        return (d.first, d.end) if d is not None and d.first <= offset < d.end else None

    def _lost_result(
        self, topic: str, queue_id: int, offset: int, lo: int, hi: int, lost: tuple[int, int]
    ) -> GetResult:
        """A read at an offset of a queue the cold tier could not load, which the hot store no
        longer holds: OFFSET_FOUND_NULL naming the lost range, ``next_offset`` the offset itself
        (as for any message the store could not deliver: the consumer decides to skip)."""
        self._log_once(
            logging.ERROR,
            (topic, queue_id, lost[0]),
            "read of %s/%d at %d: queue offsets %d..%d are lost to damage in the bucket (the queue "
            "could not be loaded; see GET /v1/status, tiering.damaged)",
            topic,
            queue_id,
            offset,
            lost[0],
            lost[1] - 1,
        )
        return GetResult(GetStatus.OFFSET_FOUND_NULL, (), offset, lo, hi, "cold", lost)

    async def _read_cold(
        self, ff: FlatMessageFile, offset: int, max_count: int, tags: TagFilter | None
    ) -> tuple[list[MessageExt], int]:
        """Messages from the cold tier and where to continue (past filtered units with ``tags``)."""
        if tags is None:
            msgs = await self.fetcher.read(ff, offset, max_count)
            return msgs, offset + len(msgs)
        return await self.fetcher.read_filtered(ff, offset, max_count, tags)

    async def _cold_copy(
        self, topic: str, queue_id: int, offset: int, count: int, tags: TagFilter | None
    ) -> tuple[list[MessageExt], int]:
        """The cold tier's messages from ``offset`` on, where the hot record at ``offset`` is
        unreadable (counted in :attr:`corrupt_served_cold`), and where to continue; ``offset``
        itself when the cold tier has no good copy."""
        ff = self.cold_file(topic, queue_id)
        if ff is None or not ff.min_offset <= offset < ff.max_offset:
            return [], offset
        try:
            msgs, nxt = await self._read_cold(ff, offset, count, tags)
        except LostMessagesError:
            return [], offset  # lost in both tiers: the hot answer reports the hole
        except TierdError as e:
            self._log_once(
                logging.ERROR,
                (topic, queue_id, offset),
                "%s/%d offset %d is unreadable in both tiers (cold: %s)",
                topic,
                queue_id,
                offset,
                e,
            )
            return [], offset
        self.corrupt_served_cold += 1
        self.reads["cold"] += 1
        self._log_once(
            logging.WARNING,
            (topic, queue_id, offset),
            "%s/%d offset %d is unreadable in the hot store; served the cold copy",
            topic,
            queue_id,
            offset,
        )
        return msgs, nxt

    def _log_once(self, level: int, key: tuple[str, int, int], msg: str, *args: object) -> None:
        """Log a per-message problem once (a consumer retrying must not flood the log)."""
        if key in self._logged:
            return
        self._logged[key] = None
        if len(self._logged) > LOGGED_MAX:
            del self._logged[next(iter(self._logged))]
        log.log(level, msg, *args)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.bounds(topic, queue_id)[1]

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.bounds(topic, queue_id)[2]

    async def store_time(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Store timestamp of the message at ``offset`` from whichever tier has it (None: none)."""
        ts = self.hot.store_timestamp(topic, queue_id, offset)
        if ts is not None:
            return ts
        ff = self.cold_file(topic, queue_id)
        if ff is None or not ff.min_offset <= offset < ff.max_offset:
            return None
        return (await self.fetcher.read(ff, offset, 1))[0].store_timestamp

    async def earliest_time(self, topic: str, queue_id: int) -> int:
        """Store timestamp of the first readable message; -1 when there is none (RocketMQ's
        ``getEarliestMessageTime``, and the HTTP API's documented value)."""
        await self._caught_up((topic, queue_id))
        ts = await self.store_time(topic, queue_id, self.bounds(topic, queue_id, readable=True)[1])
        return -1 if ts is None else ts

    async def offset_for_time(self, topic: str, queue_id: int, timestamp: int, upper: bool) -> int:
        """Binary search over the merged range (cold part through cached batches)."""
        await self._caught_up((topic, queue_id))
        _, lo, hi = self.bounds(topic, queue_id, readable=True)
        first, last = lo, hi
        while lo < hi:
            mid = (lo + hi) // 2
            stored = await self.store_time(topic, queue_id, mid)
            if stored is None or stored < timestamp:  # unknown (lost): as the oldest possible
                lo = mid + 1
            else:
                hi = mid
        if upper and lo < last and await self.store_time(topic, queue_id, lo) == timestamp:
            while lo + 1 < last and await self.store_time(topic, queue_id, lo + 1) == timestamp:
                lo += 1
        return max(lo, first)

    async def query(
        self,
        topic: str,
        key: str,
        max_count: int,
        begin: int,
        end: int,
        *,
        sources: dict[tuple[int, int], Literal["hot", "cold"]] | None = None,
        max_bytes: int | None = None,
        skip_at_end: int = 0,
    ) -> list[MessageExt]:
        """Messages of ``topic`` whose KEYS/UNIQ_KEY contain ``key``, stored in [begin, end], from
        both tiers, de-duplicated, newest first. Index hits (hot and cold alike) are only
        candidates: each is read back, CRC-checked and kept only if its keys really match.
        ``sources``: filled with the tier each message was read from, by (queue id, offset).
        ``max_bytes``, ``skip_at_end``: each tier stops reading once its messages exceed the
        bound (:class:`~tierd.local.store.QueryBudget`): the result then holds every message of
        the first ``max_bytes`` of the answer (the first always) and the one after them — what a
        byte-bounded page needs — not ``max_count`` messages."""
        await self._caught_up(None)
        hot_budget = QueryBudget(max_bytes, end, skip_at_end)
        found: dict[tuple[int, int], MessageExt] = {
            (m.queue_id, m.queue_offset): m
            for m in self.hot.query(topic, key, max_count, begin, end, wait=False, budget=hot_budget)
        }
        tier: dict[tuple[int, int], Literal["hot", "cold"]] = dict.fromkeys(found, "hot")
        t = self.tiering
        meta = t.flat.topics.get(topic) if t is not None and t.ready.is_set() else None
        if t is not None and meta is not None:
            cold_budget = QueryBudget(max_bytes, end, skip_at_end)
            for hit in await t.index.query(topic, meta.id, key, max_count * 4, begin, end):
                ff = t.flat.get(topic, hit.queue_id)
                if ff is None or hit.flat_offset < ff.commitlog.min_offset:
                    continue  # expired meanwhile
                self.query_cold_reads += 1
                try:
                    raw = await ff.read_commitlog(hit.flat_offset, hit.size)
                    msg = decode_record(raw, 0, limit=hit.size, check_crc=True)
                except TierdError as e:
                    log.warning(
                        "cold key-index hit %s/%d at flat offset %d unreadable: %s",
                        topic,
                        hit.queue_id,
                        hit.flat_offset,
                        e,
                    )
                    continue
                if msg.topic != topic or msg.queue_id != hit.queue_id:
                    continue
                if (key in msg.keys or msg.uniq_key == key) and begin <= msg.store_timestamp <= end:
                    if cold_budget.stop_before(msg.store_timestamp):
                        break
                    cold_budget.add(msg.size, msg.store_timestamp)
                    found.setdefault((msg.queue_id, msg.queue_offset), msg)
                    tier.setdefault((msg.queue_id, msg.queue_offset), "cold")
        # A total order (queue id last): a paged query (HTTP `next`) continues where it stopped.
        ordered = sorted(
            found.values(), key=lambda m: (m.store_timestamp, m.queue_offset, m.queue_id), reverse=True
        )
        if sources is not None:
            sources.update(tier)
        return ordered[:max_count]


def _byte_bounded(msgs: list[MessageExt], nxt: int, max_bytes: int | None) -> tuple[list[MessageExt], int]:
    """The messages that fit in ``max_bytes`` (at least one) and where the next read starts: the
    first message left out, or ``nxt`` when all fit."""
    if max_bytes is None:
        return msgs, nxt
    keep = byte_bounded_count([m.size for m in msgs], max_bytes)
    return (msgs, nxt) if keep == len(msgs) else (msgs[:keep], msgs[keep].queue_offset)
