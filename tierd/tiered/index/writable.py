"""One local index file (``{store_dir}/tiered_index/{begin ts}``): writable, then sealed."""

from __future__ import annotations

import logging
import mmap
import os
import struct
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tierd.errors import CorruptionError, StoreClosedError
from tierd.local.mapped_file import fsync_dir
from tierd.tiered.index.format import (
    HEADER_SIZE,
    HEADER_STRUCT,
    INT32_MAX,
    INT32_MIN,
    ITEM_DTYPE,
    ITEM_SIZE,
    ITEM_STRUCT,
    MAGIC_WRITABLE,
    SLOT_SIZE,
    SLOT_STRUCT,
    I64Array,
    RankArray,
    U32Array,
    item_column,
    read_writable_header,
    size_error,
    writable_size,
)
from tierd.tiered.index.results import FileStatus, IndexFileInfo, IndexHit

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["LocalFile"]

log = logging.getLogger(__name__)

_OFF_END, _OFF_USED = 12, 20  # header field offsets (end ts; used slots + item count)
_COUNTS = struct.Struct(">ii")
_INT64 = struct.Struct(">q")


def _check_name(path: Path, begin: int) -> None:
    if str(begin) != path.name:
        raise CorruptionError(
            f"index file {path}: header begin timestamp {begin} does not match its name", path=str(path)
        )


class LocalFile:
    """One writable or sealed local file. Header values are mirrored in attributes (one writer,
    on the loop thread) and published to the mapping in a crash-safe order."""

    def __init__(
        self,
        path: Path,
        mm: mmap.mmap,
        slots: int,
        items: int,
        header: tuple[int, int, int, int],
        min_item_time: int | None,
    ) -> None:
        self.path = path
        self.slots = slots
        self.items = items
        self.begin, self.end, self.used, self.count = header
        self.min_item_time = min_item_time
        self.status = FileStatus.UNSEALED
        self.item_base = HEADER_SIZE + slots * SLOT_SIZE
        self._mm: mmap.mmap | None = mm
        self._flushed_count = self.count
        #: Per item (by index; [0] unused): how many older items its slot held when it was
        #: inserted — what makes :func:`compact` one element-wise step instead of a chain walk.
        #: Kept only for a file created by this process (zeroed pages: memory only where
        #: written); None after a reopen or once a slot outgrows 16 bits (then the chains
        #: are peeled instead).
        self.ranks: RankArray | None = None
        #: Set when this process seals the file: per (topic id, queue id), the queue offsets
        #: ``[first, end)`` added by this process before the seal — all in this file or older
        #: ones. None for a file sealed before a restart (what it covers is not known).
        self.covers: dict[tuple[int, int], tuple[int, int]] | None = None

    @classmethod
    def create(cls, path: Path, slots: int, items: int, begin: int) -> LocalFile:
        size = writable_size(slots, items)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)  # sparse: disk is used only where items and slots land
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        HEADER_STRUCT.pack_into(mm, 0, MAGIC_WRITABLE, begin, begin, 0, 0)
        # The header reaches the disk now: only a crash inside create() leaves a torn file.
        mm.flush(0, min(size, mmap.PAGESIZE))
        fsync_dir(path.parent)
        f = cls(path, mm, slots, items, (begin, begin, 0, 0), None)
        f._flushed_count = -1
        f.ranks = np.zeros(items + 1, dtype=np.uint16)
        return f

    @classmethod
    def open(cls, path: Path, slots: int, items: int) -> LocalFile:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size != writable_size(slots, items):
                raise size_error(str(path), size, slots, items)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:
            header = read_writable_header(mm, slots, items, str(path))
            _check_name(path, header[0])
            lo = None
            if header[3]:
                col = item_column(mm, "tdiff", slots, header[3])
                lo = header[0] + int(col.min()) * 1000
                del col
        except BaseException:
            mm.close()
            raise
        return cls(path, mm, slots, items, header, lo)

    def _open_mm(self) -> mmap.mmap:
        if self._mm is None:
            raise StoreClosedError(f"index file {self.path} is closed", path=str(self.path))
        return self._mm

    @property
    def mm(self) -> mmap.mmap:
        return self._open_mm()

    @property
    def full(self) -> bool:
        return self.count >= self.items

    @property
    def dirty(self) -> bool:
        return self._mm is not None and self.count != self._flushed_count

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        return (
            self.count > 0
            and (self.min_item_time is None or self.min_item_time <= end_ms)
            and self.end >= begin_ms
        )

    def info(self) -> IndexFileInfo:
        return IndexFileInfo(self.begin, self.end, self.status, self.count, self.min_item_time)

    # ------------------------------------------------------------------ write
    def put(
        self,
        hashes: U32Array,
        topic_ids: I64Array,
        queue_ids: I64Array,
        offsets: I64Array,
        sizes: I64Array,
        timestamps: I64Array,
    ) -> int:
        """Append items in the given order; return how many leading ones fit.

        Byte-identical to inserting them one by one (chains newest first, ``used`` grows by the
        slots that were empty). Publication order: items, then count + used slots, then slot
        table, then end timestamp — a reader that follows a slot finds a written item."""
        mm = self._open_mm()
        m = min(len(hashes), self.items - self.count)
        if m <= 0:
            return 0
        h = hashes[:m]
        ts = timestamps[:m]
        count = self.count
        tdiff = np.clip((ts - self.begin) // 1000, INT32_MIN, INT32_MAX)
        # Group by slot keeping arrival order inside a slot: one sort of distinct keys.
        slot = (h % np.uint32(self.slots)).astype(np.int64)
        order_key = np.sort(slot * m + np.arange(m, dtype=np.int64))
        s_sorted = order_key // m
        pos_sorted = order_key - s_sorted * m
        idx_sorted = pos_sorted + count + 1  # item index of each sorted entry
        first = np.empty(m, dtype=bool)  # oldest new entry of its slot
        first[0] = True
        np.not_equal(s_sorted[1:], s_sorted[:-1], out=first[1:])
        last = np.empty(m, dtype=bool)  # newest new entry of its slot
        last[-1] = True
        last[:-1] = first[1:]

        table = np.ndarray((self.slots,), dtype=">i4", buffer=mm, offset=HEADER_SIZE, strides=(SLOT_SIZE,))
        heads = table[s_sorted[first]].astype(np.int64)
        heads[(heads < 0) | (heads > count)] = 0  # torn garbage after a power loss: new chain
        prev_sorted = np.empty(m, dtype=np.int64)
        prev_sorted[1:] = idx_sorted[:-1]
        prev_sorted[first] = heads
        prev = np.empty(m, dtype=np.int64)
        prev[pos_sorted] = prev_sorted
        if self.ranks is not None:
            self._rank(heads, first, idx_sorted)

        out = np.ndarray((m,), dtype=ITEM_DTYPE, buffer=mm, offset=self.item_base + (count + 1) * ITEM_SIZE)
        out["hash"] = h
        out["topic_id"] = topic_ids[:m]
        out["queue_id"] = queue_ids[:m]
        out["offset"] = offsets[:m]
        out["size"] = sizes[:m]
        out["tdiff"] = tdiff
        out["prev"] = prev
        self.used = min(self.slots, self.used + int(np.count_nonzero(heads == 0)))
        self.count = count + m
        _COUNTS.pack_into(mm, _OFF_USED, self.used, self.count)
        table[s_sorted[last]] = idx_sorted[last]
        self.end = max(self.end, int(ts.max()))
        _INT64.pack_into(mm, _OFF_END, self.end)
        lo = self.begin + int(tdiff.min()) * 1000
        self.min_item_time = lo if self.min_item_time is None else min(self.min_item_time, lo)
        del table, out  # an exported buffer would make mmap.close() fail
        return m

    def _rank(self, heads: I64Array, first: npt.NDArray[np.bool_], idx_sorted: I64Array) -> None:
        """Record the rank of each new item. The new items are sorted by slot, then age;
        ``first`` starts a slot's run and ``heads`` holds that slot's newest older item (0: none),
        so an item's rank is its head's rank + 1 (0 without one) + its place in the run."""
        assert self.ranks is not None
        m = len(first)
        starts = np.flatnonzero(first)
        base = self.ranks[heads].astype(np.int32)
        base += 1
        base *= heads > 0
        base -= starts.astype(np.int32)
        rank = np.repeat(base, np.diff(starts, append=m))
        rank += np.arange(m, dtype=np.int32)
        if int(rank.max()) > np.iinfo(np.uint16).max:
            log.debug("index file %s: a slot outgrew the rank column; compaction walks the chains", self.path)
            self.ranks = None
            return
        self.ranks[idx_sorted] = rank

    # ------------------------------------------------------------------ read
    def lookup(self, hash_: int, topic_id: int, begin_ms: int, end_ms: int, max_count: int) -> list[IndexHit]:
        """Walk the slot's chain (newest first). Links must point at strictly older, published
        items, so a torn chain can neither loop nor read past the item count."""
        mm = self._open_mm()
        hits: list[IndexHit] = []
        cur = int(SLOT_STRUCT.unpack_from(mm, HEADER_SIZE + (hash_ % self.slots) * SLOT_SIZE)[0])
        count, begin, base = self.count, self.begin, self.item_base
        while 0 < cur <= count:
            item_hash, tid, qid, off, size, tdiff, prev = ITEM_STRUCT.unpack_from(mm, base + cur * ITEM_SIZE)
            if item_hash == hash_ and tid == topic_id:
                t = begin + tdiff * 1000
                if t <= end_ms and t + 999 >= begin_ms:
                    hits.append(IndexHit(tid, qid, off, size, t))
                    if len(hits) >= max_count:
                        break
            if prev >= cur:
                break
            cur = prev
        return hits

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        """msync if anything changed since the last flush (safe from a worker thread)."""
        mm = self._mm
        if mm is not None and self.count != self._flushed_count:
            count = self.count
            mm.flush()
            self._flushed_count = count

    def close(self) -> None:
        self.ranks = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a numpy view survived (only after an error): let GC unmap it
                log.warning("index file %s is still referenced; it is unmapped when released", self.path)

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
