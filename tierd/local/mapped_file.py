"""Fixed-size files and ordered queues of them (commitlog, consume queue).

A file here has a fixed logical size and is named by the logical offset of its first byte (20
digits); a :class:`MappedFileQueue` is the ordered list of such files making one logical byte
stream, rolling to a new file when the current one is full. Two kinds of file:

* :class:`MappedFile` (the commitlog): mapped into memory for its whole life. Writes go through
  the mapping (no syscall per message); durability is an explicit ``fdatasync``. Only the file
  being written keeps a descriptor of its own (``fdatasync`` without opening anything: the
  basis of group commit); the mapping itself holds one more (CPython's ``mmap`` duplicates it).
* :class:`CachedFile` (consume queues): read and written with ``pread``/``pwrite`` through a
  descriptor from a :class:`FileCache`, which keeps at most ``store.max_open_queue_files`` open
  and closes the least recently used beyond that. A store with 10,000 queues therefore runs
  under ``ulimit -n 1024`` (a descriptor per queue exhausted it at ~500 queues). No mapping: the
  first write into a fresh block is a buffered write (~7 µs here), not a page fault that
  converts the block under the filesystem journal (~1.6 ms here, i.e. 16 s of dispatch for
  10,000 new queues).

Disk use follows the data, not the file size (docs/hot-store.md, "Resources"). Files are
created *sparse* (``ftruncate``). A consume-queue file needs nothing more: ``pwrite`` on a full
disk fails with ENOSPC. A mapped file does: writing into a hole through a mapping on a full disk
kills the process with SIGBUS, so :meth:`MappedFile.reserve` allocates blocks
(``posix_fallocate``) ahead of the writer, in steps — double what is written, at least a page,
at most :data:`RESERVE_AHEAD` ahead — and a full disk is an ordinary
:class:`~tierd.errors.StoreFullError` before the write. Running out of descriptors or mappings
(EMFILE/ENFILE/ENOMEM) is one :class:`~tierd.errors.ResourceExhaustedError` naming the limit.

Thread model: one writer per queue (the commitlog lock, or the reput thread for consume
queues); readers may read committed ranges concurrently. The file list is guarded by a lock so
retention can remove old files while readers look files up.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Generic, TypeVar

from tierd.descriptors import open_files_limit
from tierd.errors import CorruptionError, ResourceExhaustedError, StoreClosedError, StoreFullError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

log = logging.getLogger(__name__)
PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # Linux ≥ 5.14
#: The smallest reservation (one page: what the filesystem allocates anyway).
RESERVE_MIN = PAGE
#: Reservations run at most this far ahead of the writer (a busy commitlog reserves 64 MiB per
#: ``posix_fallocate``, a store with a few messages one page).
RESERVE_AHEAD = 64 * 1024 * 1024
#: Buffers per ``pwritev`` call (the kernel's limit, 1024 on Linux).
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
#: Bytes read at once while looking for the end of the written part of a file.
SCAN_CHUNK = 64 * 1024
#: errnos meaning "the process or the system is out of descriptors or mappings".
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        return None
    return libc


_libc = _load_libc()


def _load_syncfs() -> Callable[[int], int] | None:
    fn = getattr(_libc, "syncfs", None)
    if fn is None:  # pragma: no cover - non-Linux
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_syncfs = _load_syncfs()


def syncfs(path: Path) -> bool:
    """Make everything written to the filesystem holding ``path`` durable with one call (data,
    metadata, directory entries; Linux ``syncfs``, which releases the GIL through ctypes).
    False where it is not available — the caller then syncs file by file."""
    if _syncfs is None:  # pragma: no cover - non-Linux
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of {path} failed: {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


def offset_to_name(offset: int) -> str:
    return f"{offset:020d}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PendingDirSyncs:
    """Directories under ``root`` whose new entries (files, subdirectories) are not durable yet.

    Creating a consume-queue file must not cost a directory ``fsync`` on the dispatch path
    (1.5 ms each here: 15 s of dispatch for 10,000 new queues). The entries only need to be
    durable before a checkpoint claims the units in them are: the store syncs every pending
    directory right before it advances the checkpoint (:meth:`sync`), and after a crash
    recovery re-dispatches from the last checkpoint, recreating whatever did not survive."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: set[Path] = set()
        self._lock = threading.Lock()

    def add(self, directory: Path) -> None:
        """``directory`` got a new entry; so may every parent up to ``root`` (made with it)."""
        with self._lock:
            d = directory
            while True:
                self._dirs.add(d)
                if d == self.root or d.parent == d or not d.is_relative_to(self.root):
                    break
                d = d.parent

    def __len__(self) -> int:
        return len(self._dirs)

    def take(self) -> set[Path]:
        """The pending directories, no longer pending (the caller makes them durable, or gives
        them back with :meth:`restore` when it cannot)."""
        with self._lock:
            todo, self._dirs = self._dirs, set()
        return todo

    def restore(self, dirs: set[Path]) -> None:
        with self._lock:
            self._dirs.update(dirs)

    def sync(self) -> int:
        """fsync every pending directory; returns how many. On failure the rest stay pending."""
        todo = self.take()
        ordered = sorted(todo, key=lambda p: len(p.parts), reverse=True)  # deepest first
        done = 0
        try:
            for d in ordered:
                # FileNotFoundError: removed meanwhile (a deleted topic), nothing to make durable.
                with contextlib.suppress(FileNotFoundError):
                    fsync_dir(d)
                done += 1
        except BaseException:
            self.restore(set(ordered[done:]))
            raise
        return done


def exhausted(e: OSError, what: str) -> ResourceExhaustedError:
    """The one clear error for a process that ran out of descriptors or mappings: which limit,
    how to raise it, and which setting bounds tierd's own use."""
    if e.errno == errno.ENOMEM:
        reason = "out of memory or of memory mappings (vm.max_map_count)"
    else:
        scope = "the system-wide file table (fs.file-max)" if e.errno == errno.ENFILE else "open files"
        reason = (
            f"too many open files: {scope} is exhausted (RLIMIT_NOFILE of this process: "
            f"{open_files_limit()}); raise the limit (ulimit -n, LimitNOFILE=) or lower "
            "store.max_open_queue_files"
        )
    return ResourceExhaustedError(f"cannot {what}: {reason}", errno=e.errno)


def _open(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno in _EXHAUSTED:
            raise exhausted(e, f"open {path}") from e
        raise


def _no_space(e: OSError, path: Path, end: int) -> StoreFullError:
    return StoreFullError(f"no disk space to extend {path} to {end} bytes", path=str(path))


class FixedFile:
    """What a :class:`MappedFileQueue` needs of a file: position bookkeeping and byte access.
    ``wrote`` is the writer's position inside it; ``flushed`` how much of that is durable."""

    __slots__ = ("file_from_offset", "flushed", "path", "size", "wrote")

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.file_from_offset = int(path.name)
        self.wrote = 0
        self.flushed = 0

    @property
    def free(self) -> int:
        return self.size - self.wrote

    def read(self, start: int, stop: int) -> bytes:
        """A copy of bytes ``[start, stop)``."""
        raise NotImplementedError

    def write(self, data: bytes | memoryview, position: int | None = None) -> None:
        """Write ``data`` at ``position`` (default: the write position); move ``wrote`` past it."""
        raise NotImplementedError

    def flush(self) -> int:
        """Make everything up to the write position durable; return that position."""
        raise NotImplementedError

    def release_fd(self) -> None:
        """Give up a descriptor the file keeps for itself, if any (it is not written any more)."""

    def close(self) -> None:
        raise NotImplementedError

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def zero_from(self, position: int) -> None:
        """Erase bytes from ``position`` on (truncation after recovery).

        Writers fill a file contiguously from its start, so everything written lies before the
        first all-zero chunk; stopping there avoids touching (and allocating) the sparse rest of
        a 1 GiB file. Made durable only if something was erased."""
        pos = position
        erased = False
        chunk = PAGE  # a torn tail is short: look at a page first, then in growing pieces
        while pos < self.size:
            n = min(chunk, self.size - pos)
            if self.read(pos, pos + n).count(0) == n:
                break
            self.write(bytes(n), pos)
            erased = True
            pos += n
            chunk = min(chunk * 2, SCAN_CHUNK)
        self.wrote = position
        self.flushed = min(self.flushed, position)
        if erased:
            self._sync()

    def _sync(self) -> None:
        raise NotImplementedError


def _allocate(fd: int, offset: int, length: int, path: Path) -> None:
    """Reserve blocks for ``[offset, offset + length)`` of an already sized file."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _no_space(e, path, offset + length) from e
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # A filesystem without fallocate (some FUSE): blocks are allocated as pages are written.


def _create_sparse(path: Path, size: int, *, create: bool, fd: int) -> None:
    """Give a new (or short, torn at creation) file its logical size without allocating it; a
    file larger than ``size`` is corrupt."""
    actual = os.fstat(fd).st_size
    if not create and actual > size:
        raise CorruptionError(f"{path} is {actual} bytes, expected {size}", path=str(path))
    if actual != size:
        os.ftruncate(fd, size)


def _check_size(path: Path, size: int, fd: int) -> None:
    """A file opened read-only must already have its size (it cannot be given it)."""
    if (actual := os.fstat(fd).st_size) != size:
        raise CorruptionError(f"{path} is {actual} bytes, expected {size}", path=str(path))


class MappedFile(FixedFile):
    """One file mapped into memory for its whole life (the commitlog). ``reserved``: bytes from
    the start with blocks reserved on disk (see :meth:`reserve`)."""

    __slots__ = ("_cbuf", "_fd", "_mm", "_view", "populated", "reserved")

    def __init__(self, path: Path, size: int, create: bool, *, read_only: bool = False) -> None:
        super().__init__(path, size)
        self._cbuf: ctypes.Array[ctypes.c_char] | None = None
        #: Bytes from the start whose pages are already faulted in (see :meth:`populate`).
        self.populated = 0
        #: 0 for a file found on disk: reserving again what is allocated already costs nothing.
        self.reserved = 0
        # Read-only (``tierd verify``): mapped without write permission, so no code path can
        # change a byte of it; a short file is reported instead of being sized.
        fd = _open(path, os.O_RDONLY if read_only else os.O_RDWR | (os.O_CREAT if create else 0))
        try:
            if read_only:
                _check_size(path, size, fd)
            else:
                _create_sparse(path, size, create=create, fd=fd)
            prot = mmap.PROT_READ if read_only else mmap.PROT_READ | mmap.PROT_WRITE
            try:
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
            except OSError as e:
                if e.errno in _EXHAUSTED:
                    raise exhausted(e, f"map {path}") from e
                raise
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self._mm: mmap.mmap | None = mm
        self._view: memoryview | None = memoryview(mm)

    @property
    def mm(self) -> mmap.mmap:
        if self._mm is None:
            raise StoreClosedError(f"{self.path} is closed", path=str(self.path))
        return self._mm

    @property
    def view(self) -> memoryview:
        if self._view is None:
            raise StoreClosedError(f"{self.path} is closed", path=str(self.path))
        return self._view

    def reserve(self, end: int) -> None:
        """Make sure blocks up to ``end`` are allocated on disk, reserving ahead in steps (double
        what is written, at least a page, at most :data:`RESERVE_AHEAD` ahead): disk use stays
        proportional to the data, and the writer reserves once per step, not per write.
        StoreFullError when the disk has no room; nothing is written then."""
        if end <= self.reserved:
            return
        target = min(max(end * 2, RESERVE_MIN), end + RESERVE_AHEAD)
        target = min(self.size, -(-target // PAGE) * PAGE)
        fd = self._fd if self._fd is not None else _open(self.path, os.O_RDWR)
        try:
            _allocate(fd, self.reserved, target - self.reserved, self.path)
        finally:
            if fd != self._fd:
                os.close(fd)
        self.reserved = target

    def populate(self, length: int) -> bool:
        """Fault in the next ``length`` bytes of pages ahead of the writer (MADV_POPULATE_WRITE),
        within the reserved range (populating a hole would allocate it unchecked).

        First writes into a fresh page of a shared file mapping cost a page fault each — 2.5 µs per
        1 KiB record on a VM, more than encoding it. Called from a background thread through
        ctypes, which releases the GIL, so producers never pay for it. Returns False where the
        kernel lacks the call (it is then simply not used)."""
        if self._cbuf is None:
            self._cbuf = (ctypes.c_char * self.size).from_buffer(self.mm)
        start = self.populated
        length = min(length, self.reserved - start)
        if length <= 0:
            return True
        if (
            _libc is None
            or _libc.madvise(ctypes.addressof(self._cbuf) + start, length, MADV_POPULATE_WRITE) != 0
        ):
            return False
        self.populated = start + length
        return True

    def read(self, start: int, stop: int) -> bytes:
        return self.mm[start:stop]

    def write(self, data: bytes | memoryview, position: int | None = None) -> None:
        pos = self.wrote if position is None else position
        end = pos + len(data)
        if end > self.reserved:
            self.reserve(end)
        self.mm[pos:end] = data
        if end > self.wrote:
            self.wrote = end

    def write_pieces(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Append ``pieces`` at the write position with gathering
        ``pwritev`` calls: one kernel copy into the page cache — the very pages the mapping
        shows (Linux has one page cache for both) — made with the GIL released, where a join
        and a copy through the mapping were two copies under it. Without a descriptor, after a
        short write or an I/O error the rest goes through the mapping, as :meth:`write` does.
        Blocks are reserved first, so a full disk is a :class:`StoreFullError` before any byte."""
        pos = self.wrote
        end = pos + sum(map(len, pieces))
        if end > self.reserved:
            self.reserve(end)
        fd = self._fd
        i = 0
        if fd is not None:
            try:
                while i < len(pieces):
                    chunk = pieces[i : i + IOV_MAX]
                    wrote = os.pwritev(fd, chunk, pos)
                    pos += wrote
                    i += len(chunk)
                    if wrote != sum(map(len, chunk)):
                        i -= len(chunk)  # short: redo this chunk's rest through the mapping
                        break
            except OSError as e:
                log.warning("pwritev to %s failed (%s); writing through the mapping", self.path, e)
        if i < len(pieces):
            rest = b"".join(pieces[i:])
            self.mm[pos:end] = rest[len(rest) - (end - pos) :]
        self.wrote = end

    def flush(self) -> int:
        """``fdatasync`` writes back pages dirtied through the shared mapping (on Linux msync is
        the same operation) and, unlike ``mmap.flush``, releases the GIL, so producers keep
        appending while the disk works — the basis of group commit. A full file gives its own
        descriptor up once flushed; flushing it later opens one for the call."""
        target = self.wrote
        if target > self.flushed:
            if self._fd is not None:
                os.fdatasync(self._fd)
            else:
                fd = _open(self.path, os.O_RDWR)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            self.flushed = target
        if self.flushed >= self.size:
            self.release_fd()
        return target

    def _sync(self) -> None:
        self.mm.flush()

    def release_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self._cbuf = None  # drop the ctypes export before closing the mapping
        mm, view = self._mm, self._view
        try:
            if view is not None:
                view.release()
            if mm is not None:
                mm.close()
            self._mm = self._view = None
        except BufferError:
            # A reader still holds a slice (e.g. a zero-copy view); the mapping is released by GC.
            log.debug("mapping of %s still referenced at close", self.path)
        self.release_fd()


class FileCache:
    """Bounds how many consume-queue files are open at once (each holds a file descriptor).

    A :class:`CachedFile` gets its descriptor here on use (:meth:`pin`) and gives it back
    (:meth:`unpin`); beyond ``limit`` open files the least recently used unpinned one is closed.
    A pinned file is never closed — a ``pread`` in flight can never see its descriptor number
    reused by another file — so while every file is pinned the bound is exceeded for as long as
    the pins last (one per thread at most). When the process runs out of descriptors anyway,
    every unpinned file is closed and the open tried once more before it fails with
    :class:`~tierd.errors.ResourceExhaustedError`.
    """

    def __init__(self, limit: int, *, read_only: bool = False) -> None:
        self.limit = max(1, limit)
        #: Files are opened read-only (``tierd verify``): a write fails instead of changing one.
        self.read_only = read_only
        self._open: OrderedDict[CachedFile, None] = OrderedDict()
        self._lock = threading.Lock()
        #: Opens and closes since the start (metrics, tests).
        self.opens = 0
        self.closes = 0

    @property
    def open_files(self) -> int:
        """Files open now."""
        return len(self._open)

    def pin(self, f: CachedFile, flags: int = os.O_RDWR) -> int:
        """Open ``f`` if needed, mark it most recently used and pinned; return its descriptor."""
        if self.read_only:
            flags = os.O_RDONLY
        with self._lock:
            if f._closed:
                raise StoreClosedError(f"{f.path} is closed", path=str(f.path))
            fd = f._fd
            if fd is None:
                self._shrink(self.limit - 1)
                fd = f._fd = self._open_fd(f.path, flags)
                self._open[f] = None
                self.opens += 1
            else:
                self._open.move_to_end(f)
            f._pins += 1
            return fd

    def unpin(self, f: CachedFile) -> None:
        with self._lock:
            f._pins -= 1
            if f._closed and not f._pins:
                self._close(f)

    def forget(self, f: CachedFile) -> None:
        """``f`` is closed for good: close its descriptor now, or when its last pin goes."""
        with self._lock:
            f._closed = True
            if not f._pins:
                self._close(f)

    def _close(self, f: CachedFile) -> None:
        fd, f._fd = f._fd, None
        if fd is not None:
            del self._open[f]
            os.close(fd)
            self.closes += 1

    def _shrink(self, keep: int) -> None:
        excess = len(self._open) - keep
        if excess <= 0:
            return
        victims = []
        for f in self._open:
            if not f._pins:
                victims.append(f)
                if len(victims) == excess:
                    break
        for f in victims:
            self._close(f)

    def _open_fd(self, path: Path, flags: int) -> int:
        try:
            return os.open(path, flags | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno not in _EXHAUSTED:
                raise
            self._shrink(0)
            try:
                return os.open(path, flags | os.O_CLOEXEC, 0o644)
            except OSError as e2:
                if e2.errno in _EXHAUSTED:
                    raise exhausted(e2, f"open {path}") from e2
                raise


class CachedFile(FixedFile):
    """One consume-queue file, read and written with ``pread``/``pwrite`` through a descriptor
    from a :class:`FileCache` (see the module docstring for why not a mapping)."""

    __slots__ = ("_cache", "_closed", "_fd", "_pins")

    def __init__(self, path: Path, size: int, create: bool, cache: FileCache) -> None:
        super().__init__(path, size)
        self._cache = cache
        self._fd: int | None = None
        self._pins = 0
        self._closed = False
        if not create and (cache.read_only or os.stat(path).st_size == size):
            return  # opened on first use (read-only: a short file is read as it is, not sized)
        fd = cache.pin(self, os.O_RDWR | (os.O_CREAT if create else 0))
        try:
            _create_sparse(path, size, create=create, fd=fd)
        finally:
            cache.unpin(self)

    def read(self, start: int, stop: int) -> bytes:
        fd = self._cache.pin(self)
        try:
            data = os.pread(fd, stop - start, start)
            while len(data) < stop - start:  # short only at the end of the file
                more = os.pread(fd, stop - start - len(data), start + len(data))
                if not more:
                    break
                data += more
            return data
        finally:
            self._cache.unpin(self)

    def write(self, data: bytes | memoryview, position: int | None = None) -> None:
        pos = self.wrote if position is None else position
        end = pos + len(data)
        view = memoryview(data)
        fd = self._cache.pin(self)
        try:
            at = pos
            while view:
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise _no_space(e, self.path, end) from e
            raise
        finally:
            self._cache.unpin(self)
        if end > self.wrote:
            self.wrote = end

    def flush(self) -> int:
        target = self.wrote
        if target > self.flushed:
            try:
                self._sync()
            except FileNotFoundError:
                return target  # deleted meanwhile (retention): nothing left to make durable
            self.flushed = target
        return target

    def _sync(self) -> None:
        fd = self._cache.pin(self)
        try:
            os.fdatasync(fd)
        finally:
            self._cache.unpin(self)

    def close(self) -> None:
        self._cache.forget(self)


F = TypeVar("F", bound=FixedFile)


class MappedFileQueue(Generic[F]):
    """An ordered list of files (made by ``open_file(path, size, create)``) forming one logical
    stream of bytes."""

    def __init__(
        self,
        directory: Path,
        file_size: int,
        open_file: Callable[[Path, int, bool], F],
        dir_syncs: PendingDirSyncs | None = None,
        *,
        read_only: bool = False,
    ) -> None:
        self.directory = directory
        #: Opened for ``tierd verify``: nothing is created, deleted or erased; :meth:`truncate`
        #: only moves the positions (what a reader sees), never the bytes on disk.
        self.read_only = read_only
        self.file_size = file_size
        self.open_file = open_file
        #: Where a new file's directory entry is left to be made durable (None: at once).
        self.dir_syncs = dir_syncs
        self.files: list[F] = []
        self.lock = threading.RLock()

    def load(self) -> None:
        """Open every existing file in offset order; files must be contiguous and full-sized.
        Only the last keeps a descriptor of its own."""
        if self.read_only and not self.directory.is_dir():
            return
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
                if not self.read_only:
                    p.unlink()
                continue
            f = self.open_file(p, self.file_size, False)
            f.wrote = f.flushed = self.file_size
            if self.files:
                self.files[-1].release_fd()
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

    def last_file(self) -> F | None:
        return self.files[-1] if self.files else None

    def new_file(self, start: int) -> F:
        if self.read_only:
            raise StoreClosedError(f"{self.directory} is open read-only", path=str(self.directory))
        self.directory.mkdir(parents=True, exist_ok=True)
        f = self.open_file(self.directory / offset_to_name(start), self.file_size, True)
        if self.dir_syncs is not None:
            self.dir_syncs.add(self.directory)
        else:
            fsync_dir(self.directory)
        with self.lock:
            self.files.append(f)
        return f

    def writable_file(self, start_if_empty: int = 0) -> F:
        last = self.last_file()
        if last is None:
            return self.new_file(start_if_empty - start_if_empty % self.file_size)
        if last.free == 0:
            return self.new_file(last.file_from_offset + self.file_size)
        return last

    def find(self, offset: int) -> F | None:
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

    def unflushed(self) -> list[F]:
        """Files with bytes written but not known durable."""
        with self.lock:
            return [f for f in self.files if f.wrote > f.flushed]

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
        it and delete later files. Read-only: the files stay as they are; readers stop at
        ``offset`` (later files are closed, the one holding it ends there)."""
        with self.lock:
            keep: list[F] = []
            for f in self.files:
                if f.file_from_offset + self.file_size <= offset:
                    keep.append(f)
                elif self.read_only:
                    if f.file_from_offset < offset:
                        f.wrote = f.flushed = offset - f.file_from_offset
                        keep.append(f)
                    else:
                        f.close()
                elif f.file_from_offset <= offset:
                    f.zero_from(offset - f.file_from_offset)
                    if offset > f.file_from_offset:
                        keep.append(f)
                    else:
                        f.destroy()
                else:
                    f.destroy()
            removed = len(keep) < len(self.files)
            self.files = keep
        if removed and self.directory.exists() and not self.read_only:
            fsync_dir(self.directory)

    def discard(self, files: list[F]) -> None:
        """Remove freshly created (empty) files again, e.g. after a failed multi-file append."""
        with self.lock:
            self.files = [f for f in self.files if f not in files]
        for f in files:
            f.destroy()

    def delete_first(self, count: int) -> list[F]:
        """Remove the ``count`` oldest files (retention); never the last one."""
        with self.lock:
            victims = self.files[: max(0, min(count, len(self.files) - 1))]
            self.files = self.files[len(victims) :]
        for f in victims:
            f.destroy()
        return victims

    def __iter__(self) -> Iterator[F]:
        with self.lock:
            return iter(list(self.files))

    def close(self) -> None:
        with self.lock:
            for f in self.files:
                f.close()
            self.files = []
