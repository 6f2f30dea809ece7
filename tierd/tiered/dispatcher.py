"""The tiering dispatcher: moves every queue's messages from the hot store to its flat file.

Per queue, each round looks at the backlog between the cold append offset and the hot consume
queue's max offset and commits a batch when ``group_commit_count`` messages or
``group_commit_size`` bytes are pending, or the oldest pending message is older than
``group_commit_timeout`` (or when forced by :meth:`Dispatcher.tier_now`). A single message
larger than the group size still goes alone (RocketMQ blocks on it forever, #10998).

Failures never skip data: a failed commit keeps its bytes buffered in the segments and is retried
with exponential backoff and full jitter; the cold consume queue's committed offset is the only
thing readers trust. After each round the dispatcher publishes :attr:`safe_offset`, the oldest
hot commitlog offset not yet cold — hot retention may not delete from there on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tierd.errors import CorruptionError, TierdError
from tierd.format.columns import store_timestamps as store_timestamps  # (re-exported: tests import it here)
from tierd.repeats import EXPECTED, FailureLog

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tierd.config import TieredConfig
    from tierd.local.store import HotStore, SourceUnits
    from tierd.tiered.flatmessage import CommittedBatch, FlatMessageFile
    from tierd.tiered.flatstore import FlatFileStore

log = logging.getLogger(__name__)
RETRY_BASE = 0.2
RETRY_CAP = 30.0
#: Commit a queue's consume queue at least every this many batches in one round (bounds the
#: commitlog bytes held for the index hand-off until the consume queue makes them readable).
CQ_COMMIT_EVERY = 8
#: A queue's backlog left after a full batch joins that batch when it holds at most
#: ``group_commit_size`` / this many bytes and ``group_commit_count`` / this many messages (one
#: chunk object instead of a small extra one).
SMALL_REST_SHARE = 2
#: New queues named one by one in the log (beyond that, a count and the first few).
NEW_QUEUES_LISTED = 8
#: Failed queues named in a round's failure line (beyond that, a count).
FAILED_QUEUES_LISTED = 5


@dataclass(slots=True)
class DispatchStats:
    """Counters exported as metrics (RocketMQ's tiered-store names in docs/metrics.md)."""

    messages_dispatched: int = 0
    bytes_uploaded: int = 0
    commits: int = 0
    commit_failures: int = 0
    rounds: int = 0
    #: Rounds still running after ``backend_timeout`` seconds (logged as stuck).
    stuck_rounds: int = 0
    #: Wall-clock time (ms) of the last successful commit; None before the first.
    last_commit_ms: int | None = None
    #: Per queue: hot max offset − cold committed offset, and age (ms) of the oldest pending message.
    behind_messages: dict[tuple[str, int], int] = field(default_factory=dict)
    behind_ms: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(slots=True)
class RoundResult:
    """What one dispatch round did, per queue: messages made readable, and the failures (the
    exception that stopped the queue; its bytes stay buffered and are retried)."""

    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    failed: dict[tuple[str, int], BaseException] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.committed.values())


@dataclass(frozen=True, slots=True)
class QueueTiered:
    """One queue in a :class:`TierReport`."""

    topic: str
    queue_id: int
    #: Messages this call made readable in the cold tier.
    committed: int
    #: Messages acknowledged by the hot store and still not in the cold tier afterwards.
    pending: int


@dataclass(frozen=True, slots=True)
class TierReport:
    """What :meth:`MessageStore.tier_now` did: every queue that committed something or still has
    pending messages (queues with neither are left out)."""

    queues: tuple[QueueTiered, ...] = ()

    @property
    def committed(self) -> int:
        """Messages made readable in the cold tier by this call, over all queues."""
        return sum(q.committed for q in self.queues)

    @property
    def pending(self) -> int:
        """Messages still waiting for the cold tier after this call, over all queues."""
        return sum(q.pending for q in self.queues)

    def as_dict(self) -> dict[str, Any]:
        return {
            "committed": self.committed,
            "pending": self.pending,
            "queues": [
                {"topic": q.topic, "queue_id": q.queue_id, "committed": q.committed, "pending": q.pending}
                for q in self.queues
            ],
        }


class RateLimiter:
    """Token bucket in bytes/s (``upload_rate_limit``); a large request waits proportionally."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._available = float(rate)
        self._stamp = time.monotonic()

    async def acquire(self, n: int) -> None:
        now = time.monotonic()
        self._available = min(float(self.rate), self._available + (now - self._stamp) * self.rate)
        self._stamp = now
        self._available -= n
        if self._available < 0:
            await asyncio.sleep(-self._available / self.rate)


class Dispatcher:
    def __init__(
        self, hot: HotStore, flat: FlatFileStore, cfg: TieredConfig, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.hot = hot
        self.flat = flat
        self.cfg = cfg
        self.clock = clock
        self.stats = DispatchStats()
        self.on_committed: list[Callable[[CommittedBatch], None]] = []
        #: Awaited before every round; raising stops the round before it writes anything (the
        #: tiering service checks prefix ownership there).
        self.before_round: Callable[[], Awaitable[None]] | None = None
        #: Awaited after every round (the tiering service writes bucket manifests there).
        self.after_round: Callable[[], Awaitable[None]] | None = None
        #: Called with (queue, exception) for every failed queue commit (status and metrics).
        self.on_failure: Callable[[tuple[str, int], BaseException], None] | None = None
        #: Queues of the rounds in progress (named in the "stuck round" log line).
        self._active: set[tuple[str, int]] = set()
        #: The gather buffer a queue's batch is copied into (None while a queue holds it; the
        #: next queue then gathers into a new one): no fresh pages to fault in per batch.
        self._scratch: bytearray | None = None
        self._sem = asyncio.Semaphore(cfg.max_concurrent_queues)
        self._limiter = RateLimiter(cfg.upload_rate_limit) if cfg.upload_rate_limit else None
        self._retry_at: dict[tuple[str, int], tuple[int, float]] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        #: Failed commits, one line per round at most, rate-limited: with 10,000 queues on a
        #: backend that is down, a line per queue was 10,000 lines per round.
        self.failures = FailureLog(log, "tiering")
        #: Oldest hot commitlog offset whose message is not yet committed cold.
        self.safe_offset = 0
        #: Held by every round: a topic delete takes it so no round writes into what it erases.
        self.round_lock = asyncio.Lock()

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        """Dispatch every ``dispatch_interval`` seconds, or at once when triggered."""
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.cfg.dispatch_interval)
            self._wake.clear()
            if self._stopping:
                break
            try:
                await self.dispatch_round()
                if self.after_round is not None:
                    await self.after_round()
            except Exception as e:  # ownership, backend (one line); a bug (a traceback) — rate-limited
                self.failures.failed(e, "the round stopped; the next round retries")

    def trigger(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def tier_now(self) -> RoundResult:
        """Commit everything pending in every queue when called, ignoring the hold thresholds;
        retries failed commits right away. Returns what each queue committed and which failed.
        Messages written meanwhile are left to the next round (see :meth:`dispatch_round`)."""
        self._retry_at.clear()
        return await self.dispatch_round(force=True)

    async def dispatch_round(self, force: bool = False) -> RoundResult:
        """One round over every queue. Raises only what :attr:`before_round` raised; per-queue
        failures are in the result (and logged), so one bad queue never stops the others.

        A round tiers each queue up to the hot max offset it had when the round began, never
        further: while producers write faster than the cold tier accepts (a slow backend,
        ``upload_rate_limit``) a round that chased new messages never ended — ``tier_now``
        (``POST /v1/admin/tier``) never answered and the manifests written after each round
        fell behind for ever. What arrives meanwhile is the next round's."""
        async with self.round_lock:
            try:
                return await self._round(force)
            finally:
                self.flat.forget_first_writes()

    async def _round(self, force: bool) -> RoundResult:
        if self.before_round is not None:
            await self.before_round()
        await self._create_new_queues()
        # Only queues with something to do get a task: an idle store of 10,000 queues costs a
        # cheap offset comparison per queue per round, not 10,000 tasks and lock round trips.
        result = RoundResult()
        queues = [key for key in self.hot.queue_keys() if self._has_work(key)]
        ends = {key: rng.max_offset for key in queues if (rng := self.hot.queue_range(*key)) is not None}
        work = asyncio.gather(*(self._guarded(q, force, result, ends.get(q)) for q in queues))
        try:
            await self._watch(work, force)
        except asyncio.CancelledError:
            work.cancel()
            raise
        self.stats.rounds += 1
        self._update_safe_offset()
        self._log_round(result)
        return result

    def _log_round(self, result: RoundResult) -> None:
        """One line for a round's failed queues (rate-limited by :attr:`failures`, the detail of
        each at DEBUG); once none is failing any more, one line saying so."""
        if not result.failed:
            if not self._retry_at:  # no queue waiting to retry a failed commit
                self.failures.succeeded()
            return
        keys = sorted(result.failed)
        # A bug (not an expected kind) is the one shown: its traceback is logged.
        first = next((k for k in keys if not isinstance(result.failed[k], EXPECTED)), keys[0])
        named = ", ".join(f"{t}/{q}" for t, q in keys[:FAILED_QUEUES_LISTED])
        more = f", and {len(keys) - FAILED_QUEUES_LISTED} more" if len(keys) > FAILED_QUEUES_LISTED else ""
        self.failures.failed(
            result.failed[first],
            f"{len(keys)} queue(s) failed this round ({named}{more}; shown: {first[0]}/{first[1]}); "
            "their messages stay in the hot store and are retried with backoff",
        )

    async def _create_new_queues(self) -> None:
        """Flat files for every hot queue seen for the first time, with one metadata write."""
        new = [
            (topic, qid, rng.min_offset)
            for topic, qid in self.hot.queue_keys()
            if self.flat.get(topic, qid) is None and (rng := self.hot.queue_range(topic, qid)) is not None
        ]
        if not new:
            return
        made = await self.flat.create_many(new)
        await self.flat.expect_first_writes([(ff.topic, ff.queue_id) for ff in made])
        if len(new) <= NEW_QUEUES_LISTED:
            for topic, qid, first in new:
                log.info("tiering %s/%d from queue offset %d", topic, qid, first)
        else:
            log.info(
                "tiering %d new queues (%s, …)",
                len(new),
                ", ".join(f"{t}/{q} from offset {o}" for t, q, o in new[:NEW_QUEUES_LISTED]),
            )

    def _has_work(self, key: tuple[str, int]) -> bool:
        ff = self.flat.get(*key)
        hot = self.hot.queue_range(*key)
        if ff is None or hot is None or ff.needs_commit or hot.max_offset > ff.append_offset:
            return True
        if self.stats.behind_messages.get(key):
            self.stats.behind_messages[key] = self.stats.behind_ms[key] = 0
        return False

    async def _watch(self, work: asyncio.Future[list[None]], force: bool) -> None:
        """Wait for a round, logging it as stuck every ``backend_timeout`` seconds it runs on
        (each backend call is bounded by that much, so a longer round is waiting on many calls
        or a very slow backend — worth a line in the log either way)."""
        started = time.monotonic()
        stuck = False
        while True:
            done, _ = await asyncio.wait({work}, timeout=self.cfg.backend_timeout)
            if done:
                work.result()
                return
            if not stuck:
                stuck = True
                self.stats.stuck_rounds += 1
            active = sorted(self._active)
            log.warning(
                "tiering round%s still running after %.0f s: %d queue(s) unfinished (%s)",
                " (tier_now)" if force else "",
                time.monotonic() - started,
                len(active),
                ", ".join(f"{t}/{q}" for t, q in active[:5]) + (", ..." if len(active) > 5 else ""),
            )

    async def _guarded(self, key: tuple[str, int], force: bool, result: RoundResult, end: int | None) -> None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with self._sem, lock:
            self._active.add(key)
            try:
                made = await self._dispatch_queue(key, force, result, end)
            except Exception as e:  # summed up once per round (_log_round)
                log.debug(
                    "tiering %s/%d failed: %s", key[0], key[1], e, exc_info=not isinstance(e, TierdError)
                )
                self._failed(key, e, result)
                return
            finally:
                self._active.discard(key)
            if made:
                result.committed[key] = made

    def _failed(self, key: tuple[str, int], err: BaseException, result: RoundResult) -> None:
        result.failed[key] = err
        if self.on_failure is not None:
            self.on_failure(key, err)

    # ------------------------------------------------------------------ one queue
    async def _dispatch_queue(
        self, key: tuple[str, int], force: bool, result: RoundResult, end: int | None = None
    ) -> int:
        """Tier one queue's due backlog up to queue offset ``end`` (its hot max offset when the
        round began; None: no bound). The commitlog is committed per batch (≤ group size);
        the consume queue — what makes messages readable — once at the end of the queue's round
        or every CQ_COMMIT_EVERY batches, saving a PUT per batch on object stores."""
        topic, qid = key
        hot = self.hot.queue_range(topic, qid)
        if hot is None:
            return 0
        ff = self.flat.get(topic, qid)
        if ff is None:
            ff = await self.flat.create(topic, qid, hot.min_offset)
            log.info("tiering %s/%d from queue offset %d", topic, qid, hot.min_offset)
        if ff.needs_commit:
            if not force and not self._retry_due(key):
                return 0
            made = await self._commit(key, ff, full=True, result=result)
            if made is None:
                return 0
            committed = made
        else:
            committed = 0
        while (hot := self.hot.queue_range(topic, qid)) is not None:
            cold = ff.append_offset
            hot_max = hot.max_offset if end is None else min(hot.max_offset, end)
            hot_min = hot.min_offset
            self._record_lag(key, ff, hot.max_offset)
            if cold < hot_min:
                raise CorruptionError(
                    f"hot store no longer has queue offsets {cold}..{hot_min - 1} and they are not cold; "
                    "they were deleted before tiering (was tiering disabled?) — this queue cannot be tiered "
                    "contiguously",
                    cold=cold,
                    hot_min=hot_min,
                )
            backlog = hot_max - cold
            if backlog <= 0:
                break
            units = self.hot.source_units(topic, qid, cold, min(backlog, self.cfg.group_commit_count))
            if units is None:
                break
            if units.lost:  # messages lost to damage found in the hot commitlog
                await ff.append_holes(cold, units.lost, int(self.clock() * 1000))
                log.warning(
                    "tiering %s/%d: queue offsets %d..%d were lost to damage in the hot commitlog "
                    "(quarantined); the cold tier records them as a hole",
                    topic,
                    qid,
                    cold,
                    cold + units.lost - 1,
                )
                continue
            sizes = units.sizes
            due = (
                force
                or backlog >= self.cfg.group_commit_count
                or int(sizes.sum()) >= self.cfg.group_commit_size
            )
            if not due:
                first_ts = self.hot.store_timestamp(topic, qid, cold)
                age_ms = self.clock() * 1000 - first_ts if first_ts is not None else None
                due = age_ms is None or age_ms >= self.cfg.group_commit_timeout * 1000
            if not due:
                break
            # Cut at the size threshold, but always take at least one message.
            n = max(1, int(np.searchsorted(np.cumsum(sizes), self.cfg.group_commit_size, side="right")))
            if n < len(units):  # cut by size: the rest may be a sliver worth taking along
                units = self._with_small_rest(key, units.head(n), backlog)
            sizes = units.sizes
            # The gather buffer is lent to this queue until its batch is appended (append_batch
            # copies the records); a queue gathering meanwhile uses a new one.
            records, self._scratch = self.hot.source_records(units, self._scratch), None
            try:
                starts = np.cumsum(sizes) - sizes
                stamps = store_timestamps(records, starts)
                await ff.append_batch(records, sizes, cold, units.tags_codes, stamps)
            finally:
                self._scratch = records.obj  # type: ignore[assignment]
                del records
            full = ff.uncommitted_batches >= CQ_COMMIT_EVERY
            made = await self._commit(key, ff, full=full, result=result)
            if made is None:
                return committed
            committed += made
        if ff.needs_commit:
            made = await self._commit(key, ff, full=True, result=result)
            committed += made or 0
        return committed

    def _with_small_rest(self, key: tuple[str, int], units: SourceUnits, backlog: int) -> SourceUnits:
        """The batch ``units`` (cut at ``group_commit_size``), extended by the rest of the
        backlog when that rest is at most a :data:`SMALL_REST_SHARE` of ``group_commit_size``
        and of ``group_commit_count``: on an object store every commit is one chunk PUT, and a
        backlog a little over a multiple of the group size would otherwise end in a sliver
        object of its own (256 MiB over 16 queues: a fifth PUT of ~1.3 MB per queue). Never
        across damaged (quarantined) records: the hot store cuts the rest before them."""
        rest = backlog - len(units)
        limit = self.cfg.group_commit_size // SMALL_REST_SHARE
        if (
            rest <= 0
            or rest > self.cfg.group_commit_count // SMALL_REST_SHARE
            or rest * int(units.sizes.min()) > limit
        ):
            return units
        more = self.hot.source_units(*key, units.offset + len(units), rest)
        if more is None or more.lost or len(more) != rest or int(more.sizes.sum()) > limit:
            return units
        return replace(
            units,
            positions=np.concatenate([units.positions, more.positions]),
            sizes=np.concatenate([units.sizes, more.sizes]),
            tags_codes=np.concatenate([units.tags_codes, more.tags_codes]),
        )

    async def _commit(
        self, key: tuple[str, int], ff: FlatMessageFile, *, full: bool, result: RoundResult
    ) -> int | None:
        """Commit ``ff`` (``full``: commitlog and consume queue; else the commitlog only).
        Returns the messages that became readable, or None after a failure (retry scheduled,
        failure recorded in ``result``)."""
        pending = ff.pending_bytes
        if self._limiter is not None and pending > 0:
            await self._limiter.acquire(pending)
        try:
            if full:
                batches = await ff.commit()
            else:
                await ff.commit_commitlog()
                batches = []
        except Exception as e:
            attempts = self._retry_at.get(key, (0, 0.0))[0] + 1
            delay = random.uniform(0, min(RETRY_CAP, RETRY_BASE * 2**attempts))
            self._retry_at[key] = (attempts, time.monotonic() + delay)
            self.stats.commit_failures += 1
            log.debug(  # summed up once per round (_log_round)
                "commit of %s/%d failed (attempt %d, retry in %.2fs): %s", key[0], key[1], attempts, delay, e
            )
            self._failed(key, e, result)
            return None
        self._retry_at.pop(key, None)
        self.stats.commits += 1
        self.stats.last_commit_ms = int(time.time() * 1000)
        made = 0
        for b in batches:
            made += len(b.sizes)
            self.stats.bytes_uploaded += len(b.records)
            for hook in self.on_committed:
                hook(b)
        self.stats.messages_dispatched += made
        return made

    def _retry_due(self, key: tuple[str, int]) -> bool:
        entry = self._retry_at.get(key)
        return entry is None or time.monotonic() >= entry[1]

    def _record_lag(self, key: tuple[str, int], ff: FlatMessageFile, hot_max: int) -> None:
        behind = max(0, hot_max - ff.max_offset)
        self.stats.behind_messages[key] = behind
        if behind:
            ts = self.hot.store_timestamp(key[0], key[1], ff.max_offset)
            self.stats.behind_ms[key] = max(0, int(self.clock() * 1000) - ts) if ts is not None else 0
        else:
            self.stats.behind_ms[key] = 0

    def _update_safe_offset(self) -> None:
        safe = self.hot.end_position
        for topic, qid in self.hot.queue_keys():
            hot = self.hot.queue_range(topic, qid)
            if hot is None:
                continue
            ff = self.flat.get(topic, qid)
            first_not_cold = max(ff.max_offset, hot.min_offset) if ff is not None else hot.min_offset
            pos = self.hot.position(topic, qid, first_not_cold)
            if pos is not None:
                safe = min(safe, pos)
        self.safe_offset = safe

    def allows_delete(self, end_offset: int) -> bool:
        """Hot-retention guard: may commitlog bytes before ``end_offset`` go?"""
        return end_offset <= self.safe_offset
