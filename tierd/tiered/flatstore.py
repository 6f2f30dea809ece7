"""FlatFileStore: every queue's :class:`FlatMessageFile`, loaded from and saved to metadata.

Scaling to many queues (docs/tiering.md, "Many queues"): the metadata file is rewritten whole
(7.5 MB and ~0.5 s at 10,000 queues), so writes are few — queues tiered for the first time in a
round are recorded with one write (:meth:`FlatFileStore.create_many`), and concurrent changes
share one write (:meth:`FlatFileStore.save`). Loading reconciles queues with the backend
concurrently (:data:`LOAD_CONCURRENCY`), not one round trip after another.

Damage in the bucket is fenced to its queue (docs/tiering.md, "Damage in the bucket"): a queue
whose cold files do not load (a truncated or missing object, a consume queue that references
commitlog bytes the backend no longer holds) is recorded in :attr:`FlatFileStore.damaged` with
the queue offsets it lost, and nothing more is written into its segments; every other queue loads
and tiers. Before, one such queue stopped the whole cold tier (every queue's reads failed) and
``tierd restore`` refused the whole bucket.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tierd.drivers.paths import segment_dir, topic_dir
from tierd.drivers.segment import FileType
from tierd.errors import CorruptionError, SegmentNotFoundError, TierdError
from tierd.queue_map import QueueMap
from tierd.tiered.flatmessage import FlatMessageFile
from tierd.tiered.guard import GuardedRoot
from tierd.tiered.metadata import MetadataStore, QueueMeta, TieredMetadata, TopicMeta

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from tierd.config import TieredConfig
    from tierd.drivers.segment import DriverRoot
    from tierd.tiered.flatfile import FlatAppendFile
    from tierd.tiered.records import LocalSegment

log = logging.getLogger(__name__)
#: Queues reconciled with the backend at once while loading (each needs a size check of its last
#: segments and a read of its last consume-queue unit: round trips on an object store).
LOAD_CONCURRENCY = 32
#: Load failures that are damage to one queue's objects (fenced to that queue), not a backend
#: that cannot be reached (which fails, and retries, the whole load).
DAMAGE = (CorruptionError, SegmentNotFoundError)


@dataclass(frozen=True, slots=True)
class QueueDamage:
    """A queue whose cold files are damaged: queue offsets ``[first, end)`` are unreadable from
    the cold tier, and nothing more is tiered into it (its messages stay in the hot store)."""

    topic: str
    queue_id: int
    first: int
    end: int
    #: What the load found (names the object and what is wrong with it).
    error: TierdError
    #: The queue as metadata recorded it, when it could not be loaded at all (kept in metadata
    #: as it was, so that nothing is tiered over it after a restart either); None when it was
    #: loaded and serves the offsets before ``first``.
    meta: QueueMeta | None = None

    @property
    def lost(self) -> int:
        return max(0, self.end - self.first)

    def as_dict(self) -> dict[str, Any]:
        """For ``GET /v1/status``, the metrics and the CLI."""
        return {
            "topic": self.topic,
            "queue_id": self.queue_id,
            "first": self.first,
            "end": self.end,
            "messages": self.lost,
            "loaded": self.meta is None,
            "error": self.error.code,
            "message": self.error.message,
        }

    def fence_error(self) -> CorruptionError:
        """What a write into the queue's segments gets."""
        return CorruptionError(
            f"{self.topic}/{self.queue_id} is not tiered any more: its cold files are damaged "
            f"(queue offsets {self.first}..{self.end - 1} unreadable: {self.error.message}); its "
            "new messages stay in the hot store — see docs/tiering.md, 'Damage in the bucket'",
            topic=self.topic,
            queue_id=self.queue_id,
            first=self.first,
            end=self.end,
        )


class FlatFileStore:
    def __init__(self, root: DriverRoot, cfg: TieredConfig, metadata: MetadataStore) -> None:
        self.root = root
        self.cfg = cfg
        self.metadata = metadata
        #: Its topics' highest queue ids are kept too: produce asks for a topic's count per request.
        self.files: QueueMap[FlatMessageFile] = QueueMap()
        self.topics: dict[str, TopicMeta] = {}
        self._save_lock = asyncio.Lock()
        #: Save requests made and covered by a completed write (see :meth:`save`).
        self._save_requested = 0
        self._save_done = 0
        #: Queues whose cold files are damaged (see module doc), found by the last load.
        self.damaged: dict[tuple[str, int], QueueDamage] = {}
        #: Uploaded cold-index segments as recorded in metadata (until the index service owns them).
        self.loaded_index: list[LocalSegment] = []
        #: Set by the tiering service: the index segments to record in metadata.
        self.index_infos: Callable[[], list[LocalSegment]] | None = None
        #: Called after metadata was saved for a structural change (segment created, sealed,
        #: deleted) — the tiering service writes bucket manifests there.
        self.after_change: Callable[[], Awaitable[None]] | None = None

    # ------------------------------------------------------------------ access
    def get(self, topic: str, queue_id: int) -> FlatMessageFile | None:
        return self.files.get((topic, queue_id))

    def _make(self, topic: str, queue_id: int) -> FlatMessageFile:
        return FlatMessageFile(self.root, self.cfg, topic, queue_id, on_change=self._changed)

    async def create(self, topic: str, queue_id: int, first_queue_offset: int) -> FlatMessageFile:
        """A flat file for a queue tiered for the first time, starting at ``first_queue_offset``
        (all history the hot store still has — unlike RocketMQ, which starts two minutes back).
        Refused for a damaged queue that could not be loaded: its history is in the bucket."""
        damage = self.damaged.get((topic, queue_id))
        if damage is not None:
            raise damage.fence_error()
        return (await self.create_many([(topic, queue_id, first_queue_offset)]))[0]

    async def create_many(self, queues: Sequence[tuple[str, int, int]]) -> list[FlatMessageFile]:
        """Flat files for queues ``(topic, queue id, first queue offset)`` tiered for the first
        time, recorded in metadata with ONE write before any data goes into them. (One write per
        queue — two, for its commitlog and consume queue — rewrote the whole file 20,000 times
        for 10,000 new queues: O(n²), hours.)"""
        queues = [q for q in queues if (q[0], q[1]) not in self.damaged]  # never over their history
        made: list[FlatMessageFile] = []
        new_topics: list[str] = []
        next_id = max((t.id for t in self.topics.values()), default=-1) + 1
        for topic, queue_id, first in queues:
            if topic not in self.topics:
                self.topics[topic] = TopicMeta(name=topic, id=next_id)
                new_topics.append(topic)
                next_id += 1
            ff = FlatMessageFile(self.root, self.cfg, topic, queue_id)  # no hook while initialising
            await ff.init_offset(first)
            ff.commitlog.on_change = ff.consumequeue.on_change = self._changed
            self.files[topic, queue_id] = ff
            made.append(ff)
        if made:
            try:
                await self._changed()
            except BaseException:
                # Not recorded, so not created: no data may go into segments metadata lacks.
                for ff in made:
                    self.files.pop((ff.topic, ff.queue_id), None)
                for topic in new_topics:
                    self.topics.pop(topic, None)
                raise
        return made

    async def expect_first_writes(self, queues: Sequence[tuple[str, int]]) -> int:
        """Tell the backend that ``queues`` (just created) are about to get their first
        segments: one listing of each topic's directory (:meth:`DriverRoot.expect_new_dirs`,
        topics at once up to ``max_concurrent_queues``) instead of a confirming listing per new
        segment — two per queue. At most one page per new queue of the topic: fewer requests
        than it saves when the round writes them (a round where they are not due yet spends
        the listing for nothing; the next one confirms per segment). Best effort: a failed
        listing leaves those queues' first writes to confirm themselves. Returns how many queue
        directories were found empty."""
        by_topic: dict[str, list[str]] = {}
        for topic, qid in queues:
            by_topic.setdefault(topic, []).append(str(qid))
        gate = asyncio.Semaphore(self.cfg.max_concurrent_queues)

        async def expect(topic: str, names: list[str]) -> int:
            parent = topic_dir("", self.cfg.cluster, self.cfg.broker, topic)
            async with gate:
                try:
                    return await self.root.expect_new_dirs(parent, names, max_requests=len(names))
                except (TierdError, TimeoutError) as e:
                    log.debug("listing %s before its first writes failed: %s", parent, e)
                    return 0

        return sum(await asyncio.gather(*(expect(t, names) for t, names in by_topic.items())))

    def forget_first_writes(self) -> None:
        """Forget what :meth:`expect_first_writes` found (it holds for one round)."""
        self.root.forget_new_dirs()

    async def _changed(self, _: FlatAppendFile | None = None) -> None:
        await self.save()
        if self.after_change is not None:
            await self.after_change()

    # ------------------------------------------------------------------ persistence
    def snapshot(self) -> TieredMetadata:
        return TieredMetadata.model_validate(self.snapshot_data())

    def snapshot_data(self) -> dict[str, Any]:
        """The metadata as the JSON document :class:`MetadataStore` writes. Queues are built as
        plain objects (their model's dump, field for field: the tests check both agree), the
        rest through the model — so a write costs ~10 µs per queue on the event loop, not a
        model validation per segment."""
        index = self.index_infos() if self.index_infos is not None else self.loaded_index
        head = TieredMetadata(
            cluster=self.cfg.cluster,
            broker=self.cfg.broker,
            topics=tuple(sorted(self.topics.values(), key=lambda t: t.id)),
            index=tuple(index),
        )
        data = head.model_dump(mode="json", by_alias=True)
        data["queues"] = [
            {
                "topic": topic,
                "queue-id": qid,
                "min-offset": ff.min_offset,
                "max-offset": ff.max_offset,
                "commitlog": ff.commitlog.infos_data(),
                "consumequeue": ff.consumequeue.infos_data(),
            }
            for (topic, qid), ff in sorted(self.files.items())
        ]
        unloaded = [d.meta for d in self.damaged.values() if d.meta is not None]
        if unloaded:  # kept as they were: nothing may be tiered over their history
            data["queues"] += [m.model_dump(mode="json", by_alias=True) for m in unloaded]
            data["queues"].sort(key=lambda q: (q["topic"], q["queue-id"]))
        return data

    async def load_queue(self, q: QueueMeta) -> FlatMessageFile:
        """The flat file of one queue as ``q`` records it, reconciled with the backend (not
        registered: :meth:`load_from` does that once every queue loaded)."""
        if not q.commitlog or not q.consumequeue:
            raise CorruptionError(
                f"tiering metadata lists {q.topic}/{q.queue_id} without segments",
                path=str(self.metadata.path),
            )
        ff = self._make(q.topic, q.queue_id)
        await ff.commitlog.load(list(q.commitlog))
        await ff.consumequeue.load(list(q.consumequeue))
        await ff.recover()
        return ff

    async def _load_or_fence(self, q: QueueMeta) -> FlatMessageFile | None:
        """:meth:`load_queue`, with damage fenced to the queue (see module doc): the flat file
        when it loaded — also when only its roll-forward found the commitlog short of what the
        consume queue references (it then serves the offsets before the first lost one) — or
        None when it could not be loaded at all. Damage is recorded in :attr:`damaged`."""
        ff = self._make(q.topic, q.queue_id)
        try:
            if not q.commitlog or not q.consumequeue:
                await self.load_queue(q)  # raises: listed without segments
            await ff.commitlog.load(list(q.commitlog))
            await ff.consumequeue.load(list(q.consumequeue))
        except DAMAGE as e:
            self._fence(QueueDamage(q.topic, q.queue_id, q.min_offset, q.max_offset, e, q))
            return None
        try:
            await ff.recover()
        except DAMAGE as e:
            first = await self._first_lost(ff)
            self._fence(QueueDamage(q.topic, q.queue_id, first, ff.max_offset, e))
        return ff

    @staticmethod
    async def _first_lost(ff: FlatMessageFile) -> int:
        """The first queue offset whose unit points past the commitlog's committed end (units
        of a queue point at ascending bytes: a binary search, a unit read per step)."""
        end = ff.commitlog.commit_offset
        lo, hi = ff.min_offset, ff.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = (await ff.read_units(mid, 1))[0]
            if int(unit["offset"]) + int(unit["size"]) > end:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _fence(self, damage: QueueDamage) -> None:
        key = (damage.topic, damage.queue_id)
        self.damaged[key] = damage
        log.error(
            "cold tier: %s/%d is damaged — queue offsets %d..%d cannot be read from the bucket (%s); "
            "the queue is fenced (nothing more is tiered into it, its new messages stay in the hot "
            "store), every other queue works",
            damage.topic,
            damage.queue_id,
            damage.first,
            damage.end - 1,
            damage.error,
        )
        if isinstance(self.root, GuardedRoot):
            for kind in (FileType.COMMIT_LOG, FileType.CONSUME_QUEUE):
                where = segment_dir(
                    "", self.cfg.cluster, self.cfg.broker, damage.topic, damage.queue_id, kind
                )
                self.root.refuse_writes(where + "/", damage.fence_error())

    async def save(self) -> None:
        """Write the metadata as it stands when this call begins (or later). Concurrent callers
        share writes: one arriving while a write is in flight waits for the next write, which
        snapshots after its change, instead of queueing a whole-file rewrite of its own."""
        self._save_requested += 1
        request = self._save_requested
        async with self._save_lock:
            if self._save_done >= request:
                return  # a write that began after this request covered it
            covered = self._save_requested
            data = self.snapshot_data()
            await asyncio.to_thread(self.metadata.save_data, data)
            self._save_done = covered

    async def load(self) -> int:
        """Rebuild every flat file from the metadata on disk (see :meth:`load_from`)."""
        return await self.load_from(await asyncio.to_thread(self.metadata.load))

    async def load_from(self, meta: TieredMetadata | None) -> int:
        """Rebuild every flat file from ``meta``, reconcile last segments with the backend and
        roll committed-but-unreferenced records forward. Returns the number of queues."""
        if meta is None:
            await self.save()
            return 0
        if (meta.cluster, meta.broker) != (self.cfg.cluster, self.cfg.broker):
            log.warning(
                "metadata belongs to %s/%s, configuration says %s/%s; using the configuration",
                meta.cluster,
                meta.broker,
                self.cfg.cluster,
                self.cfg.broker,
            )
        self.topics = {t.name: t for t in meta.topics}
        self.loaded_index = list(meta.index)
        self.damaged = {}
        if isinstance(self.root, GuardedRoot):
            self.root.refuse_writes_clear()
        gate = asyncio.Semaphore(LOAD_CONCURRENCY)

        async def load_queue(q: QueueMeta) -> FlatMessageFile | None:
            async with gate:
                return await self._load_or_fence(q)

        tasks = [asyncio.ensure_future(load_queue(q)) for q in meta.queues]
        try:
            loaded = await asyncio.gather(*tasks)
        except BaseException:
            # The first failure stops the other loads (the caller retries them all), and is
            # raised as itself: callers tell corruption from an unreachable backend by its type.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        for q, ff in zip(meta.queues, loaded, strict=True):
            if ff is not None:
                self.files[q.topic, q.queue_id] = ff
            if q.topic not in self.topics:
                self.topics[q.topic] = TopicMeta(name=q.topic, id=len(self.topics))
        await self.save()
        return len(self.files)
