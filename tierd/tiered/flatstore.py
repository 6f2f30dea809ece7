"""FlatFileStore: every queue's :class:`FlatMessageFile`, loaded from and saved to metadata.

Scaling to many queues (docs/tiering.md, "Many queues"): the metadata file is rewritten whole
(7.5 MB and ~0.5 s at 10,000 queues), so writes are few — queues tiered for the first time in a
round are recorded with one write (:meth:`FlatFileStore.create_many`), and concurrent changes
share one write (:meth:`FlatFileStore.save`). Loading reconciles queues with the backend
concurrently (:data:`LOAD_CONCURRENCY`), not one round trip after another.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from tierd.errors import CorruptionError
from tierd.tiered.flatmessage import FlatMessageFile
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


class FlatFileStore:
    def __init__(self, root: DriverRoot, cfg: TieredConfig, metadata: MetadataStore) -> None:
        self.root = root
        self.cfg = cfg
        self.metadata = metadata
        self.files: dict[tuple[str, int], FlatMessageFile] = {}
        self.topics: dict[str, TopicMeta] = {}
        self._save_lock = asyncio.Lock()
        #: Save requests made and covered by a completed write (see :meth:`save`).
        self._save_requested = 0
        self._save_done = 0
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
        (all history the hot store still has — unlike RocketMQ, which starts two minutes back)."""
        return (await self.create_many([(topic, queue_id, first_queue_offset)]))[0]

    async def create_many(self, queues: Sequence[tuple[str, int, int]]) -> list[FlatMessageFile]:
        """Flat files for queues ``(topic, queue id, first queue offset)`` tiered for the first
        time, recorded in metadata with ONE write before any data goes into them. (One write per
        queue — two, for its commitlog and consume queue — rewrote the whole file 20,000 times
        for 10,000 new queues: O(n²), hours.)"""
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
        gate = asyncio.Semaphore(LOAD_CONCURRENCY)

        async def load_queue(q: QueueMeta) -> FlatMessageFile:
            async with gate:
                return await self.load_queue(q)

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
            self.files[q.topic, q.queue_id] = ff
            if q.topic not in self.topics:
                self.topics[q.topic] = TopicMeta(name=q.topic, id=len(self.topics))
        await self.save()
        return len(self.files)
