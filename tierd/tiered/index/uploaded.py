"""One uploaded index file: an INDEX segment on the backend, looked up with two ranged reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierd.drivers.segment import ByteRange
from tierd.tiered.index.format import HEADER_SIZE, SLOT_SIZE
from tierd.tiered.index.reading import MAX_SLOT_READ, slot_extent, slot_hits, slot_position
from tierd.tiered.index.results import FileStatus, IndexFileInfo, IndexHit, IndexStats

if TYPE_CHECKING:
    from tierd.drivers.segment import SegmentDriver
    from tierd.tiered.records import LocalSegment

__all__ = ["UploadedFile"]


class UploadedFile:
    """An INDEX segment; geometry comes from its header (read once at load or known at upload)."""

    def __init__(
        self,
        info: LocalSegment,
        driver: SegmentDriver,
        *,
        slots: int,
        count: int,
        end: int,
    ) -> None:
        self.info = info
        self.driver = driver
        self.begin = info.base_offset
        #: 0 = unreadable (bad header): kept for metadata and expiry, never queried.
        self.slots = slots
        self.count = count
        self.end = end
        self.item_base = HEADER_SIZE + slots * SLOT_SIZE

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        lo = self.info.min_store_timestamp
        return self.slots > 0 and self.count > 0 and (lo is None or lo <= end_ms) and self.end >= begin_ms

    def info_row(self) -> IndexFileInfo:
        return IndexFileInfo(
            self.begin, self.end, FileStatus.UPLOADED, self.count, self.info.min_store_timestamp
        )

    async def lookup(
        self, hash_: int, topic_id: int, begin_ms: int, end_ms: int, max_count: int, stats: IndexStats
    ) -> list[IndexHit]:
        raw = await self.driver.read(ByteRange(slot_position(self.slots, hash_), SLOT_SIZE))
        stats.backend_reads += 1
        stats.backend_read_bytes += SLOT_SIZE
        pos, length = slot_extent(raw, self.slots, self.count, hash_, self.driver.path)
        hits: list[IndexHit] = []
        done = 0
        while done < length and len(hits) < max_count:
            n = min(length - done, MAX_SLOT_READ)
            chunk = await self.driver.read(ByteRange(pos + done, n))
            stats.backend_reads += 1
            stats.backend_read_bytes += n
            done += n
            found = slot_hits(chunk, self.begin, hash_, topic_id, begin_ms, end_ms)
            hits.extend(found[: max_count - len(hits)])
        return hits
