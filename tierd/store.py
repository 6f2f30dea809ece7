"""The public facade: :class:`MessageStore` (asyncio) and :class:`BlockingMessageStore` (scripts).

Writes go to the hot store; reads are routed by read policy across both tiers. The facade
validates arguments and owns lifecycle; it holds no data structures of its own.

Readiness: the cold tier loads in the background after open (the hot store takes writes at
once). Every answer that depends on it — a read's status and offsets, listings, time lookups,
key queries — waits until it has loaded, at most ``tiered.ready_timeout`` seconds, then fails
with the retriable :class:`~tierd.errors.NotReadyError`; it is never answered from the hot tier
alone (a consumer told ``OFFSET_TOO_SMALL`` by a half-loaded store would skip the cold history).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tierd.consumption.groups import ConsumerGroups, GroupInfo
from tierd.consumption.longpoll import ArrivalNotifier
from tierd.consumption.offsets import ConsumerOffsets, check_group
from tierd.consumption.subscription import TagFilter, parse_tags
from tierd.errors import (
    InvalidArgumentError,
    InvalidTopicError,
    NotReadyError,
    ReadOnlyError,
    StoreClosedError,
    TierdError,
)
from tierd.format.properties import PROPERTY_UNIQ_KEY
from tierd.inventory import QueueInfo, SegmentRow, check_kind, live_segments, queue_infos
from tierd.local.store import MAX_GET_COUNT, HotStore, PutBatchResult, byte_bounded_count
from tierd.local.validation import TOPIC_CACHE_MAX, TOPIC_MAX_LENGTH, check_key, check_queue, check_topic
from tierd.lockfile import lock_holder
from tierd.lookup import FoundMessage, check_message_id, find_message
from tierd.message import GetResult, GetStatus, Message, PutResult, ReadPolicy
from tierd.router import TierRouter
from tierd.scheduled.scheduler import Scheduler
from tierd.scheduled.timing import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    SCHEDULE_TOPIC,
    delivery_time,
    handle_text,
    new_uniq_key,
)
from tierd.systopics import is_system_topic, system_copy
from tierd.tiered.dispatcher import TierReport
from tierd.tiered.ownership import OwnerRecord, take_over_unreadable_prefix
from tierd.tiered.roots import backend_for_url
from tierd.tiered.service import TieringService
from tierd.topics import TopicAdmin, TopicInfo
from tierd.topics import restore_table as restore_topic_table
from tierd.traffic import TopicTraffic
from tierd.transactions.coordinator import EndResult, HalfResult, PendingTransaction, TransactionCoordinator
from tierd.transactions.names import Resolution

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
    from types import TracebackType

    from tierd.config import TierdConfig
    from tierd.drivers.segment import BackendObserver
    from tierd.format.message_ext import MessageExt
    from tierd.tiered.dispatcher import DispatchStats
    from tierd.tiered.fetcher import CacheStats
    from tierd.tiered.guard import BackendHealth
    from tierd.tiered.index.results import IndexStats
    from tierd.tiered.restore import Progress, RestoreReport
    from tierd.verify import Progress as VerifyProgress
    from tierd.verify import VerifyReport

MAX_TIMESTAMP = 2**63 - 1
#: Seconds tier_now / gc / verify wait for the hot store to index what was written before them.
DISPATCH_WAIT = 30.0
T = TypeVar("T")
S = TypeVar("S", bound="_StoreCore")
Boundary = Literal["lower", "upper"]
log = logging.getLogger(__name__)
#: Statuses after which a long poll waits: the read is caught up (nothing to return yet).
_CAUGHT_UP = frozenset(
    {GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE}
)


def _policy(policy: ReadPolicy | str | None, default: str) -> ReadPolicy:
    if policy is None:
        return ReadPolicy(default)
    if isinstance(policy, ReadPolicy):
        return policy
    try:
        return ReadPolicy(str(policy).upper())
    except ValueError as e:
        raise InvalidArgumentError(
            f"policy must be one of {', '.join(p.value for p in ReadPolicy)}, got {policy!r}", policy=policy
        ) from e


def _hours(value: float | str | None) -> float | Literal["default"] | None:
    """A retention argument: hours, None (unchanged) or ``"default"`` (the store-wide one)."""
    if isinstance(value, str):
        if value != "default":
            raise InvalidArgumentError(f"retention must be hours or 'default', got {value!r}", value=value)
        return "default"
    return value


def _boundary(boundary: str) -> Boundary:
    if boundary not in ("lower", "upper"):
        raise InvalidArgumentError(f"boundary must be 'lower' or 'upper', got {boundary!r}")
    return boundary  # type: ignore[return-value]


class _StoreCore:
    """Argument handling shared by both facades (one place, so both behave the same)."""

    def __init__(self, cfg: TierdConfig, hot: HotStore, tiering: TieringService | None = None) -> None:
        self.config = cfg
        self.hot = hot
        #: The cold tier (None when ``tiered.enabled`` is false).
        self.tiering = tiering
        self.router = TierRouter(cfg, hot, tiering)
        #: Committed consumer offsets (``{store.dir}/config/consumer-offsets.json``).
        self.offsets = ConsumerOffsets(cfg.store.dir)
        self.consumers = ConsumerGroups(self.offsets, self.router, self.topics, cfg.store.max_queues)
        self._max_queues = cfg.store.max_queues  # the config is frozen
        #: Topic settings and lifecycle (docs/topics.md).
        self.topic_admin = TopicAdmin(cfg, hot, self.offsets, tiering)
        #: Long-poll waiters, woken by the hot store's dispatch thread.
        self.arrivals = ArrivalNotifier()
        hot.listen_dispatched(self.arrivals.arrived)
        self._offsets_mirror: asyncio.Task[None] | None = None
        #: Delivers scheduled messages (docs/scheduled.md); started with the store's upkeep.
        self.scheduler = Scheduler(self)
        #: User topics a scheduled put has checked: later puts into them skip those checks.
        self._schedulable: set[str] = set()
        #: The longest delay a scheduled put accepts, when it cannot change (no cold tier: the
        #: config's hot retention bounds it); None: :meth:`_max_delay_ms` asks on each put.
        fixed = not cfg.tiered.enabled and tiering is None
        self._fixed_max_delay_ms = self._max_delay_ms() if fixed else None
        #: Half messages, commits, rollbacks, check-backs (docs/transactions.md).
        self.transactions = TransactionCoordinator(self)
        #: Per-topic messages and bytes produced and consumed (docs/metrics.md).
        self.traffic = TopicTraffic(cfg.server.metrics_max_topics)

    def _scheduled(
        self, message: Message, deliver_at: int | None, delay_level: int | None
    ) -> tuple[Message, int, str]:
        """The record a scheduled put appends to the system topic, its delivery time and its
        UNIQ_KEY: the message as given, its real topic and queue and its delivery time in
        properties (RocketMQ's names), a UNIQ_KEY of its own if it came without one (the
        delivered copy keeps it: the key index finds the copy by it after a crash).

        The usual put — a topic scheduled into before, a delivery time, no properties of its
        own — is checked inline against the same rules and builds its properties in one dict
        display; anything else takes :meth:`_scheduled_checked`, which raises the typed error.
        Each call saved here is a few percent of a scheduled put (docs/performance.md,
        "Scheduled messages")."""
        topic = message.topic
        qid = message.queue_id
        now = time.time_ns() // 1_000_000
        if not (
            delay_level is None
            and topic in self._schedulable
            and (qid is None or (type(qid) is int and 0 <= qid < self._max_queues))
            and type(deliver_at) is int
            and 0 < deliver_at - now <= (self._fixed_max_delay_ms or self._max_delay_ms())
        ):
            return self._scheduled_checked(message, deliver_at, delay_level, now)
        given = message.properties
        if given:
            return self._scheduled_props(message, topic, qid, given, deliver_at, None)
        uniq = new_uniq_key()
        if qid is None:
            props = {
                PROPERTY_UNIQ_KEY: uniq,
                PROPERTY_REAL_TOPIC: topic,
                PROPERTY_TIMER_DELIVER_MS: str(deliver_at),
            }
        else:
            props = {
                PROPERTY_UNIQ_KEY: uniq,
                PROPERTY_REAL_TOPIC: topic,
                PROPERTY_TIMER_DELIVER_MS: str(deliver_at),
                PROPERTY_REAL_QID: str(qid),
            }
        return system_copy(message, SCHEDULE_TOPIC, props), deliver_at, uniq

    def _scheduled_checked(
        self, message: Message, deliver_at: int | None, delay_level: int | None, now: int
    ) -> tuple[Message, int, str]:
        """:meth:`_scheduled` with every rule checked by its owner, raising its typed error."""
        topic = check_topic(message.topic)
        if is_system_topic(topic):
            raise InvalidTopicError(
                f"topic {topic!r} is a system topic; schedule into a user topic", topic=topic
            )
        if message.queue_id is not None:
            check_queue(message.queue_id, self.config.store.max_queues)
        when = delivery_time(
            now,
            deliver_at=deliver_at,
            delay_level=delay_level,
            levels=self.scheduler.levels,
            max_delay_ms=self._max_delay_ms(),
        )
        if len(self._schedulable) < TOPIC_CACHE_MAX:
            self._schedulable.add(topic)  # the next put into it takes the inline checks
        given = message.properties
        return self._scheduled_props(message, topic, message.queue_id, given, when, delay_level)

    def _scheduled_props(
        self,
        message: Message,
        topic: str,
        qid: int | None,
        given: Mapping[str, str],
        when: int,
        delay_level: int | None,
    ) -> tuple[Message, int, str]:
        """:meth:`_scheduled`'s result for a message checked already (any properties)."""
        uniq = given.get(PROPERTY_UNIQ_KEY) or new_uniq_key()
        props = {
            **given,
            PROPERTY_UNIQ_KEY: uniq,
            PROPERTY_REAL_TOPIC: topic,
            PROPERTY_TIMER_DELIVER_MS: str(when),
        }
        if delay_level is not None:
            props[PROPERTY_DELAY] = str(delay_level)
        if qid is not None:
            props[PROPERTY_REAL_QID] = str(qid)
        return system_copy(message, SCHEDULE_TOPIC, props), when, uniq

    def _max_delay_ms(self) -> int:
        """The longest delay a scheduled put accepts: ``scheduled.max_delay``, and no longer
        than the system topic keeps the message (:meth:`_schedule_retention`)."""
        return int(min(self.config.scheduled.max_delay, self._schedule_retention()) * 1000)

    def _schedule_retention(self) -> float:
        """Seconds the system topic keeps a scheduled message: its cold retention with a cold
        tier (hot files are freed only once tiered), else the store-wide hot retention. A delay
        longer than that would be freed before delivery, so it bounds the delay accepted."""
        if self.tiering is None and not self.config.tiered.enabled:
            return self.config.store.file_reserved_time * 3600
        entry = self.topic_admin.registry.table.topics.get(SCHEDULE_TOPIC)
        declared = self.config.topics.get(SCHEDULE_TOPIC)
        hours = (entry.cold_retention_hours if entry is not None else None) or (
            declared.cold_retention_hours if declared is not None else None
        )
        return (hours or self.config.tiered.file_reserved_time) * 3600

    def _start_scheduler(self) -> None:
        """On the store's loop: start delivering (a writable store with the scheduler on)."""
        if not self.hot.read_only and self.config.scheduled.enabled:
            self.scheduler.start()

    @property
    def closed(self) -> bool:
        """True once the store is closed (or closing): it answers nothing more."""
        return self.hot.closed

    @property
    def ready(self) -> bool:
        """True once the cold tier is usable (prefix claimed, flat files loaded); always True
        without a cold tier. Reads wait for it by themselves; this is for health reports."""
        return self.tiering is None or self.tiering.ready.is_set()

    @property
    def cold_failure(self) -> Exception | None:
        """Why the cold tier cannot start until an operator acts (another store owns the prefix,
        missing or corrupt metadata, bad settings): every read fails meanwhile, while produce is
        still acknowledged into the hot store. None when it is ready, off, still starting, or
        retrying a failure that may pass by itself (a backend outage). Which failures are final
        is the tiering service's call (``check_ready``): this only asks it."""
        t = self.tiering
        if t is None or t.ready.is_set() or t.start_error is None:
            return None
        try:
            t.check_ready()
        except NotReadyError:
            return None
        except TierdError:
            return t.start_error
        return None

    @property
    def stats(self) -> StoreStats:
        """The live counters behind the metrics (docs/metrics.md)."""
        cache = self.router.fetcher.cache
        hot, router = self.hot, self.router
        return StoreStats(
            dispatch=self.tiering.dispatcher.stats if self.tiering is not None else None,
            cache=cache.stats,
            cache_bytes=cache.bytes,
            cache_batches=cache.batch_count,
            hot=HotStats(
                topics=len({topic for topic, _ in hot.queue_keys()}),
                writes_refused=hot.full_reason is not None,
                commitlog_end=hot.end_position,
                open_queue_files=hot.queue_files.open_files,
                queue_file_opens=hot.queue_files.opens,
                quarantined_ranges=len(hot.quarantine.ranges),
                lost_messages=hot.quarantine.lost_messages,
                corrupt_reads=hot.corrupt_reads,
            ),
            reads=ReadStats(router.fallbacks, router.corrupt_served_cold, dict(router.reads)),
            cold=self._cold_stats(),
        )

    def _cold_stats(self) -> ColdStats | None:
        t = self.tiering
        if t is None:
            return None
        ownership = t.ownership
        return ColdStats(
            ready=t.ready.is_set(),
            metadata_loaded=t.metadata_loaded,
            start_error=t.start_error,
            writes_refused=t.refused is not None,
            capabilities=t.root.capability_report(),
            health=t.health,
            prefix_owned=ownership is not None and ownership.fenced is not None,
            owner_epoch=ownership.epoch if ownership is not None else None,
            index=t.index.stats,
        )

    def dispatch_lag(self) -> list[QueueLag]:
        """Per hot queue, sorted: messages acknowledged and not yet committed to the cold tier,
        and when the oldest of them was stored — from the live offsets, never waiting. Empty
        without a cold tier."""
        t = self.tiering
        if t is None:
            return []
        hot, out = self.hot, []
        for topic, qid in hot.queue_keys():
            rng = hot.acknowledged_range(topic, qid)
            if rng is None:
                continue
            ff = t.flat.get(topic, qid)
            cold = ff.max_offset if ff is not None and ff.initialised else rng.min_offset
            n = max(0, rng.max_offset - cold)
            out.append(QueueLag(topic, qid, n, hot.store_timestamp(topic, qid, cold) if n else None))
        return out

    def cold_storage(self) -> ColdStorage | None:
        """Committed cold-tier bytes and segments by file type, and the oldest cold message's
        store time per topic (None without a cold tier)."""
        t = self.tiering
        if t is None:
            return None
        sizes = {"COMMIT_LOG": 0, "CONSUME_QUEUE": 0, "INDEX": 0}
        counts = dict.fromkeys(sizes, 0)
        oldest: dict[str, int] = {}
        for (topic, _), ff in list(t.flat.files.items()):
            for kind, flat in (("COMMIT_LOG", ff.commitlog), ("CONSUME_QUEUE", ff.consumequeue)):
                for seg in flat.segments:
                    sizes[kind] += seg.commit_position
                    counts[kind] += 1
            first = ff.commitlog.segments[0].min_timestamp if ff.commitlog.segments else None
            if first is not None:
                oldest[topic] = min(first, oldest.get(topic, first))
        for info in t.index.uploaded_infos():
            sizes["INDEX"] += info.size
            counts["INDEX"] += 1
        return ColdStorage(sizes, counts, oldest)

    def tiering_status(self) -> dict[str, object] | None:
        """The cold tier's health as ``GET /v1/status`` reports it (docs/http.md); None without
        a cold tier."""
        return self.tiering.status() if self.tiering is not None else None

    def set_backend_observer(self, observer: BackendObserver) -> None:
        """Report every cold-tier backend call to ``observer`` (the metrics' latency and size
        histograms); nothing without a cold tier."""
        if self.tiering is not None:
            self.tiering.root.observer = observer

    def _hot(self) -> HotStore:
        if self.hot.closed:
            raise StoreClosedError("the store is closed")
        return self.hot

    async def _cold_loaded(self) -> None:
        """Wait (bounded by ``tiered.ready_timeout``) until the cold tier has loaded; without
        one, or once loaded, this returns without suspending."""
        if self.tiering is not None and not self.tiering.ready.is_set():
            await self.tiering.wait_ready()

    def _cold_loaded_now(self) -> None:
        """The synchronous entry points' readiness gate. The asyncio facade cannot block its
        loop, so it refuses (NotReadyError) until the cold tier has loaded — ``open`` waits
        for it first, so this only bites when loading outlasts ``tiered.ready_timeout``."""
        if self.tiering is not None:
            self.tiering.check_ready()

    async def _get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        policy: ReadPolicy | str | None,
        tags: str | TagFilter | None = None,
        max_bytes: int | None = None,
    ) -> GetResult:
        self._hot()
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 1):
            raise InvalidArgumentError(f"max_bytes must be a positive integer, got {max_bytes!r}")
        chosen, flt = _policy(policy, self.config.tiered.storage_level), parse_tags(tags)
        await self._cold_loaded()
        return await self.router.get(topic, queue_id, offset, max_count, chosen, flt, max_bytes)

    def _check_wait(self, wait_ms: int) -> int:
        bound = self.config.server.long_poll_max_ms
        if not isinstance(wait_ms, int) or isinstance(wait_ms, bool) or not 0 <= wait_ms <= bound:
            raise InvalidArgumentError(
                f"wait_ms must be an integer in [0, {bound}] (server.long_poll_max_ms), got {wait_ms!r}",
                wait_ms=repr(wait_ms),
            )
        return wait_ms

    async def _get_waiting(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        policy: ReadPolicy | str | None,
        tags: str | TagFilter | None,
        wait_ms: int,
        max_bytes: int | None = None,
    ) -> GetResult:
        """A read that, when caught up, waits up to ``wait_ms`` for a matching message: woken by
        each arrival in the queue (no polling), it reads again and returns what matches; at the
        deadline (or when the store drains) it returns the last, empty, result — whose
        ``next_offset`` has moved past whatever did not match."""
        flt = parse_tags(tags)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        key = (topic, queue_id)
        skipped = False  # some messages were examined and none matched: say so at the end
        while True:
            arrival = self.arrivals.register(key)
            try:
                r = await self._get(topic, queue_id, offset, max_count, policy, flt, max_bytes)
                unmatched = r.status is GetStatus.NO_MATCHED_MESSAGE
                if r.messages or not (r.status in _CAUGHT_UP or unmatched):
                    return r
                skipped |= unmatched
                if skipped and r.status is GetStatus.OFFSET_OVERFLOW_ONE:
                    r = dataclasses.replace(r, status=GetStatus.NO_MATCHED_MESSAGE)
                left = deadline - loop.time()
                if left <= 0 or self.arrivals.released:
                    return r
                if unmatched:
                    offset = r.next_offset
                    if offset < r.max_offset:
                        continue  # nothing matched in the units scanned, but more are there
                try:
                    await asyncio.wait_for(arrival, left)
                except TimeoutError:
                    return r
            finally:
                self.arrivals.unregister(key, arrival)

    async def _query(
        self,
        topic: str,
        key: str,
        max_count: int,
        begin: int,
        end: int,
        max_bytes: int | None = None,
        skip_at_end: int = 0,
    ) -> list[MessageExt]:
        if not isinstance(max_count, int) or max_count < 1:
            raise InvalidArgumentError(f"max_count must be a positive integer, got {max_count!r}")
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 1):
            raise InvalidArgumentError(f"max_bytes must be a positive integer, got {max_bytes!r}")
        if not isinstance(skip_at_end, int) or skip_at_end < 0:
            raise InvalidArgumentError(f"skip_at_end must be a non-negative integer, got {skip_at_end!r}")
        if begin > end:
            raise InvalidArgumentError(f"begin ({begin}) must not be after end ({end})")
        check_key(key)
        self._hot()
        await self._cold_loaded()
        return await self.router.query(
            topic, key, max_count, begin, end, max_bytes=max_bytes, skip_at_end=skip_at_end
        )

    async def _message(self, msg_id: str, topic: str | None) -> FoundMessage:
        msg_id = check_message_id(msg_id)
        if topic is not None:
            check_topic(topic)
        self._hot()
        await self._cold_loaded()
        topics = [topic] if topic is not None else list(self._topic_queues())
        return await find_message(self.hot, self.router, msg_id, topics, topic)

    # Cheap, synchronous reads shared verbatim by both facades (both tiers).
    def min_offset(self, topic: str, queue_id: int) -> int:
        self._hot()
        self._cold_loaded_now()
        return self.router.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        self._hot()
        self._cold_loaded_now()
        return self.router.max_offset(topic, queue_id)

    async def _offset_for_time(self, topic: str, queue_id: int, timestamp: int, boundary: str) -> int:
        self._hot()
        upper = _boundary(boundary) == "upper"
        await self._cold_loaded()
        return await self.router.offset_for_time(topic, queue_id, timestamp, upper)

    async def _earliest_time(self, topic: str, queue_id: int) -> int:
        self._hot()
        await self._cold_loaded()
        return await self.router.earliest_time(topic, queue_id)

    # Consumer groups (docs/reading.md, "Consumer groups"): reads shared by both facades.
    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """The group's committed offsets by (topic, queue id); empty for an unknown group."""
        self._hot()
        return self.offsets.get(check_group(group))

    def consumer_groups(self, group: str | None = None) -> list[GroupInfo]:
        """Every consumer group (or one) with, per queue of the topics it consumes, the
        committed offset, the queue's range and the lag (max offset − committed)."""
        self._hot()
        return self.consumers.info(group)

    async def _reset(
        self, group: str, topic: str, to: str, timestamp: int | None, offset: int | None, queue_id: int | None
    ) -> dict[tuple[str, int], int]:
        self._hot()
        if self.tiering is not None:  # earliest offsets and times live in the cold tier
            await self.tiering.wait_ready()
        plan = await self.consumers.reset_plan(
            group, topic, to, timestamp=timestamp, offset=offset, queue_id=queue_id
        )
        await asyncio.to_thread(self.offsets.commit, group, plan)
        return plan

    def _start_transactions(self) -> None:
        """On the store's loop: load pending transactions and check back (a writable store)."""
        if not self.hot.read_only:
            self.transactions.start()

    def _start_consumers(self) -> None:
        """On the store's loop: mirror committed offsets to the bucket (with a cold tier), and
        deliver scheduled messages."""
        self._start_scheduler()
        self._start_transactions()
        if self.tiering is not None and self._offsets_mirror is None:
            self._offsets_mirror = asyncio.get_running_loop().create_task(
                self._mirror_offsets(), name="tierd-offsets-mirror"
            )

    async def _mirror_offsets(self) -> None:
        while True:
            await asyncio.sleep(self.config.tiered.manifest_interval)
            await self._upload_offsets()

    async def _upload_offsets(self) -> None:
        """Put the committed offsets in the bucket if they changed (restore brings them back)."""
        t = self.tiering
        if t is None or not t.ready.is_set() or t.refused is not None:  # refused: write nothing
            return
        try:
            await self.offsets.upload(t.root, self.config.tiered.cluster, self.config.tiered.broker)
            await self.topic_admin.upload()  # the topic table, likewise (docs/topics.md)
        except Exception as e:  # the local file is the truth; the copy is retried
            log.warning("uploading consumer offsets to the bucket failed (%s); retrying later", e)

    async def _stop_consumers(self) -> None:
        """Release long polls, stop the scheduler and the mirror, upload the offsets one last time."""
        self.arrivals.release()
        await self.scheduler.stop()
        await self.transactions.stop()
        task, self._offsets_mirror = self._offsets_mirror, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._upload_offsets()

    def release_waiters(self) -> None:
        """End every long poll now and make new reads return at once (the daemon drains)."""
        self.arrivals.release()

    def topics(self, *, system: bool = False) -> dict[str, list[int]]:
        """Topic → queue ids, across both tiers (a topic whose hot files expired stays listed).
        The store's own system topics (:mod:`tierd.systopics`) only with ``system=True``: they
        hold bookkeeping, not messages a user put."""
        self._hot()
        self._cold_loaded_now()
        out = self._topic_queues()
        return out if system else {t: q for t, q in out.items() if not is_system_topic(t)}

    def _topic_queues(self) -> dict[str, list[int]]:
        """:meth:`topics` once the cold tier has loaded (callable on the store's loop)."""
        return dict(sorted(self.topic_admin.known().items()))

    def list_topics(self) -> list[str]:
        """Every topic: created, declared in the configuration, or holding messages — less the
        system topics (:mod:`tierd.systopics`), which hold no message a user put."""
        self._hot()
        self._cold_loaded_now()
        return [t for t in self.topic_admin.names() if not is_system_topic(t)]

    def queue_ids(self, topic: str) -> list[int]:
        """``topic``'s queue ids with data in either tier — its :meth:`topics` entry, system
        topics included — answered without listing every topic (a receive asks it per call)."""
        self._hot()
        self._cold_loaded_now()
        return self.topic_admin.queue_ids(check_topic(topic))

    def has_topic(self, topic: str) -> bool:
        """Whether :meth:`list_topics` lists ``topic``, answered without listing every topic
        (produce asks it per request when topics are not created on first use)."""
        self._hot()
        self._cold_loaded_now()
        return not is_system_topic(topic) and self.topic_admin.exists(topic)

    def describe_topic(self, topic: str) -> TopicInfo:
        """A topic's queue count, retention, sizes and per-queue ranges in both tiers
        (NotFoundError if it does not exist)."""
        self._hot()
        self._cold_loaded_now()
        return self.topic_admin.describe(topic)

    def queue_count(self, topic: str) -> int:
        """The queues ``topic`` spreads over (its created count, else what it has, else
        ``store.default_queues``). Produce asks it: it never waits for the cold tier (a topic
        that matters for message groups is created with its count, which is known at once)."""
        self._hot()
        return self.topic_admin.queue_count(check_topic(topic))

    def group_queue(self, topic: str, group: str) -> int:
        """The queue message group ``group`` of ``topic`` is produced to (one queue per group,
        so its messages stay in order; :func:`tierd.topics.queue_for_group`)."""
        self._hot()
        return self.topic_admin.group_queue(topic, group)

    async def _start_topics(self) -> None:
        """At open, before anything is served: finish deletes a crash interrupted, create the
        topics the configuration declares."""
        admin = self.topic_admin
        if self.hot.read_only:  # changes nothing: a pending delete waits for a writable open
            return
        if self.tiering is not None:
            admin.finish_later()  # once the cold tier has loaded: open does not wait for the bucket
        else:
            await admin.resume()
        await admin.apply_config()

    def queues(self, topic: str) -> list[QueueInfo]:
        """Every queue of ``topic`` with its offsets in each tier (NotFoundError if unknown)."""
        hot = self._hot()
        self._cold_loaded_now()
        return queue_infos(hot, self.tiering, topic)

    async def _segments(self, topic: str | None, queue_id: int | None, type: str | None) -> list[SegmentRow]:
        kind = check_kind(type)
        self._hot()
        if self.tiering is None:
            return []
        await self.tiering.wait_ready()
        return await live_segments(self.tiering, topic, queue_id, kind)

    async def _gc(self) -> GcReport:
        hot = self._hot()
        await asyncio.to_thread(hot.require_dispatched, DISPATCH_WAIT, "gc")
        files = await asyncio.to_thread(hot.apply_retention)
        segments = 0
        if self.tiering is not None:
            await self.tiering.wait_ready()
            await self.topic_admin.resume()
            await self.topic_admin.sync_cold()
            segments = await self.tiering.apply_retention()
        return GcReport(hot_files=files, cold_segments=segments)

    async def _verify(self, progress: VerifyProgress | None, repair: bool) -> VerifyReport:
        hot = self._hot()
        await asyncio.to_thread(hot.require_dispatched, DISPATCH_WAIT, "verify")
        if self.tiering is not None:
            await self.tiering.wait_ready()
        from tierd.verify import verify  # lazily: not on the open + put path (issue 31)

        return await verify(hot, self.tiering, progress, repair=repair)


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    """What a scheduled put answers (docs/scheduled.md)."""

    #: Recalls the message before it is due (``recall``); also on the delivered copy, as the
    #: ``TIMER_HANDLE`` property.
    handle: str
    #: When the message becomes visible in its topic (ms since the epoch).
    deliver_at: int
    #: The message's UNIQ_KEY (RocketMQ's client message id), kept by the delivered copy.
    msg_id: str
    topic: str


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


_new_object = object.__new__
_SET_RESULT = {name: ScheduleResult.__dict__[name].__set__ for name in ScheduleResult.__slots__}
_set_handle, _set_deliver_at = _SET_RESULT["handle"], _SET_RESULT["deliver_at"]
_set_msg_id, _set_topic = _SET_RESULT["msg_id"], _SET_RESULT["topic"]


def _schedule_result(offset: int, deliver_at: int, msg_id: str, topic: str) -> ScheduleResult:
    """``ScheduleResult(...)`` through the slots' descriptors: a frozen dataclass's ``__init__``
    pays an ``object.__setattr__`` per field, a part of every scheduled put worth saving."""
    r: ScheduleResult = _new_object(ScheduleResult)
    _set_handle(r, handle_text(offset, deliver_at))
    _set_deliver_at(r, deliver_at)
    _set_msg_id(r, msg_id)
    _set_topic(r, topic)
    return r


@dataclass(frozen=True, slots=True)
class GcReport:
    """What :meth:`MessageStore.gc` deleted."""

    hot_files: int
    cold_segments: int


@dataclass(frozen=True, slots=True)
class HotStats:
    """The hot store's part of :class:`StoreStats`."""

    topics: int
    #: The disk is too full and nothing more may be deleted: writes are refused.
    writes_refused: bool
    #: The commitlog's write position (bytes).
    commitlog_end: int
    open_queue_files: int
    queue_file_opens: int
    quarantined_ranges: int
    lost_messages: int
    corrupt_reads: int


@dataclass(frozen=True, slots=True)
class ReadStats:
    """The read router's part of :class:`StoreStats`."""

    #: Cold reads that failed and were served from the hot store.
    fallbacks: int
    #: Reads of a corrupt hot record answered with the cold tier's copy.
    corrupt_served_cold: int
    #: Queue reads by the tier that served them ("hot", "cold").
    reads: dict[str, int]


@dataclass(frozen=True, slots=True)
class ColdStats:
    """The cold tier's part of :class:`StoreStats` (cheap: no I/O, no per-queue walk)."""

    ready: bool
    metadata_loaded: bool
    #: Why the cold tier has not started yet (None once ready or still trying without error).
    start_error: Exception | None
    #: Tiering is refused: the backend could overwrite committed data.
    writes_refused: bool
    #: The backend capability probe's verdict (None before it ran).
    capabilities: Mapping[str, Any] | None
    health: BackendHealth
    #: Another store owns the bucket prefix: this one does not tier.
    prefix_owned: bool
    owner_epoch: int | None
    index: IndexStats


@dataclass(frozen=True, slots=True)
class QueueLag:
    """One queue in :meth:`MessageStore.dispatch_lag`."""

    topic: str
    queue_id: int
    #: Messages acknowledged and not yet committed to the cold tier.
    messages: int
    #: Store time (ms) of the oldest of them (None when caught up or unknown).
    oldest_ms: int | None


@dataclass(frozen=True, slots=True)
class ColdStorage:
    """What :meth:`MessageStore.cold_storage` returns."""

    #: Committed bytes and segment counts by file type (COMMIT_LOG, CONSUME_QUEUE, INDEX).
    sizes: dict[str, int]
    segments: dict[str, int]
    #: Per topic: store time (ms) of its oldest message in the cold tier.
    oldest_ms: dict[str, int]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What :attr:`MessageStore.stats` returns: live counters, read when metrics are scraped."""

    #: The tiering dispatcher's counters (None without a cold tier).
    dispatch: DispatchStats | None
    #: The cold read-ahead cache's counters, and what it holds now.
    cache: CacheStats
    cache_bytes: int
    cache_batches: int
    hot: HotStats
    reads: ReadStats
    #: None without a cold tier.
    cold: ColdStats | None


class MessageStore(_StoreCore):
    """Asyncio facade. Open with ``async with MessageStore.open(cfg) as store`` (or
    ``store = await MessageStore.open(cfg)`` and ``await store.close()``)."""

    @classmethod
    def open(cls, cfg: TierdConfig, *, ready_timeout: float | None = None) -> _Opener:
        """Open (recovering after a crash) and wait up to ``ready_timeout`` seconds (default
        ``tiered.ready_timeout``; 0: not at all) for the cold tier to load, so that reads right
        after open see both tiers. If it takes longer the store opens anyway — writes work,
        and reads that need the cold tier wait for it themselves or raise NotReadyError."""
        return _Opener(cfg, ready_timeout)

    async def put(self, message: Message) -> PutResult:
        res = await self._put(message)
        self.traffic.produced_one(message)
        return res

    async def _put(self, message: Message) -> PutResult:
        res, fut = self.hot.put(message)  # the hot store checks it is open
        if fut is not None:
            await asyncio.wrap_future(fut)
        return res

    async def put_batch(self, messages: Sequence[Message]) -> PutBatchResult:
        res, fut = self._hot().put_batch(messages)
        if fut is not None:
            await asyncio.wrap_future(fut)
        self.traffic.produced_batch(messages)
        return res

    async def schedule(
        self, message: Message, *, deliver_at: int | None = None, delay_level: int | None = None
    ) -> ScheduleResult:
        """Put ``message`` now, visible in its topic at ``deliver_at`` (ms since the epoch) or
        after RocketMQ delay level ``delay_level`` (``scheduled.delay_levels``) — not before.
        Durable when this returns, like :meth:`put`. DeliveryTimeError for a time in the past,
        beyond ``scheduled.max_delay`` or a level out of range (docs/scheduled.md)."""
        stored, when, uniq = self._scheduled(message, deliver_at, delay_level)
        res = await self._put(stored)
        self.scheduler.scheduled(res.queue_offset, when)  # acknowledged: spares a read-back
        self.traffic.produced_one(message)  # under its own topic, not the scheduler's
        return _schedule_result(res.queue_offset, when, uniq, message.topic)

    async def recall(self, handle: str) -> bool:
        """Cancel a scheduled message before it is due (RocketMQ 5.3's RecallMessage): True
        when this call recalled it, False when it was recalled already. UnknownHandleError,
        AlreadyDeliveredError (it is in its topic). Durable when this returns."""
        self._hot()
        return await self.scheduler.recall(handle)

    async def put_half(self, message: Message, *, producer_group: str) -> HalfResult:
        """Send the half message of a transaction (docs/transactions.md): durable when this
        returns, invisible in ``message.topic`` until :meth:`end_transaction` commits it. A
        transaction left unresolved is checked back with ``producer_group`` after
        ``transactions.transaction_timeout`` s, then every ``check_interval`` s, and rolled back
        after ``check_max`` unanswered checks."""
        self._hot()
        res = await self.transactions.prepare(message, producer_group)
        self.traffic.produced_one(message)
        return res

    async def end_transaction(self, transaction_id: str, resolution: Resolution | str) -> EndResult:
        """``COMMIT`` (the message becomes visible, exactly once) or ``ROLLBACK`` (it never
        does); durable when this returns. UnknownTransactionError for an id with nothing pending,
        TransactionResolvedError (its detail says how) for one already resolved."""
        self._hot()
        return await self.transactions.end(transaction_id, resolution)

    async def commit_transaction(self, transaction_id: str) -> EndResult:
        """:meth:`end_transaction` with ``COMMIT``."""
        return await self.end_transaction(transaction_id, Resolution.COMMIT)

    async def rollback_transaction(self, transaction_id: str) -> EndResult:
        """:meth:`end_transaction` with ``ROLLBACK``."""
        return await self.end_transaction(transaction_id, Resolution.ROLLBACK)

    async def pending_transactions(
        self, producer_group: str | None = None, *, due: bool = False
    ) -> list[PendingTransaction]:
        """Transactions waiting for their producer, oldest first; ``due``: only those a
        check-back asks about (older than ``transactions.transaction_timeout``)."""
        self._hot()
        await self.transactions.wait_started()
        return self.transactions.pending(producer_group, due=due)

    async def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        policy: ReadPolicy | str | None = None,
        *,
        tags: str | TagFilter | None = None,
        wait_ms: int = 0,
        max_bytes: int | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages from ``offset``. ``tags``: a subscription expression
        (``"paid || refunded"``; ``"*"`` or None: every message) — other messages are skipped
        before they are read, ``next_offset`` moves past them. ``wait_ms``: when caught up,
        wait that long (≤ ``server.long_poll_max_ms``) for a matching message (docs/reading.md).
        ``max_bytes``: the read stops before the message that would take the total past it (the
        first message always comes)."""
        if self._check_wait(wait_ms):
            return await self._get_waiting(
                topic, queue_id, offset, max_count, policy, tags, wait_ms, max_bytes
            )
        return await self._get(topic, queue_id, offset, max_count, policy, tags, max_bytes)

    async def offset_for_time(
        self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower"
    ) -> int:
        """First offset stored at/after ``timestamp`` (``upper``: last of those stored exactly then)."""
        return await self._offset_for_time(topic, queue_id, timestamp, boundary)

    async def earliest_time(self, topic: str, queue_id: int) -> int:
        return await self._earliest_time(topic, queue_id)

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Commit ``offset`` (the next to read) for ``group`` on ``topic``/``queue_id``; durable
        when this returns. OffsetOutOfRangeError beyond the queue's max offset."""
        self._hot()
        key = self.consumers.check_commit(group, topic, queue_id, offset)
        await asyncio.to_thread(self.offsets.commit, group, {key: offset})

    async def reset_offsets(
        self,
        group: str,
        topic: str,
        to: str,
        *,
        timestamp: int | None = None,
        offset: int | None = None,
        queue_id: int | None = None,
    ) -> dict[tuple[str, int], int]:
        """Move ``group`` on ``topic`` (every queue, or ``queue_id``) to the ``earliest`` or
        ``latest`` offset, the first stored at/after ``timestamp`` (ms), or ``offset`` (one
        queue, inside its range). Returns the offsets set. Stop the group's consumers first:
        a consumer still running commits its own position over the reset."""
        return await self._reset(group, topic, to, timestamp, offset, queue_id)

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """Forget ``group``'s offsets (or only those of ``topic``); returns queues forgotten."""
        self._hot()
        return await asyncio.to_thread(self.offsets.delete, check_group(group), topic)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the cold tier has loaded (no-op without one), at most ``timeout`` seconds
        (default ``tiered.ready_timeout``), else NotReadyError. Reads wait by themselves; this
        is for callers that want to wait up front."""
        if self.tiering is not None:
            await self.tiering.wait_ready(timeout)

    async def create_topic(
        self, topic: str, queues: int | None = None, *, cold_retention_hours: float | None = None
    ) -> TopicInfo:
        """Create ``topic`` with ``queues`` queues (TopicExistsError if it exists)."""
        self._hot()
        await self._cold_loaded()
        return await self.topic_admin.create(topic, queues, cold_retention_hours)

    async def update_topic(
        self,
        topic: str,
        *,
        queues: int | None = None,
        cold_retention_hours: float | str | None = None,
        hot_retention_hours: float | None = None,
    ) -> TopicInfo:
        """Grow the queue count (QueueShrinkError below the current one) and/or set the cold
        retention (``"default"``: back to ``tiered.file_reserved_time``). A hot retention is
        refused: it is store-wide (:func:`tierd.topics.refuse_hot_retention` says why)."""
        self._hot()
        await self._cold_loaded()
        hours = _hours(cold_retention_hours)
        return await self.topic_admin.update(
            topic, queues=queues, cold_retention_hours=hours, hot_retention_hours=hot_retention_hours
        )

    async def delete_topic(self, topic: str, *, force: bool = False) -> None:
        """Delete ``topic`` from both tiers (docs/topics.md); TopicInUseError while a consumer
        group or a pending tiering round needs it, unless ``force``."""
        self._hot()
        await self._cold_loaded()
        await self.topic_admin.delete(topic, force=force)

    async def segments(
        self, topic: str | None = None, queue_id: int | None = None, type: str | None = None
    ) -> list[SegmentRow]:
        """Cold segments (filters: topic, queue id, type COMMIT_LOG/CONSUME_QUEUE/INDEX)."""
        return await self._segments(topic, queue_id, type)

    async def gc(self) -> GcReport:
        """Apply retention now in both tiers (what the daemon does on its timers)."""
        return await self._gc()

    async def verify(self, progress: VerifyProgress | None = None, *, repair: bool = False) -> VerifyReport:
        """Check CRCs, consume queues, metadata, cold sizes/checksums, manifests and the bucket
        prefix; lists every problem. Read-only unless ``repair`` (see :mod:`tierd.verify`)."""
        return await self._verify(progress, repair)

    @staticmethod
    async def verify_store(
        cfg: TierdConfig, progress: VerifyProgress | None = None, *, repair: bool = False
    ) -> VerifyReport:
        """Check a *stopped* store's directory and bucket without starting anything (what
        ``tierd verify`` runs); ``repair`` fixes what it safely can and says what it changed."""
        from tierd.verify import verify_store  # lazily: not on the open + put path (issue 31)

        return await verify_store(cfg, progress, repair=repair)

    async def query(
        self,
        topic: str,
        key: str,
        max_count: int = 32,
        begin: int = 0,
        end: int = MAX_TIMESTAMP,
        *,
        max_bytes: int | None = None,
        skip_at_end: int = 0,
    ) -> list[MessageExt]:
        """Messages of ``topic`` carrying ``key`` stored in ``[begin, end]``, both tiers, newest
        first (docs/reading.md, "Key queries"). ``max_bytes``: read no further than a page of
        that many bytes needs — the answer holds the messages of its first ``max_bytes`` (the
        first always) and the next one, maybe a few more, instead of reading ``max_count`` whole
        messages; cut it with :func:`~tierd.local.store.byte_bounded_count`. ``skip_at_end``:
        messages stored exactly at ``end`` that a continued page leaves out, not counted."""
        return await self._query(topic, key, max_count, begin, end, max_bytes, skip_at_end)

    async def message(self, msg_id: str, *, topic: str | None = None) -> FoundMessage:
        """The message ``msg_id`` names, from either tier (:mod:`tierd.lookup`): an offset id
        (the hot commitlog position a producer was told) or a client id (UNIQ_KEY), each hit
        verified. ``topic``: search only that topic (else every topic's key index is asked).
        MessageNotFoundError when none, AmbiguousMessageIdError (listing them) when several."""
        return await self._message(msg_id, topic)

    @staticmethod
    async def restore(
        cfg: TierdConfig, progress: Progress | None = None, *, take_over: bool = True, dry_run: bool = False
    ) -> RestoreReport:
        """Rebuild an empty store directory's tiering metadata from the bucket's manifests,
        taking the bucket prefix over (``take_over=False``: refused while another store owns
        it). ``dry_run``: only report what it would bring back, writing nothing."""
        # Lazily: restoring (and the read-only stack it opens the bucket with) is not on the
        # open + put path (issue 31).
        from tierd.tiered.restore import dry_run as restore_dry_run
        from tierd.tiered.restore import restore as restore_from_bucket

        if dry_run:
            return await restore_dry_run(cfg, progress=progress)
        report = await restore_from_bucket(cfg, progress=progress, take_over=take_over)
        await restore_topic_table(cfg)  # created topics' settings (docs/topics.md)
        return report

    async def tier_now(self) -> TierReport:
        """Commit everything pending to the cold tier now. Returns what each queue committed
        (``.committed`` is the total); raises when pending messages could not be committed
        (:class:`~tierd.errors.BackendError`, naming each queue and the backend's error) or the
        bucket prefix belongs to another store (:class:`~tierd.errors.PrefixOwnedError`), and
        :class:`~tierd.errors.NotReadyError` when the hot store has not indexed what was written
        before the call within ``DISPATCH_WAIT`` seconds (it would tier only part of it)."""
        if self.tiering is None:
            return TierReport()
        await asyncio.to_thread(self._hot().require_dispatched, DISPATCH_WAIT, "tier_now")
        n = await self.tiering.tier_now()
        await self._upload_offsets()
        return n

    async def close(self, grace: float | None = None) -> None:
        """Close both tiers; pending messages get ``grace`` seconds (default
        ``server.shutdown_grace``) to reach the cold tier, the rest goes at the next start."""
        await self.scheduler.stop()
        await self.router.fetcher.aclose()
        await self._stop_consumers()
        await self.topic_admin.stop()
        if self.tiering is not None:
            await self.tiering.close(self.config.server.shutdown_grace if grace is None else grace)
            self.tiering = self.router.tiering = None
        await asyncio.to_thread(self.hot.close)

    async def __aenter__(self) -> MessageStore:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class _Opener:
    """Awaitable *and* async context manager returned by :meth:`MessageStore.open`."""

    def __init__(self, cfg: TierdConfig, ready_timeout: float | None) -> None:
        self._cfg = cfg
        self._ready_timeout = cfg.tiered.ready_timeout if ready_timeout is None else ready_timeout
        self._store: MessageStore | None = None

    async def _open(self) -> MessageStore:
        cfg = self._cfg
        self._store = store = await _open_async(cfg, lambda hot, tiering: MessageStore(cfg, hot, tiering))
        if store.tiering is not None and self._ready_timeout > 0:
            try:
                await store.tiering.wait_ready(self._ready_timeout)
            except TierdError as e:  # writes work without it; reads report it themselves
                log.warning("store open; %s", e)
            except BaseException:  # cancelled while waiting: the caller never gets the store
                self._store = None
                await store.close(grace=0)
                raise
        return store

    def __await__(self) -> Generator[object, None, MessageStore]:
        return self._open().__await__()

    async def __aenter__(self) -> MessageStore:
        return await self._open()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._store is not None:
            await self._store.close()


class BlockingMessageStore(_StoreCore):
    """The same operations, synchronously, for scripts and threads::

    with BlockingMessageStore.open(cfg) as store:
        store.put(Message(topic="orders", body=b"..."))
    """

    def __init__(
        self,
        cfg: TierdConfig,
        hot: HotStore,
        tiering: TieringService | None = None,
        loop: _LoopThread | None = None,
    ) -> None:
        super().__init__(cfg, hot, tiering)
        self._loop = loop
        #: Without a cold tier there is no loop: the scheduler gets one of its own.
        self._own_loop: _LoopThread | None = None
        # No event loop runs reads without a cold tier (see _run): they may wait in place.
        self.router.waits_in_place = loop is None

    @classmethod
    def open(cls, cfg: TierdConfig) -> BlockingMessageStore:
        """Open (recovering after a crash). A failure on the way closes what was opened."""
        store: BlockingMessageStore | None = None
        if not cfg.tiered.enabled:
            hot = HotStore.open(cfg.store)
            try:
                store = cls(cfg, hot)
                asyncio.run(store._start_topics())
                if not hot.read_only and cfg.scheduled.enabled:
                    store._own_loop = own = _LoopThread()
                    own.run(_on_loop(store._start_scheduler))
                    own.run(_on_loop(store._start_transactions))
            except BaseException:
                if store is not None and store._own_loop is not None:
                    store._own_loop.stop()
                hot.close()
                raise
            return store
        loop = _LoopThread()
        try:
            return loop.run(_open_async(cfg, lambda hot, tiering: cls(cfg, hot, tiering, loop)))
        except BaseException:
            loop.stop()
            raise

    @staticmethod
    def restore(
        cfg: TierdConfig, progress: Progress | None = None, *, take_over: bool = True, dry_run: bool = False
    ) -> RestoreReport:
        """See :meth:`MessageStore.restore`."""
        return asyncio.run(MessageStore.restore(cfg, progress, take_over=take_over, dry_run=dry_run))

    @classmethod
    def open_bucket(cls, cfg: TierdConfig, url: str | None = None) -> BlockingMessageStore:
        """A bucket's cold tier opened READ-ONLY (:mod:`tierd.tiered.readonly`): reads, key
        queries, listings, consumer groups and ``verify`` answer as the owner's store does,
        while nothing is written to the bucket or claimed (every write and admin call raises
        :class:`~tierd.errors.ReadOnlyError`) — a DR drill next to the live owner. ``url``
        overrides ``[backend] url`` (the driver follows its scheme); ``store.dir`` is not used
        (an empty hot store in a temporary directory, removed at close)."""
        if url is not None:
            cfg = cfg.model_copy(update={"backend": backend_for_url(url, cfg.backend)})
        # Lazily: a read-only bucket store is not on the open + put path (issue 31).
        from tierd.tiered.readonly import ReadOnlyTiering, remove_scratch, scratch_config

        cfg, scratch = scratch_config(cfg)
        loop = _LoopThread()

        def make(hot: HotStore, tiering: TieringService | None) -> _BucketStore:
            return _BucketStore(cfg, hot, tiering, loop, lambda: remove_scratch(scratch))

        try:
            return loop.run(_open_async(cfg, make, ReadOnlyTiering))
        except BaseException:
            loop.stop()
            remove_scratch(scratch)
            raise

    @staticmethod
    def lock_holder(cfg: TierdConfig) -> int | None:
        """The pid of the process holding ``cfg``'s store directory (0 when the lock file does
        not say), or None when none does — without opening the store: how the CLI chooses
        between opening the directory and asking the running daemon."""
        return lock_holder(cfg)

    @staticmethod
    def take_over_unreadable(cfg: TierdConfig, epoch: int) -> OwnerRecord:
        """Take the bucket prefix over from the UNREADABLE owner record ``epoch`` (the highest one):
        write the next epoch for this store so it tiers again (docs/tiering.md, "One owner per
        prefix"). The CLI's ``tierd takeover`` reaches the tiering layer through here."""
        return asyncio.run(take_over_unreadable_prefix(cfg, epoch))

    def tier_now(self) -> TierReport:
        """Commit everything pending to the cold tier now (see :meth:`MessageStore.tier_now`)."""
        if self.tiering is None or self._loop is None:
            return TierReport()
        self._hot().require_dispatched(DISPATCH_WAIT, "tier_now")
        n = self._loop.run(self.tiering.tier_now())
        self._loop.run(self._upload_offsets())
        return n

    def put(self, message: Message) -> PutResult:
        # _put and TopicTraffic.produced_one written out: two calls fewer on every put.
        res, fut = self.hot.put(message)  # the hot store checks it is open
        if fut is not None:
            fut.result()
        self.traffic.produced(message.topic, 1, len(message.body))
        return res

    def _put(self, message: Message) -> PutResult:
        res, fut = self.hot.put(message)  # the hot store checks it is open
        if fut is not None:
            fut.result()
        return res

    def put_batch(self, messages: Sequence[Message]) -> PutBatchResult:
        res, fut = self._hot().put_batch(messages)
        if fut is not None:
            fut.result()
        self.traffic.produced_batch(messages)
        return res

    def schedule(
        self, message: Message, *, deliver_at: int | None = None, delay_level: int | None = None
    ) -> ScheduleResult:
        """See :meth:`MessageStore.schedule`."""
        stored, when, uniq = self._scheduled(message, deliver_at, delay_level)
        # _put and TopicTraffic.produced_one written out, as in put: two calls fewer.
        res, fut = self.hot.put(stored)  # the hot store checks it is open
        if fut is not None:
            fut.result()
        offset = res.queue_offset
        self.scheduler.scheduled(offset, when)  # acknowledged: spares a read-back
        topic = message.topic
        self.traffic.produced(topic, 1, len(message.body))  # its own topic, not the scheduler's
        return _schedule_result(offset, when, uniq, topic)

    def recall(self, handle: str) -> bool:
        """See :meth:`MessageStore.recall`."""
        self._hot()
        loop = self._sched_loop
        if loop is None:
            raise StoreClosedError("the scheduler is not running (scheduled.enabled is false)")
        return loop.run(self.scheduler.recall(handle))

    def _transactions_loop(self) -> _LoopThread:
        loop = self._sched_loop
        if loop is None:
            raise StoreClosedError(
                "transactions need the store's event loop: open with a cold tier or scheduled.enabled"
            )
        return loop

    def put_half(self, message: Message, *, producer_group: str) -> HalfResult:
        """See :meth:`MessageStore.put_half`."""
        self._hot()
        res = self._transactions_loop().run(self.transactions.prepare(message, producer_group))
        self.traffic.produced_one(message)
        return res

    def end_transaction(self, transaction_id: str, resolution: Resolution | str) -> EndResult:
        """See :meth:`MessageStore.end_transaction`."""
        self._hot()
        return self._transactions_loop().run(self.transactions.end(transaction_id, resolution))

    def commit_transaction(self, transaction_id: str) -> EndResult:
        return self.end_transaction(transaction_id, Resolution.COMMIT)

    def rollback_transaction(self, transaction_id: str) -> EndResult:
        return self.end_transaction(transaction_id, Resolution.ROLLBACK)

    def pending_transactions(
        self, producer_group: str | None = None, *, due: bool = False
    ) -> list[PendingTransaction]:
        """See :meth:`MessageStore.pending_transactions`."""
        self._hot()
        c = self.transactions
        self._transactions_loop().run(c.wait_started())
        return c.pending(producer_group, due=due)

    @property
    def _sched_loop(self) -> _LoopThread | None:
        """The loop the scheduler runs on: the tiering loop, or one of its own without a cold tier."""
        return self._loop if self._loop is not None else self._own_loop

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        policy: ReadPolicy | str | None = None,
        *,
        tags: str | TagFilter | None = None,
        wait_ms: int = 0,
        max_bytes: int | None = None,
    ) -> GetResult:
        """See :meth:`MessageStore.get` (``tags``, ``wait_ms``: the calling thread waits)."""
        if self._check_wait(wait_ms):
            waiting = self._get_waiting(topic, queue_id, offset, max_count, policy, tags, wait_ms, max_bytes)
            return self._run_any(waiting)
        return self._run(self._get(topic, queue_id, offset, max_count, policy, tags, max_bytes))

    def offset_for_time(self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower") -> int:
        """First offset stored at/after ``timestamp`` (``upper``: last of those stored exactly then)."""
        return self._run(self._offset_for_time(topic, queue_id, timestamp, boundary))

    def earliest_time(self, topic: str, queue_id: int) -> int:
        return self._run(self._earliest_time(topic, queue_id))

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """See :meth:`MessageStore.commit_offset`."""
        self._hot()
        self.offsets.commit(group, {self.consumers.check_commit(group, topic, queue_id, offset): offset})

    def reset_offsets(
        self,
        group: str,
        topic: str,
        to: str,
        *,
        timestamp: int | None = None,
        offset: int | None = None,
        queue_id: int | None = None,
    ) -> dict[tuple[str, int], int]:
        """See :meth:`MessageStore.reset_offsets`."""
        return self._run_any(self._reset(group, topic, to, timestamp, offset, queue_id))

    def delete_group(self, group: str, topic: str | None = None) -> int:
        """See :meth:`MessageStore.delete_group`."""
        self._hot()
        return self.offsets.delete(check_group(group), topic)

    def create_topic(
        self, topic: str, queues: int | None = None, *, cold_retention_hours: float | None = None
    ) -> TopicInfo:
        """See :meth:`MessageStore.create_topic`."""
        self._hot()
        self._cold_loaded_now()
        return self._run_any(self.topic_admin.create(topic, queues, cold_retention_hours))

    def update_topic(
        self,
        topic: str,
        *,
        queues: int | None = None,
        cold_retention_hours: float | str | None = None,
        hot_retention_hours: float | None = None,
    ) -> TopicInfo:
        """See :meth:`MessageStore.update_topic`."""
        self._hot()
        self._cold_loaded_now()
        hours = _hours(cold_retention_hours)
        return self._run_any(
            self.topic_admin.update(
                topic, queues=queues, cold_retention_hours=hours, hot_retention_hours=hot_retention_hours
            )
        )

    def delete_topic(self, topic: str, *, force: bool = False) -> None:
        """See :meth:`MessageStore.delete_topic`."""
        self._hot()
        self._cold_loaded_now()
        self._run_any(self.topic_admin.delete(topic, force=force))

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the cold tier has loaded (no-op without one), at most ``timeout`` seconds
        (default ``tiered.ready_timeout``), else NotReadyError. Reads wait by themselves; this
        is for callers that want to wait up front."""
        if self.tiering is not None and self._loop is not None:
            self._loop.run(self.tiering.wait_ready(timeout))

    def _cold_loaded_now(self) -> None:
        # A blocking caller may block: wait (bounded) on the tiering loop instead of refusing.
        if self.tiering is not None and not self.tiering.ready.is_set():
            self.wait_ready()

    def segments(
        self, topic: str | None = None, queue_id: int | None = None, type: str | None = None
    ) -> list[SegmentRow]:
        """Cold segments (filters: topic, queue id, type COMMIT_LOG/CONSUME_QUEUE/INDEX)."""
        return self._run(self._segments(topic, queue_id, type))

    def gc(self) -> GcReport:
        """Apply retention now in both tiers (what the daemon does on its timers)."""
        return self._run_any(self._gc())

    def verify(self, progress: VerifyProgress | None = None, *, repair: bool = False) -> VerifyReport:
        """Check CRCs, consume queues, metadata, cold sizes/checksums, manifests and the bucket
        prefix; lists every problem. Read-only unless ``repair`` (see :mod:`tierd.verify`)."""
        return self._run_any(self._verify(progress, repair))

    @staticmethod
    def verify_store(
        cfg: TierdConfig, progress: VerifyProgress | None = None, *, repair: bool = False
    ) -> VerifyReport:
        """Check a *stopped* store's directory and bucket (see :meth:`MessageStore.verify_store`)."""
        from tierd.verify import verify_store  # lazily: not on the open + put path (issue 31)

        return asyncio.run(verify_store(cfg, progress, repair=repair))

    def _run_any(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine that may suspend even without a cold tier."""
        if self._loop is not None:
            return self._loop.run(coro)
        return asyncio.run(coro)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a read on the tiering loop; without a cold tier the coroutine never suspends, so
        it is driven to completion right here (no loop round trip on the hot path)."""
        if self._loop is not None:
            return self._loop.run(coro)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        coro.close()
        raise RuntimeError("a read without a cold tier tried to suspend")

    def query(
        self,
        topic: str,
        key: str,
        max_count: int = 32,
        begin: int = 0,
        end: int = MAX_TIMESTAMP,
        *,
        max_bytes: int | None = None,
        skip_at_end: int = 0,
    ) -> list[MessageExt]:
        """See :meth:`MessageStore.query`."""
        return self._run(self._query(topic, key, max_count, begin, end, max_bytes, skip_at_end))

    def message(self, msg_id: str, *, topic: str | None = None) -> FoundMessage:
        """See :meth:`MessageStore.message`."""
        return self._run_any(self._message(msg_id, topic))

    def close(self, grace: float | None = None) -> None:
        """Close both tiers; pending messages get ``grace`` seconds (default
        ``server.shutdown_grace``) to reach the cold tier, the rest goes at the next start."""
        self.arrivals.release()
        own, self._own_loop = self._own_loop, None
        if own is not None:
            own.run(self.scheduler.stop())
            own.run(self.transactions.stop())  # its task must not die pending with the loop
            own.stop()
        if self._loop is not None:
            self._loop.run(self.scheduler.stop())
            self._loop.run(self.router.fetcher.aclose())
            self._loop.run(self._stop_consumers())
            self._loop.run(self.topic_admin.stop())
        if self.tiering is not None and self._loop is not None:
            self._loop.run(self.tiering.close(self.config.server.shutdown_grace if grace is None else grace))
            self.tiering = self.router.tiering = None
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
        self.hot.close()

    def __enter__(self) -> BlockingMessageStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def _on_loop(fn: Callable[[], None]) -> None:
    """Call ``fn`` on the running loop (what starts a task there)."""
    fn()


async def _open_async(
    cfg: TierdConfig,
    make: Callable[[HotStore, TieringService | None], S],
    tiering_class: type[TieringService] = TieringService,
) -> S:
    """Open the hot store, start the cold tier, build the facade with ``make`` (which reads the
    consumer offsets) and start its upkeep — on the loop the store will run on.

    A failure or a cancellation on the way closes everything opened so far before it propagates
    — the hot store (its lock, files and threads), the cold tier's tasks and backend sessions —
    so a store that failed to open leaves nothing running and can be opened again at once."""
    hot = await _open_hot(cfg)
    tiering: TieringService | None = None
    try:
        if cfg.tiered.enabled:
            tiering = tiering_class(cfg, hot)
            await tiering.start()
        store = make(hot, tiering)
        await store._start_topics()
    except BaseException:
        # Shielded: a second cancellation must not cut the clean-up short.
        await asyncio.shield(_close_opened(hot, tiering))
        raise
    store._start_consumers()
    return store


async def _open_hot(cfg: TierdConfig) -> HotStore:
    """:meth:`HotStore.open` in a worker thread. The thread cannot be stopped: cancelled while it
    runs, this waits for it and closes the store it opened, then lets the cancellation through."""
    opening = asyncio.ensure_future(asyncio.to_thread(HotStore.open, cfg.store))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            hot = await opening
            await asyncio.to_thread(hot.close)
        raise


async def _close_opened(hot: HotStore, tiering: TieringService | None) -> None:
    """Undo a partial open: stop the cold tier (no final commit) and close the hot store."""
    try:
        if tiering is not None:
            await tiering.close(grace=0)
    except Exception as e:  # the hot store must close whatever the cold tier did
        log.warning("closing the cold tier of a store that failed to open: %s", e)
    finally:
        await asyncio.to_thread(hot.close)


class _BucketStore(BlockingMessageStore):
    """What :meth:`BlockingMessageStore.open_bucket` returns: every read of the facade, every
    write refused (the hot store is a scratch one: a message put there would be acknowledged
    and then lost at close — a misleading answer)."""

    def __init__(
        self,
        cfg: TierdConfig,
        hot: HotStore,
        tiering: TieringService | None,
        loop: _LoopThread,
        cleanup: Callable[[], None],
    ) -> None:
        super().__init__(cfg, hot, tiering, loop)
        self._cleanup = cleanup

    def _refuse(self, operation: str) -> ReadOnlyError:
        return ReadOnlyError(
            f"{operation} is refused: the bucket {self.config.backend.url} is open read-only "
            "(`tierd --bucket`, a DR drill); nothing is written or claimed there",
            operation=operation,
            backend=self.config.backend.url,
        )

    def put(self, message: Message) -> PutResult:
        raise self._refuse("produce")

    def put_batch(self, messages: Sequence[Message]) -> PutBatchResult:
        raise self._refuse("produce")

    def schedule(
        self, message: Message, *, deliver_at: int | None = None, delay_level: int | None = None
    ) -> ScheduleResult:
        raise self._refuse("produce")

    def recall(self, handle: str) -> bool:
        raise self._refuse("recalling a scheduled message")

    def put_half(self, message: Message, *, producer_group: str) -> HalfResult:
        raise self._refuse("sending a half message")

    def end_transaction(self, transaction_id: str, resolution: Resolution | str) -> EndResult:
        raise self._refuse("ending a transaction")

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        raise self._refuse("committing a consumer offset")

    def reset_offsets(
        self,
        group: str,
        topic: str,
        to: str,
        *,
        timestamp: int | None = None,
        offset: int | None = None,
        queue_id: int | None = None,
    ) -> dict[tuple[str, int], int]:
        raise self._refuse("resetting consumer offsets")

    def delete_group(self, group: str, topic: str | None = None) -> int:
        raise self._refuse("deleting a consumer group")

    def gc(self) -> GcReport:
        raise self._refuse("gc")

    def tier_now(self) -> TierReport:
        raise self._refuse("tiering")

    def verify(self, progress: VerifyProgress | None = None, *, repair: bool = False) -> VerifyReport:
        if repair:
            raise self._refuse("verify --repair")
        return super().verify(progress)

    def _start_consumers(self) -> None:
        pass  # no offsets mirror: the bucket's copy is the owner's

    async def _upload_offsets(self) -> None:
        pass

    def close(self, grace: float | None = None) -> None:
        try:
            super().close(0.0)
        finally:
            self._cleanup()


class _LoopThread:
    """An asyncio loop on a daemon thread: the blocking facade runs the (async) cold tier there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tierd-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def __getattr__(name: str) -> Any:
    """``RestoreReport`` on first use: its module (and the read-only stack behind it) is not on
    the open + put path, so it is not imported with this one (issue 31)."""
    if name == "RestoreReport":
        from tierd.tiered.restore import RestoreReport

        return RestoreReport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The HTTP layer takes these from here, not from the layers below (docs/design.md, "Seams").
__all__ = [
    "MAX_GET_COUNT",
    "TOPIC_MAX_LENGTH",
    "BlockingMessageStore",
    "MessageStore",
    "RestoreReport",
    "ScheduleResult",
    "StoreStats",
    "TierReport",
    "byte_bounded_count",
]
