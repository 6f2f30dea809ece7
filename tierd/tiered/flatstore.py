"""FlatFileStore: every queue's :class:`FlatMessageFile`, loaded from and saved to metadata."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tierd.tiered.flatfile import FlatAppendFile, SegmentInfo
from tierd.tiered.flatmessage import FlatMessageFile
from tierd.tiered.metadata import MetadataStore, QueueMeta, SegmentMeta, TieredMetadata, TopicMeta
from tierd.tiered.segment import DriverRoot, FileType

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tierd.config import TieredConfig

log = logging.getLogger(__name__)


def _segment_meta(info: SegmentInfo) -> SegmentMeta:
    return SegmentMeta(
        type=info.file_type.name,
        base_offset=info.base_offset,
        size=info.size,
        sealed=info.sealed,
        create_timestamp=info.created,
        seal_timestamp=info.sealed_at,
        min_timestamp=info.min_timestamp,
        max_timestamp=info.max_timestamp,
        first_queue_offset=info.first_item,
        crc32c=info.crc32c,
    )


def _segment_info(meta: SegmentMeta) -> SegmentInfo:
    return SegmentInfo(
        FileType[meta.type],
        meta.base_offset,
        meta.size,
        meta.sealed,
        meta.min_timestamp,
        meta.max_timestamp,
        meta.create_timestamp,
        meta.seal_timestamp,
        meta.first_queue_offset,
        meta.crc32c,
    )


class FlatFileStore:
    def __init__(self, root: DriverRoot, cfg: TieredConfig, metadata: MetadataStore) -> None:
        self.root = root
        self.cfg = cfg
        self.metadata = metadata
        self.files: dict[tuple[str, int], FlatMessageFile] = {}
        self.topics: dict[str, TopicMeta] = {}
        self._save_lock = asyncio.Lock()
        #: Uploaded cold-index segments as recorded in metadata (until the index service owns them).
        self.loaded_index: list[SegmentInfo] = []
        #: Set by the tiering service: the index segments to record in metadata.
        self.index_infos: Callable[[], list[SegmentInfo]] | None = None
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
        if topic not in self.topics:
            self.topics[topic] = TopicMeta(
                name=topic, id=max((t.id for t in self.topics.values()), default=-1) + 1
            )
        ff = self._make(topic, queue_id)
        self.files[topic, queue_id] = ff
        await ff.init_offset(first_queue_offset)
        return ff

    async def _changed(self, _: FlatAppendFile) -> None:
        await self.save()
        if self.after_change is not None:
            await self.after_change()

    # ------------------------------------------------------------------ persistence
    def snapshot(self) -> TieredMetadata:
        queues = []
        for (topic, qid), ff in sorted(self.files.items()):
            queues.append(
                QueueMeta(
                    topic=topic,
                    queue_id=qid,
                    min_offset=ff.min_offset,
                    max_offset=ff.max_offset,
                    commitlog=tuple(_segment_meta(i) for i in ff.commitlog.infos()),
                    consumequeue=tuple(_segment_meta(i) for i in ff.consumequeue.infos()),
                )
            )
        index = self.index_infos() if self.index_infos is not None else self.loaded_index
        return TieredMetadata(
            cluster=self.cfg.cluster,
            broker=self.cfg.broker,
            topics=tuple(sorted(self.topics.values(), key=lambda t: t.id)),
            queues=tuple(queues),
            index=tuple(_segment_meta(i) for i in index),
        )

    async def save(self) -> None:
        async with self._save_lock:
            meta = self.snapshot()
            await asyncio.to_thread(self.metadata.save, meta)

    async def load(self) -> int:
        """Rebuild every flat file from metadata, reconcile last segments with the backend and
        roll committed-but-unreferenced records forward. Returns the number of queues."""
        meta = await asyncio.to_thread(self.metadata.load)
        if meta is None:
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
        self.loaded_index = [_segment_info(s) for s in meta.index]
        for q in meta.queues:
            ff = self._make(q.topic, q.queue_id)
            await ff.commitlog.load([_segment_info(s) for s in q.commitlog])
            await ff.consumequeue.load([_segment_info(s) for s in q.consumequeue])
            await ff.recover()
            self.files[q.topic, q.queue_id] = ff
            if q.topic not in self.topics:
                self.topics[q.topic] = TopicMeta(name=q.topic, id=len(self.topics))
        await self.save()
        return len(self.files)

    async def destroy_topic(self, topic: str) -> None:
        for key in [k for k in self.files if k[0] == topic]:
            await self.files.pop(key).destroy()
        self.topics.pop(topic, None)
        await self.save()
