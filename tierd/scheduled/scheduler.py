"""The scheduler: moves each scheduled message into its topic at (not before) its delivery time,
exactly once, across crashes, restarts, retention and restores (docs/scheduled.md).

Everything it needs to remember lives in the store itself, in three system topics
(:mod:`tierd.scheduled.timing`), so it is as durable as any acknowledged message, tiers with the
rest and comes back with a restore from the bucket — there is no side file to lose:

* :data:`SCHEDULE_TOPIC` — the scheduled messages, in put order. Its queue is the durable index:
  a start scans it (from the progress record's ``low`` mark) into an in-memory heap ordered by
  delivery time; the running scheduler then tails it. Bodies are read back through the facade's
  normal read, so a message whose hot copy retention has freed is read from the cold tier.
* :data:`RECALL_TOPIC` — a tombstone per recalled handle, read whole at start.
* :data:`PROGRESS_TOPIC` — progress records ``{low, scanned, through}``, at most one per
  ``scheduled.checkpoint_interval``. One record says: every scheduled message at an offset below
  ``scanned`` whose delivery time is at or before ``through`` is delivered or recalled, and none
  below ``low`` is still pending. That stays true for ever once written, so the last record found
  — even an old one in the bucket after a restore — is a safe place to start from.

Exactly once to the topic: a delivery appends the real message (carrying the scheduled message's
UNIQ_KEY and a ``TIMER_HANDLE`` property) and waits for it to be durable before the message
leaves the pending set; the progress record comes later. A crash in between leaves delivered
messages the last record does not cover; at the next start each scheduled message that was
already due then is looked up by its UNIQ_KEY in the real topic's key index (both tiers) before
it is written, and skipped when a copy with its handle is there. The window to check is what
was due since the last record — seconds of deliveries, not the history.

Producers are never held up: deliveries go out in batches of ``scheduled.batch`` messages (one
store append each) and the task yields to the event loop between batches.

Nor does the scheduler compete with them for the interpreter. A put tells it the message's
offset and delivery time (:meth:`Scheduler.scheduled`), so the scheduler need not read the
message back to learn them — decoding each new message was half the time of a scheduled put
(docs/performance.md, "Scheduled messages"). Only a message due within :data:`LOOKAHEAD_MS`
wakes it at once (wakes coalesce: at most one is outstanding), and is read back whole so its
body is at hand when it falls due. The rest wait for the round it makes at least once per
:data:`IDLE_WAIT` — soon enough, since IDLE_WAIT is shorter than LOOKAHEAD_MS — or sooner, once
they half fill the bounded deque that holds them (past it they would be dropped and read back).
The told offsets are taken in order; whatever no put told of (a gap: a message due soon, a put
whose acknowledgement failed, told offsets dropped while the scheduler was stalled) is read, so
the schedule topic stays the one source of truth and a start still reads it all.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tierd.errors import AlreadyDeliveredError, NotReadyError, TierdError, UnknownHandleError
from tierd.format.properties import PROPERTY_KEYS, PROPERTY_TAGS
from tierd.message import GetStatus, Message, ReadPolicy
from tierd.repeats import FailureLog
from tierd.scheduled.timing import (
    PROGRESS_TOPIC,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_HANDLE,
    RECALL_TOPIC,
    SCHEDULE_ONLY,
    SCHEDULE_TOPIC,
    Handle,
    parse_delay_levels,
    scheduled_deliver_at,
)

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.format.message_ext import MessageExt
    from tierd.local.store import HotStore
    from tierd.router import TierRouter
    from tierd.tiered.service import TieringService

log = logging.getLogger(__name__)
#: Messages read per scan of the system topics (one read call each).
SCAN_BATCH = 1024
#: Bodies of messages due within this many ms are kept from the scan (no second read).
LOOKAHEAD_MS = 2_000
#: At most this many bodies are kept so (memory stays bounded whatever the backlog).
MAX_KEPT_BODIES = 20_000
#: Longest idle wait (s): the scheduler scans for new scheduled messages at least this often.
#: A put due later than LOOKAHEAD_MS does not wake it, so this must stay well below that.
IDLE_WAIT = 1.0
assert IDLE_WAIT * 1000 < LOOKAHEAD_MS, "a message due beyond the lookahead must be scanned in time"
#: Told offsets taken in per call, between which the scheduler yields to the event loop.
TAKE_BATCH = 8 * SCAN_BATCH
#: Told offsets kept for the scheduler's next round; beyond this the oldest are dropped (they
#: are read instead), so a stalled scheduler does not make producers grow memory without end.
MAX_TOLD = 65_536
#: Pause (s) after a failed delivery, scan or progress write before trying again.
RETRY_PAUSE = 1.0
#: Seconds a start waits for the hot store to index what it recovered.
DISPATCH_WAIT = 30.0
#: Delivery lateness histogram buckets (s): the metric's ``le`` labels.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_NEVER = 2**63 - 1


class Host(Protocol):
    """What the scheduler uses of the store facade (no import of :mod:`tierd.store`)."""

    config: TierdConfig
    hot: HotStore
    router: TierRouter
    tiering: TieringService | None


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress record (see the module doc)."""

    low: int = 0
    scanned: int = 0
    through: int = -1

    def covers(self, offset: int, deliver_at: int) -> bool:
        return offset < self.scanned and deliver_at <= self.through

    def encode(self) -> bytes:
        return json.dumps({"low": self.low, "scanned": self.scanned, "through": self.through}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Progress:
        doc = json.loads(raw)
        return cls(int(doc["low"]), int(doc["scanned"]), int(doc["through"]))


@dataclass(slots=True)
class SchedulerStats:
    """Counters behind the metrics (docs/metrics.md); plain increments on the scheduler's loop."""

    delivered: int = 0
    recalls: int = 0
    #: Deliveries found already done after a crash (skipped, not written twice).
    deduplicated: int = 0
    #: Scheduled messages gone before delivery (retention freed them in both tiers, or damage).
    lost: int = 0
    #: Reads of the schedule topic made to find new messages (not one per put: the module doc).
    scans: int = 0
    #: Scheduled messages taken in from what their put told, without reading them back.
    told: int = 0
    lateness_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENESS_BUCKETS))
    lateness_count: int = 0
    lateness_sum: float = 0.0

    def observe_lateness(self, seconds: float) -> None:
        self.lateness_count += 1
        self.lateness_sum += seconds
        for i, bound in enumerate(LATENESS_BUCKETS):
            if seconds <= bound:
                self.lateness_buckets[i] += 1
                break


class Scheduler:
    """Runs on the store's event loop; every method below is called there."""

    def __init__(self, host: Host) -> None:
        self.host = host
        cfg = host.config.scheduled
        self.levels = parse_delay_levels(cfg.delay_levels)
        self.batch = cfg.batch
        self.checkpoint_interval = cfg.checkpoint_interval
        self.stats = SchedulerStats()
        #: offset -> delivery time of every scanned message not yet delivered or recalled
        #: (including those being delivered or recalled right now).
        self.pending: dict[int, int] = {}
        self._due: list[tuple[int, int]] = []  # (deliver_at, offset), lazily cleaned
        self._lows: list[int] = []  # offsets, lazily cleaned: the smallest pending one is `low`
        self._claimed: dict[int, int] = {}  # being delivered or recalled: offset -> deliver_at
        self._suspect: set[int] = set()  # due before this start: maybe delivered before a crash
        self._bodies: dict[int, MessageExt] = {}
        self._recalled: set[int] = set()
        self._recall_scanned = 0
        #: Next offset of SCHEDULE_TOPIC to scan.
        self.scanned = 0
        self._start_progress = Progress()
        self._start_end = 0  # SCHEDULE_TOPIC's end offset when this start began
        self._start_ms = 0
        self._saved = Progress()
        self._saved_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: A wake is on its way (set by a put's thread, cleared by the round it starts): puts
        #: due soon send one between them, not one each. Plain reads and writes under the GIL:
        #: a race between two puts costs a second wake, never a missing one.
        self._wake_sent = False
        #: (offset, delivery time) of acknowledged puts due later than LOOKAHEAD_MS, appended by
        #: producers' threads (deque appends are atomic), taken in order by :meth:`_scan`.
        self._told: collections.deque[tuple[int, int]] = collections.deque(maxlen=MAX_TOLD)
        #: Told offsets beyond the cursor, waiting for the offsets before them.
        self._ahead: dict[int, int] = {}
        #: Set once the start-up scan of the progress and recall topics is done.
        self.started = asyncio.Event()
        self._failures = FailureLog(log, "scheduled delivery")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the scheduler task on the running loop."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._wake_sent = False
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name="tierd-scheduler")

    async def stop(self) -> None:
        """Stop the task and write a last progress record (a clean restart checks nothing)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._loop = None  # puts from now on wake nothing (the next start scans them all)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self.started.is_set() and not self.host.hot.closed:
            try:
                await self._save_progress(force=True)
            except Exception as e:  # the next start checks a little more; nothing is lost
                log.warning("scheduler: last progress record not written (%s)", e)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def scheduled(self, offset: int, deliver_at: int) -> None:
        """A scheduled put was acknowledged at ``offset`` of the schedule topic (any thread may
        call this). A message due later than LOOKAHEAD_MS is noted, for the next round to take
        in without reading it back; one due sooner wakes the scheduler, which reads it (its body
        then stays at hand for the delivery).

        Neither is needed for correctness — a round reads whatever it was not told of — only
        for speed: reading each new message back cost half a scheduled put's time. The round
        that a wake starts clears :attr:`_wake_sent` before it reads, and its read takes in
        every acknowledged offset (read-your-writes), so a put that finds a wake already on its
        way is read by the round that wake starts."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return  # not running: the start reads everything
        if deliver_at - _now() > LOOKAHEAD_MS:
            told = self._told
            told.append((offset, deliver_at))
            # Half full: wake it now rather than at its next round. A producer putting more than
            # MAX_TOLD a round would otherwise overflow the deque, and each offset dropped is
            # read back — what telling spares (docs/performance.md, "Scheduled messages").
            if self._wake_sent or 2 * len(told) < MAX_TOLD:
                return
        elif self._wake_sent:
            return
        self._wake_sent = True
        with contextlib.suppress(RuntimeError):  # its loop closed: the next start reads it
            loop.call_soon_threadsafe(wake.set)

    # ------------------------------------------------------------------ reads
    async def _read(self, topic: str, offset: int, count: int) -> tuple[GetStatus, list[MessageExt], int]:
        """Messages of ``topic`` queue 0 from ``offset`` through the normal two-tier read."""
        policy = ReadPolicy(self.host.config.tiered.storage_level)
        r = await self.host.router.get(topic, 0, offset, count, policy)
        return r.status, list(r.messages), r.next_offset

    async def _last(self, topic: str) -> MessageExt | None:
        end = self.host.router.max_offset(topic, 0)
        if end <= 0:
            return None
        status, msgs, _ = await self._read(topic, end - 1, 1)
        return msgs[0] if status is GetStatus.FOUND and msgs else None

    async def _load(self) -> None:
        """Start-up: wait for the cold tier and the hot store's index, read the last progress
        record and every recall tombstone, and position the scan."""
        t = self.host.tiering
        if t is not None:
            await t.wait_ready()
        await asyncio.to_thread(self.host.hot.require_dispatched, DISPATCH_WAIT, "scheduled delivery")
        last = await self._last(PROGRESS_TOPIC)
        progress = Progress()
        if last is not None:
            try:
                progress = Progress.decode(last.body)
            except (ValueError, KeyError, TypeError) as e:
                log.error("scheduler: unreadable progress record (%s); scanning every scheduled message", e)
        await self._scan_recalls()
        self._start_progress = self._saved = progress
        self._start_ms = _now()
        self._start_end = self.host.router.max_offset(SCHEDULE_TOPIC, 0)
        self.scanned = max(progress.low, self.host.router.min_offset(SCHEDULE_TOPIC, 0))
        self._saved_at = time.monotonic()
        self.started.set()
        log.info(
            "scheduler: started at offset %d (progress: low %d, scanned %d, through %d)",
            self.scanned,
            progress.low,
            progress.scanned,
            progress.through,
        )

    async def _scan_recalls(self) -> None:
        offset = max(self._recall_scanned, self.host.router.min_offset(RECALL_TOPIC, 0))
        while True:
            status, msgs, nxt = await self._read(RECALL_TOPIC, offset, SCAN_BATCH)
            for m in msgs:
                try:
                    self._recalled.add(Handle.parse(m.body.decode()).offset)
                except (TierdError, UnicodeDecodeError):
                    continue  # not a tombstone of ours: someone wrote to the system topic
            if status is not GetStatus.FOUND or nxt <= offset:
                break
            offset = nxt
        self._recall_scanned = offset

    def _take_told(self) -> bool:
        """Move the cursor over the offsets puts told of, in order, up to the first one none
        told of (see :meth:`scheduled`); True when more than TAKE_BATCH were waiting (the rest
        are taken after a yield to the loop). Called with no await inside, like the cursor's
        other move."""
        told, ahead = self._told, self._ahead
        for _ in range(min(len(told), TAKE_BATCH)):
            o, deliver_at = told.popleft()
            if o >= self.scanned:
                ahead[o] = deliver_at
        if not ahead:
            return bool(told)
        now = _now()
        o = self.scanned
        while o in ahead:
            self._enter(o, ahead.pop(o), None, now)
            self.stats.told += 1
            o += 1
        self.scanned = o
        return bool(told)

    async def _scan(self, limit: int = SCAN_BATCH) -> bool:
        """Take in newly scheduled messages: those puts told of, then a read of the rest; True
        when there is more to take in now (the read stopped short of what was there when it
        began: a full batch, or the next told offset). Messages put while it read wait for the
        next round, so steady puts do not keep the scheduler reading one or two at a time.

        A message enters the pending set only as the cursor (:attr:`scanned`) passes it, and
        the cursor only moves forward, so each one enters at most once. The delivery loop and
        a recall both scan, and their reads may overlap: whichever comes back second holds
        offsets the first already took (and may since have delivered, and dropped from the
        pending set), so those are skipped here rather than put back to be delivered twice.
        No await lies between the cursor check and the cursor's move."""
        if self._take_told():
            return True
        end = self.host.router.max_offset(SCHEDULE_TOPIC, 0)
        if self.scanned >= end:
            return False
        # Read only what was there (puts after it are told of by the time of the next round),
        # and only up to the next offset told of: what lies beyond was told of.
        limit = min(limit, end - self.scanned)
        if self._ahead:
            limit = max(1, min(limit, min(self._ahead) - self.scanned))
        self.stats.scans += 1
        status, msgs, nxt = await self._read(SCHEDULE_TOPIC, self.scanned, limit)
        if status is GetStatus.OFFSET_TOO_SMALL:
            low = self.host.router.min_offset(SCHEDULE_TOPIC, 0)
            if low <= self.scanned:
                return True  # another scan already moved past what retention freed
            self.stats.lost += low - self.scanned
            log.error(
                "scheduler: scheduled messages at offsets %d..%d are gone (retention freed them in "
                "both tiers) before delivery; continuing at %d",
                self.scanned,
                low - 1,
                low,
            )
            self.scanned = low
            return True
        if status is not GetStatus.FOUND:
            return False
        now = _now()
        for m in msgs:
            if m.queue_offset >= self.scanned:
                self._add(m, now)
        self.scanned = max(self.scanned, nxt)
        if self._ahead:
            self._ahead = {o: at for o, at in self._ahead.items() if o >= self.scanned}
        return bool(msgs) and nxt < end

    def _add(self, m: MessageExt, now: int) -> None:
        o = m.queue_offset
        deliver_at = scheduled_deliver_at(m.properties)
        if deliver_at is None or PROPERTY_REAL_TOPIC not in m.properties:
            log.warning("scheduler: %s offset %d is not a scheduled message; skipped", SCHEDULE_TOPIC, o)
            return
        self._enter(o, deliver_at, m, now)

    def _enter(self, o: int, deliver_at: int, m: MessageExt | None, now: int) -> None:
        """Scheduled message ``o`` enters the pending set (``m``: its body, when read back)."""
        if o in self._recalled or o in self.pending or self._start_progress.covers(o, deliver_at):
            return
        self.pending[o] = deliver_at
        heapq.heappush(self._due, (deliver_at, o))
        heapq.heappush(self._lows, o)
        if o < self._start_end and deliver_at <= self._start_ms:
            self._suspect.add(o)  # due before this start: a crash may have delivered it already
        if m is not None and deliver_at <= now + LOOKAHEAD_MS and len(self._bodies) < MAX_KEPT_BODIES:
            self._bodies[o] = m

    # ------------------------------------------------------------------ progress
    def progress(self) -> Progress:
        """What may be recorded now (see the module doc)."""
        while self._lows and self._lows[0] not in self.pending:
            heapq.heappop(self._lows)
        low = self._lows[0] if self._lows else self.scanned
        first = self._next_due()
        if self._claimed:
            first = min(first, *self._claimed.values())
        return Progress(low=low, scanned=self.scanned, through=min(first - 1, _NEVER))

    async def _save_progress(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self._saved_at < self.checkpoint_interval:
            return
        p = self.progress()
        self._saved_at = time.monotonic()
        if p == self._saved or p.scanned == 0:
            # Nothing scanned yet, so the record would cover no offset: it says no more than no
            # record at all. Not writing it keeps a store that never scheduled free of system
            # topics (and an earlier record, which stays true, is not weakened).
            return
        await self._put([Message(topic=PROGRESS_TOPIC, body=p.encode(), queue_id=0)])
        self._saved = p

    async def _put(self, messages: list[Message]) -> None:
        _, fut = self.host.hot.put_batch(messages)
        if fut is not None:
            await asyncio.wrap_future(fut)

    # ------------------------------------------------------------------ delivery
    def _next_due(self) -> int:
        due = self._due
        while due and (due[0][1] not in self.pending or due[0][1] in self._claimed):
            heapq.heappop(due)
        return due[0][0] if due else _NEVER

    def _claim(self, now: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        while len(out) < self.batch and self._next_due() <= now:
            deliver_at, o = heapq.heappop(self._due)
            self._claimed[o] = deliver_at
            out.append((deliver_at, o))
        return out

    def _unclaim(self, claimed: list[tuple[int, int]]) -> None:
        for deliver_at, o in claimed:
            if self._claimed.pop(o, None) is not None and o in self.pending:
                heapq.heappush(self._due, (deliver_at, o))

    def _resolve(self, o: int) -> None:
        self._claimed.pop(o, None)
        self.pending.pop(o, None)
        self._suspect.discard(o)
        self._bodies.pop(o, None)

    async def _body(self, o: int) -> MessageExt | None:
        m = self._bodies.pop(o, None)
        if m is not None:
            return m
        status, msgs, _ = await self._read(SCHEDULE_TOPIC, o, 1)
        if status is GetStatus.FOUND and msgs and msgs[0].queue_offset == o:
            return msgs[0]
        if status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_FOUND_NULL) or status is GetStatus.FOUND:
            return None  # gone for good (retention in both tiers, damage)
        raise NotReadyError(f"scheduled message {o} could not be read ({status.value}); retrying", offset=o)

    async def _delivered_before(self, m: MessageExt, handle: str) -> bool:
        """Was ``m`` delivered before the crash this start recovers from? Its copy carries its
        UNIQ_KEY (indexed) and its handle."""
        uniq = m.uniq_key
        topic = m.properties[PROPERTY_REAL_TOPIC]
        if not uniq:
            return False
        found = await self.host.router.query(topic, uniq, 64, 0, _NEVER)
        return any(c.properties.get(PROPERTY_TIMER_HANDLE) == handle for c in found)

    async def _read_bodies(self, offsets: list[int]) -> None:
        """Read the bodies of ``offsets`` not at hand, a run of consecutive offsets per read:
        messages told of were never read, and one read each would slow a delivery burst."""
        missing = sorted(o for o in offsets if o not in self._bodies)
        i = 0
        while i < len(missing):
            j = i + 1
            while j < len(missing) and missing[j] == missing[j - 1] + 1 and j - i < SCAN_BATCH:
                j += 1
            status, msgs, _ = await self._read(SCHEDULE_TOPIC, missing[i], j - i)
            if status is GetStatus.FOUND:
                for m in msgs:
                    if m.queue_offset in self._claimed:
                        self._bodies[m.queue_offset] = m
            i = j

    async def _deliver(self, claimed: list[tuple[int, int]]) -> None:
        out: list[Message] = []
        done: list[tuple[int, int]] = []
        await self._read_bodies([o for _, o in claimed])
        for deliver_at, o in claimed:
            m = await self._body(o)
            handle = str(Handle(o, deliver_at))
            if m is None:
                self.stats.lost += 1
                log.error(
                    "scheduler: scheduled message %s is gone before delivery (retention, damage)", handle
                )
                self._resolve(o)
                continue
            if o in self._suspect and await self._delivered_before(m, handle):
                self.stats.deduplicated += 1
                self._resolve(o)
                continue
            out.append(_real_message(m, handle))
            done.append((deliver_at, o))
        if out:
            await self._put(out)
        now = _now()
        for deliver_at, o in done:
            self._resolve(o)
            self.stats.delivered += 1
            self.stats.observe_lateness(max(0, now - deliver_at) / 1000)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                if not self.started.is_set():
                    await self._load()
                await self._round()
                self._failures.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self.host.hot.closed:
                    return
                self._failures.failed(e, f"retrying in {RETRY_PAUSE:g} s")
                await asyncio.sleep(RETRY_PAUSE)

    async def _round(self) -> None:
        """Scan, deliver what is due, record progress; wait when there is nothing to do: until
        the next delivery, an urgent put (:meth:`scheduled`) or IDLE_WAIT, whichever is first."""
        assert self._wake is not None
        self._wake_sent = False  # before the scan: a put after this sends a wake of its own
        self._wake.clear()
        more = await self._scan()
        claimed = self._claim(_now())
        if claimed:
            try:
                await self._deliver(claimed)
            finally:
                self._unclaim(claimed)  # only those not delivered: a failure retries them
        await self._save_progress()
        if more or claimed:
            await asyncio.sleep(0)  # yield: producers and readers share this loop
            return
        wait = min(IDLE_WAIT, max(0.0, (self._next_due() - _now()) / 1000))
        if self.pending or self._saved != self.progress():
            wait = min(wait, self.checkpoint_interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait)

    # ------------------------------------------------------------------ recall
    async def recall(self, handle: str) -> bool:
        """Cancel the scheduled message ``handle`` names. True when this call recalled it, False
        when it was recalled already; UnknownHandleError for a handle this store never gave out,
        AlreadyDeliveredError once it is in its topic (or on its way there). Returns once the
        tombstone is durable."""
        h = Handle.parse(handle)
        await asyncio.wait_for(self.started.wait(), self.host.config.tiered.ready_timeout + DISPATCH_WAIT)
        if h.offset >= self.scanned:
            await asyncio.to_thread(self.host.hot.require_dispatched, DISPATCH_WAIT, "recall")
            while h.offset >= self.scanned and await self._scan():
                pass
        if h.offset in self._recalled:
            if await self._matches(h):
                return False
            raise _unknown(h)
        deliver_at = self.pending.get(h.offset)
        if deliver_at is None or deliver_at != h.deliver_at:
            if not await self._matches(h):
                raise _unknown(h)
            raise AlreadyDeliveredError(
                f"scheduled message {h} was already delivered (due at {h.deliver_at}); nothing recalled",
                handle=str(h),
            )
        if h.offset in self._claimed:
            raise AlreadyDeliveredError(
                f"scheduled message {h} is being delivered now (due at {h.deliver_at}); nothing recalled",
                handle=str(h),
            )
        self._claimed[h.offset] = h.deliver_at  # holds the progress record back until durable
        try:
            await self._put([Message(topic=RECALL_TOPIC, body=str(h).encode(), queue_id=0)])
        except BaseException:
            self._unclaim([(h.deliver_at, h.offset)])
            raise
        self._recalled.add(h.offset)
        self._resolve(h.offset)
        self.stats.recalls += 1
        return True

    async def _matches(self, h: Handle) -> bool:
        """Does ``h`` name a message of SCHEDULE_TOPIC (offset and delivery time both)?"""
        try:
            status, msgs, _ = await self._read(SCHEDULE_TOPIC, h.offset, 1)
        except TierdError:
            return False
        if status is not GetStatus.FOUND or not msgs or msgs[0].queue_offset != h.offset:
            return False
        return scheduled_deliver_at(msgs[0].properties) == h.deliver_at


def _unknown(h: Handle) -> UnknownHandleError:
    return UnknownHandleError(
        f"no scheduled message has handle {h} (a handle of another store, a typo, or retention freed it)",
        handle=str(h),
    )


def _real_message(m: MessageExt, handle: str) -> Message:
    """The message as its producer put it, for its real topic and queue, plus its handle."""
    props = m.properties
    qid = props.get(PROPERTY_REAL_QID)
    kept = {
        k: v for k, v in props.items() if k not in SCHEDULE_ONLY and k != PROPERTY_KEYS and k != PROPERTY_TAGS
    }
    kept[PROPERTY_TIMER_HANDLE] = handle
    return Message(
        topic=props[PROPERTY_REAL_TOPIC],
        body=m.body,
        queue_id=int(qid) if qid is not None else None,
        keys=m.keys,
        tags=m.tags,
        properties=kept,
        flag=m.flag,
        born_host=m.born_host,
        born_timestamp=m.born_timestamp,
    )


def _now() -> int:
    return time.time_ns() // 1_000_000
