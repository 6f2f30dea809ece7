"""``posix`` driver: one segment = one file under a local (or mounted) directory.

Writes are positional (``os.pwrite``) and fsynced before they return; creating a file also
fsyncs its directory (and every directory created on the way), so a segment that ``write``
reported is still there after a power cut. Sealing clears the file's write permission bits —
the driver checks them itself before every write, so the seal holds even for root, and it
survives restarts without a second marker file. Whole objects (``PosixRoot.put_object``, for
manifests) are written to a temporary file beside the target, fsynced, renamed over it and the
directory fsynced, so readers see the old or the new file, never a partial one. Blocking calls
run in a worker thread (``asyncio.to_thread``) so that an fsync never stalls the event loop.

Configuration: ``[backend] name = "posix"``, ``url = "/abs/dir"`` (or ``file:///abs/dir``; a
relative path is resolved against the working directory when the root is made). The only
storage option is ``fsync`` (default true; false is for throwaway test data).
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierd.drivers._objects import (
    create_file_exclusively,
    fsync_dir,
    listed_paths,
    make_dirs,
    write_file_atomically,
)
from tierd.drivers.segment import (
    ByteRange,
    DriverRoot,
    SegmentDriver,
    check_readable,
    stored_overlap,
    validate_object_prefix,
    validate_segment_path,
)
from tierd.errors import (
    BackendError,
    CorruptionError,
    InvalidArgumentError,
    InvalidRangeError,
    ObjectExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    TierdError,
    UnsupportedOperationError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["PosixDriver", "PosixRoot"]

_WRITABLE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
_OPEN_MODE = 0o644
_SEALED_MODE = 0o444


class PosixRoot(DriverRoot):
    """A directory holding segments as files (created on first write)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        unknown = set(self.storage_options) - {"fsync"}
        if unknown:
            raise InvalidArgumentError(
                f"posix driver storage_options accept only 'fsync', got {sorted(unknown)}",
                options=sorted(unknown),
            )
        raw = url.removeprefix("file://") if url.startswith("file://") else url
        if not raw:
            raise InvalidArgumentError(
                "backend.url for the posix driver must be a directory, got ''", url=url
            )
        #: Absolute directory under which segment paths are resolved.
        self.directory = Path(raw).expanduser().absolute()
        self.fsync = bool(self.storage_options.get("fsync", True))

    def driver(self, path: str) -> PosixDriver:
        # docstring inherited
        return PosixDriver(self, path)

    # ------------------------------------------------------------------ whole objects
    def _file(self, path: str) -> Path:
        return self.directory.joinpath(*validate_segment_path(path).split("/"))

    def _missing(self, path: str) -> SegmentNotFoundError:
        return SegmentNotFoundError(f"object {path!r} does not exist under {self.directory}", path=path)

    async def _run(self, op: str, path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except OSError as e:
            if isinstance(e, TierdError):
                raise
            raise BackendError(
                f"posix {op} of {path!r} under {self.directory} failed: {e.strerror or e}",
                path=path,
                errno=e.errno,
            ) from e

    def _get_sync(self, path: str, file: Path) -> bytes:
        try:
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(path) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory: no object here
                raise self._missing(path)
            chunks: list[bytes] = []
            while piece := os.read(fd, 1 << 20):
                chunks.append(piece)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _delete_sync(self, file: Path) -> None:
        try:
            os.unlink(file)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except PermissionError:
            if file.is_dir():  # some systems report unlink(directory) as EPERM
                return
            raise
        if self.fsync:
            fsync_dir(file.parent)

    def _list_sync(self, prefix: str) -> list[str]:
        names: list[str] = []
        stack = [(self.directory.joinpath(*prefix.split("/")) if prefix else self.directory, prefix)]
        while stack:
            directory, rel = stack.pop()
            try:
                it = os.scandir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with it:
                for entry in it:
                    name = f"{rel}/{entry.name}" if rel else entry.name
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((Path(entry.path), name))
                    elif entry.is_file():
                        names.append(name)
        return listed_paths(names, prefix)

    async def put_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        file = self._file(path)
        await self._run("put_object", path, write_file_atomically, file, bytes(data), fsync=self.fsync)

    @property
    def supports_create_object(self) -> bool:
        # docstring inherited
        return True

    def _create_sync(self, path: str, file: Path, data: bytes) -> None:
        try:
            create_file_exclusively(file, data, fsync=self.fsync)
        except FileExistsError:
            raise ObjectExistsError(
                f"object {path!r} already exists under {self.directory}", path=path
            ) from None
        except OSError as e:
            if e.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise UnsupportedOperationError(
                    f"the filesystem of {self.directory} does not support hard links ({e.strerror}), "
                    "which the posix driver uses to create objects exclusively",
                    backend=self.url,
                    operation="create_object",
                ) from e
            raise

    async def create_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        file = self._file(path)
        await self._run("create_object", path, self._create_sync, path, file, bytes(data))

    async def get_object(self, path: str) -> bytes:
        # docstring inherited
        data: bytes = await self._run("get_object", path, self._get_sync, path, self._file(path))
        return data

    async def delete_object(self, path: str) -> None:
        # docstring inherited
        await self._run("delete_object", path, self._delete_sync, self._file(path))

    async def list_objects(self, prefix: str) -> list[str]:
        # docstring inherited
        prefix = validate_object_prefix(prefix)
        names: list[str] = await self._run("list_objects", prefix, self._list_sync, prefix)
        return names


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while length:
        piece = os.pread(fd, length, offset)
        if not piece:
            break
        chunks.append(piece)
        length -= len(piece)
        offset += len(piece)
    return b"".join(chunks)


def _preadv_into(fd: int, out: memoryview, offset: int) -> int:
    """Fill ``out`` from ``offset`` (fewer bytes only at the end of the file); the bytes read.
    Received straight into the caller's memory: no ``bytes`` of the range is made."""
    done = 0
    while done < out.nbytes:
        n = os.preadv(fd, [out[done:]], offset + done)
        if not n:
            break
        done += n
    return done


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data = data[written:]
        offset += written


class PosixDriver(SegmentDriver):
    """One file per segment (see module doc)."""

    supports_append = True
    needs_seal = False
    root: PosixRoot

    def __init__(self, root: PosixRoot, path: str) -> None:
        super().__init__(root, path)
        self.file = root.directory.joinpath(*self.path.split("/"))

    @classmethod
    def open_root(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> PosixRoot:
        # docstring inherited
        return PosixRoot(url, storage_options)

    # ------------------------------------------------------------------ sync helpers
    def _missing(self) -> SegmentNotFoundError:
        return SegmentNotFoundError(
            f"segment {self.path!r} does not exist under {self.root.directory}", path=self.path
        )

    def _os_error(self, op: str, err: OSError) -> BackendError:
        return BackendError(
            f"posix {op} of {self.file} failed: {err.strerror or err}", path=self.path, errno=err.errno
        )

    def _stat(self) -> os.stat_result:
        try:
            st = os.stat(self.file)
        except FileNotFoundError:
            raise self._missing() from None
        except NotADirectoryError:
            raise self._missing() from None
        if not stat.S_ISREG(st.st_mode):
            raise self._missing()
        return st

    def _make_parents(self) -> None:
        """Create missing parent directories, fsyncing each new directory's parent."""
        make_dirs(self.file.parent, fsync=self.root.fsync)

    def _sealed(self) -> SegmentSealedError:
        return SegmentSealedError(f"segment {self.path!r} is sealed; writes are refused", path=self.path)

    def _open_rw(self) -> int:
        """Open the existing file read-write. Without root, a sealed (0444) file cannot be opened
        for writing at all; report that as the seal it is, not as a permission problem."""
        try:
            return os.open(self.file, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            if not os.stat(self.file).st_mode & _WRITABLE:
                raise self._sealed() from None
            raise

    def _create_file(self) -> int:
        """Open the file for writing, creating it (durably) if missing."""
        try:
            return self._open_rw()
        except FileNotFoundError:
            pass
        self._make_parents()
        try:
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _OPEN_MODE)
        except FileExistsError:
            return self._open_rw()
        # Undo the umask: cleared write bits mean "sealed" to this driver.
        os.fchmod(fd, _OPEN_MODE)
        if self.root.fsync:
            os.fsync(fd)
            fsync_dir(self.file.parent)
        return fd

    def _create_sync(self) -> None:
        if self.file.is_file():
            return
        os.close(self._create_file())

    def _write_sync(self, position: int, data: bytes) -> None:
        if position == 0:
            fd = self._create_file()
        else:
            try:
                fd = self._open_rw()
            except (FileNotFoundError, NotADirectoryError):
                raise self._missing() from None
        try:
            st = os.fstat(fd)
            if not st.st_mode & _WRITABLE:
                raise self._sealed()
            end = st.st_size
            overlap = stored_overlap(self.path, position, end, len(data))
            if overlap > 0 and _pread_exact(fd, overlap, position) != data[:overlap]:
                raise CorruptionError(
                    f"write at {position} of segment {self.path!r} conflicts with the {overlap} bytes "
                    "already stored there",
                    path=self.path,
                    position=position,
                )
            if overlap < len(data):
                _pwrite_all(fd, memoryview(data)[overlap:], end)
                if self.root.fsync:
                    os.fsync(fd)
        finally:
            os.close(fd)

    def _read_sync(self, rng: ByteRange) -> bytes:
        data = b""

        def read(fd: int) -> int:
            nonlocal data
            data = _pread_exact(fd, rng.length, rng.start)
            return len(data)

        self._read_checked(rng, read)
        return data

    def _read_into_sync(self, rng: ByteRange, out: memoryview) -> None:
        self._read_checked(rng, lambda fd: _preadv_into(fd, out, rng.start))

    def _read_checked(self, rng: ByteRange, read: Callable[[int], int]) -> None:
        """Open the segment's file, check ``rng`` lies inside it, then ``read(fd)`` (the bytes it
        got): fewer than asked means the file shrank meanwhile, never a short read."""
        try:
            fd = os.open(self.file, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing() from None
        try:
            size = os.fstat(fd).st_size
            check_readable(self.path, rng, size)
            got = read(fd)
        finally:
            os.close(fd)
        if got != rng.length:
            raise CorruptionError(
                f"segment {self.path!r} shrank while reading [{rng.start}, {rng.end})", path=self.path
            )

    def _seal_sync(self) -> None:
        try:
            fd = os.open(self.file, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing() from None
        try:
            os.fchmod(fd, _SEALED_MODE)
            if self.root.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _delete_sync(self) -> None:
        try:
            os.unlink(self.file)
        except (FileNotFoundError, NotADirectoryError):
            return
        if self.root.fsync:
            fsync_dir(self.file.parent)

    async def _run(self, op: str, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except OSError as e:
            if isinstance(e, TierdError):  # ours (several derive from OSError): already typed
                raise
            if e.errno == errno.ENOENT:
                raise self._missing() from e
            raise self._os_error(op, e) from e

    # ------------------------------------------------------------------ the contract
    async def size(self) -> int:
        # docstring inherited
        st: os.stat_result = await self._run("stat", self._stat)
        return st.st_size

    async def exists(self) -> bool:
        # docstring inherited
        return bool(await self._run("stat", self.file.is_file))

    async def create(self) -> None:
        # docstring inherited
        await self._run("create", self._create_sync)

    async def delete(self) -> None:
        # docstring inherited
        await self._run("delete", self._delete_sync)

    async def read(self, byte_range: ByteRange) -> bytes:
        # docstring inherited
        data: bytes = await self._run("read", self._read_sync, byte_range)
        return data

    async def read_into(self, byte_range: ByteRange, out: memoryview) -> None:
        # docstring inherited: preadv straight into ``out``, no intermediate bytes
        if out.nbytes != byte_range.length:
            await super().read_into(byte_range, out)  # raises: the sizes differ
            return
        await self._run("read", self._read_into_sync, byte_range, out)

    async def write(self, position: int, data: bytes) -> None:
        # docstring inherited
        if position < 0:
            raise InvalidRangeError(f"write position must be >= 0, got {position}", position=position)
        if not data:
            raise InvalidRangeError("write needs at least one byte, got empty data", position=position)
        await self._run("write", self._write_sync, position, bytes(data))

    async def seal(self) -> None:
        # docstring inherited
        await self._run("seal", self._seal_sync)

    async def is_sealed(self) -> bool:
        # docstring inherited
        st: os.stat_result = await self._run("stat", self._stat)
        return not st.st_mode & _WRITABLE
