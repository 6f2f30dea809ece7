"""Consume queue (FORMATS §1.2): per topic/queue, 20-byte units pointing into the commitlog.

Unit = commitlog offset (8) · record size (4) · tags code (8). Unit ``i`` lives at byte
``i × 20`` of the logical stream, so a queue offset is found by arithmetic, never by search.
Only the reput thread writes units; readers take whatever prefix is visible.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from tierd.errors import CorruptionError
from tierd.format.cq_unit import UNIT_DTYPE, UNIT_SIZE, decode_units
from tierd.local.mapped_file import CachedFile, MappedFileQueue, fsync_dir, syncfs

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from tierd.local.mapped_file import FileCache, PendingDirSyncs

FLOOR_FILE: Final = "floor"
#: Recovery reads units in pieces growing from a page's worth to this many (64 KiB), up to the
#: first empty unit: a queue with a few messages costs one small read, and the unwritten rest of
#: its file is never touched.
RECOVER_UNITS: Final = 3276
#: Files to make durable (unflushed consume-queue files plus new directories) beyond which one
#: ``syncfs`` replaces an ``fdatasync`` per file: 10,000 queues written since the last
#: checkpoint took 17 s of fsyncs here, one syncfs well under a second.
SYNCFS_THRESHOLD: Final = 64


class ConsumeQueue:
    """The units of one ``(topic, queue_id)``. Its files take descriptors from ``cache`` while in
    use (a store with thousands of queues would otherwise hold one per queue); new files'
    directory entries are made durable through ``dir_syncs`` before the next checkpoint."""

    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        units_per_file: int,
        cache: FileCache,
        dir_syncs: PendingDirSyncs | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id

        def open_file(path: Path, size: int, create: bool) -> CachedFile:
            return CachedFile(path, size, create, cache)

        directory = root / topic / str(queue_id)
        self.files = MappedFileQueue(
            directory, units_per_file * UNIT_SIZE, open_file, dir_syncs, read_only=cache.read_only
        )
        #: First valid queue offset (moves up when retention deletes commitlog data).
        self.min_offset = 0
        #: Offset this queue starts at when it did not start at 0 (a store restored from the cold
        #: tier continues the queue where the cold tier ends). Persisted in ``{dir}/floor``.
        self.floor = 0
        #: Queue offsets :meth:`recover` found damaged: units that do not look written, with
        #: written units after them (the store rebuilds them from the commitlog).
        self.damaged: list[int] = []
        #: Whether :meth:`recover` cut units that were not all zeros (a torn or damaged last
        #: unit): their records must be re-dispatched from this queue's end, not the checkpoint.
        self.cut_written = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ state
    @property
    def max_offset(self) -> int:
        """One past the last unit written: the next queue offset to be dispatched."""
        return max(self.files.max_offset // UNIT_SIZE, self.floor)

    @property
    def _floor_path(self) -> Path:
        return self.files.directory / FLOOR_FILE

    def load(self) -> None:
        self.files.load()
        if self._floor_path.exists():
            self.floor = int(self._floor_path.read_text().strip())
        if self.files.files:
            self.min_offset = self.files.min_offset // UNIT_SIZE
        self.min_offset = max(self.min_offset, self.floor)

    def set_floor(self, queue_offset: int) -> None:
        """Make an empty queue start at ``queue_offset`` (durably: temp file, fsync, rename)."""
        if self.files.max_offset // UNIT_SIZE > queue_offset:
            raise CorruptionError(f"{self.topic}/{self.queue_id} already holds offsets beyond {queue_offset}")
        self.files.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._floor_path.with_suffix(".tmp")
        with tmp.open("w") as fh:
            fh.write(f"{queue_offset}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._floor_path)
        fsync_dir(self.files.directory)
        self.floor = queue_offset
        self.min_offset = max(self.min_offset, queue_offset)

    def recover(self) -> int:
        """Find the end of the written units and truncate after it. Return the commitlog offset
        one past the last unit's record (0 when empty) — where re-dispatch may resume.

        A unit that does not look written (size <= 0 or offset < 0) is the end only when no
        written unit follows it: one flipped byte in the middle of a queue is *damage*, listed
        in :attr:`damaged` and rebuilt from the commitlog — never a reason to cut every later
        unit. Zeros are searched past for :data:`RECOVER_UNITS` units only (a lost block; an
        unwritten tail stays a small read); non-zero bytes to the end of the files read."""
        files = list(self.files)
        self.damaged, self.cut_written = [], False
        start = max(self.floor * UNIT_SIZE, files[0].file_from_offset) if files else self.floor * UNIT_SIZE
        considered = files[-3:]
        pos = max(start, considered[0].file_from_offset) if considered else start
        limit = files[-1].file_from_offset + files[-1].size if files else start
        valid_end, end_phys = pos, 0
        chunk = RECOVER_UNITS // 16
        while pos < limit:
            units = self._raw_units(pos, chunk)
            chunk = min(chunk * 2, RECOVER_UNITS)
            good = _looks_written(units)
            n = len(units) if good.all() else int(np.argmin(good))
            if n:
                last = units[n - 1]
                end_phys = int(last["offset"]) + int(last["size"])
                pos += n * UNIT_SIZE
                valid_end = pos
            if n == len(units):
                continue
            written = any(units[n : n + 1].tobytes())
            search = limit if written else min(limit, pos + (RECOVER_UNITS + 1) * UNIT_SIZE)
            resume = self._next_written(pos + UNIT_SIZE, search)
            if resume is None:
                self.cut_written = written
                break
            self.damaged += range(pos // UNIT_SIZE, resume // UNIT_SIZE)
            pos = resume
        self.files.truncate(valid_end)  # read-only: readers stop there, nothing is erased
        if files and not self.files.files and valid_end // UNIT_SIZE > self.floor:
            # Everything was torn: remember where the queue stands so its offsets never restart.
            if self.files.read_only:
                self.floor = self.min_offset = valid_end // UNIT_SIZE
            else:
                self.set_floor(valid_end // UNIT_SIZE)
        for f in self.files:
            f.wrote = f.flushed = min(f.size, max(0, valid_end - f.file_from_offset))
        return end_phys

    def _raw_units(self, pos: int, count: int) -> npt.NDArray[np.void]:
        """Up to ``count`` units from logical byte ``pos``, never crossing a file end, whatever
        the file's write position (recovery reads what is on disk)."""
        f = self.files.find(pos)
        if f is None:
            return np.empty(0, UNIT_DTYPE)
        at = pos - f.file_from_offset
        return decode_units(f.read(at, min(f.size, at + count * UNIT_SIZE)))

    def _next_written(self, pos: int, limit: int) -> int | None:
        """Logical byte position of the first unit from ``pos`` (before ``limit``) that looks
        written, or None."""
        while pos < limit:
            units = self._raw_units(pos, min(RECOVER_UNITS, (limit - pos) // UNIT_SIZE))
            if not len(units):
                return None
            good = _looks_written(units)
            if good.any():
                return pos + int(np.argmax(good)) * UNIT_SIZE
            pos += len(units) * UNIT_SIZE
        return None

    # ------------------------------------------------------------------ writes (reput thread only)
    def put_units(self, queue_offset: int, units: bytes) -> None:
        """Write units starting at ``queue_offset`` (overwriting is allowed: re-dispatch after a
        crash rewrites the same units)."""
        pos = queue_offset * UNIT_SIZE
        data = memoryview(units)
        if not self.files.files:
            self.min_offset = queue_offset
            if queue_offset > self.floor:
                self.set_floor(queue_offset)  # a queue starting mid-file: remember where
        while data:
            f = self.files.find(pos) or self.files.writable_file(pos)
            if not f.file_from_offset <= pos < f.file_from_offset + f.size:
                f = self.files.new_file(pos - pos % self.files.file_size)
            at = pos - f.file_from_offset
            n = min(len(data), f.size - at)
            f.write(data[:n], at)
            data = data[n:]
            pos += n

    def truncate_from_physical(self, phys: int) -> None:
        """Drop the units at the queue's end that point at or beyond commitlog offset ``phys``
        (commitlog truncated). Walks back from the end in growing pieces: only the last units
        can point past the commitlog's end, and a damaged unit further back — pointing anywhere
        — must not be taken for the place to cut (a binary search could land on it)."""
        end = pos = self.max_offset
        keep = self.min_offset
        chunk = 16
        while pos > self.min_offset:
            f = self.files.find((pos - 1) * UNIT_SIZE)
            if f is None:
                keep = pos  # nothing readable below: nothing there to cut
                break
            first = max(self.min_offset, f.file_from_offset // UNIT_SIZE, pos - chunk)
            chunk = min(chunk * 2, RECOVER_UNITS)
            below = np.flatnonzero(self.read_units(first, pos - first)["offset"] < phys)
            if len(below):
                keep = first + int(below[-1]) + 1
                break
            pos = first
        if keep < end:
            self.files.truncate(keep * UNIT_SIZE)

    def offsets_pointing_into(self, lo: int, hi: int) -> list[int]:
        """Queue offsets of the units at the queue's end pointing into commitlog ``[lo, hi)``
        (walking back from the end while units point at or past ``lo``)."""
        out: list[int] = []
        pos = self.max_offset
        while pos > self.min_offset:
            f = self.files.find((pos - 1) * UNIT_SIZE)
            if f is None:
                break
            first = max(self.min_offset, f.file_from_offset // UNIT_SIZE, pos - RECOVER_UNITS)
            phys = self.read_units(first, pos - first)["offset"]
            inside = np.flatnonzero((phys >= lo) & (phys < hi))
            out[:0] = (first + inside).tolist()
            if (phys < lo).any():
                break
            pos = first
        return out

    # ------------------------------------------------------------------ reads
    def read_units(self, queue_offset: int, max_count: int) -> npt.NDArray[np.void]:
        """Units from ``queue_offset`` on, at most ``max_count``, never crossing a file end."""
        pos = queue_offset * UNIT_SIZE
        f = self.files.find(pos)
        if f is None:
            return np.empty(0, UNIT_DTYPE)
        at = pos - f.file_from_offset
        end = min(f.wrote, at + max_count * UNIT_SIZE)
        if end <= at:
            return np.empty(0, UNIT_DTYPE)
        return decode_units(f.read(at, end))

    def flush(self) -> None:
        self.files.flush()

    def delete_before_physical(self, phys: int) -> int:
        """Retention: delete whole files whose every unit points below commitlog offset ``phys``
        (that data is gone); then move ``min_offset`` to the first unit still readable."""
        with self._lock:
            doomed = 0
            for f in list(self.files)[:-1]:
                last_unit = decode_units(f.read(f.size - UNIT_SIZE, f.size))
                if len(last_unit) and int(last_unit["offset"][0]) + int(last_unit["size"][0]) <= phys:
                    doomed += 1
                else:
                    break
            self.files.delete_first(doomed)
            first = self.files.min_offset // UNIT_SIZE
            self.min_offset = max(self.min_offset, first)
            while self.min_offset < self.max_offset:
                unit = self.read_units(self.min_offset, 1)
                if len(unit) and int(unit["offset"][0]) >= phys:
                    break
                self.min_offset += 1
            return doomed

    def close(self) -> None:
        self.files.close()


def _looks_written(units: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    good: npt.NDArray[np.bool_] = (units["size"] > 0) & (units["offset"] >= 0)
    return good


def flush_queues(queues: Iterable[ConsumeQueue], dir_syncs: PendingDirSyncs) -> None:
    """Make every consume queue durable up to what was written when the call began, with the
    directory entries of new files: file by file when few changed, else with one ``syncfs`` of
    the store's filesystem (see :data:`SYNCFS_THRESHOLD`)."""
    dirty = [(f, f.wrote) for cq in queues for f in cq.files.unflushed()]
    if len(dirty) + len(dir_syncs) > SYNCFS_THRESHOLD:
        dirs = dir_syncs.take()
        try:
            synced = syncfs(dir_syncs.root.parent)
        except BaseException:
            dir_syncs.restore(dirs)
            raise
        if synced:
            for f, target in dirty:
                f.flushed = max(f.flushed, target)
            return
        dir_syncs.restore(dirs)
    for f, _ in dirty:
        f.flush()
    dir_syncs.sync()
