"""``fsspec`` driver: segments on any fsspec filesystem (``memory://``, ``file://``, ``gcs://``,
``abfs://``, ...), with the same chunk scheme as the S3 driver.

Portable means lowest common denominator: no server-side copy (sealing downloads the chunks and
writes the sealed object from the client, as a temporary ``{key}.sealing`` that is verified and
then moved into place), no conditional writes (chunk keys are still never reused by this
driver; the single-writer rule of the contract carries the rest), and durability is whatever the
filesystem gives (use the ``posix`` driver for local disks: it fsyncs). Listing caches are
invalidated before every listing, and the filesystem is created with ``skip_instance_cache``.

Whole objects (``FsspecRoot.put_object``, for manifests) are replaced atomically: on local disks
by writing a temporary file beside the target, fsyncing it and renaming it over the target; on
object stores (memory, s3, gcs, azure) by one ``pipe_file`` — a single PUT; on any other
filesystem by writing a temporary file and moving it into place (atomic only if the filesystem's
move is).

Filesystem calls are blocking in fsspec's sync API (async implementations run them on fsspec's
own I/O thread), so every call goes through ``asyncio.to_thread``.

Configuration: ``[backend] name = "fsspec"``, ``url = "memory://bucket/prefix"`` (any fsspec
URL); ``storage_options`` go to the filesystem class.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from tierd.drivers._chunks import (
    VERIFY_PIECE,
    Chunk,
    ChunkedDriver,
    Layout,
    Listing,
    ObjectInfo,
    chunk_key,
    crc32c,
)
from tierd.drivers._objects import create_file_exclusively, listed_paths, temp_name, write_file_atomically
from tierd.drivers.segment import DriverRoot, validate_object_prefix, validate_segment_path
from tierd.errors import (
    BackendError,
    CorruptionError,
    ObjectExistsError,
    SegmentNotFoundError,
    TierdError,
    UnsupportedOperationError,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping, Sequence

    import fsspec

__all__ = ["FsspecDriver", "FsspecRoot"]

_T = TypeVar("_T")

#: Protocols whose ``pipe_file`` stores the whole object in one atomic operation (a dictionary
#: assignment, one PUT): a put goes straight to the target there.
ATOMIC_PIPE_PROTOCOLS = frozenset({"memory", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
#: Suffix of the temporary object a seal composes into before moving it to the segment's key.
SEALING_SUFFIX = ".sealing"
#: Protocols whose ``pipe_file(..., mode="create")`` is an atomic create-if-absent on the server
#: (``If-None-Match: *``, see s3fs); other object stores are refused rather than raced.
CONDITIONAL_PIPE_PROTOCOLS = frozenset({"s3", "s3a"})
#: fsspec's memory filesystem is one dictionary per process: a lock makes check-and-set atomic.
_MEMORY_CREATE_LOCK = threading.Lock()


async def _run(op: str, key: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Run a blocking filesystem call in a thread; ``FileNotFoundError`` becomes
    :class:`~tierd.errors.SegmentNotFoundError`, anything else untyped a
    :class:`~tierd.errors.BackendError`."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except TierdError:
        raise
    except FileNotFoundError as e:
        raise SegmentNotFoundError(f"{key} does not exist", key=key) from e
    except Exception as e:
        raise BackendError(f"fsspec {op} of {key!r} failed: {type(e).__name__}: {e}", key=key) from e


class FsspecRoot(DriverRoot):
    """An fsspec URL; the filesystem object is made on first use and dropped when pickled."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self._fs: fsspec.AbstractFileSystem | None = None
        self._base: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None
        state["_base"] = None
        return state

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        """The filesystem and the root path inside it (no trailing slash)."""
        if self._fs is None or self._base is None:
            options = dict(self.storage_options)
            options.setdefault("skip_instance_cache", True)
            try:
                fs, base = url_to_fs(self.url, **options)
            except (ImportError, ValueError) as e:
                raise BackendError(
                    f"cannot open backend.url {self.url!r} with fsspec: {e} (is the filesystem's "
                    "package installed and are backend.storage_options right?)",
                    url=self.url,
                ) from e
            self._fs, self._base = fs, str(base).rstrip("/")
        return self._fs, self._base

    def key_for(self, path: str) -> str:
        """Filesystem path of the segment at ``path``."""
        _, base = self.filesystem()
        return f"{base}/{path}" if base else path

    def driver(self, path: str) -> FsspecDriver:
        # docstring inherited
        return FsspecDriver(self, path)

    # ------------------------------------------------------------------ whole objects
    def _put_sync(self, key: str, data: bytes) -> None:
        fs, _ = self.filesystem()
        if isinstance(fs, LocalFileSystem):
            write_file_atomically(Path(key), data, fsync=True)
            return
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        fs.makedirs(fs._parent(key), exist_ok=True)
        if protocols & ATOMIC_PIPE_PROTOCOLS:
            fs.pipe_file(key, data)
            return
        if fs.isdir(key):  # a move would land *inside* the directory
            raise IsADirectoryError(f"{key} is a directory")
        tmp = temp_name(key)
        try:
            fs.pipe_file(tmp, data)
            fs.mv(tmp, key)
        except BaseException:
            with contextlib.suppress(Exception):
                fs.rm_file(tmp)
            raise

    def _create_mode(self) -> str | None:
        """How this filesystem creates an object exclusively: ``link`` (local disks), ``lock``
        (fsspec's per-process memory filesystem), ``condition`` (a conditional PUT), or None."""
        fs, _ = self.filesystem()
        if isinstance(fs, LocalFileSystem):
            return "link"
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        if "memory" in protocols:
            return "lock"
        if protocols & CONDITIONAL_PIPE_PROTOCOLS:
            return "condition"
        return None

    @property
    def supports_create_object(self) -> bool:
        # docstring inherited
        return self._create_mode() is not None

    def _create_sync(self, path: str, key: str, data: bytes) -> None:
        fs, _ = self.filesystem()
        mode = self._create_mode()
        if mode is None:
            raise UnsupportedOperationError(
                f"fsspec filesystem {type(fs).__name__} ({self.url!r}) offers no atomic "
                "create-if-absent that tierd can rely on; use the posix driver for local or "
                "mounted disks, the s3 driver for S3",
                backend=self.url,
                operation="create_object",
            )
        exists = ObjectExistsError(f"object {path!r} already exists at {self.url}", path=path)
        if mode == "lock":
            with _MEMORY_CREATE_LOCK:
                if fs.exists(key):
                    raise exists
                fs.makedirs(fs._parent(key), exist_ok=True)
                fs.pipe_file(key, data)
            return
        try:
            if mode == "link":
                create_file_exclusively(Path(key), data, fsync=True)
            else:
                fs.pipe_file(key, data, mode="create")
                fs.invalidate_cache(key)
        except FileExistsError:
            raise exists from None

    async def create_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        key = self.key_for(validate_segment_path(path))
        await _run("create_object", key, self._create_sync, path, key, bytes(data))

    def _get_sync(self, key: str) -> bytes:
        fs, _ = self.filesystem()
        fs.invalidate_cache(key)
        try:
            return bytes(fs.cat_file(key))
        except (IsADirectoryError, NotADirectoryError) as e:
            raise FileNotFoundError(key) from e

    def _delete_sync(self, key: str) -> None:
        fs, _ = self.filesystem()
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            fs.rm_file(key)
        fs.invalidate_cache(key)

    def _list_sync(self, prefix: str) -> list[str]:
        fs, base = self.filesystem()
        target = f"{base}/{prefix}" if base and prefix else (base or prefix)
        fs.invalidate_cache()  # every level below target: one fresh listing, never the dircache
        try:
            found = fs.find(target, withdirs=False, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            found = []
        strip = f"{base}/" if base else ""
        names = [n[len(strip) :] if strip else n.lstrip("/") for n in map(str, found) if n.startswith(strip)]
        return listed_paths(names, prefix, chunked=True, reserved_suffixes=(SEALING_SUFFIX,))

    async def put_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        key = self.key_for(validate_segment_path(path))
        await _run("put_object", key, self._put_sync, key, bytes(data))

    async def get_object(self, path: str) -> bytes:
        # docstring inherited
        key = self.key_for(validate_segment_path(path))
        return await _run("get_object", key, self._get_sync, key)

    async def delete_object(self, path: str) -> None:
        # docstring inherited
        key = self.key_for(validate_segment_path(path))
        await _run("delete_object", key, self._delete_sync, key)

    async def list_objects(self, prefix: str) -> list[str]:
        # docstring inherited
        prefix = validate_object_prefix(prefix)
        return await _run("list_objects", prefix or self.url, self._list_sync, prefix)


class FsspecDriver(ChunkedDriver):
    """Chunked segment on an fsspec filesystem (see module doc)."""

    supports_append = False
    needs_seal = True
    root: FsspecRoot

    def __init__(self, root: FsspecRoot, path: str) -> None:
        super().__init__(root, path, root.key_for(path))

    @classmethod
    def open_root(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> FsspecRoot:
        # docstring inherited
        return FsspecRoot(url, storage_options)

    @property
    def _fs(self) -> fsspec.AbstractFileSystem:
        return self.root.filesystem()[0]

    async def _call(self, op: str, key: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await _run(op, key, fn, *args, **kwargs)

    # ------------------------------------------------------------------ primitives
    def _list_sync(self) -> Listing:
        fs = self._fs
        chunk_dir = self.key + ".chunks"
        fs.invalidate_cache(fs._parent(self.key))
        fs.invalidate_cache(chunk_dir)
        sealed: ObjectInfo | None = None
        try:
            info = fs.info(self.key)
        except FileNotFoundError:
            info = None
        if info is not None and info.get("type") == "file":
            sealed = ObjectInfo(self.key, int(info["size"]))
        chunks: list[ObjectInfo] = []
        try:
            entries = fs.ls(chunk_dir, detail=True)
        except FileNotFoundError:
            entries = []
        prefix = chunk_dir + "/"
        for e in entries:
            name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            # A non-file entry gets a trailing slash, which the name check reports as corruption.
            suffix = "" if e.get("type") == "file" else "/"
            chunks.append(ObjectInfo(prefix + name + suffix, int(e.get("size") or 0)))
        return Listing(sealed, tuple(chunks))

    async def _list(self) -> Listing:
        return await self._call("list", self.key, self._list_sync)

    def _pipe(self, key: str, data: bytes) -> None:
        fs = self._fs
        fs.makedirs(fs._parent(key), exist_ok=True)
        fs.pipe_file(key, data)

    async def _put_chunk(self, position: int, data: bytes, replace: Chunk | None) -> Chunk:
        key = chunk_key(self.key, position)
        await self._call("put", key, self._pipe, key, data)
        return Chunk(position, len(data), key)

    async def _put_object(self, key: str, data: bytes) -> None:
        await self._call("put", key, self._pipe, key, data)

    async def _get(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        data = await self._call("read", key, self._fs.cat_file, key, start=start, end=end)
        return bytes(data)

    async def _iter_object(self, key: str) -> AsyncIterator[bytes]:
        info = await self._call("stat", key, self._fs.info, key)
        size = int(info["size"])
        for start in range(0, size, VERIFY_PIECE):
            yield await self._get(key, start, min(size, start + VERIFY_PIECE))

    def _delete_sync(self, keys: Sequence[str]) -> None:
        fs = self._fs
        for k in [*keys, self.key + SEALING_SUFFIX]:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(k)
        # Local filesystems keep the emptied chunk directory around; others have none.
        with contextlib.suppress(OSError, NotImplementedError):
            if fs.exists(self.key + ".chunks") and not fs.ls(self.key + ".chunks"):
                fs.rmdir(self.key + ".chunks")

    async def _delete_keys(self, keys: Sequence[str]) -> None:
        await self._call("delete", self.key, self._delete_sync, keys)

    def _concat_sync(self, chunks: Sequence[Chunk], target: str) -> list[int]:
        fs = self._fs
        fs.makedirs(fs._parent(target), exist_ok=True)
        crcs: list[int] = []
        with fs.open(target, "wb") as out:
            for c in chunks:
                data = fs.cat_file(c.key) if c.length else b""
                if len(data) != c.length:
                    raise CorruptionError(
                        f"chunk {c.key!r} holds {len(data)} bytes, listing said {c.length}", key=c.key
                    )
                crcs.append(crc32c(data) if data else 0)
                out.write(data)
        return crcs

    async def _compose(self, layout: Layout) -> None:
        tmp = self.key + SEALING_SUFFIX
        fs = self._fs
        try:
            crcs = await self._call("compose", tmp, self._concat_sync, layout.chunks, tmp)
            self.sealed_crc32c = await self._verify(tmp, layout.chunks, crcs, layout.size)
            await self._call("rename", tmp, fs.mv, tmp, self.key)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(fs.rm_file, tmp)
            raise
