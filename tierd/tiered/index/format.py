"""The cold key index's two file formats, their geometry and header checks.

Formats (FORMATS.md §2.4, big-endian). Both forms start with the same 28-byte header::

    magic (4) · begin timestamp (8) · end timestamp (8) · used slots (4) · item count (4)

**Writable** (``TIDX`` = ``0x54494458``), the local file ``{store_dir}/tiered_index/{begin ts}``,
memory-mapped, ``28 + slots*8 + (items+1)*32`` bytes::

    slot  (8)  index of the newest item of the slot (4; 0 = empty) · 4 zero bytes
    item (32)  key hash (4, unsigned) · topic id (4) · queue id (4) · flat commitlog offset (8) ·
               size (4) · seconds since begin (4, may be negative) · previous item (4; 0 = none)

Item indices run from 1 to ``item count``; item 0 is reserved space (32 zero bytes, never an
item) so that item *i* sits at ``28 + slots*8 + i*32`` exactly as in RocketMQ and 0 can mean "no
item". ``items`` (the configured capacity) is the number of usable items. ``begin`` is the file's
creation time — its name, unique and increasing, and the time base of the item times; ``end`` is
the largest store timestamp indexed (``begin`` while empty).

**Compacted** (``TIDC`` = ``0x54494443``), uploaded as the INDEX segment whose base offset is the
file's begin timestamp, ``28 + cslots*8 + count*28`` bytes::

    slot  (8)  absolute byte position (4) · byte length (4) of the slot's items (0 · 0 = empty)
    item (28)  the writable item without its link; each slot's items contiguous, newest first

A lookup costs two ranged reads: the 8-byte slot, then exactly that slot's items (one read only
when the slot is empty).

**Compacted slot count** (tierd's choice; the header does not carry it): ``cslots =
min(slots, ceil(count * slots / items))`` — the writable file's own load factor, so a full file
keeps its ``slots`` and a file sealed early by age uploads a proportionally small slot table
instead of ``slots * 8`` bytes (40 MB by default) of mostly empty slots. A reader derives it from
the header and the segment size: ``cslots = (size - 28 - count*28) / 8``; the service reads
each uploaded file's header once in
:meth:`~tierd.tiered.index.service.ColdIndexService.load`.

**Key hash**: mmh3 32-bit (seed 0) of the UTF-8 ``topic#key``, unsigned; slot = hash mod slot
count. Lookups compare the full hash and the topic id, never the key: a hash collision yields a
false positive the caller removes by checking the record's real keys (DESIGN: "collision-free
queries" happen in the facade).

**Times.** An item stores whole seconds since ``begin`` (RocketMQ's ``timeDiff``), so its time
``t = begin + seconds*1000`` is the store time rounded down to the file's second: the real store
time lies in ``[t, t + 999]``. Queries keep an item when that second overlaps the query window
(so nothing is missed; at most 999 ms of extra candidates the caller may re-check). A file's time
range is ``[min item time, end]``: the dispatcher indexes backlogs, so items may be older than
the file's creation, and a query scans **every file whose range overlaps the window** — also
files that began before it (RocketMQ #9233 / #10268 skip those).
"""

from __future__ import annotations

import struct
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tierd.errors import CorruptionError, InvalidArgumentError

__all__ = [
    "COMPACTED_ITEM_DTYPE",
    "COMPACTED_ITEM_SIZE",
    "HEADER_SIZE",
    "HEADER_STRUCT",
    "INT32_MAX",
    "INT32_MIN",
    "ITEM_DTYPE",
    "ITEM_SIZE",
    "ITEM_STRUCT",
    "MAGIC_COMPACTED",
    "MAGIC_WRITABLE",
    "SLOT_SIZE",
    "SLOT_STRUCT",
    "I64Array",
    "RankArray",
    "U8Array",
    "U32Array",
    "check_geometry",
    "compacted_size",
    "compacted_slots",
    "item_column",
    "read_writable_header",
    "size_error",
    "writable_size",
]

HEADER_SIZE: Final = 28
SLOT_SIZE: Final = 8
ITEM_SIZE: Final = 32
COMPACTED_ITEM_SIZE: Final = 28
MAGIC_WRITABLE: Final = 0x54494458  # "TIDX"
MAGIC_COMPACTED: Final = 0x54494443  # "TIDC"

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
HEADER_STRUCT = struct.Struct(">Iqqii")
SLOT_STRUCT = struct.Struct(">ii")
ITEM_STRUCT = struct.Struct(">Iiiqiii")
assert HEADER_STRUCT.size == HEADER_SIZE
assert ITEM_STRUCT.size == ITEM_SIZE

#: One writable item as numpy sees it (packed, big-endian, 32 bytes).
ITEM_DTYPE: Final = np.dtype(
    [
        ("hash", ">u4"),
        ("topic_id", ">i4"),
        ("queue_id", ">i4"),
        ("offset", ">i8"),
        ("size", ">i4"),
        ("tdiff", ">i4"),
        ("prev", ">i4"),
    ]
)
#: One compacted item (the writable item without ``prev``; 28 bytes).
COMPACTED_ITEM_DTYPE: Final = np.dtype(
    [
        ("hash", ">u4"),
        ("topic_id", ">i4"),
        ("queue_id", ">i4"),
        ("offset", ">i8"),
        ("size", ">i4"),
        ("tdiff", ">i4"),
    ]
)
assert ITEM_DTYPE.itemsize == ITEM_SIZE
assert COMPACTED_ITEM_DTYPE.itemsize == COMPACTED_ITEM_SIZE
_FIELDS = ITEM_DTYPE.fields
assert _FIELDS is not None
_FIELD_OFFSET: Final = {name: int(spec[1]) for name, spec in _FIELDS.items()}

U32Array = npt.NDArray[np.uint32]
I64Array = npt.NDArray[np.int64]
RankArray = npt.NDArray[np.uint16]
U8Array = npt.NDArray[np.uint8]


# ----------------------------------------------------------------------------- geometry
def writable_size(slots: int, items: int) -> int:
    """Bytes of a writable file with ``slots`` slots and ``items`` usable items (+ item 0)."""
    return HEADER_SIZE + slots * SLOT_SIZE + (items + 1) * ITEM_SIZE


def compacted_size(slots: int, count: int) -> int:
    """Bytes of a compacted file with ``slots`` slots holding ``count`` items."""
    return HEADER_SIZE + slots * SLOT_SIZE + count * COMPACTED_ITEM_SIZE


def compacted_slots(count: int, slots: int, items: int) -> int:
    """Slot count of the compacted form of a file of geometry ``slots``/``items`` holding
    ``count`` items: the writable file's load factor, ``min(slots, ceil(count*slots/items))``
    (at least 1)."""
    return max(1, min(slots, -(-count * slots // items)))


def check_geometry(slots: int, items: int) -> None:
    if not 1 <= slots <= INT32_MAX:
        raise InvalidArgumentError(f"index slots must be in [1, {INT32_MAX}], got {slots}", slots=slots)
    if not 1 <= items < INT32_MAX:
        raise InvalidArgumentError(f"index items must be in [1, {INT32_MAX - 1}], got {items}", items=items)
    # Compacted slots hold 4-byte signed positions.
    if compacted_size(slots, items) > INT32_MAX:
        raise InvalidArgumentError(
            f"index slots={slots} and items={items} make a compacted file of "
            f"{compacted_size(slots, items)} bytes; slot positions are 4-byte ints, so it must be "
            f"at most {INT32_MAX}",
            slots=slots,
            items=items,
        )


def size_error(name: str, size: int, slots: int, items: int) -> CorruptionError:
    return CorruptionError(
        f"index file {name} is {size} bytes, expected {writable_size(slots, items)} for "
        f"slots={slots}, items={items} (did index_slots/index_items change? restore them until the "
        "local index files are uploaded)",
        path=name,
        size=size,
    )


def read_writable_header(buf: Any, slots: int, items: int, name: str) -> tuple[int, int, int, int]:
    """Validated (begin, end, used, count) of a writable file's bytes."""
    size = len(buf)
    if size != writable_size(slots, items):
        raise size_error(name, size, slots, items)
    magic, begin, end, used, count = HEADER_STRUCT.unpack_from(buf, 0)
    problem = None
    if magic != MAGIC_WRITABLE:
        problem = f"magic 0x{magic:08X}, expected 0x{MAGIC_WRITABLE:08X}"
    elif not 0 <= count <= items:
        problem = f"item count {count} outside [0, {items}]"
    elif not 0 <= used <= min(slots, count):
        problem = f"used slots {used} outside [0, {min(slots, count)}]"
    elif end < begin:
        problem = f"end timestamp {end} before begin {begin}"
    if problem is not None:
        raise CorruptionError(f"index file {name}: bad header: {problem}", path=name)
    return begin, end, used, count


def item_column(buf: Any, name: str, slots: int, count: int) -> npt.NDArray[Any]:
    """Strided read-only view of one field of items 1..count (no copy)."""
    off = HEADER_SIZE + slots * SLOT_SIZE + ITEM_SIZE + _FIELD_OFFSET[name]
    return np.ndarray((count,), dtype=ITEM_DTYPE[name], buffer=buf, offset=off, strides=(ITEM_SIZE,))
