"""Receive / ack consumption (RocketMQ 5's "pop"): leases on delivered messages, durable acks,
redelivery after the invisible time, and the committed prefix in the shared offset store.

Per (group, topic, queue) the state is:

* ``committed`` — the next offset not yet consumed; every offset below it is acked (or filtered
  out). It is the group's committed offset in :class:`~tierd.consumption.offsets.ConsumerOffsets`, so
  ``tierd groups`` shows gRPC groups next to HTTP ones, and ``tierd groups reset`` moves it.
* ``cursor`` — the next offset never delivered.
* ``done`` — offsets at or above ``committed`` that are consumed (acked, or skipped by the tag
  filter), as merged intervals: the committed prefix moves over them as soon as it reaches them.
* ``leases`` — delivered, not yet acked offsets: when each becomes visible again, the delivery
  attempt so far and the nonce that the current receipt handle carries.

Durability (the rule of docs/grpc.md): an ack answered OK is never redelivered. Every ack is
appended to ``{store.dir}/consumption/acks.log`` and fsynced *before* the answer; a restart
reads the journal back, so acked offsets above the committed prefix stay consumed. Leases are
memory only: after a restart every un-acked message is visible at once (at-least-once).

The committed prefix reaches the offset store lazily: at most :data:`COMMIT_DELAY` after it
moved, in one write for every queue that moved meanwhile, rather than one offsets-file rewrite
(two fsyncs) per ack. The journal is what makes an ack durable, so the lag costs nothing on a
crash: the journal is compacted only after the prefixes it covers are written, and a restart
moves the prefix over the journaled offsets again. Readers of the offset store (``tierd
groups``, HTTP) see a receive / ack group's offset up to that long after the ack.

Dead letters: a message whose lease expires after ``max_attempts`` deliveries is not delivered
again but copied to the topic ``%DLQ%<group>`` (RocketMQ's name), then acked in its own topic —
in that order, so a crash between the two costs a second copy at most, never the message; the
copy is skipped when ``%DLQ%<group>`` already holds one with the same message id.

FIFO: a message carrying a message group (``__SHARDINGKEY``, all of one group in one queue) is
delivered only when no earlier message of its queue with the same group is in flight: a group's
next message waits until the previous one is acked or moved to the dead-letter topic.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tierd.consumption.longpoll import ANY_QUEUE
from tierd.consumption.offsets import check_group, write_atomically
from tierd.consumption.subscription import parse_tags
from tierd.errors import InvalidArgumentError, NotFoundError
from tierd.format.properties import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from tierd.local.validation import check_topic
from tierd.message import GetStatus, Message
from tierd.repeats import FailureLog

if TYPE_CHECKING:
    from tierd.consumption.subscription import TagFilter
    from tierd.format.message_ext import MessageExt
    from tierd.store import MessageStore

log = logging.getLogger(__name__)

QueueKey = tuple[str, str, int]  # (group, topic, queue id)
_commit_failures = FailureLog(log, "committing receive / ack offsets")
#: Journal lines kept beyond the live ones before the journal is rewritten with only those.
COMPACT_SLACK = 10_000
#: Longest a moved committed prefix waits before it is written to the offset store (s).
COMMIT_DELAY = 0.2
#: Longest the shutdown waits to write them (s).
CLOSE_TIMEOUT = 10.0
#: Shortest and longest invisible duration (s). The RocketMQ proxy's floor is 10 s; tierd accepts
#: one second so short-lived leases (tests, fast retries) work.
MIN_INVISIBLE = 1.0
MAX_INVISIBLE = 12 * 3600.0
#: Most messages one receive returns.
MAX_BATCH = 1024
#: RocketMQ's MessageConst.PROPERTY_SHARDING_KEY: a FIFO message's group.
PROPERTY_MESSAGE_GROUP = "__SHARDINGKEY"
#: Properties RocketMQ puts on a dead-letter copy: where it came from and how often it was tried.
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"


class InvalidReceiptHandleError(InvalidArgumentError):
    """A receipt handle that this store did not hand out for this group and topic, or whose
    message was redelivered since (a newer handle supersedes it)."""

    code = "invalid_receipt_handle"


class TopicNotFoundError(NotFoundError):
    """A topic that does not exist, where topics are not created on first use."""

    code = "topic_not_found"


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group, as RocketMQ names it."""
    return f"%DLQ%{group}"


def message_id(ext: MessageExt) -> str:
    """The id a client knows a message by: the producer's (``UNIQ_KEY``), else the offset id."""
    return ext.properties.get(PROPERTY_UNIQ_KEY) or ext.msg_id


def dead_letter(ext: MessageExt, group: str, attempts: int) -> Message:
    """The copy of ``ext`` that goes to ``group``'s dead-letter topic: same body, id, keys, tag
    and properties, plus the origin topic and message id and the retries made
    (``RECONSUME_TIME`` = deliveries - 1, as RocketMQ counts)."""
    props = {k: v for k, v in ext.properties.items() if k not in (PROPERTY_KEYS, PROPERTY_TAGS)}
    mid = message_id(ext)
    props[PROPERTY_UNIQ_KEY] = mid
    props[PROPERTY_DLQ_ORIGIN_TOPIC] = ext.topic
    props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = mid
    props[PROPERTY_RECONSUME_TIME] = str(max(0, attempts - 1))
    keys = ext.properties.get(PROPERTY_KEYS, "")
    return Message(
        topic=dlq_topic(group),
        body=ext.body,
        queue_id=0,  # a dead-letter topic has one queue, as RocketMQ's
        keys=tuple(k for k in keys.split(KEY_SEPARATOR) if k),
        tags=ext.properties.get(PROPERTY_TAGS) or None,
        properties=props,
        born_timestamp=ext.born_timestamp,
    )


def valid_topic(topic: str) -> str:
    """The topic name, or :class:`~tierd.errors.InvalidTopicError` naming what is wrong."""
    return check_topic(topic)


def check_invisible(seconds: float) -> float:
    if not MIN_INVISIBLE <= seconds <= MAX_INVISIBLE:
        raise InvalidArgumentError(
            f"invisible duration must be between {MIN_INVISIBLE:.0f} s and {MAX_INVISIBLE:.0f} s, "
            f"got {seconds} s",
            invisible_duration=seconds,
        )
    return seconds


@dataclass(slots=True)
class Lease:
    visible_at: float
    attempt: int
    nonce: str
    #: The message group of a FIFO message (its group's next message waits for this one).
    group: str | None = None


@dataclass(slots=True)
class _Queue:
    committed: int
    cursor: int
    #: The committed offset last written to the offset store (behind ``committed`` for at most
    #: COMMIT_DELAY): the store holding anything else means someone else moved it (a reset).
    written: int
    done: list[tuple[int, int]] = field(default_factory=list)
    leases: dict[int, Lease] = field(default_factory=dict)

    def is_done(self, offset: int) -> bool:
        if offset < self.committed:
            return True
        i = bisect.bisect_right(self.done, (offset, 1 << 62)) - 1
        return i >= 0 and self.done[i][0] <= offset < self.done[i][1]

    def mark_done(self, start: int, end: int) -> None:
        """Consume [start, end) and move the committed prefix over whatever it now reaches."""
        start = max(start, self.committed)
        if start >= end:
            return
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*self.done, (start, end)]):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        while merged and merged[0][0] <= self.committed:
            self.committed = max(self.committed, merged.pop(0)[1])
        self.done = merged
        self.cursor = max(self.cursor, self.committed)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to a consumer, with what its receipt handle names."""

    message: MessageExt
    attempt: int
    handle: str
    invisible: float


def encode_handle(group: str, topic: str, queue_id: int, offset: int, nonce: str) -> str:
    raw = f"{group}\t{topic}\t{queue_id}\t{offset}\t{nonce}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_handle(handle: str) -> tuple[str, str, int, int, str]:
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
        group, topic, queue, offset, nonce = raw.split("\t")
        return group, topic, int(queue), int(offset), nonce
    except (binascii.Error, UnicodeDecodeError, ValueError) as e:
        raise InvalidReceiptHandleError(
            f"receipt handle {handle[:80]!r} was not handed out by this store", handle=handle[:80]
        ) from e


class AckJournal:
    """Append-only, fsynced record of acks above the committed prefix (one line per ack:
    ``group TAB topic TAB queue TAB offset``). A torn last line (a crash mid-write) belongs to
    an ack that was never answered, and is dropped when read."""

    def __init__(self, store_dir: Path) -> None:
        self.path = store_dir / "consumption" / "acks.log"
        self.lines = 0
        #: Entries waiting for the next write, and the future their callers await.
        self._pending: list[tuple[QueueKey, int]] = []
        self._next: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        #: One file operation at a time: a rewrite must not replace the file under an append.
        self._io = asyncio.Lock()

    def load(self) -> dict[QueueKey, list[int]]:
        out: dict[QueueKey, list[int]] = {}
        try:
            text = self.path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return out
        for line in text.split("\n"):
            parts = line.split("\t")
            if len(parts) != 4:
                continue
            try:
                key, offset = (parts[0], parts[1], int(parts[2])), int(parts[3])
            except ValueError:
                continue
            out.setdefault(key, []).append(offset)
            self.lines += 1
        return out

    def append(self, entries: list[tuple[QueueKey, int]]) -> None:
        """Durable when this returns (runs in a worker thread)."""
        data = "".join(f"{g}\t{t}\t{q}\t{o}\n" for (g, t, q), o in entries).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.lines += len(entries)

    async def write(self, entries: list[tuple[QueueKey, int]]) -> None:
        """Durable when this returns. Group commit: entries that arrive while a write is being
        fsynced go out together in the next one, so concurrent acks share an fsync instead of
        queueing for one each."""
        if not entries:
            return
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        done = self._next
        self._pending.extend(entries)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(), name="tierd-ack-journal")
        await asyncio.shield(done)

    async def _drain(self) -> None:
        while self._pending:
            batch, done = self._pending, self._next
            self._pending, self._next = [], None
            assert done is not None
            try:
                async with self._io:
                    await asyncio.to_thread(self.append, batch)
            except Exception as e:  # each waiting ack reports it; none is answered OK
                done.set_exception(e)
                done.exception()  # retrieved: no "never retrieved" warning when all gave up
            else:
                done.set_result(None)

    async def compact(self, live: list[tuple[QueueKey, int]]) -> None:
        async with self._io:
            await asyncio.to_thread(self.rewrite, live)

    def rewrite(self, live: list[tuple[QueueKey, int]]) -> None:
        data = "".join(f"{g}\t{t}\t{q}\t{o}\n" for (g, t, q), o in live).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, data)
        self.lines = len(live)


class Inflight:
    """The receive / ack state of every gRPC consumer group of one store (one event loop)."""

    def __init__(self, store: MessageStore, max_attempts: int) -> None:
        self.store = store
        #: Deliveries of a message before it moves to the group's dead-letter topic.
        self.max_attempts = max_attempts
        self._now = time.monotonic
        self.journal = AckJournal(Path(store.config.store.dir))
        self._acked_on_disk = self.journal.load()
        #: Acks being written to the journal (outside the lock): never redelivered meanwhile.
        self._acking: set[tuple[QueueKey, int]] = set()
        self._queues: dict[QueueKey, _Queue] = {}
        self._lock = asyncio.Lock()
        #: Redeliveries so far (a metric).
        self.redeliveries = 0
        #: Messages moved to a dead-letter topic so far (a metric).
        self.dead_letters = 0
        #: Receives waiting per (group, topic): woken when a FIFO message is acked or moved, so
        #: the next message of its group is delivered at once, not at the end of the long poll.
        self._waiting: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        #: Queues whose committed prefix moved since it was last written, and the task that
        #: writes them COMMIT_DELAY later.
        self._moved: set[QueueKey] = set()
        self._writer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ state
    async def _queue(self, group: str, topic: str, queue_id: int) -> _Queue:
        """The queue's state, in step with the committed-offset store: a reset made by
        ``tierd groups reset`` (or an HTTP consumer of the same group) restarts it there."""
        key = (group, topic, queue_id)
        stored = self.store.committed_offsets(group).get((topic, queue_id))
        q = self._queues.get(key)
        if q is not None and stored is not None and stored != q.written:
            log.info("group %s moved on %s/%d to offset %d; leases dropped", group, topic, queue_id, stored)
            q = None
        if q is None:
            if stored is None:
                stored = self._start_offset(topic, queue_id)
                await self.store.commit_offset(group, topic, queue_id, stored)
            q = _Queue(committed=stored, cursor=stored, written=stored)
            for offset in self._acked_on_disk.pop(key, []):
                q.mark_done(offset, offset + 1)
            if q.committed != stored:
                await self.store.commit_offset(group, topic, queue_id, q.committed)
                q.written = q.committed
            self._queues[key] = q
        return q

    def _start_offset(self, topic: str, queue_id: int) -> int:
        """Where a new group starts, as the RocketMQ proxy's pop does (``ConsumeInitMode.MAX``,
        with the broker's check for a queue still whole from its first message): at the start
        of a queue that still holds offset 0, else at its end."""
        low = self.store.min_offset(topic, queue_id)
        return low if low == 0 else self.store.max_offset(topic, queue_id)

    # ------------------------------------------------------------------ receive
    async def receive(
        self,
        group: str,
        topic: str,
        tags: str | TagFilter | None,
        batch: int,
        invisible: float,
        wait: float,
    ) -> list[Delivery]:
        """Up to ``batch`` visible messages of ``topic`` across its queues: expired leases first
        (attempt + 1), then new ones. When none is visible, wait up to ``wait`` seconds for an
        arrival or a lease to expire."""
        group, topic = check_group(group), valid_topic(topic)
        flt = parse_tags(tags)
        check_invisible(invisible)
        if not 1 <= batch <= MAX_BATCH:
            raise InvalidArgumentError(f"batch size must be 1 to {MAX_BATCH}, got {batch}", batch=batch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait)
        arrivals = self.store.arrivals
        while True:
            queue_ids = self.store.queue_ids(topic)
            # Woken by a message in any queue of the topic, also one that held nothing when
            # this read began (a producer's round-robin reaches it next).
            futures = [((topic, ANY_QUEUE), arrivals.register((topic, ANY_QUEUE)))]
            released: asyncio.Future[None] = loop.create_future()
            self._waiting.setdefault((group, topic), set()).add(released)
            try:
                async with self._lock:
                    out = await self._collect(group, topic, queue_ids, flt, batch, invisible)
                left = deadline - loop.time()
                if out or left <= 0 or arrivals.released:
                    return out
                expiry = self._next_expiry(group, topic)
                if expiry is not None:
                    left = min(left, max(0.01, expiry - self._now()))
                await asyncio.wait(
                    [released, *(f for _, f in futures)], timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for key, fut in futures:
                    arrivals.unregister(key, fut)
                waiting = self._waiting.get((group, topic))
                if waiting is not None:
                    waiting.discard(released)
                    if not waiting:
                        del self._waiting[(group, topic)]

    def _next_expiry(self, group: str, topic: str) -> float | None:
        times = [
            lease.visible_at
            for (g, t, _), q in self._queues.items()
            if g == group and t == topic
            for lease in q.leases.values()
        ]
        return min(times, default=None)

    async def _collect(
        self, group: str, topic: str, queue_ids: list[int], flt: TagFilter, batch: int, invisible: float
    ) -> list[Delivery]:
        now = self._now()
        out: list[Delivery] = []
        states = [(q, await self._queue(group, topic, q)) for q in queue_ids]
        # Expired leases first: a message not acked in time is visible again, attempt + 1.
        for queue_id, q in states:
            for offset, lease in sorted(q.leases.items()):
                if len(out) >= batch:
                    return out
                if lease.visible_at > now or ((group, topic, queue_id), offset) in self._acking:
                    continue
                r = await self.store.get(topic, queue_id, offset, 1)
                if not r.messages or r.messages[0].queue_offset != offset:
                    q.leases.pop(offset)  # gone (retention): nothing left to deliver
                    q.mark_done(offset, offset + 1)
                    continue
                if lease.attempt >= self.max_attempts:
                    await self._dead_letter(group, (group, topic, queue_id), r.messages[0], lease.attempt)
                    continue
                self.redeliveries += 1
                out.append(self._lease(group, q, r.messages[0], lease.attempt + 1, invisible, now))
        # Then new messages, queue by queue from a rotating start so no queue starves.
        start = int(now * 1000) % len(states) if states else 0
        for queue_id, q in states[start:] + states[:start]:
            # FIFO: message groups with a message in flight in this queue wait for it.
            busy = {lease.group for lease in q.leases.values() if lease.group is not None}
            while len(out) < batch:
                r = await self.store.get(topic, queue_id, q.cursor, batch - len(out), tags=flt)
                fresh: list[MessageExt] = []
                held = None
                for m in r.messages:
                    if q.is_done(m.queue_offset):
                        continue
                    mgroup = m.properties.get(PROPERTY_MESSAGE_GROUP)
                    if mgroup and mgroup in busy:
                        held = m.queue_offset  # everything from here on waits, in order
                        break
                    if mgroup:
                        busy.add(mgroup)
                    fresh.append(m)
                before = q.cursor
                if held is not None:
                    q.cursor = held
                elif r.messages:
                    q.cursor = r.messages[-1].queue_offset + 1
                elif r.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.NO_MATCHED_MESSAGE) or (
                    r.status is GetStatus.OFFSET_OVERFLOW_BADLY
                ):
                    q.cursor = max(q.cursor, r.next_offset)
                # What the read moved over without delivering (filtered out, expired) is consumed.
                delivered = {m.queue_offset for m in fresh}
                gap_start = before
                for offset in [*sorted(delivered), q.cursor]:
                    if offset > gap_start:
                        q.mark_done(gap_start, offset)
                    gap_start = offset + 1
                for m in fresh:
                    out.append(self._lease(group, q, m, 1, invisible, now))
                if q.cursor == before or held is not None:
                    break
            await self._commit(group, topic, queue_id, q)
        return out

    def _lease(
        self, group: str, q: _Queue, m: MessageExt, attempt: int, invisible: float, now: float
    ) -> Delivery:
        nonce = secrets.token_hex(6)
        mgroup = m.properties.get(PROPERTY_MESSAGE_GROUP)
        q.leases[m.queue_offset] = Lease(now + invisible, attempt, nonce, mgroup)
        handle = encode_handle(group, m.topic, m.queue_id, m.queue_offset, nonce)
        return Delivery(m, attempt, handle, invisible)

    # ------------------------------------------------------------------ ack / change
    def _leased(self, group: str, topic: str, handle: str) -> tuple[QueueKey, int, Lease | None]:
        g, t, queue_id, offset, nonce = decode_handle(handle)
        if (g, t) != (group, topic):
            raise InvalidReceiptHandleError(
                f"receipt handle belongs to group {g!r} on topic {t!r}, not group {group!r} on {topic!r}",
                handle=handle[:80],
            )
        key = (g, t, queue_id)
        q = self._queues.get(key)
        if q is not None and q.is_done(offset):
            return key, offset, None  # acked already: acking again changes nothing
        lease = q.leases.get(offset) if q is not None else None
        if lease is None or lease.nonce != nonce:
            raise InvalidReceiptHandleError(
                f"receipt handle for {t}/{queue_id} offset {offset} is stale: the message was "
                "delivered again since, or the store restarted (it is visible again)",
                handle=handle[:80],
            )
        return key, offset, lease

    async def ack(self, group: str, topic: str, handles: list[str]) -> list[InvalidReceiptHandleError | None]:
        """Ack each handle; durable (journal fsynced) before this returns. One result per handle:
        None for acked (or acked before), else the error saying why not."""
        async with self._lock:
            results: list[InvalidReceiptHandleError | None] = []
            todo: list[tuple[QueueKey, int]] = []
            for handle in handles:
                try:
                    key, offset, lease = self._leased(group, topic, handle)
                except InvalidReceiptHandleError as e:
                    results.append(e)
                    continue
                results.append(None)
                if lease is not None:  # (also when being acked: OK only once it is durable)
                    todo.append((key, offset))
            self._acking.update(todo)
        # The fsync happens outside the lock, so concurrent acks share one (group commit) and
        # receives go on meanwhile; the offsets being acked are not redelivered in between.
        try:
            await self.journal.write(todo)
            async with self._lock:
                self._apply(todo)
                await self._after_apply(todo)
        finally:
            self._acking.difference_update(todo)
        return results

    async def _consume(self, todo: list[tuple[QueueKey, int]]) -> None:
        """Journal (fsynced) then forget the leases of ``todo``; move the committed prefixes."""
        if not todo:
            return
        await self.journal.write(todo)
        self._apply(todo)
        await self._after_apply(todo)

    def _apply(self, todo: list[tuple[QueueKey, int]]) -> None:
        """Forget the leases of journaled acks and consume their offsets."""
        for key, offset in todo:
            q = self._queues[key]
            lease = q.leases.pop(offset, None)
            q.mark_done(offset, offset + 1)
            if lease is not None and lease.group is not None:  # the group's next may go now
                for fut in self._waiting.get((key[0], key[1]), ()):
                    if not fut.done():
                        fut.set_result(None)

    async def _after_apply(self, todo: list[tuple[QueueKey, int]]) -> None:
        for key in {k for k, _ in todo}:
            await self._commit(*key, self._queues[key])
        await self._compact()

    async def _dead_letter(self, group: str, key: QueueKey, ext: MessageExt, attempts: int) -> None:
        """Copy ``ext`` to ``%DLQ%<group>`` (unless a copy with its id is there: a crash
        between copy and ack), then ack it: the copy is in the store before the ack is."""
        copy = dead_letter(ext, group, attempts)
        mid = copy.properties[PROPERTY_UNIQ_KEY]
        try:
            existing = await self.store.query(copy.topic, mid, 1)
        except NotFoundError:
            existing = []
        if not any(message_id(m) == mid for m in existing):
            await self.store.put(copy)
        await self._consume([(key, ext.queue_offset)])
        self.dead_letters += 1
        log.info(
            "group %s: %s/%d offset %d (message %s) moved to %s after %d deliveries",
            group,
            ext.topic,
            ext.queue_id,
            ext.queue_offset,
            mid,
            copy.topic,
            attempts,
        )

    async def forward_to_dead_letter(self, group: str, topic: str, handle: str, attempts: int) -> None:
        """A push consumer gave up on a delivery (its own retries are spent): move it now."""
        async with self._lock:
            key, offset, lease = self._leased(group, topic, handle)
            if lease is None:
                return  # acked already: nothing to move
            r = await self.store.get(topic, key[2], offset, 1)
            if not r.messages or r.messages[0].queue_offset != offset:
                await self._consume([(key, offset)])  # gone (retention)
                return
            await self._dead_letter(group, key, r.messages[0], max(attempts, lease.attempt))

    async def change_invisible(self, group: str, topic: str, handle: str, invisible: float) -> str:
        """A new receipt handle for the same delivery, visible again ``invisible`` s from now."""
        check_invisible(invisible)
        async with self._lock:
            (g, t, queue_id), offset, lease = self._leased(group, topic, handle)
            if lease is None:
                raise InvalidReceiptHandleError(
                    f"{t}/{queue_id} offset {offset} is acked already", handle=handle[:80]
                )
            lease.visible_at = self._now() + invisible
            lease.nonce = secrets.token_hex(6)
            return encode_handle(g, t, queue_id, offset, lease.nonce)

    async def _commit(self, group: str, topic: str, queue_id: int, q: _Queue) -> None:
        """Write ``q``'s committed prefix to the offset store within COMMIT_DELAY."""
        if q.committed == q.written:
            return
        self._moved.add((group, topic, queue_id))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write_later(), name="tierd-consumption-commit"
            )

    async def _write_later(self) -> None:
        await asyncio.sleep(COMMIT_DELAY)
        async with self._lock:
            try:
                await self._write_moved()
            except Exception as e:  # the journal still has the acks: written at the next move
                _commit_failures.failed(e)

    async def _write_moved(self) -> None:
        """Write every moved committed prefix to the offset store (under ``self._lock``). One
        the store no longer holds as written was moved by someone else (``tierd groups reset``,
        UpdateOffset): left as it is, and :meth:`_queue` restarts from it."""
        moved, self._moved = self._moved, set()
        for key in sorted(moved):
            q = self._queues.get(key)
            if q is None or q.committed == q.written:
                continue
            group, topic, queue_id = key
            stored = self.store.committed_offsets(group).get((topic, queue_id))
            if stored is not None and stored != q.written:
                continue  # (none stored: the group was deleted meanwhile, written again as before)
            try:
                await self.store.commit_offset(group, topic, queue_id, q.committed)
            except BaseException:
                self._moved.add(key)  # tried again at the next write
                raise
            q.written = q.committed

    async def flush(self) -> None:
        """Write every moved committed prefix now: before an offset is read or set through the
        protocol (GetOffset, UpdateOffset), so it reads what was acked and is not overwritten."""
        async with self._lock:
            await self._write_moved()

    async def close(self) -> None:
        """At shutdown: the committed prefixes written (the journal would restore them anyway,
        but ``tierd groups`` on a stopped store then shows where each group is)."""
        if self._writer is not None:
            self._writer.cancel()
        try:
            await asyncio.wait_for(self.flush(), CLOSE_TIMEOUT)
        except TimeoutError:  # the journal has the acks: a restart moves the prefixes
            _commit_failures.failed(
                TimeoutError(f"committed offsets not written within {CLOSE_TIMEOUT} s at shutdown")
            )
        except Exception as e:
            _commit_failures.failed(e)

    async def _compact(self) -> None:
        if self.journal.lines <= COMPACT_SLACK:  # the common case, without building ``live``
            return
        live = [(key, offset) for key, q in self._queues.items() for a, b in q.done for offset in range(a, b)]
        live += [(key, o) for key, offsets in self._acked_on_disk.items() for o in offsets]
        live += self._acking  # journaled (or about to be) but not applied yet: keep them
        if self.journal.lines > COMPACT_SLACK + 4 * len(live):
            # Journal lines below a prefix not yet written are what keeps those acks: write first.
            await self._write_moved()
            await self.journal.compact(live)

    def in_flight(self) -> dict[str, int]:
        """Leased messages per group (a metric)."""
        out: dict[str, int] = {}
        for (group, _, _), q in self._queues.items():
            out[group] = out.get(group, 0) + len(q.leases)
        return out


def unknown_topic(topic: str) -> TopicNotFoundError:
    return TopicNotFoundError(
        f"topic {topic!r} does not exist (grpc.auto_create_topics is false)", topic=topic
    )
