"""Fixed-size memory-mapped files and ordered queues of them (commitlog, consume queue).

A :class:`MappedFile` is one preallocated file named by the logical offset of its first byte
(20 digits). Writes go through the mapping (no syscall per message); durability is an explicit
``msync`` of the dirty page range. A :class:`MappedFileQueue` is the ordered list of such files
making one logical byte stream, rolling to a new file when the current one is full.

Thread model: one writer per queue (the commitlog lock, or the reput thread for consume
queues); readers may read committed ranges concurrently. The file list is guarded by a lock so
retention can remove old files while readers look files up.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
from typing import TYPE_CHECKING

from tierd.errors import CorruptionError, StoreFullError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

log = logging.getLogger(__name__)
PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # Linux ≥ 5.14


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        return None
    return libc


_libc = _load_libc()


def offset_to_name(offset: int) -> str:
    return f"{offset:020d}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reserve(fd: int, size: int, path: Path) -> None:
    """Give the file its full size with blocks reserved on disk.

    Writing through a mapping into a *sparse* file when the disk is full kills the process with
    SIGBUS; reserving up front turns that into an ordinary error here, at file creation, where
    the store can refuse writes cleanly. It also keeps block allocation out of page faults."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            path.unlink(missing_ok=True)  # the caller closes ``fd``
            raise StoreFullError(f"no disk space for a new {size}-byte file {path}", path=str(path)) from e
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # filesystem without fallocate (tmpfs variants, some FUSE)


class MappedFile:
    """One fixed-size file mapped into memory. ``wrote`` is the writer's position inside it;
    ``flushed`` how much of that is known durable."""

    __slots__ = (
        "_cbuf",
        "_fd",
        "file_from_offset",
        "flushed",
        "mm",
        "path",
        "populated",
        "size",
        "view",
        "wrote",
    )

    def __init__(self, path: Path, size: int, *, create: bool) -> None:
        self.path = path
        self.size = size
        self.file_from_offset = int(path.name)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self._fd = os.open(path, flags, 0o644)
        actual = os.fstat(self._fd).st_size
        if not create and actual > size:
            os.close(self._fd)
            raise CorruptionError(f"{path} is {actual} bytes, expected {size}", path=str(path))
        try:
            if actual != size:
                _reserve(self._fd, size, path)
            self.mm = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self._fd)
            raise
        self.view = memoryview(self.mm)
        self.wrote = 0
        self.flushed = 0
        #: Bytes from the start whose pages are already faulted in (see :meth:`populate`).
        self.populated = 0
        self._cbuf: ctypes.Array[ctypes.c_char] | None = None

    def populate(self, length: int) -> bool:
        """Fault in the next ``length`` bytes of pages ahead of the writer (MADV_POPULATE_WRITE).

        First writes into a fresh page of a shared file mapping cost a page fault each — 2.5 µs per
        1 KiB record on a VM, more than encoding it. Called from a background thread through
        ctypes, which releases the GIL, so producers never pay for it. Returns False where the
        kernel lacks the call (it is then simply not used)."""
        if self._cbuf is None:
            self._cbuf = (ctypes.c_char * self.size).from_buffer(self.mm)
        start = self.populated
        length = min(length, self.size - start)
        if length <= 0:
            return True
        if (
            _libc is None
            or _libc.madvise(ctypes.addressof(self._cbuf) + start, length, MADV_POPULATE_WRITE) != 0
        ):
            return False
        self.populated = start + length
        return True

    @property
    def free(self) -> int:
        return self.size - self.wrote

    def write(self, data: bytes | memoryview, position: int | None = None) -> None:
        pos = self.wrote if position is None else position
        end = pos + len(data)
        self.mm[pos:end] = data
        if end > self.wrote:
            self.wrote = end

    def flush(self) -> int:
        """Make everything up to the write position durable; return that position.

        ``fdatasync`` on the descriptor writes back pages dirtied through the shared mapping (on
        Linux msync is the same operation) and, unlike ``mmap.flush``, releases the GIL, so
        producers keep appending while the disk works — the basis of group commit."""
        target = self.wrote
        if target > self.flushed:
            os.fdatasync(self._fd)
            self.flushed = target
        return target

    def zero_from(self, position: int) -> None:
        """Erase bytes from ``position`` on (truncation after recovery).

        Writers fill a file contiguously from its start, so everything written lies before the
        first all-zero chunk; stopping there avoids touching (and allocating) the sparse rest of
        a 1 GiB file."""
        chunk = 64 * 1024
        pos = position
        while pos < self.size:
            n = min(chunk, self.size - pos)
            if self.mm[pos : pos + n].count(0) == n:
                break
            self.mm[pos : pos + n] = bytes(n)
            pos += n
        self.mm.flush()
        self.wrote = position
        self.flushed = min(self.flushed, position)

    def close(self) -> None:
        self._cbuf = None  # drop the ctypes export before closing the mapping
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            # A reader still holds a slice (e.g. a zero-copy view); the mapping is released by GC.
            log.debug("mapping of %s still referenced at close", self.path)
        os.close(self._fd)

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class MappedFileQueue:
    """An ordered list of :class:`MappedFile` forming one logical stream of bytes."""

    def __init__(self, directory: Path, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self.lock = threading.RLock()

    def load(self) -> None:
        """Map every existing file in offset order; files must be contiguous and full-sized."""
        self.directory.mkdir(parents=True, exist_ok=True)
        names = sorted(p for p in self.directory.iterdir() if p.name.isdigit() and len(p.name) == 20)
        expected: int | None = None
        for p in names:
            start = int(p.name)
            if expected is not None and start != expected:
                raise CorruptionError(
                    f"{self.directory}: file {p.name} does not follow the previous file "
                    f"(expected start {expected})",
                    path=str(p),
                )
            if p.stat().st_size == 0:
                # Created but never sized: a crash between open and ftruncate. Nothing in it.
                p.unlink()
                continue
            f = MappedFile(p, self.file_size, create=False)
            f.wrote = f.flushed = self.file_size
            self.files.append(f)
            expected = start + self.file_size

    @property
    def min_offset(self) -> int:
        with self.lock:
            return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """Logical offset one past the last written byte."""
        with self.lock:
            if not self.files:
                return 0
            last = self.files[-1]
            return last.file_from_offset + last.wrote

    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def new_file(self, start: int) -> MappedFile:
        self.directory.mkdir(parents=True, exist_ok=True)
        f = MappedFile(self.directory / offset_to_name(start), self.file_size, create=True)
        fsync_dir(self.directory)
        with self.lock:
            self.files.append(f)
        return f

    def writable_file(self, start_if_empty: int = 0) -> MappedFile:
        last = self.last_file()
        if last is None:
            return self.new_file(start_if_empty - start_if_empty % self.file_size)
        if last.free == 0:
            return self.new_file(last.file_from_offset + self.file_size)
        return last

    def find(self, offset: int) -> MappedFile | None:
        """The file holding logical ``offset`` (None when it was deleted or never written)."""
        with self.lock:
            if not self.files:
                return None
            first = self.files[0].file_from_offset
            idx = (offset - first) // self.file_size
            if 0 <= idx < len(self.files):
                f = self.files[idx]
                if f.file_from_offset <= offset < f.file_from_offset + self.file_size:
                    return f
            return None

    def flush(self) -> int:
        """Flush every file with unflushed bytes; return the logical offset now durable.

        The end is read *before* syncing: bytes appended while the sync runs may not be covered,
        so they must not be reported durable."""
        with self.lock:
            end = self.max_offset
            files = [f for f in self.files if f.wrote > f.flushed]
        for f in files:
            f.flush()
        return end

    def truncate(self, offset: int) -> None:
        """Drop everything at or beyond ``offset`` (recovery): zero the tail of the file holding
        it and delete later files."""
        with self.lock:
            keep: list[MappedFile] = []
            for f in self.files:
                if f.file_from_offset + self.file_size <= offset:
                    keep.append(f)
                elif f.file_from_offset <= offset:
                    f.zero_from(offset - f.file_from_offset)
                    if offset > f.file_from_offset:
                        keep.append(f)
                    else:
                        f.destroy()
                else:
                    f.destroy()
            self.files = keep
        if self.directory.exists():
            fsync_dir(self.directory)

    def discard(self, files: list[MappedFile]) -> None:
        """Remove freshly created (empty) files again, e.g. after a failed multi-file append."""
        with self.lock:
            self.files = [f for f in self.files if f not in files]
        for f in files:
            f.destroy()

    def delete_first(self, count: int) -> list[MappedFile]:
        """Remove the ``count`` oldest files (retention); never the last one."""
        with self.lock:
            victims = self.files[: max(0, min(count, len(self.files) - 1))]
            self.files = self.files[len(victims) :]
        for f in victims:
            f.destroy()
        return victims

    def __iter__(self) -> Iterator[MappedFile]:
        with self.lock:
            return iter(list(self.files))

    def close(self) -> None:
        with self.lock:
            for f in self.files:
                f.close()
            self.files = []
