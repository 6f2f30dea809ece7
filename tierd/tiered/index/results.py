"""What the cold key index reports: candidate hits, file statuses and rows, counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FileStatus", "IndexFileInfo", "IndexHit", "IndexStats"]


@dataclass(frozen=True, slots=True)
class IndexHit:
    """One candidate message. Matched on key hash and topic id only: the caller reads
    ``size`` bytes at ``flat_offset`` of queue ``queue_id``'s flat commitlog and checks the key."""

    topic_id: int
    queue_id: int
    flat_offset: int
    size: int
    #: Store time rounded down to the index file's whole second (ms): the real store timestamp
    #: is in ``[timestamp, timestamp + 999]``.
    timestamp: int


@dataclass
class IndexStats:
    """Counters of one :class:`ColdIndexService` (monotonic, except the file gauges)."""

    items_added: int = 0
    queries: int = 0
    hits: int = 0
    #: Local and uploaded files whose lookup ran (time range overlapped the query).
    files_queried: int = 0
    #: Backend reads made by queries (2 per uploaded file queried, 1 for an empty slot).
    backend_reads: int = 0
    backend_read_bytes: int = 0
    #: Header reads made by :meth:`ColdIndexService.load`.
    header_reads: int = 0
    compactions: int = 0
    compaction_seconds: float = 0.0
    uploads: int = 0
    uploaded_bytes: int = 0
    expired_files: int = 0
    #: Gauges: files currently local (writable + sealed) and uploaded.
    local_files: int = 0
    uploaded_files: int = 0


class FileStatus(enum.Enum):
    """RocketMQ's IndexStoreFile status."""

    UNSEALED = "unsealed"
    SEALED = "sealed"
    UPLOADED = "uploaded"


@dataclass(frozen=True, slots=True)
class IndexFileInfo:
    """Diagnostics: one index file of the service."""

    begin_timestamp: int
    end_timestamp: int
    status: FileStatus
    item_count: int
    #: Smallest item time (ms, second resolution); None when unknown or empty.
    min_item_time: int | None
