"""The transaction coordinator: half messages, commits, rollbacks and check-backs, exactly once
across crashes (docs/transactions.md).

Everything it remembers lives in the store, in three system topics (:mod:`.names`), so it is as
durable as any acknowledged message, tiers with the rest and comes back with a restore:

* :data:`HALF_TOPIC` — the half messages, in put order. A start reads it from the progress
  record's ``HALF_FROM`` into the pending set (metadata only: bodies are read back when a commit
  needs them, from whichever tier holds them).
* :data:`OP_TOPIC` — one record per fact about a half: ``CHECK`` (a check-back was asked; its
  count, so a restart neither forgets nor resets it), ``COMMIT``, ``ROLLBACK``. A resolution is
  durable *before* the caller hears of it.
* :data:`PROGRESS_TOPIC` — ``HALF_FROM`` (every half below it is resolved) and ``OP_FROM`` (no
  record below it is about a half at or above ``HALF_FROM``). Both only grow, so the last record
  found — even an old one after a restore — is a safe place to start from.

Exactly once: a commit appends the real message (the half's body and properties, its UNIQ_KEY,
and ``__transactionId__``) and waits for it to be durable, then appends the ``COMMIT`` record,
then answers. A crash between the two leaves a half that looks pending; the start looks each
pending half up by its UNIQ_KEY in the real topic's key index (both tiers) and, when a copy with
its transaction id is there, writes the missing ``COMMIT`` instead of ever writing the message
again. A rollback writes only its record: nothing reached the real topic.

Concurrency: everything runs on the store's event loop; one lock per pending transaction
serialises its commit, rollback and check, so a commit racing a rollback resolves once and the
other caller is told how (``transaction_resolved``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tierd.consumption.offsets import check_group
from tierd.errors import (
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidTopicError,
    NotReadyError,
    TransactionResolvedError,
    UnknownTransactionError,
)
from tierd.format.properties import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from tierd.local.validation import check_queue, check_topic
from tierd.message import GetStatus, Message, PutResult, ReadPolicy
from tierd.repeats import FailureLog
from tierd.systopics import is_system_topic, system_copy
from tierd.transactions.names import (
    HALF_ONLY,
    HALF_TOPIC,
    OP_TAG,
    OP_TOPIC,
    PROGRESS_TOPIC,
    PROPERTY_CHECKS,
    PROPERTY_HALF_FROM,
    PROPERTY_HALF_OFFSET,
    PROPERTY_OP,
    PROPERTY_OP_FROM,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_REASON,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    Op,
    Reason,
    Resolution,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from tierd.config import TierdConfig
    from tierd.format.message_ext import MessageExt
    from tierd.local.store import HotStore
    from tierd.router import TierRouter
    from tierd.tiered.service import TieringService

log = logging.getLogger(__name__)
#: Messages read per call when a start reads the system topics.
SCAN_BATCH = 1024
#: Seconds a start waits for the hot store to index what it recovered.
DISPATCH_WAIT = 30.0
#: Pause (s) after a failed start or checker round before trying again.
RETRY_PAUSE = 1.0
#: Longest wait (s) at close for the checker to stop, and for its last progress record.
STOP_WAIT = 10.0
#: Resolved transactions remembered (to answer a late commit "already committed", not "unknown").
REMEMBERED = 100_000
_NEVER = 2**63 - 1


class Host(Protocol):
    """What the coordinator uses of the store facade (no import of :mod:`tierd.store`)."""

    config: TierdConfig
    hot: HotStore
    router: TierRouter
    tiering: TieringService | None


@dataclass(frozen=True, slots=True)
class HalfResult:
    """What sending a half message answers: the id to commit or roll back with."""

    transaction_id: str
    #: The half message's client id (UNIQ_KEY): the committed message keeps it.
    uniq_key: str
    topic: str
    #: Offset message id of the half (in the system topic; not a message consumers will see).
    msg_id: str


@dataclass(frozen=True, slots=True)
class EndResult:
    """How a transaction ended; ``put`` is where the committed message landed (None: rollback)."""

    transaction_id: str
    resolution: Resolution
    put: PutResult | None = None


@dataclass(frozen=True, slots=True)
class PendingTransaction:
    """A transaction waiting for its producer (what a check-back poll lists)."""

    transaction_id: str
    producer_group: str
    topic: str
    queue_id: int | None
    uniq_key: str
    #: When the half message was stored (ms since the epoch).
    stored_at: int
    #: Check-backs asked so far.
    checks: int


@dataclass(slots=True)
class TransactionStats:
    """Counters behind the metrics (docs/metrics.md); plain increments on the store's loop."""

    checks: int = 0
    commits: int = 0
    rollbacks: int = 0
    #: Rollbacks after ``transactions.check_max`` unanswered check-backs (also in ``rollbacks``).
    check_max_rollbacks: int = 0
    #: Commits found written after a crash and recorded (the message was not written again).
    recovered_commits: int = 0


@dataclass(slots=True)
class _Half:
    tid: str
    offset: int
    producer_group: str
    topic: str
    queue_id: int | None
    uniq_key: str
    stored_at: int
    checks: int = 0
    last_check: int = 0
    #: Set once the real message is durable (a failed COMMIT record is then retried alone).
    written: PutResult | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def info(self) -> PendingTransaction:
        return PendingTransaction(
            self.tid,
            self.producer_group,
            self.topic,
            self.queue_id,
            self.uniq_key,
            self.stored_at,
            self.checks,
        )


def transaction_id(offset: int, uniq_key: str) -> str:
    """A transaction's id: its half's offset in :data:`HALF_TOPIC` and its UNIQ_KEY. Both are
    checked against the stored half, so an id of another store or a typo is "unknown", never
    another transaction resolved."""
    return f"{offset}-{uniq_key}"


class TransactionCoordinator:
    """Runs on the store's event loop; every coroutine below is awaited there."""

    def __init__(self, host: Host) -> None:
        self.host = host
        cfg = host.config.transactions
        self.timeout_ms = int(cfg.transaction_timeout * 1000)
        self.interval_ms = int(cfg.check_interval * 1000)
        self.check_max = cfg.check_max
        self.stats = TransactionStats()
        self._pending: dict[str, _Half] = {}
        self._remembered: collections.OrderedDict[str, Resolution] = collections.OrderedDict()
        #: Half offset -> offset of the first op record about it (pending or resolved halves at or
        #: above the last progress: what the next progress record's OP_FROM must keep).
        self._first_op: dict[int, int] = {}
        #: Appends in flight: token -> the system topic's end offset before it (a lower bound
        #: of where it lands, until its offset is known).
        self._half_floor: dict[object, int] = {}
        self._op_floor: dict[object, int] = {}
        self._saved: tuple[int, int] = (-1, -1)
        self._listeners: list[Callable[[PendingTransaction], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._load_lock = asyncio.Lock()
        #: Set once the start-up read of the system topics is done.
        self.started = asyncio.Event()
        self._failures = FailureLog(log, "transaction checker")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the checker task on the running loop (it loads first)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tierd-transactions")

    async def stop(self) -> None:
        """Stop the checker and write a last progress record (a clean restart reads less).
        Bounded by :data:`STOP_WAIT` each: a close never hangs here, and never leaves the task
        pending on a loop about to close."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STOP_WAIT)
        if not done:  # stuck in a call that ignores cancellation: close goes on without it
            log.error("transactions: the checker did not stop within %g s; closing without it", STOP_WAIT)
            return
        await asyncio.gather(task, return_exceptions=True)
        if self.started.is_set() and not self.host.hot.closed:
            try:
                await asyncio.wait_for(self._save_progress(), STOP_WAIT)
            except Exception as e:  # the next start reads a little more; nothing is lost
                log.warning("transactions: last progress record not written (%s)", e or type(e).__name__)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def subscribe(self, listener: Callable[[PendingTransaction], None]) -> Callable[[], None]:
        """Call ``listener`` (on the loop, must not block) with each check-back asked; returns
        the function that unsubscribes. The gRPC telemetry streams listen here."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # ------------------------------------------------------------------ producer side
    async def prepare(self, message: Message, producer_group: str) -> HalfResult:
        """Store ``message`` as a half message of ``producer_group``: durable, invisible in its
        topic until :meth:`end` commits it."""
        group = check_group(producer_group)
        topic = check_topic(message.topic)
        if is_system_topic(topic):
            raise InvalidTopicError(f"topic {topic!r} is a system topic", topic=topic)
        if message.queue_id is not None:
            check_queue(message.queue_id, self.host.config.store.max_queues)
        props = dict(message.properties)
        clash = sorted(k for k in props if k in HALF_ONLY or k == PROPERTY_TRANSACTION_ID)
        if clash:
            raise InvalidPropertiesError(
                f"property {clash[0]!r} is the store's own on a transactional message", name=clash[0]
            )
        await self.wait_started()
        uniq = props.get(PROPERTY_UNIQ_KEY) or uuid.uuid4().hex.upper()
        props[PROPERTY_UNIQ_KEY] = uniq
        props[PROPERTY_REAL_TOPIC] = topic
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
        props[PROPERTY_PRODUCER_GROUP] = group
        if message.queue_id is not None:
            props[PROPERTY_REAL_QID] = str(message.queue_id)
        half = system_copy(message, HALF_TOPIC, props)
        res = await self._append(half, self._half_floor, HALF_TOPIC)
        tid = transaction_id(res.queue_offset, uniq)
        self._pending[tid] = _Half(tid, res.queue_offset, group, topic, message.queue_id, uniq, _now())
        return HalfResult(tid, uniq, topic, res.msg_id)

    async def end(
        self, transaction_id: str, resolution: Resolution | str, reason: Reason = Reason.PRODUCER
    ) -> EndResult:
        """Commit (the message becomes visible in its topic, once) or roll back (it never does).
        Durable before it returns. UnknownTransactionError for an id with no pending half,
        TransactionResolvedError (saying how) for one already resolved."""
        if not isinstance(transaction_id, str) or not transaction_id:
            raise InvalidArgumentError(
                f"transaction id must be a non-empty string, got {transaction_id!r}",
                transaction_id=repr(transaction_id),
            )
        how = Resolution.parse(resolution)
        await self.wait_started()
        h = self._pending.get(transaction_id)
        if h is None:
            raise self._not_pending(transaction_id)
        async with h.lock:
            if self._pending.get(transaction_id) is not h:
                raise self._not_pending(transaction_id)
            asked = how
            if h.written is not None:
                how = Resolution.COMMIT  # visible already (its record failed): only a commit is true
            elif how is Resolution.COMMIT:
                h.written = await self._put(self._real_message(h, await self._half_message(h)))
            await self._op(h, Op(how.value), reason)
            self._resolve(h, how, reason)
        if how is not asked:
            raise self._not_pending(transaction_id)
        return EndResult(h.tid, how, h.written)

    def pending(self, producer_group: str | None = None, *, due: bool = False) -> list[PendingTransaction]:
        """Pending transactions (of one producer group), oldest first; ``due``: only those older
        than ``transactions.transaction_timeout`` — what a producer polling for check-backs
        should answer."""
        if producer_group is not None:
            check_group(producer_group)
        if not self.started.is_set():
            raise NotReadyError("transactions are still loading; retry shortly", retry_after=1)
        limit = _now() - self.timeout_ms
        return [
            h.info()
            for h in sorted(self._pending.values(), key=lambda h: h.offset)
            if (producer_group is None or h.producer_group == producer_group)
            and (not due or h.stored_at <= limit)
        ]

    async def half(self, transaction_id: str) -> MessageExt:
        """The half message of a pending transaction (a check-back shows it to the producer)."""
        await self.wait_started()
        h = self._pending.get(transaction_id)
        if h is None:
            raise self._not_pending(transaction_id)
        return await self._half_message(h)

    # ------------------------------------------------------------------ internals
    async def wait_started(self) -> None:
        timeout = self.host.config.tiered.ready_timeout
        if self.started.is_set():
            return
        if self._task is None:  # no checker on this store: load in place
            await self._load()
            return
        try:
            await asyncio.wait_for(self.started.wait(), timeout)
        except TimeoutError:
            raise NotReadyError(
                f"transactions are still loading after {timeout:g} s (tiered.ready_timeout); retry shortly",
                retry_after=5,
            ) from None

    def _not_pending(self, tid: str) -> Exception:
        done = self._remembered.get(tid)
        if done is not None:
            word = "committed" if done is Resolution.COMMIT else "rolled back"
            return TransactionResolvedError(
                f"transaction {tid!r} was already {word}", transaction_id=tid, resolution=done.value
            )
        return UnknownTransactionError(
            f"no transaction {tid!r} is pending: never begun on this store, or resolved long ago",
            transaction_id=tid,
        )

    async def _put(self, message: Message) -> PutResult:
        res, fut = self.host.hot.put(message)
        if fut is not None:
            await asyncio.wrap_future(fut)
        return res

    async def _append(self, message: Message, floors: dict[object, int], topic: str) -> PutResult:
        """Append to a system topic, keeping its end offset as a floor while the append is in
        flight (the progress record must not pass a record whose offset is not known yet)."""
        token = object()
        floors[token] = self.host.router.max_offset(topic, 0)
        try:
            return await self._put(message)
        finally:
            del floors[token]

    async def _op(self, h: _Half, op: Op, reason: Reason | None = None) -> None:
        props = {
            PROPERTY_TRANSACTION_ID: h.tid,
            PROPERTY_OP: op.value,
            PROPERTY_HALF_OFFSET: str(h.offset),
            PROPERTY_CHECKS: str(h.checks),
        }
        if reason is not None:
            props[PROPERTY_REASON] = reason.value
        msg = Message(topic=OP_TOPIC, body=h.tid.encode(), queue_id=0, tags=OP_TAG, properties=props)
        res = await self._append(msg, self._op_floor, OP_TOPIC)
        self._first_op.setdefault(h.offset, res.queue_offset)

    def _resolve(self, h: _Half, how: Resolution, reason: Reason) -> None:
        self._pending.pop(h.tid, None)
        self._remembered[h.tid] = how
        while len(self._remembered) > REMEMBERED:
            self._remembered.popitem(last=False)
        if how is Resolution.COMMIT:
            self.stats.commits += 1
            if reason is Reason.RECOVERED:
                self.stats.recovered_commits += 1
        else:
            self.stats.rollbacks += 1
            if reason is Reason.CHECK_MAX:
                self.stats.check_max_rollbacks += 1
                log.warning(
                    "transaction %s of producer group %s rolled back: no answer to %d check-backs "
                    "(transactions.check_max)",
                    h.tid,
                    h.producer_group,
                    h.checks,
                )

    async def _read(self, topic: str, offset: int, count: int) -> tuple[GetStatus, list[MessageExt], int]:
        policy = ReadPolicy(self.host.config.tiered.storage_level)
        r = await self.host.router.get(topic, 0, offset, count, policy)
        return r.status, list(r.messages), r.next_offset

    async def _half_message(self, h: _Half) -> MessageExt:
        status, msgs, _ = await self._read(HALF_TOPIC, h.offset, 1)
        if status is not GetStatus.FOUND or not msgs or msgs[0].uniq_key != h.uniq_key:
            raise UnknownTransactionError(
                f"the half message of transaction {h.tid!r} is gone (retention freed it in both tiers, "
                f"or damage): it cannot be committed ({status.value})",
                transaction_id=h.tid,
            )
        return msgs[0]

    def _real_message(self, h: _Half, m: MessageExt) -> Message:
        """The message as its producer sent it, for its real topic and queue, plus the id of the
        transaction that committed it."""
        kept = {
            k: v
            for k, v in m.properties.items()
            if k not in HALF_ONLY and k != PROPERTY_KEYS and k != PROPERTY_TAGS  # indexed from keys=
        }
        kept[PROPERTY_TRANSACTION_ID] = h.tid
        return Message(
            topic=h.topic,
            body=m.body,
            queue_id=h.queue_id,
            keys=m.keys,
            tags=m.tags,
            properties=kept,
            flag=m.flag,
            born_host=m.born_host,
            born_timestamp=m.born_timestamp,
        )

    # ------------------------------------------------------------------ start-up
    async def _scan(self, topic: str, start: int) -> AsyncIterator[MessageExt]:
        router = self.host.router
        end = router.max_offset(topic, 0)
        offset = max(start, router.min_offset(topic, 0))
        while offset < end:
            status, msgs, nxt = await self._read(topic, offset, min(SCAN_BATCH, end - offset))
            for m in msgs:
                yield m
            if nxt <= offset:
                low = router.min_offset(topic, 0)
                if low <= offset:
                    log.error("transactions: %s stops at offset %d (%s)", topic, offset, status.value)
                    return
                nxt = low  # retention freed what was below: go on from what is left
            offset = nxt

    async def _load(self) -> None:
        """Read the progress, the halves and the op records; record commits a crash left
        without their record. Idempotent (concurrent callers wait for one load)."""
        async with self._load_lock:
            if self.started.is_set():
                return
            t = self.host.tiering
            if t is not None:
                await t.wait_ready()
            await asyncio.to_thread(self.host.hot.require_dispatched, DISPATCH_WAIT, "transactions")
            half_from, op_from = await self._last_progress()
            pending: dict[str, _Half] = {}
            by_offset: dict[int, _Half] = {}
            async for m in self._scan(HALF_TOPIC, half_from):
                h = _from_half(m)
                if h is not None:
                    pending[h.tid] = by_offset[h.offset] = h
            async for m in self._scan(OP_TOPIC, op_from):
                self._apply_op(m, by_offset, pending, half_from)
            self._pending = pending
            self._saved = (half_from, op_from)
            for h in list(pending.values()):
                if await self._committed_before(h):
                    await self._op(h, Op.COMMIT, Reason.RECOVERED)
                    self._resolve(h, Resolution.COMMIT, Reason.RECOVERED)
                    log.info(
                        "transaction %s: its committed message was written before a crash; recorded", h.tid
                    )
            self.started.set()
            log.info(
                "transactions: %d pending (read from half offset %d, op offset %d)",
                len(pending),
                half_from,
                op_from,
            )

    def _apply_op(
        self, m: MessageExt, by_offset: dict[int, _Half], pending: dict[str, _Half], floor: int
    ) -> None:
        props = m.properties
        try:
            offset = int(props[PROPERTY_HALF_OFFSET])
            op = Op(props[PROPERTY_OP])
        except (KeyError, ValueError):
            log.error("transactions: unreadable op record at offset %d; ignored", m.queue_offset)
            return
        if offset < floor:
            return  # about a half resolved before the last progress record
        self._first_op.setdefault(offset, m.queue_offset)
        h = by_offset.get(offset)
        tid = props.get(PROPERTY_TRANSACTION_ID)
        if h is None or h.tid != tid:
            if tid is not None and op is not Op.CHECK:
                self._remembered[tid] = Resolution(op.value)
            return
        if op is Op.CHECK:
            h.checks = max(h.checks, int(props.get(PROPERTY_CHECKS, "0") or 0))
            h.last_check = m.store_timestamp
        elif h.tid in pending:
            del pending[h.tid]
            self._remembered[h.tid] = Resolution(op.value)

    async def _committed_before(self, h: _Half) -> bool:
        """Whether the real topic holds this transaction's message already (a crash between
        writing it and its COMMIT record): looked up by UNIQ_KEY in the key index, both tiers."""
        found = await self.host.router.query(h.topic, h.uniq_key, 64, 0, _NEVER)
        return any(m.properties.get(PROPERTY_TRANSACTION_ID) == h.tid for m in found)

    async def _last_progress(self) -> tuple[int, int]:
        end = self.host.router.max_offset(PROGRESS_TOPIC, 0)
        if end <= self.host.router.min_offset(PROGRESS_TOPIC, 0):
            return 0, 0
        status, msgs, _ = await self._read(PROGRESS_TOPIC, end - 1, 1)
        if status is not GetStatus.FOUND or not msgs:
            log.error("transactions: last progress record unreadable (%s); reading every half", status.value)
            return 0, 0
        try:
            p = msgs[0].properties
            return int(p[PROPERTY_HALF_FROM]), int(p[PROPERTY_OP_FROM])
        except (KeyError, ValueError):
            log.error("transactions: last progress record unreadable; reading every half")
            return 0, 0

    def progress(self) -> tuple[int, int]:
        """(HALF_FROM, OP_FROM) as of now (see the module doc)."""
        router = self.host.router
        half_from = min(
            [h.offset for h in self._pending.values()]
            + list(self._half_floor.values())
            + [router.max_offset(HALF_TOPIC, 0)]
        )
        for offset in [o for o in self._first_op if o < half_from]:
            del self._first_op[offset]
        op_from = min(
            list(self._first_op.values()) + list(self._op_floor.values()) + [router.max_offset(OP_TOPIC, 0)]
        )
        return half_from, op_from

    async def _save_progress(self) -> None:
        p = self.progress()
        if p == self._saved:
            return
        props = {PROPERTY_HALF_FROM: str(p[0]), PROPERTY_OP_FROM: str(p[1])}
        await self._put(Message(topic=PROGRESS_TOPIC, body=b"", queue_id=0, properties=props))
        self._saved = p

    # ------------------------------------------------------------------ check-back
    async def check_round(self) -> int:
        """Ask about every transaction due (older than ``transaction_timeout``, not asked within
        ``check_interval``); roll back those asked ``check_max`` times already. Returns how many
        were asked or rolled back."""
        now = _now()
        acted = 0
        for h in sorted(self._pending.values(), key=lambda h: h.offset):
            if now - h.stored_at < self.timeout_ms or (
                h.last_check and now - h.last_check < self.interval_ms
            ):
                continue
            if h.lock.locked():
                continue  # being resolved right now
            async with h.lock:
                if self._pending.get(h.tid) is not h:
                    continue
                acted += 1
                if h.written is not None:  # written, its record failed: it is committed
                    await self._op(h, Op.COMMIT, Reason.RECOVERED)
                    self._resolve(h, Resolution.COMMIT, Reason.RECOVERED)
                    continue
                if h.checks >= self.check_max:
                    await self._op(h, Op.ROLLBACK, Reason.CHECK_MAX)
                    self._resolve(h, Resolution.ROLLBACK, Reason.CHECK_MAX)
                    continue
                h.checks += 1
                h.last_check = now
                await self._op(h, Op.CHECK)
                self.stats.checks += 1
            info = h.info()
            for listener in list(self._listeners):
                try:
                    listener(info)
                except Exception:
                    log.exception("transactions: a check-back listener failed")
        return acted

    async def _run(self) -> None:
        tick = min(self.interval_ms, self.timeout_ms) / 1000
        while True:
            try:
                if not self.started.is_set():
                    await self._load()
                await self.check_round()
                await self._save_progress()
                self._failures.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self.host.hot.closed:
                    return
                self._failures.failed(e, f"retrying in {RETRY_PAUSE:g} s")
                await asyncio.sleep(RETRY_PAUSE)
                continue
            await asyncio.sleep(tick)


def _from_half(m: MessageExt) -> _Half | None:
    props = m.properties
    topic, group, uniq = props.get(PROPERTY_REAL_TOPIC), props.get(PROPERTY_PRODUCER_GROUP), m.uniq_key
    if topic is None or group is None or uniq is None:
        log.error("transactions: half message at offset %d lacks its properties; ignored", m.queue_offset)
        return None
    qid = props.get(PROPERTY_REAL_QID)
    tid = transaction_id(m.queue_offset, uniq)
    return _Half(
        tid, m.queue_offset, group, topic, int(qid) if qid is not None else None, uniq, m.store_timestamp
    )


def _now() -> int:
    return time.time_ns() // 1_000_000
