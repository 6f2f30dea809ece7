"""The segment driver contract and the append/commit logic built once on top of it.

A *segment* is one backend file of the cold tier: a slice of a flat commitlog, consume queue or
index, named by its base offset (see :mod:`tierd.drivers.paths`). Two layers live here:

* :class:`SegmentDriver` — the small async ABC a backend implements for ONE segment (seven
  methods, two capability flags). Its docstrings are the contract; ``tierd.testing.segment``
  ships the conformance suite that checks it.
* :class:`FileSegment` — RocketMQ's FileSegment: append buffer, append vs commit position,
  timestamps, one driver write per commit, and reconciliation with the backend after a failed
  commit. Drivers never see buffering or retries; FileSegment never sees backend details.

Drivers are made by a :class:`DriverRoot` — one per backend location (a directory, a bucket
prefix, a memory namespace) — which owns whatever is expensive to share (an S3 client). Roots
and drivers pickle to plain data (URL, options, path) and reconnect lazily after unpickling, so
Spark can ship them to workers. A root also stores small, replaceable *whole objects* beside the
segments (bucket manifests): :meth:`DriverRoot.put_object`, :meth:`~DriverRoot.get_object`,
:meth:`~DriverRoot.delete_object` and :meth:`~DriverRoot.list_objects`. They live on the root, not
on :class:`SegmentDriver`, because segments are append-only by contract and objects are not.

Concurrency model (drivers and FileSegment alike): everything runs on ONE asyncio event loop.
Any number of reads of a segment may run concurrently, but at most one *mutating* call
(``create``, ``write``, ``seal``, ``delete``) per segment may be in flight at a time;
:class:`FileSegment` guarantees this by refusing a second concurrent commit with
:class:`~tierd.errors.ConcurrentCommitError`. Nothing here is thread-safe; different segments
are independent.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tierd.errors import (
    ConcurrentCommitError,
    CorruptionError,
    InvalidArgumentError,
    InvalidRangeError,
    SegmentNotFoundError,
    SegmentReadError,
    StoreClosedError,
    UnsupportedOperationError,
)

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

__all__ = [
    "MAX_POSITION",
    "AppendResult",
    "BackendObserver",
    "ByteRange",
    "DriverRoot",
    "FileSegment",
    "FileType",
    "SegmentDriver",
    "check_readable",
    "stored_overlap",
    "validate_object_prefix",
    "validate_segment_path",
]

#: ``observer(operation, seconds, nbytes, ok)``: told about every backend call a
#: :class:`FileSegment` makes (``write``, ``read``, ``seal``, ``size``, ``create``), with the bytes
#: moved (0 for metadata calls) and whether it succeeded. Metrics hang off it (see
#: :attr:`DriverRoot.observer`); it must be cheap and must not raise.
BackendObserver = Callable[[str, float, int, bool], None]

_T = TypeVar("_T")

#: Largest byte position or length tierd accepts (Java's ``Long.MAX_VALUE``, like RocketMQ).
MAX_POSITION = 2**63 - 1


class FileType(enum.IntEnum):
    """What a segment holds; the value is RocketMQ's ``FileSegmentType`` code."""

    COMMIT_LOG = 0
    CONSUME_QUEUE = 1
    INDEX = 2

    @classmethod
    def from_code(cls, code: int) -> FileType:
        """Decode a stored code; unknown codes read as COMMIT_LOG, as RocketMQ does."""
        try:
            return cls(code)
        except ValueError:
            return cls.COMMIT_LOG


@dataclass(frozen=True, slots=True)
class ByteRange:
    """``length`` bytes starting at byte ``start`` of a segment (end exclusive).

    Validated on construction so that a bad range fails where it is made, with a typed
    :class:`~tierd.errors.InvalidRangeError`: ``start >= 0``, ``length >= 1`` and
    ``start + length <= MAX_POSITION``. Whether the range lies inside a segment is the reader's
    business (:class:`~tierd.errors.SegmentReadError`).
    """

    start: int
    length: int

    def __post_init__(self) -> None:
        if self.start < 0:
            raise InvalidRangeError(
                f"byte range start must be >= 0, got {self.start}", start=self.start, length=self.length
            )
        if self.length <= 0:
            raise InvalidRangeError(
                f"byte range length must be >= 1, got {self.length}", start=self.start, length=self.length
            )
        if self.start + self.length > MAX_POSITION:
            raise InvalidRangeError(
                f"byte range {self.start}+{self.length} overflows the largest position {MAX_POSITION}",
                start=self.start,
                length=self.length,
            )

    @property
    def end(self) -> int:
        """First byte position after the range."""
        return self.start + self.length


def check_readable(path: str, byte_range: ByteRange, size: int) -> None:
    """Contract rule of :meth:`SegmentDriver.read`: a range past the ``size`` stored bytes is a
    :class:`~tierd.errors.SegmentReadError`. One place for every driver."""
    if byte_range.end > size:
        raise SegmentReadError(
            f"cannot read [{byte_range.start}, {byte_range.end}) of segment {path!r}: it holds {size} bytes",
            path=path,
            start=byte_range.start,
            length=byte_range.length,
            size=size,
        )


def stored_overlap(path: str, position: int, size: int, length: int) -> int:
    """Check a write of ``length`` bytes at ``position`` against a segment holding ``size`` bytes
    (contract rule 4 of :meth:`SegmentDriver.write`: no hole) and return how many of its bytes
    overlap what is already stored — the part rule 5 compares. One place for every driver."""
    if position > size:
        raise InvalidRangeError(
            f"write at {position} would leave a hole: segment {path!r} holds {size} bytes",
            path=path,
            position=position,
            size=size,
        )
    return min(size, position + length) - position


def validate_segment_path(path: str) -> str:
    """Check a driver path: relative, ``/``-separated, no empty, ``.`` or ``..`` components.

    Paths are logical (see :func:`tierd.drivers.paths.segment_path`); each driver maps them under
    its root. Refusing ``..`` and absolute paths keeps a segment from escaping its root.
    """
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(f"segment path must be a non-empty string, got {path!r}", path=path)
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise InvalidArgumentError(
            f"segment path must be relative and use '/' separators, got {path!r}", path=path
        )
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise InvalidArgumentError(
                f"segment path {path!r} has an empty, '.' or '..' component", path=path
            )
    return path


def validate_object_prefix(prefix: str) -> str:
    """Check a :meth:`DriverRoot.list_objects` prefix and return it normalised.

    ``""`` means the whole root. Otherwise the prefix names a directory-like path under the
    root and follows :func:`validate_segment_path`, except that one trailing ``/`` is accepted
    and removed (``"a/b/"`` is ``"a/b"``).
    """
    if not isinstance(prefix, str):
        raise InvalidArgumentError(f"object prefix must be a string, got {prefix!r}", prefix=prefix)
    if prefix == "":
        return ""
    trimmed = prefix[:-1] if prefix.endswith("/") else prefix
    if not trimmed:
        raise InvalidArgumentError(
            "object prefix must be '' (everything) or a relative path, got '/'", prefix=prefix
        )
    try:
        return validate_segment_path(trimmed)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"object prefix {prefix!r} must be '' or a relative '/'-separated path without empty, "
            "'.' or '..' components",
            prefix=prefix,
        ) from None


class DriverRoot(ABC):
    """One backend location that makes :class:`SegmentDriver` instances for paths under it, and
    stores small whole objects beside them.

    A root owns the resources its drivers share (an S3 client, a filesystem object) and releases
    them in :meth:`aclose`; a closed root reconnects lazily when used again. Roots are cheap to
    construct (no I/O) and must pickle to plain data: ``url``, ``storage_options`` and whatever
    the subclass needs, never a live client. ``repr`` shows the URL only, because storage
    options may hold secrets.

    **Objects.** Besides segments, a root stores *objects*: small byte strings that are written
    whole and replaced whole (the cold tier's bucket manifests, rewritten every minute). Four
    abstract coroutines make up this API: :meth:`put_object`, :meth:`get_object`,
    :meth:`delete_object`, :meth:`list_objects`; a fifth, :meth:`create_object`, creates an
    object only if none exists (the prefix-ownership claim needs one writer to win a race), and
    :attr:`supports_create_object` says whether the root can. Object paths follow
    :func:`validate_segment_path` and share ONE namespace with segment paths on the backend (a
    manifest at ``a/b/MANIFEST.json`` sits in the same directory as the segments under
    ``a/b/COMMIT_LOG/``). A path must hold either an object or a segment, never both: an object
    put at a segment's path replaces (posix, memory) or shadows (chunked drivers: it reads as
    the sealed segment) that segment. Names reserved for driver internals must not be used for
    objects or segments: a path component ending in ``.chunks`` (chunked drivers), a name ending
    in ``.sealing`` (fsspec) or in ``.tierd-tmp-`` plus 32 hex digits (temporary files of puts).

    Concurrency is the segments' model: one event loop; any number of :meth:`get_object` and
    :meth:`list_objects` calls may run concurrently with each other and with :meth:`put_object`
    of the same path; concurrent puts of one path end with one of the values put (last writer
    wins, no merging). Failures are typed: :class:`~tierd.errors.SegmentNotFoundError` for a
    missing object, :class:`~tierd.errors.InvalidArgumentError` for a bad path,
    :class:`~tierd.errors.BackendError` for backend faults (retryable); never a sentinel.

    Use as ``async with root:`` to close it on exit.
    """

    #: Optional timing hook for the calls :class:`FileSegment` makes through drivers of this root
    #: (the daemon's metrics set it on its own root; nothing else does). A class-level ``None``
    #: so roots that never get one — every root Spark pickles — carry no extra state.
    observer: BackendObserver | None = None

    @property
    def supports_create_object(self) -> bool:
        """True when :meth:`create_object` keeps its promise on this root (exactly one of any
        number of concurrent creators wins). False: it raises
        :class:`~tierd.errors.UnsupportedOperationError` and writes nothing. Default False, so a
        third-party root that predates :meth:`create_object` refuses clearly instead of racing."""
        return False

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.storage_options: dict[str, Any] = dict(storage_options or {})

    @abstractmethod
    def driver(self, path: str) -> SegmentDriver:
        """A driver for the segment at ``path`` (relative to the root; see
        :func:`validate_segment_path`). No I/O happens here."""

    # ------------------------------------------------------------------ whole objects
    @abstractmethod
    async def put_object(self, path: str, data: bytes) -> None:
        """Create the object at ``path`` holding exactly ``data``, or replace it whole.

        ``path`` is relative to the root and must pass :func:`validate_segment_path` (else
        :class:`~tierd.errors.InvalidArgumentError`, nothing written); missing parent
        directories are created. ``data`` may be empty. Unconditional: replacing is the point,
        there is no compare-and-swap.

        **Atomic.** Every :meth:`get_object` that starts while this call runs, or after it
        returned, sees either the complete old bytes (or "missing", if there were none) or the
        complete new bytes — never a mix, a prefix or an empty placeholder. **Durable** on
        return: the new bytes survive a crash or power cut, and every later :meth:`get_object`
        and :meth:`list_objects` of any root on the same location sees them.

        If the call raises, the object holds the old bytes or the new ones (the request may have
        landed before the acknowledgement was lost), nothing else; calling again with the same
        data is always safe. How the shipped roots achieve this: posix writes a temporary file
        in the same directory, fsyncs it, renames it over the target and fsyncs the directory;
        S3 sends one plain ``PutObject`` (atomic by S3 semantics); fsspec renames a temporary
        file on local disks and uses one ``pipe_file`` (a single PUT) on object stores; memory
        assigns one dictionary entry.
        """

    async def create_object(self, path: str, data: bytes) -> None:
        """Create the object at ``path`` holding exactly ``data`` — only if no object exists there.

        **Exclusive.** If an object already exists at ``path`` (put, created, or a segment), raises
        :class:`~tierd.errors.ObjectExistsError` (also a ``FileExistsError``) and leaves it
        untouched. Of any number of concurrent calls for one path — from this root, other roots,
        other processes or machines on the same location — exactly one returns; every other
        raises :class:`~tierd.errors.ObjectExistsError`. Otherwise as :meth:`put_object`: path
        validated first, parents created, atomic (a reader sees "missing" or the whole
        ``data``), durable on return.

        If the call raises anything else (a :class:`~tierd.errors.BackendError`), the object may
        or may not have been created — with exactly ``data``; :meth:`get_object` tells. A root
        that cannot make the guarantee raises :class:`~tierd.errors.UnsupportedOperationError`
        without writing (see :attr:`supports_create_object`); that is the default here.

        How the shipped roots do it: posix writes a temporary file, fsyncs it and hard-links it
        to the target (``link`` fails if the name exists); S3 sends ``PutObject`` with
        ``If-None-Match: *``; memory checks and assigns without yielding to the event loop;
        fsspec links on local disks, sends ``If-None-Match`` on S3 and refuses elsewhere.
        """
        validate_segment_path(path)
        raise UnsupportedOperationError(
            f"{type(self).__name__} cannot create objects exclusively (create-if-absent), which "
            f"claiming ownership of a cold-tier prefix needs; backend {self.url!r}",
            backend=self.url,
            operation="create_object",
        )

    @abstractmethod
    async def get_object(self, path: str) -> bytes:
        """The whole object at ``path`` (``b""`` for an empty one), as it is on the backend now.

        Raises :class:`~tierd.errors.SegmentNotFoundError` (also a ``FileNotFoundError``) when
        no object exists at ``path`` — including when ``path`` is only a directory-like prefix
        of other objects — and :class:`~tierd.errors.InvalidArgumentError` for an invalid
        path. Never served from a cache: a value put by another root or process before this
        call started is returned (drivers built on caching clients, such as s3fs, bypass or
        invalidate them).
        """

    @abstractmethod
    async def delete_object(self, path: str) -> None:
        """Remove the object at ``path``. Idempotent: deleting a missing object (or a path that
        is only a directory-like prefix of other objects) is a no-op that leaves everything
        else untouched. Durable on return; a later :meth:`get_object` raises
        :class:`~tierd.errors.SegmentNotFoundError`."""

    @abstractmethod
    async def list_objects(self, prefix: str) -> list[str]:
        """Paths (relative to the root, sorted ascending) of everything stored under ``prefix``.

        ``prefix`` is ``""`` for the whole root or a directory-like path (see
        :func:`validate_object_prefix`): ``"a/b"`` lists ``a/b/x`` and ``a/b/c/d`` (recursive)
        but not ``a/bc`` nor ``a/b`` itself. The result holds every object put with
        :meth:`put_object` and every segment (open or sealed; each exactly once, by its segment
        path), and nothing a driver keeps for itself: chunk objects under ``<segment>.chunks/``
        are reported as their segment, temporary and ``.sealing`` files are left out, and so
        are backend entries that are not valid paths (directory markers such as ``a/``). An
        empty or missing prefix gives ``[]``. Never served from a cache: one fresh listing of
        the backend per call (not a snapshot — entries changing meanwhile may or may not show).
        """

    async def expect_new_dirs(self, parent: str, names: Collection[str], *, max_requests: int) -> int:
        """Prepare the first writes of segments under the directories ``parent/name``, one per
        name (a tiering round's new queues): a root whose first write to a segment it has not
        looked at costs a confirming listing per segment (S3's blind conditional first write)
        lists ``parent`` instead — once, at most ``max_requests`` pages of directory names —
        and lets the first write of every segment under a directory found holding nothing go
        straight to a create-only PUT, until :meth:`forget_new_dirs`. A listing before the
        write is what every later append relies on too (the cached layout), with the
        create-only PUT still refusing a key taken meanwhile. Returns how many directories
        were found empty; the default (no listing to save) finds none."""
        return 0

    def forget_new_dirs(self) -> None:  # noqa: B027 — optional hook, empty on purpose
        """Forget what :meth:`expect_new_dirs` found: it holds for one tiering round, not for
        segments written later."""

    async def aclose(self) -> None:  # noqa: B027 — optional hook, empty on purpose
        """Release shared resources (network clients). Idempotent. Default: nothing to release."""

    async def check_capabilities(self) -> Mapping[str, Any] | None:
        """Make sure this backend can be written without risking committed bytes, before the
        first write (the tiering service calls it at start-up; drivers that probe also call it
        before their first mutation). Returns the backend's verdict as JSON-able data (see
        :meth:`capability_report`), or None when the driver has nothing to check (the default).
        Raises :class:`~tierd.errors.UnsafeBackendError` when writing must be refused, and
        :class:`~tierd.errors.BackendError` when the backend cannot be reached (retry)."""
        return None

    def capability_report(self) -> Mapping[str, Any] | None:
        """The last verdict of :meth:`check_capabilities` (for ``/v1/status`` and metrics), or
        None when nothing was checked yet or there is nothing to check. Never does I/O."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class SegmentDriver(ABC):
    """Async access to ONE segment on one backend: the contract every tierd driver implements.

    Ten members: eight abstract coroutines (:meth:`size`, :meth:`exists`, :meth:`create`,
    :meth:`delete`, :meth:`read`, :meth:`write`, :meth:`seal`, :meth:`is_sealed`) and two
    capability flags (:attr:`supports_append`, :attr:`needs_seal`) — plus one optional hint with a
    default, :meth:`object_bounds`. Everything else (buffering, retries, offsets) belongs to
    :class:`FileSegment`.

    **Model.** A segment is a byte string that only grows at its end, plus a *sealed* bit. Bytes
    once written never change; sealing freezes the length. A segment that does not exist is
    distinct from an empty one: every method except :meth:`exists`, :meth:`create`,
    :meth:`delete` and ``write(0, ...)`` raises :class:`~tierd.errors.SegmentNotFoundError` for a
    missing segment. No method signals failure with a sentinel (``-1``, ``False``, ``None``):
    failures are typed exceptions from :mod:`tierd.errors` — backend faults are
    :class:`~tierd.errors.BackendError` (retryable), data that contradicts the model (gaps,
    overlaps, conflicting rewrites) is :class:`~tierd.errors.CorruptionError`.

    **Truth.** :meth:`size` and :meth:`exists` report the backend's state *now*, not a cache; a
    driver may cache for its own reads and writes only what it can revalidate.

    **Concurrency.** One event loop; concurrent reads are allowed; at most one mutating call
    (``create``/``write``/``seal``/``delete``) per segment at a time, across all processes.
    :class:`FileSegment` serialises commits, and the tiering layer owns each segment from one
    process.

    **Constructing.** Drivers are made by their :class:`DriverRoot` (``root.driver(path)``);
    registered drivers implement the classmethod :meth:`open_root` that the registry calls with
    the ``[backend]`` URL and storage options. Drivers pickle together with their root.

    Note for implementers: docstrings in drivers say ``# docstring inherited``; the contract is
    here. Run ``tierd.testing.segment.SegmentDriverTests`` against your driver.
    """

    #: True when the backend extends one file in place (posix, memory). False for immutable
    #: object stores, where each write becomes a chunk object (``needs_seal`` is then True).
    supports_append: bool
    #: True when :meth:`seal` does real work worth scheduling (composing chunks into one
    #: object: O(segment size)); False when sealing only flips a flag.
    needs_seal: bool

    def __init__(self, root: DriverRoot, path: str) -> None:
        self.root = root
        self.path = validate_segment_path(path)

    @classmethod
    def open_root(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> DriverRoot:
        """Make the root this driver class is registered for, from ``[backend] url`` and
        ``storage_options``. Registered drivers override this; wrappers (e.g. the fault
        injector) do not, and cannot be selected by name."""
        raise TypeError(f"{cls.__name__} cannot be opened from a URL; wrap a driver made by a root instead")

    # ------------------------------------------------------------------ the contract
    @abstractmethod
    async def size(self) -> int:
        """Number of bytes the backend holds for this segment right now.

        Raises :class:`~tierd.errors.SegmentNotFoundError` if the segment does not exist and
        :class:`~tierd.errors.CorruptionError` if its stored form is inconsistent (for chunked
        drivers: a gap or overlap between chunks). This is the value :class:`FileSegment`
        trusts when it reconciles after a failed commit, so it must not come from a cache.
        """

    @abstractmethod
    async def exists(self) -> bool:
        """True if the segment exists (empty, open or sealed). Answers a question, so it returns
        False rather than raising for a missing segment."""

    @abstractmethod
    async def create(self) -> None:
        """Create the segment empty if it does not exist; a no-op if it exists (never truncates,
        allowed on a sealed segment). Durable on return."""

    @abstractmethod
    async def delete(self) -> None:
        """Remove the segment and everything stored for it (chunks, temporary objects).
        Idempotent: deleting a missing segment is a no-op. Allowed on sealed segments."""

    @abstractmethod
    async def read(self, byte_range: ByteRange) -> bytes:
        """Return exactly ``byte_range.length`` bytes starting at ``byte_range.start``.

        The whole range must lie inside the bytes the segment holds: ``byte_range.end > size``
        raises :class:`~tierd.errors.SegmentReadError` (no short reads; clamping is the caller's
        choice). Raises :class:`~tierd.errors.SegmentNotFoundError` for a missing segment. A read
        sees every write that returned before the read started.
        """

    async def read_into(self, byte_range: ByteRange, out: memoryview) -> None:
        """Fill ``out`` (writable, ``byte_range.length`` bytes) with the bytes :meth:`read` would
        return, same rules and errors. For a caller that receives into memory it reuses (the
        cold read path's batch buffers): a driver that can receive straight into ``out``
        overrides this and spares a fresh allocation per read — and the page faults of touching
        it (docs/performance.md, P3). Default: :meth:`read`, then one copy."""
        if out.nbytes != byte_range.length:
            raise InvalidRangeError(
                f"read_into needs a buffer of {byte_range.length} bytes, got {out.nbytes}",
                length=byte_range.length,
                buffer=out.nbytes,
            )
        out[:] = await self.read(byte_range)

    @abstractmethod
    async def write(self, position: int, data: bytes) -> None:
        """Make the segment hold ``data`` at ``[position, position + len(data))``.

        Checked in this order; when a check fails nothing is written:

        1. ``position >= 0`` and ``data`` non-empty, else
           :class:`~tierd.errors.InvalidRangeError`.
        2. The segment exists, or ``position == 0`` (then the write creates it), else
           :class:`~tierd.errors.SegmentNotFoundError`.
        3. It is not sealed, else :class:`~tierd.errors.SegmentSealedError`.
        4. No hole: ``position <= size``, else :class:`~tierd.errors.InvalidRangeError` with
           ``detail["size"]`` the current size.
        5. Bytes already stored in ``[position, min(size, position + len(data)))`` equal the
           corresponding prefix of ``data``, else :class:`~tierd.errors.CorruptionError`.

        Effect: the part of ``data`` beyond the current end is appended. Hence rewriting bytes
        that are already there is a no-op (**idempotent**), and repeating a write whose
        acknowledgement was lost, or which landed only partly, completes it without duplicating
        anything.

        On return the new bytes are durable and visible to :meth:`size` and :meth:`read` of any
        driver for this path. If the call raises, some prefix (possibly empty, possibly all) of
        the new bytes may have landed, and nothing else; :meth:`size` tells how much.
        """

    @abstractmethod
    async def seal(self) -> None:
        """Make the segment immutable: afterwards :meth:`write` raises
        :class:`~tierd.errors.SegmentSealedError`; :meth:`size` and :meth:`read` are unchanged.

        Idempotent. Raises :class:`~tierd.errors.SegmentNotFoundError` for a missing segment.
        Chunked drivers compose their chunks into one object here and verify it before removing
        the chunks; if ``seal`` raises, the segment still reads the same bytes and ``seal`` may
        simply be called again.
        """

    @abstractmethod
    async def is_sealed(self) -> bool:
        """True once :meth:`seal` has completed. Raises
        :class:`~tierd.errors.SegmentNotFoundError` for a missing segment."""

    # ------------------------------------------------------------------ hints
    def object_bounds(self, start: int, end: int) -> list[int]:
        """Positions strictly between ``start`` and ``end`` where one stored object of this
        segment ends and the next begins, ascending, as far as the driver knows *without asking
        the backend* (an object store's open segment is several chunk objects). A hint for
        readers, never a fact to rely on: a read cut at these positions costs one request per
        object instead of two for a range that straddles one. Default: none (one file)."""
        return []

    # ------------------------------------------------------------------ conveniences
    async def read_all(self) -> bytes:
        """All bytes of the segment (``b""`` when empty). Convenience for small segments and tests:
        two calls (size, read), not atomic against a concurrent writer."""
        size = await self.size()
        if size == 0:
            return b""
        return await self.read(ByteRange(0, size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root.url!r}, {self.path!r})"


class AppendResult(enum.Enum):
    """Outcome of :meth:`FileSegment.append` (RocketMQ's ``AppendResult``)."""

    SUCCESS = "success"
    #: The bytes would not fit below ``max_size``: roll to a new segment.
    FILE_FULL = "file_full"
    #: ``max_buffer_count`` appends are waiting for a commit: commit first (back-pressure).
    BUFFER_FULL = "buffer_full"
    #: The segment was closed or sealed.
    FILE_CLOSED = "file_closed"


class FileSegment:
    """A segment being filled: append buffer on top of a :class:`SegmentDriver`.

    Positions are byte positions inside the segment; offsets are ``base_offset + position``.
    ``commit_position`` counts bytes durably on the backend, ``append_position`` bytes accepted
    (committed + in flight + buffered). Only committed bytes are readable.

    **Commit.** :meth:`commit` sends every byte not yet committed in ONE ``driver.write`` at
    ``commit_position``. If it fails, the bytes stay queued and the segment is marked *suspect*;
    the next :meth:`commit` first reconciles with the backend's real size (``driver.size()``):
    bytes that actually landed — read back and compared, so another writer's bytes are never
    mistaken for ours — are dropped from the queue (never sent twice), a partial write is
    completed by writing the rest at the backend's end, and a backend that is *shorter* than
    what was acknowledged before, longer than anything sent, or holding other bytes, is reported
    as :class:`~tierd.errors.CorruptionError`. A write the driver refused as conflicting
    (:class:`~tierd.errors.CorruptionError`: nothing written) leaves the segment as it was, so
    every retry meets the same conflict. Then it writes what remains, including bytes appended
    meanwhile. Retry timing (backoff, jitter) is the caller's: ``commit`` is always safe to call
    again after it raised. A second ``commit`` (or ``seal``/``destroy``) while one is in flight
    raises :class:`~tierd.errors.ConcurrentCommitError` — it never waits and never returns a
    sentinel.
    """

    def __init__(
        self,
        driver: SegmentDriver,
        file_type: FileType,
        base_offset: int,
        *,
        max_size: int,
        max_buffer_count: int = 10_000,
    ) -> None:
        if base_offset < 0:
            raise InvalidArgumentError(
                f"base_offset must be >= 0, got {base_offset}", base_offset=base_offset
            )
        if max_size <= 0:
            raise InvalidArgumentError(f"max_size must be >= 1, got {max_size}", max_size=max_size)
        if max_buffer_count <= 0:
            raise InvalidArgumentError(
                f"max_buffer_count must be >= 1, got {max_buffer_count}", max_buffer_count=max_buffer_count
            )
        self.driver = driver
        self.file_type = file_type
        self.base_offset = base_offset
        self.max_size = max_size
        self.max_buffer_count = max_buffer_count
        self._commit_position = 0
        self._buffers: list[bytes] = []
        self._buffered_bytes = 0
        # Bytes handed to a commit and not yet confirmed; they start at commit_position.
        self._pending = b""
        self._pending_count = 0
        self._suspect = False
        self._busy = False
        self._closed = False
        self._sealed = False
        self.min_timestamp: int | None = None
        self.max_timestamp: int | None = None

    # ------------------------------------------------------------------ positions
    @property
    def path(self) -> str:
        """The driver's segment path."""
        return self.driver.path

    @property
    def commit_position(self) -> int:
        """Bytes durably stored on the backend (as far as this segment knows)."""
        return self._commit_position

    @property
    def append_position(self) -> int:
        """Bytes accepted: committed, in flight and buffered."""
        return self._commit_position + len(self._pending) + self._buffered_bytes

    @property
    def commit_offset(self) -> int:
        """``base_offset + commit_position``."""
        return self.base_offset + self._commit_position

    @property
    def append_offset(self) -> int:
        """``base_offset + append_position``."""
        return self.base_offset + self.append_position

    @property
    def needs_commit(self) -> bool:
        """True while some accepted bytes are not yet committed."""
        return self.append_position > self._commit_position

    @property
    def buffered_count(self) -> int:
        """Appends not yet committed (the BUFFER_FULL measure)."""
        return len(self._buffers) + self._pending_count

    @property
    def closed(self) -> bool:
        """True after :meth:`close`, :meth:`seal` or :meth:`destroy`."""
        return self._closed

    @property
    def sealed(self) -> bool:
        """True after a successful :meth:`seal`."""
        return self._sealed

    def init_position(self, position: int) -> None:
        """Set both positions (recovery: the backend already holds ``position`` bytes).

        Only allowed while nothing is buffered, since buffered bytes were positioned against the
        old value.
        """
        if position < 0:
            raise InvalidArgumentError(f"position must be >= 0, got {position}", position=position)
        if self.needs_commit:
            raise InvalidArgumentError(
                "init_position with uncommitted bytes buffered would misplace them",
                position=position,
                append_position=self.append_position,
            )
        self._commit_position = position
        self._suspect = False

    async def load_position(self) -> int:
        """Recovery helper: set both positions from the backend's size (0 if the segment does
        not exist yet) and return it."""
        try:
            size = await self._timed("size", 0, self.driver.size())
        except SegmentNotFoundError:
            size = 0
        self.init_position(size)
        return size

    # ------------------------------------------------------------------ append / commit
    def append(self, data: bytes, timestamp: int) -> AppendResult:
        """Queue ``data`` (a whole record or batch) for the next commit.

        Checks, in RocketMQ's order: closed → FILE_CLOSED; ``append_position + len(data) >
        max_size`` → FILE_FULL; ``max_buffer_count`` appends waiting → BUFFER_FULL. On SUCCESS
        the append position advances and ``timestamp`` (store time, ms) widens the min/max.
        """
        if self._closed:
            return AppendResult.FILE_CLOSED
        if self.append_position + len(data) > self.max_size:
            return AppendResult.FILE_FULL
        if self.buffered_count >= self.max_buffer_count:
            return AppendResult.BUFFER_FULL
        if not data:
            return AppendResult.SUCCESS
        self._buffers.append(bytes(data))
        self._buffered_bytes += len(data)
        if self.min_timestamp is None or timestamp < self.min_timestamp:
            self.min_timestamp = timestamp
        if self.max_timestamp is None or timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        return AppendResult.SUCCESS

    async def commit(self) -> int:
        """Upload everything not yet committed in one driver write; return by how many bytes
        ``commit_position`` advanced during this call (0 when there was nothing to do).

        Raises :class:`~tierd.errors.StoreClosedError` on a closed segment,
        :class:`~tierd.errors.ConcurrentCommitError` if a commit is in flight, and whatever the
        driver raised (the bytes stay queued; call again later).
        """
        if self._closed:
            raise StoreClosedError(f"segment {self.path} is closed", path=self.path)
        self._enter()
        try:
            return await self._commit_locked()
        finally:
            self._busy = False

    def _enter(self) -> None:
        if self._busy:
            raise ConcurrentCommitError(
                f"a commit of segment {self.path} is already in flight; commits are serialised",
                path=self.path,
            )
        self._busy = True

    async def _commit_locked(self) -> int:
        before = self._commit_position
        if self._suspect:
            await self._reconcile()
        if self._buffers:
            joined = b"".join(self._buffers)
            self._pending = self._pending + joined if self._pending else joined
            self._pending_count += len(self._buffers)
            self._buffers = []
            self._buffered_bytes = 0
        if self._pending:
            try:
                await self._timed(
                    "write", len(self._pending), self.driver.write(self._commit_position, self._pending)
                )
            except CorruptionError:
                # The driver refused before writing (stored bytes differ from ours: another writer
                # got there first). Nothing landed, so nothing may be reconciled as ours: the size
                # the backend reports now is *their* bytes. Retrying fails the same way.
                raise
            except BaseException:
                # Cancellation included: we cannot know what landed, so ask the backend next time.
                self._suspect = True
                raise
            self._commit_position += len(self._pending)
            self._pending = b""
            self._pending_count = 0
        return self._commit_position - before

    async def _reconcile(self) -> None:
        """Align ``commit_position`` with the backend after a failed write (see class doc)."""
        try:
            size = await self._timed("size", 0, self.driver.size())
        except SegmentNotFoundError:
            size = 0
        low = self._commit_position
        high = low + len(self._pending)
        if size < low:
            raise CorruptionError(
                f"segment {self.path} holds {size} bytes but {low} were acknowledged before: "
                "the backend lost committed data",
                path=self.path,
                size=size,
                commit_position=low,
            )
        if size > high:
            raise CorruptionError(
                f"segment {self.path} holds {size} bytes but only {high} were ever sent: "
                "another writer touched it",
                path=self.path,
                size=size,
                sent=high,
            )
        landed = size - low
        if landed:
            # Only bytes equal to ours count as ours: after a lost acknowledgement another writer
            # may have appended meanwhile, and its bytes must never be taken for a landed prefix.
            stored = await self._timed("read", landed, self.driver.read(ByteRange(low, landed)))
            if stored != self._pending[:landed]:
                raise CorruptionError(
                    f"segment {self.path} holds {landed} bytes at {low} that this process did not "
                    "write: another writer touched it",
                    path=self.path,
                    position=low,
                    length=landed,
                )
            self._pending = self._pending[landed:]
            if not self._pending:
                self._pending_count = 0
        self._commit_position = size
        self._suspect = False

    # ------------------------------------------------------------------ read / lifecycle
    async def read(self, position: int, length: int) -> bytes:
        """Read committed bytes: ``length`` is clamped to the commit position, like RocketMQ;
        ``position < 0``, ``position >= commit_position`` or ``length <= 0`` raise
        :class:`~tierd.errors.SegmentReadError`."""
        self._check_read(position, length)
        length = min(length, self._commit_position - position)
        return await self._timed("read", length, self.driver.read(ByteRange(position, length)))

    def _check_read(self, position: int, length: int) -> None:
        if position < 0 or length <= 0 or position >= self._commit_position:
            raise SegmentReadError(
                f"cannot read {length} bytes at position {position} of segment {self.path}: "
                f"readable range is [0, {self._commit_position})",
                path=self.path,
                position=position,
                length=length,
                commit_position=self._commit_position,
            )

    async def read_into(self, position: int, out: memoryview) -> int:
        """Like :meth:`read` of ``out.nbytes`` bytes, received into ``out`` (see
        :meth:`SegmentDriver.read_into`); returns how many bytes were read — fewer only at the
        commit position, into the head of ``out``."""
        self._check_read(position, out.nbytes)
        length = min(out.nbytes, self._commit_position - position)
        await self._timed("read", length, self.driver.read_into(ByteRange(position, length), out[:length]))
        return length

    def object_bounds(self, start: int, end: int) -> list[int]:
        """Where stored objects meet strictly inside ``[start, end)`` (positions; a hint, see
        :meth:`SegmentDriver.object_bounds`)."""
        return self.driver.object_bounds(start, end)

    async def seal(self) -> None:
        """Commit what is queued, then seal the backend segment; the segment is closed after.

        Raises :class:`~tierd.errors.StoreClosedError` if it was closed with bytes still
        queued (they would be lost), and whatever commit or ``driver.seal`` raised (call again).
        """
        if self._sealed:
            return
        if self.needs_commit:
            if self._closed:
                raise StoreClosedError(
                    f"segment {self.path} was closed with {self.append_position - self._commit_position} "
                    "uncommitted bytes; they cannot be sealed",
                    path=self.path,
                )
            await self.commit()
        self._enter()
        try:
            if self._commit_position == 0:
                await self._timed("create", 0, self.driver.create())
            await self._timed("seal", self._commit_position, self.driver.seal())
        finally:
            self._busy = False
        self._sealed = True
        self._closed = True

    def close(self) -> None:
        """Refuse further appends and commits. Reads still work. Bytes still queued are dropped,
        so commit first."""
        self._closed = True

    async def destroy(self) -> None:
        """Close the segment and delete it from the backend (idempotent)."""
        self._enter()
        try:
            self._closed = True
            self._buffers = []
            self._buffered_bytes = 0
            self._pending = b""
            self._pending_count = 0
            await self.driver.delete()
        finally:
            self._busy = False

    async def _timed(self, operation: str, nbytes: int, call: Awaitable[_T]) -> _T:
        """Await one driver call and report it to the root's :attr:`~DriverRoot.observer`, if any.

        Timing lives here, not in every driver, so each backend is measured the same way and a
        third-party driver gets metrics for free; without an observer the cost is one attribute
        lookup.
        """
        observer = self.driver.root.observer
        if observer is None:
            return await call
        start = time.perf_counter()
        ok = False
        try:
            result = await call
            ok = True
        finally:
            observer(operation, time.perf_counter() - start, nbytes, ok)
        return result

    def __repr__(self) -> str:
        return (
            f"FileSegment({self.path!r}, {self.file_type.name}, base={self.base_offset}, "
            f"commit={self._commit_position}, append={self.append_position})"
        )
