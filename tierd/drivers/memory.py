"""``memory`` driver: segments in a process-wide dictionary, for tests and demos.

Data lives in a module-level table of *namespaces* keyed by the root's name, so two roots (or
two unpickled copies of one) with the same name see the same segments — that is what lets tests
reach the data behind the driver's back (:func:`namespace`). Nothing survives the process.
Whole objects (``MemoryRoot.put_object``) live in the same table as segments, stored as one
:class:`StoredSegment` each; a put replaces the table entry in one assignment (atomic).

Configuration: ``[backend] name = "memory"``, ``url = "memory://NAME"`` (or just ``NAME``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tierd.drivers._objects import listed_paths
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
    CorruptionError,
    InvalidArgumentError,
    InvalidRangeError,
    ObjectExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["MemoryDriver", "MemoryRoot", "StoredSegment", "drop_namespace", "namespace"]


@dataclass
class StoredSegment:
    """What the memory backend holds for one segment."""

    data: bytearray = field(default_factory=bytearray)
    sealed: bool = False


_NAMESPACES: dict[str, dict[str, StoredSegment]] = {}


def namespace(name: str) -> dict[str, StoredSegment]:
    """The live table of segments (path → :class:`StoredSegment`) of root ``name`` (backdoor)."""
    return _NAMESPACES.setdefault(name, {})


def drop_namespace(name: str) -> None:
    """Forget every segment of root ``name`` (tests free memory with it)."""
    _NAMESPACES.pop(name, None)


class MemoryRoot(DriverRoot):
    """A named namespace in the process-wide table."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        if self.storage_options:
            raise InvalidArgumentError(
                f"memory driver takes no storage_options, got {sorted(self.storage_options)}",
                options=sorted(self.storage_options),
            )
        #: Namespace name: the URL without ``memory://`` and surrounding slashes.
        self.name = url.removeprefix("memory://").strip("/") or "default"

    def driver(self, path: str) -> MemoryDriver:
        # docstring inherited
        return MemoryDriver(self, path)

    async def put_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        validate_segment_path(path)
        namespace(self.name)[path] = StoredSegment(bytearray(data))

    @property
    def supports_create_object(self) -> bool:
        # docstring inherited
        return True

    async def create_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        table = namespace(self.name)
        if validate_segment_path(path) in table:  # check and set with no await between: atomic
            raise ObjectExistsError(f"object {path!r} already exists in memory://{self.name}", path=path)
        table[path] = StoredSegment(bytearray(data))

    async def get_object(self, path: str) -> bytes:
        # docstring inherited
        stored = namespace(self.name).get(validate_segment_path(path))
        if stored is None:
            raise SegmentNotFoundError(f"object {path!r} does not exist in memory://{self.name}", path=path)
        return bytes(stored.data)

    async def delete_object(self, path: str) -> None:
        # docstring inherited
        namespace(self.name).pop(validate_segment_path(path), None)

    async def list_objects(self, prefix: str) -> list[str]:
        # docstring inherited
        return listed_paths(list(namespace(self.name)), validate_object_prefix(prefix))


class MemoryDriver(SegmentDriver):
    """A segment as a ``bytearray`` in the namespace of its root."""

    supports_append = True
    needs_seal = False
    root: MemoryRoot

    def __init__(self, root: MemoryRoot, path: str) -> None:
        super().__init__(root, path)

    @classmethod
    def open_root(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> MemoryRoot:
        # docstring inherited
        return MemoryRoot(url, storage_options)

    def _get(self) -> StoredSegment:
        seg = namespace(self.root.name).get(self.path)
        if seg is None:
            raise SegmentNotFoundError(f"segment {self.path!r} does not exist in memory://{self.root.name}")
        return seg

    async def size(self) -> int:
        # docstring inherited
        return len(self._get().data)

    async def exists(self) -> bool:
        # docstring inherited
        return self.path in namespace(self.root.name)

    async def create(self) -> None:
        # docstring inherited
        namespace(self.root.name).setdefault(self.path, StoredSegment())

    async def delete(self) -> None:
        # docstring inherited
        namespace(self.root.name).pop(self.path, None)

    async def read(self, byte_range: ByteRange) -> bytes:
        # docstring inherited
        data = self._get().data
        check_readable(self.path, byte_range, len(data))
        return bytes(data[byte_range.start : byte_range.end])

    async def write(self, position: int, data: bytes) -> None:
        # docstring inherited
        if position < 0:
            raise InvalidRangeError(f"write position must be >= 0, got {position}", position=position)
        if not data:
            raise InvalidRangeError("write needs at least one byte, got empty data", position=position)
        table = namespace(self.root.name)
        seg = table.get(self.path)
        if seg is None:
            if position != 0:
                raise SegmentNotFoundError(
                    f"segment {self.path!r} does not exist in memory://{self.root.name}"
                )
            seg = table.setdefault(self.path, StoredSegment())
        if seg.sealed:
            raise SegmentSealedError(f"segment {self.path!r} is sealed; writes are refused", path=self.path)
        end = len(seg.data)
        overlap = stored_overlap(self.path, position, end, len(data))
        if overlap > 0 and seg.data[position : position + overlap] != data[:overlap]:
            raise CorruptionError(
                f"write at {position} of segment {self.path!r} conflicts with the {overlap} bytes "
                "already there",
                path=self.path,
                position=position,
            )
        seg.data += data[overlap:]

    async def seal(self) -> None:
        # docstring inherited
        self._get().sealed = True

    async def is_sealed(self) -> bool:
        # docstring inherited
        return self._get().sealed
