"""Checkpoint, abort marker and the store lock file (FORMATS §1.4).

* ``checkpoint``: 4096 bytes, longs at 0 (commitlog flush timestamp), 8 (consume queue), 16
  (index) as RocketMQ writes them. tierd adds, in bytes RocketMQ leaves unused, the commitlog
  offset up to which consume queues and index are durable (long at 40). Recovery re-dispatches
  from exactly there — a record boundary — instead of from the start of a 1 GiB file.
* ``abort``: exists while the store is open; finding it at start-up means the last exit was
  abnormal.
* ``lock``: held with ``flock`` while a process owns the store, so a second process fails fast
  with a clear error instead of corrupting the files.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from typing import TYPE_CHECKING

from tierd.errors import StoreLockedError

if TYPE_CHECKING:
    from pathlib import Path

CHECKPOINT_SIZE = 4096
_LONGS = struct.Struct(">qqq")
_DISPATCHED = struct.Struct(">q")
DISPATCHED_POS = 40
#: RocketMQ backs the minimum off by 3 s to cover records stored around the flush.
MIN_TIMESTAMP_MARGIN_MS = 3000


class Checkpoint:
    """``read_only``: read the file as it is (zeros where it is missing or short) and never
    write it — ``tierd verify`` without --repair must not touch the store."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self._mm: mmap.mmap | None = None
        if read_only:
            raw = path.read_bytes()[:CHECKPOINT_SIZE] if path.exists() else b""
            source: bytes | mmap.mmap = raw + bytes(CHECKPOINT_SIZE - len(raw))
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size < CHECKPOINT_SIZE:
                    os.ftruncate(fd, CHECKPOINT_SIZE)
                self._mm = source = mmap.mmap(fd, CHECKPOINT_SIZE)
            finally:
                os.close(fd)
        self.physic_timestamp, self.logics_timestamp, self.index_timestamp = _LONGS.unpack_from(source, 0)
        self.dispatched_offset: int = _DISPATCHED.unpack_from(source, DISPATCHED_POS)[0]

    @property
    def min_timestamp(self) -> int:
        """Oldest moment up to which commitlog and consume queues are both durable."""
        return int(max(0, min(self.physic_timestamp, self.logics_timestamp) - MIN_TIMESTAMP_MARGIN_MS))

    @property
    def min_timestamp_index(self) -> int:
        return int(min(self.min_timestamp, self.index_timestamp))

    def flush(self) -> None:
        """Write the values (nothing when read-only)."""
        if self._mm is None:
            return
        _LONGS.pack_into(self._mm, 0, self.physic_timestamp, self.logics_timestamp, self.index_timestamp)
        _DISPATCHED.pack_into(self._mm, DISPATCHED_POS, self.dispatched_offset)
        self._mm.flush()

    def close(self) -> None:
        if self._mm is not None:
            self.flush()
            self._mm.close()
            self._mm = None


class StoreLock:
    """Exclusive ``flock`` on ``{dir}/lock`` for the lifetime of the store.

    ``read_only`` (``tierd verify`` without --repair) takes the same lock through a read-only
    descriptor and writes no pid: the file is not changed. With no lock file (a store never
    opened by tierd) there is nothing to lock without creating one, so no lock is taken."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        if read_only:
            try:
                self._fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                self._fd = -1
                return
        else:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(self._fd)
            raise StoreLockedError(
                f"store directory {path.parent} is in use by another process (lock file {path} is held); "
                "stop that process or point store.dir elsewhere",
                path=str(path),
            ) from e
        if not read_only:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, str(os.getpid()).encode())

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1

    @staticmethod
    def holder(path: Path) -> int | None:
        """Whether another process holds the lock at ``path``, without taking it for long: its
        pid (0 when the file does not say), or None when nobody holds it (or there is no file).
        The CLI asks this to decide between opening the store and asking the daemon."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.read(fd, 32).decode("ascii", errors="replace").strip()
                return int(text) if text.isdigit() else 0
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)


class AbortMarker:
    """``{dir}/abort`` exists exactly while the store is open."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.found_at_start = path.exists()

    def create(self) -> None:
        self.path.write_text(str(os.getpid()))
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
