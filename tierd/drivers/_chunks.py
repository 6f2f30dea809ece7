"""The chunk scheme (FORMATS §2.3) shared by drivers for stores without append (S3, fsspec).

An open segment at key ``K`` is a set of immutable objects ``K.chunks/{position:020d}``; chunk
``p`` holds the segment's bytes ``[p, p + len)``. A sealed segment is the single object ``K``.
The rules that keep this safe, each enforced here once for every chunked driver:

* **Only ever append a new chunk at the current end.** A write computes the current end from
  the layout; bytes of the write that are already stored are compared (a mismatch is
  :class:`~tierd.errors.CorruptionError`), and only the remainder becomes a new chunk whose key
  is the old end. No key is written twice, except the empty marker chunk ``…/00000000000000000000``
  that :meth:`create` puts down, which the first write replaces. Backends with conditional PUTs
  make each chunk PUT ``If-None-Match: *`` (the marker replacement ``If-Match: <etag>``), so a
  late or duplicated request can never clobber a chunk.
* **Readers trust nothing they cannot check.** The chunks must tile ``[0, size)`` exactly, in
  order: a gap or an overlap is reported as corruption, never papered over. A name under
  ``K.chunks/`` that is not a 20-digit position is corruption too.
* **The sealed object wins.** Once ``K`` exists, the segment is sealed, its size is ``K``'s size
  and leftover chunks (a crash between composing and deleting them) are ignored by readers and
  removed by the next :meth:`seal` after verifying them against ``K``.
* **Seal = compose, verify, then delete.** Composition is backend-specific (S3 copies parts on
  the server); verification re-reads ``K`` and compares the size and the CRC32C of every
  chunk's range with the chunk; the chunks are deleted only after that and after checking that
  the chunk set did not change meanwhile.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import re
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import google_crc32c

from tierd.drivers._objects import CHUNK_DIR
from tierd.drivers.segment import ByteRange, DriverRoot, SegmentDriver, check_readable, stored_overlap
from tierd.errors import (
    BackendError,
    CorruptionError,
    InvalidRangeError,
    SegmentNotFoundError,
    SegmentReadError,
    SegmentSealedError,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

_T = TypeVar("_T")

__all__ = [
    "CHUNK_DIR_SUFFIX",
    "Chunk",
    "ChunkConflictError",
    "ChunkedDriver",
    "Layout",
    "Listing",
    "ObjectInfo",
    "OverwriteDetectedError",
    "chunk_key",
    "crc32c",
]

CHUNK_DIR_SUFFIX = CHUNK_DIR + "/"
_CHUNK_NAME = re.compile(r"[0-9]{20}")
#: Bounded fan-out for reads that span several chunks.
_READ_CONCURRENCY = 8
#: Piece size when streaming a composed object for verification.
VERIFY_PIECE = 8 * 1024 * 1024


def chunk_key(key: str, position: int) -> str:
    """Object key of the chunk starting at ``position`` of the segment at ``key``."""
    return f"{key}{CHUNK_DIR_SUFFIX}{position:020d}"


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    """CRC32C of ``data`` continuing from ``crc`` (google_crc32c's C implementation; it takes
    ``bytes`` only, hence the copy of a memoryview)."""
    return int(google_crc32c.extend(crc, data if isinstance(data, bytes) else bytes(data)))


def _same_etag(a: str | None, b: str | None) -> bool:
    """ETags as servers spell them (quoted or not); unknown on either side counts as equal."""
    return a is None or b is None or a.strip('"') == b.strip('"')


class OverwriteDetectedError(CorruptionError):
    """A write that relied on a precondition turned out to have landed on top of existing data:
    the server did not enforce the precondition. Never retried silently."""

    code = "overwrite_detected"


class ChunkConflictError(BackendError):
    """A conditional chunk PUT found the key already taken (another request got there first).
    Handled inside :class:`ChunkedDriver.write` by re-reading the layout; it escapes only when a
    second writer keeps racing this one."""

    code = "chunk_conflict"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object: key, size and ETag (if the backend has one)."""

    key: str
    size: int
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class Listing:
    """Raw view of everything stored for one segment, before validation."""

    sealed: ObjectInfo | None
    chunks: tuple[ObjectInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class Chunk:
    """A validated chunk: bytes ``[position, position + length)`` of the segment."""

    position: int
    length: int
    key: str
    etag: str | None = None

    @property
    def end(self) -> int:
        return self.position + self.length


@dataclass(frozen=True, slots=True)
class Layout:
    """A validated listing: sealed object size, or contiguous chunks."""

    sealed_size: int | None
    chunks: tuple[Chunk, ...] = ()
    positions: tuple[int, ...] = field(default=(), repr=False)

    @property
    def exists(self) -> bool:
        return self.sealed_size is not None or bool(self.chunks)

    @property
    def sealed(self) -> bool:
        return self.sealed_size is not None

    @property
    def size(self) -> int:
        if self.sealed_size is not None:
            return self.sealed_size
        return self.chunks[-1].end if self.chunks else 0

    def pieces(self, start: int, end: int) -> list[tuple[str, int, int]]:
        """Bytes ``[start, end)`` of an open segment as ``(chunk key, start, end)`` ranges of
        the chunks that hold them, in order."""
        first = max(bisect.bisect_right(self.positions, start) - 1, 0)
        pieces: list[tuple[str, int, int]] = []
        for c in self.chunks[first:]:
            if c.position >= end:
                break
            lo, hi = max(start, c.position), min(end, c.end)
            if hi > lo:
                pieces.append((c.key, lo - c.position, hi - c.position))
        return pieces

    def with_chunk(self, chunk: Chunk) -> Layout:
        """This layout plus ``chunk`` appended at the end (replacing an empty chunk at the same
        position — the create marker)."""
        chunks = (*tuple(c for c in self.chunks if c.position != chunk.position), chunk)
        return Layout(None, chunks, tuple(c.position for c in chunks))

    @classmethod
    def build(cls, key: str, listing: Listing) -> Layout:
        """Validate ``listing``: parse chunk names, sort, and require an exact tiling of
        ``[0, size)`` (gaps and overlaps are corruption). Chunks are not validated once the
        sealed object exists: they are leftovers that only :meth:`ChunkedDriver.seal` reads."""
        if listing.sealed is not None:
            return cls(listing.sealed.size)
        prefix = key + CHUNK_DIR_SUFFIX
        parsed: list[Chunk] = []
        for obj in listing.chunks:
            name = obj.key[len(prefix) :]
            if not obj.key.startswith(prefix) or not _CHUNK_NAME.fullmatch(name):
                raise CorruptionError(
                    f"unexpected object {obj.key!r} among the chunks of segment {key!r}", key=obj.key
                )
            parsed.append(Chunk(int(name), obj.size, obj.key, obj.etag))
        parsed.sort(key=lambda c: c.position)
        expected = 0
        for c in parsed:
            if c.position != expected:
                kind = "gap" if c.position > expected else "overlap"
                raise CorruptionError(
                    f"segment {key!r}: chunk at {c.position} does not follow the previous chunk "
                    f"ending at {expected} ({kind}); chunks must tile the segment exactly",
                    key=key,
                    position=c.position,
                    expected=expected,
                )
            expected = c.end
        chunks = tuple(parsed)
        return cls(None, chunks, tuple(c.position for c in chunks))


class ChunkedDriver(SegmentDriver):
    """:class:`SegmentDriver` over immutable objects; subclasses supply the object primitives.

    The layout (chunk table) is cached per driver instance after the driver's own scans and
    writes, so a commit costs one PUT; :meth:`size`, :meth:`exists` and :meth:`is_sealed` always
    rescan, as the contract demands, and a read past the cached end rescans too.
    """

    supports_append = False
    needs_seal = True

    def __init__(self, root: DriverRoot, path: str, key: str) -> None:
        super().__init__(root, path)
        #: Backend key of the sealed object; chunks live under ``key + ".chunks/"``.
        self.key = key
        self._layout: Layout | None = None
        #: CRC32C of the whole sealed object, set by :meth:`seal` when it verified one.
        self.sealed_crc32c: int | None = None

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_layout"] = None
        return state

    # ------------------------------------------------------------------ primitives
    @abstractmethod
    async def _list(self) -> Listing:
        """Everything stored for this segment: the sealed object (if any) and every object under
        ``key + ".chunks/"`` — never siblings that merely share the prefix. Not cached."""

    @abstractmethod
    async def _put_chunk(self, position: int, data: bytes, replace: Chunk | None) -> Chunk:
        """Store ``data`` as the chunk at ``position``. ``replace`` is the empty marker chunk
        being replaced, else the key must be new; raise :class:`ChunkConflictError` if the
        backend reports that condition violated."""

    @abstractmethod
    async def _put_object(self, key: str, data: bytes) -> None:
        """Store a small whole object (the empty sealed object)."""

    @abstractmethod
    async def _get(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of object ``key``; :class:`SegmentNotFoundError` if it is gone."""

    async def _get_into(self, key: str, start: int, out: memoryview) -> None:
        """Fill ``out`` with bytes ``[start, start + out.nbytes)`` of object ``key`` (as
        :meth:`_get`). Default: :meth:`_get`, then one copy; a driver that can receive into
        ``out`` directly overrides it."""
        data = await self._get(key, start, start + out.nbytes)
        if len(data) != out.nbytes:
            raise CorruptionError(
                f"segment {self.path!r}: read of {out.nbytes} bytes at {start} of {key!r} returned "
                f"{len(data)}",
                key=key,
                start=start,
                length=out.nbytes,
            )
        out[:] = data

    @abstractmethod
    async def _iter_object(self, key: str) -> AsyncIterator[bytes]:
        """Stream the whole object ``key`` in pieces (for verification)."""
        yield b""  # pragma: no cover — abstract

    @abstractmethod
    async def _delete_keys(self, keys: Sequence[str]) -> None:
        """Delete objects; missing ones are fine."""

    @abstractmethod
    async def _compose(self, layout: Layout) -> None:
        """Build the sealed object ``key`` from ``layout.chunks`` and verify it
        (:meth:`_verify`); on any failure leave no object at ``key`` and raise."""

    def _blind_first_write(self) -> bool:
        """True if the first write of a segment this instance has not looked at yet may skip
        the listing (see :meth:`_write_first`): only when chunk creation is conditional (fails if
        the chunk exists). Off by default."""
        return False

    def _listed_empty(self) -> bool:
        """True if a listing of this round found the segment's directory holding nothing
        (:meth:`~tierd.drivers.segment.DriverRoot.expect_new_dirs`): its first write then
        needs no listing of its own, before or after. Off by default."""
        return False

    async def _chunk_crcs(self, chunks: Sequence[Chunk]) -> list[int]:
        """CRC32C of each chunk. Default downloads them; S3 reads the CRC stored at write time."""
        return [crc32c(await self._get(c.key, 0, c.length)) if c.length else 0 for c in chunks]

    # ------------------------------------------------------------------ helpers
    async def _refresh(self) -> Layout:
        return (await self._scan())[1]

    async def _scan(self) -> tuple[Listing, Layout]:
        self._layout = None
        listing = await self._list()
        layout = Layout.build(self.key, listing)
        self._layout = layout
        return listing, layout

    def _missing(self) -> SegmentNotFoundError:
        return SegmentNotFoundError(
            f"segment {self.path!r} does not exist at {self.root.url}", path=self.path
        )

    async def _read_layout_into(self, layout: Layout, start: int, out: memoryview) -> None:
        if layout.sealed:
            await self._get_into(self.key, start, out)
            return
        sem = asyncio.Semaphore(_READ_CONCURRENCY)
        pieces = layout.pieces(start, start + out.nbytes)
        at = itertools.accumulate((hi - lo for _, lo, hi in pieces), initial=0)  # where each lands

        async def fetch(piece: tuple[str, int, int], pos: int) -> None:
            key, lo, hi = piece
            async with sem:
                await self._get_into(key, lo, out[pos : pos + hi - lo])

        await asyncio.gather(*(fetch(p, pos) for p, pos in zip(pieces, at, strict=False)))

    async def _read_layout(self, layout: Layout, start: int, length: int) -> bytes:
        end = start + length
        if layout.sealed:
            data = await self._get(self.key, start, end)
        else:
            pieces = layout.pieces(start, end)
            sem = asyncio.Semaphore(_READ_CONCURRENCY)

            async def fetch(piece: tuple[str, int, int]) -> bytes:
                async with sem:
                    return await self._get(*piece)

            if len(pieces) == 1:
                data = await self._get(*pieces[0])
            else:
                data = b"".join(await asyncio.gather(*(fetch(p) for p in pieces)))
        if len(data) != length:
            raise CorruptionError(
                f"segment {self.path!r}: read of {length} bytes at {start} returned {len(data)}",
                path=self.path,
                start=start,
                length=length,
            )
        return data

    async def _verify(
        self, key: str, chunks: Sequence[Chunk], crcs: Sequence[int], expected_size: int
    ) -> int:
        """Stream the composed object ``key`` and check its size and each chunk's CRC32C against
        ``crcs``; return the CRC32C of the whole object."""
        total = 0
        whole = 0
        idx = 0
        # Running CRC of the current chunk's range and how many of its bytes were seen.
        cur = 0
        seen = 0
        live = [(c, crc) for c, crc in zip(chunks, crcs, strict=True) if c.length]
        async for piece in self._iter_object(key):
            view = memoryview(piece)
            whole = crc32c(view, whole)
            total += len(view)
            while view:
                if idx >= len(live):
                    raise CorruptionError(
                        f"sealed object of segment {self.path!r} is longer than its {expected_size} bytes",
                        path=self.path,
                    )
                chunk, want = live[idx]
                take = min(len(view), chunk.length - seen)
                cur = crc32c(view[:take], cur)
                seen += take
                view = view[take:]
                if seen == chunk.length:
                    if cur != want:
                        raise CorruptionError(
                            f"sealed object of segment {self.path!r}: CRC32C of bytes "
                            f"[{chunk.position}, {chunk.end}) is {cur:08x}, chunk has {want:08x}",
                            path=self.path,
                            position=chunk.position,
                        )
                    idx, cur, seen = idx + 1, 0, 0
        if total != expected_size or idx != len(live):
            raise CorruptionError(
                f"sealed object of segment {self.path!r} has {total} bytes, chunks hold {expected_size}",
                path=self.path,
                size=total,
                expected=expected_size,
            )
        return whole

    # ------------------------------------------------------------------ the contract
    async def size(self) -> int:
        # docstring inherited
        layout = await self._refresh()
        if not layout.exists:
            raise self._missing()
        return layout.size

    async def exists(self) -> bool:
        # docstring inherited
        return (await self._refresh()).exists

    async def is_sealed(self) -> bool:
        # docstring inherited
        layout = await self._refresh()
        if not layout.exists:
            raise self._missing()
        return layout.sealed

    async def create(self) -> None:
        # docstring inherited
        layout = await self._refresh()
        if layout.exists:
            return
        try:
            chunk = await self._put_chunk(0, b"", None)
        except ChunkConflictError:
            self._layout = None  # someone created it meanwhile: fine, it exists
            return
        except BaseException:
            self._layout = None
            raise
        self._layout = layout.with_chunk(chunk)

    async def delete(self) -> None:
        # docstring inherited
        self._layout = None
        listing = await self._list()
        keys = [c.key for c in listing.chunks]
        if listing.sealed is not None:
            keys.append(listing.sealed.key)
        if keys:
            await self._delete_keys(keys)

    async def read(self, byte_range: ByteRange) -> bytes:
        # docstring inherited
        return await self._read_with(byte_range, self._read_layout)

    async def read_into(self, byte_range: ByteRange, out: memoryview) -> None:
        # docstring inherited: each chunk's range is received straight into its part of ``out``
        if out.nbytes != byte_range.length:
            await super().read_into(byte_range, out)  # raises: the sizes differ
            return

        async def into(layout: Layout, start: int, _: int) -> None:
            await self._read_layout_into(layout, start, out)

        await self._read_with(byte_range, into)

    async def _read_with(
        self, byte_range: ByteRange, read: Callable[[Layout, int, int], Awaitable[_T]]
    ) -> _T:
        """``read(layout, start, length)`` on the cached layout (refreshed when the range lies
        beyond it), and once more on a fresh layout if a chunk vanished meanwhile."""
        cached = self._layout
        layout = cached if cached is not None else await self._refresh()
        if cached is not None and (byte_range.end > layout.size or not layout.exists):
            layout = await self._refresh()  # the cache only ever lags behind: look again
        if not layout.exists:
            raise self._missing()
        check_readable(self.path, byte_range, layout.size)
        try:
            return await read(layout, byte_range.start, byte_range.length)
        except SegmentNotFoundError:
            # A chunk vanished: the segment was sealed (or deleted) since we looked. Look again once.
            layout = await self._refresh()
            if not layout.exists:
                raise self._missing() from None
            if byte_range.end > layout.size:
                raise SegmentReadError(
                    f"segment {self.path!r} shrank to {layout.size} bytes while reading", path=self.path
                ) from None
            return await read(layout, byte_range.start, byte_range.length)

    def object_bounds(self, start: int, end: int) -> list[int]:
        # docstring inherited: the chunk positions of the cached layout (a sealed segment is one
        # object; an unknown layout gives no hint rather than a listing)
        layout = self._layout
        if layout is None or layout.sealed:
            return []
        lo = bisect.bisect_right(layout.positions, start)
        hi = bisect.bisect_left(layout.positions, end)
        return list(layout.positions[lo:hi])

    async def write(self, position: int, data: bytes) -> None:
        # docstring inherited
        if position < 0:
            raise InvalidRangeError(f"write position must be >= 0, got {position}", position=position)
        if not data:
            raise InvalidRangeError("write needs at least one byte, got empty data", position=position)
        data = bytes(data)
        if self._layout is None and position == 0:
            if self._listed_empty():
                if await self._write_listed_empty(data):
                    return
            elif self._blind_first_write() and await self._write_first(data):
                return
        for _ in range(3):
            cached = self._layout
            layout = cached if cached is not None else await self._refresh()
            if cached is not None and (position != layout.size or not layout.exists):
                # Anything but a plain append from a warm cache is decided on fresh facts.
                layout = await self._refresh()
            if not layout.exists and position != 0:
                raise self._missing()
            if layout.sealed:
                raise SegmentSealedError(
                    f"segment {self.path!r} is sealed; writes are refused", path=self.path
                )
            end = layout.size
            overlap = stored_overlap(self.path, position, end, len(data))
            if overlap > 0:
                stored = await self._read_layout(layout, position, overlap)
                if stored != data[:overlap]:
                    raise CorruptionError(
                        f"write at {position} of segment {self.path!r} conflicts with the {overlap} "
                        "bytes already stored there",
                        path=self.path,
                        position=position,
                    )
            tail = data[overlap:]
            if not tail:
                return
            last = layout.chunks[-1] if layout.chunks else None
            marker = last if last is not None and last.length == 0 and last.position == end else None
            try:
                chunk = await self._put_chunk(end, tail, marker)
            except ChunkConflictError:
                self._layout = None
                continue
            except BaseException:
                self._layout = None
                raise
            self._layout = layout.with_chunk(chunk)
            return
        raise BackendError(
            f"segment {self.path!r}: chunk writes keep conflicting; is another process writing it?",
            path=self.path,
        )

    async def _write_listed_empty(self, data: bytes) -> bool:
        """Write ``data`` as chunk 0 of a segment whose directory a listing of this round found
        empty: a create-only PUT (plain, where the operator declared a single writer), like any
        append from a listed layout. Returns False when the key was taken since (the caller then
        decides from a fresh listing, comparing bytes)."""
        try:
            chunk = await self._put_chunk(0, data, None)
        except ChunkConflictError:
            return False
        self._layout = Layout(None).with_chunk(chunk)
        return True

    async def _write_first(self, data: bytes) -> bool:
        """Write ``data`` at position 0 of a segment not looked at yet: create chunk 0 with a
        conditional PUT (no listing first: one round trip for the common case, a brand-new
        segment), then confirm it with one listing before reporting success. Returns False when
        chunk 0 already exists (the caller then decides from a listing, as for any other write).

        The confirmation is defence in depth against a server that ignores the precondition
        although it passed the capability probe: the write only counts if the listing shows our
        chunk 0 (same ETag and size), alone and with no sealed object. Another writer's chunk 0
        in its place means ours was replaced (the caller re-decides from the listing, comparing
        bytes); other chunks beside ours mean the segment existed and the server let a
        create-only PUT replace its chunk 0 — :class:`OverwriteDetectedError`, never success."""
        try:
            put = await self._put_chunk(0, data, None)
        except ChunkConflictError:
            return False
        listing = await self._list()
        if listing.sealed is not None:
            # A sealed segment never takes writes: take back the chunk we just added beside it.
            mine = [c.key for c in listing.chunks if c.key == put.key and _same_etag(c.etag, put.etag)]
            if mine:
                await self._delete_keys(mine)
            raise SegmentSealedError(f"segment {self.path!r} is sealed; writes are refused", path=self.path)
        ours = [c for c in listing.chunks if c.key == put.key]
        if not ours or ours[0].size != put.length or not _same_etag(ours[0].etag, put.etag):
            return False  # replaced (or gone) since our PUT: decide from the listing like any write
        others = sorted(c.key for c in listing.chunks if c.key != put.key)
        if others:
            raise OverwriteDetectedError(
                f"segment {self.path!r}: a create-only write of chunk 0 succeeded although the segment "
                f"already held other chunks ({others[0].rsplit('/', 1)[-1]}, ...): the server ignored "
                "If-None-Match: * and may have replaced committed bytes of chunk 0 (or another writer "
                "appended at the same moment). Nothing was acknowledged; stop and check the server",
                path=self.path,
                chunks=len(listing.chunks),
            )
        self._layout = Layout(None).with_chunk(put)
        return True

    async def seal(self) -> None:
        # docstring inherited
        listing, layout = await self._scan()
        if not layout.exists:
            raise self._missing()
        listing_chunks = {c.key for c in layout.chunks}
        if layout.sealed:
            if not listing.chunks:
                return
            # Leftovers of an interrupted seal: check them against the sealed object first.
            leftovers = Layout.build(self.key, Listing(None, listing.chunks))
            if leftovers.size != layout.size:
                raise CorruptionError(
                    f"segment {self.path!r}: sealed object has {layout.size} bytes but leftover "
                    f"chunks hold {leftovers.size}; refusing to delete them",
                    path=self.path,
                )
            self.sealed_crc32c = await self._verify(
                self.key, leftovers.chunks, await self._chunk_crcs(leftovers.chunks), leftovers.size
            )
            await self._delete_keys([c.key for c in leftovers.chunks])
            return
        if layout.size == 0:
            await self._put_object(self.key, b"")
            self.sealed_crc32c = 0
        else:
            await self._compose(layout)
        after = await self._list()
        if {c.key for c in after.chunks} != listing_chunks:
            raise CorruptionError(
                f"segment {self.path!r}: its chunks changed while it was being sealed; "
                "another writer is active — chunks kept",
                path=self.path,
            )
        if after.chunks:
            await self._delete_keys([c.key for c in after.chunks])
        self._layout = Layout(layout.size)
