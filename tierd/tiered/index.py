"""The cold key index: writable local files, compacted into INDEX segments on the backend.

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
each uploaded file's header once in :meth:`ColdIndexService.load`.

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

**Lifecycle** (RocketMQ's UNSEALED → SEALED → UPLOAD): :meth:`ColdIndexService.add` appends to
the newest local file; a full one is sealed and a new file created (first), so the newest local
file is always the writable one and every older local file is sealed — that rule alone
restores the statuses after a restart. :meth:`ColdIndexService.maintain` also seals a non-empty
file older than ``max_file_age_ms``, then, oldest first: compacts a sealed file (numpy, in a
worker thread), uploads it (piecewise commits, then seal), records it as UPLOADED
(``on_change`` persists metadata), and only then deletes the local file.

**Index manifest.** A reader of the bucket alone (Spark) sees only uploaded files, which lag the
messages by up to ``max_file_age_ms``. After every upload, and before every expiry, the service
publishes ``{cluster dir}/{broker}/INDEX_MANIFEST.json``: the uploaded segments and, per queue,
the queue offsets ``[first, end)`` whose keys are certainly in them — claimed from the snapshot a
file takes when this process seals it (offsets added before the seal by this process; never
those of a batch a roll split, never those added before a restart), plus ``expired-through``,
the newest end timestamp of a deleted file (messages stored up to then may have lost their
items). Claiming less is always safe: a reader scans what is not claimed.

**Crash safety.** Compaction output never touches local disk, and a local file is deleted only
after the upload committed *and* ``on_change`` returned, so after a crash at any step the sealed
local file is still there and is compacted and uploaded again. The compacted bytes are a pure
function of the sealed file's header (begin, end) and items ``1..count``: no clock; items
ordered by slot, then by descending item index (newest first); the writable file's slot table
and links serve only as a shortcut to that order and are ignored unless they describe it
exactly (a torn chain falls back to a sort) — so a re-upload writes the very same bytes, and the driver's
idempotent-write contract turns what landed before into a no-op and appends the rest. A segment
sealed by an earlier attempt is accepted after comparing it byte for byte; a segment holding
anything else is deleted and written again. A file uploaded and recorded but not yet deleted
locally is dropped at :meth:`~ColdIndexService.load` (the upload wins). Power loss may lose
index items of local files not yet flushed (``maintain`` and ``close`` msync); the messages
themselves are safe in the flat commitlog.

**Concurrency**: one asyncio loop. :meth:`~ColdIndexService.add` and
:meth:`~ColdIndexService.query` run on it and never overlap each other (add is synchronous, and
a query reads all local files before its first await), so the writable file needs no lock;
compaction runs in a worker thread on a sealed, immutable file; ``maintain``, ``expire``,
``load`` and ``close`` are serialised by one asyncio lock.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import mmap
import os
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import google_crc32c
import mmh3
import numpy as np
import numpy.typing as npt

from tierd.errors import (
    CorruptionError,
    InvalidArgumentError,
    SegmentNotFoundError,
    SegmentReadError,
    SegmentSealedError,
    StoreClosedError,
)
from tierd.local.codec import HEADER_V4, MAGIC_V1, MAGIC_V2, POS_MAGIC, POS_SYSFLAG, gather_at
from tierd.local.index import index_key, key_hash
from tierd.local.mapped_file import fsync_dir
from tierd.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from tierd.tiered import paths
from tierd.tiered.flatfile import SegmentInfo
from tierd.tiered.manifest import IndexCoverage, IndexManifest, ManifestSegment, index_manifest_path
from tierd.tiered.segment import AppendResult, ByteRange, FileSegment, FileType

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tierd.tiered.flatmessage import CommittedBatch
    from tierd.tiered.segment import DriverRoot, SegmentDriver

__all__ = [
    "COMPACTED_ITEM_DTYPE",
    "COMPACTED_ITEM_SIZE",
    "HEADER_SIZE",
    "ITEM_DTYPE",
    "ITEM_SIZE",
    "MAGIC_COMPACTED",
    "MAGIC_WRITABLE",
    "SLOT_SIZE",
    "ColdIndexService",
    "CompactedIndex",
    "FileStatus",
    "IndexFileInfo",
    "IndexHit",
    "IndexStats",
    "batch_keys",
    "compact",
    "compacted_size",
    "compacted_slots",
    "hash_keys",
    "segment_slots",
    "slot_extent",
    "slot_hits",
    "slot_position",
    "writable_size",
]

log = logging.getLogger(__name__)

HEADER_SIZE: Final = 28
SLOT_SIZE: Final = 8
ITEM_SIZE: Final = 32
COMPACTED_ITEM_SIZE: Final = 28
MAGIC_WRITABLE: Final = 0x54494458  # "TIDX"
MAGIC_COMPACTED: Final = 0x54494443  # "TIDC"
DIR_NAME: Final = "tiered_index"

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_HEADER = struct.Struct(">Iqqii")
_SLOT = struct.Struct(">ii")
_ITEM = struct.Struct(">Iiiqiii")
_OFF_END, _OFF_USED = 12, 20  # header field offsets (end ts; used slots + item count)
_COUNTS = struct.Struct(">ii")
_INT64 = struct.Struct(">q")
assert _HEADER.size == HEADER_SIZE
assert _ITEM.size == ITEM_SIZE

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

#: Largest slot run read in one request; longer runs (a very hot key) are read in pieces of this
#: size until ``max_count`` hits are found.
MAX_SLOT_READ: Final = 37_449 * COMPACTED_ITEM_SIZE  # just under 1 MiB
#: Rows moved per step by :func:`compact` (bounds its temporaries to ~28 MiB).
_MOVE_PIECE: Final = 1 << 20
#: Uploads go out as commits of this many bytes (one driver write / S3 chunk each).
DEFAULT_UPLOAD_PIECE: Final = 64 * 1024 * 1024
DEFAULT_MAX_FILE_AGE_MS: Final = 3_600_000
_HEADER_READ_CONCURRENCY: Final = 16

_U2: Final = np.dtype(">u2")
_U4: Final = np.dtype(">u4")
U32Array = npt.NDArray[np.uint32]
I64Array = npt.NDArray[np.int64]
RankArray = npt.NDArray[np.uint16]
U8Array = npt.NDArray[np.uint8]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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


def _check_geometry(slots: int, items: int) -> None:
    if not 1 <= slots <= _INT32_MAX:
        raise InvalidArgumentError(f"index slots must be in [1, {_INT32_MAX}], got {slots}", slots=slots)
    if not 1 <= items < _INT32_MAX:
        raise InvalidArgumentError(f"index items must be in [1, {_INT32_MAX - 1}], got {items}", items=items)
    # Compacted slots hold 4-byte signed positions.
    if compacted_size(slots, items) > _INT32_MAX:
        raise InvalidArgumentError(
            f"index slots={slots} and items={items} make a compacted file of "
            f"{compacted_size(slots, items)} bytes; slot positions are 4-byte ints, so it must be "
            f"at most {_INT32_MAX}",
            slots=slots,
            items=items,
        )


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class IndexHit:
    """One candidate message. Matched on key hash and topic id only: the caller reads
    ``size`` bytes at ``flat_offset`` of queue ``queue_id``'s flat commitlog and checks the key."""

    topic_id: int
    queue_id: int
    flat_offset: int
    size: int
    #: Store time rounded down to the index file's whole second (ms): the real store timestamp
    #: is in ``[timestamp, timestamp + 999]``.
    timestamp: int


@dataclass
class IndexStats:
    """Counters of one :class:`ColdIndexService` (monotonic, except the file gauges)."""

    items_added: int = 0
    queries: int = 0
    hits: int = 0
    #: Local and uploaded files whose lookup ran (time range overlapped the query).
    files_queried: int = 0
    #: Backend reads made by queries (2 per uploaded file queried, 1 for an empty slot).
    backend_reads: int = 0
    backend_read_bytes: int = 0
    #: Header reads made by :meth:`ColdIndexService.load`.
    header_reads: int = 0
    compactions: int = 0
    compaction_seconds: float = 0.0
    uploads: int = 0
    uploaded_bytes: int = 0
    expired_files: int = 0
    #: Gauges: files currently local (writable + sealed) and uploaded.
    local_files: int = 0
    uploaded_files: int = 0


class FileStatus(enum.Enum):
    """RocketMQ's IndexStoreFile status."""

    UNSEALED = "unsealed"
    SEALED = "sealed"
    UPLOADED = "uploaded"


@dataclass(frozen=True, slots=True)
class IndexFileInfo:
    """Diagnostics: one index file of the service."""

    begin_timestamp: int
    end_timestamp: int
    status: FileStatus
    item_count: int
    #: Smallest item time (ms, second resolution); None when unknown or empty.
    min_item_time: int | None


# ----------------------------------------------------------------------------- compaction
@dataclass(frozen=True, slots=True)
class CompactedIndex:
    """The compacted form of one sealed file, built by :func:`compact`."""

    data: U8Array
    begin_timestamp: int
    end_timestamp: int
    item_count: int
    slots: int
    used_slots: int
    #: Smallest item time (ms, second resolution), None for an empty file.
    min_item_time: int | None


def _size_error(name: str, size: int, slots: int, items: int) -> CorruptionError:
    return CorruptionError(
        f"index file {name} is {size} bytes, expected {writable_size(slots, items)} for "
        f"slots={slots}, items={items} (did index_slots/index_items change? restore them until the "
        "local index files are uploaded)",
        path=name,
        size=size,
    )


def _read_writable_header(buf: Any, slots: int, items: int, name: str) -> tuple[int, int, int, int]:
    """Validated (begin, end, used, count) of a writable file's bytes."""
    size = len(buf)
    if size != writable_size(slots, items):
        raise _size_error(name, size, slots, items)
    magic, begin, end, used, count = _HEADER.unpack_from(buf, 0)
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


def _check_name(path: Path, begin: int) -> None:
    if str(begin) != path.name:
        raise CorruptionError(
            f"index file {path}: header begin timestamp {begin} does not match its name", path=str(path)
        )


def _column(buf: Any, name: str, slots: int, count: int) -> npt.NDArray[Any]:
    """Strided read-only view of one field of items 1..count (no copy)."""
    off = HEADER_SIZE + slots * SLOT_SIZE + ITEM_SIZE + _FIELD_OFFSET[name]
    return np.ndarray((count,), dtype=ITEM_DTYPE[name], buffer=buf, offset=off, strides=(ITEM_SIZE,))


def compact(
    buf: Any,
    slots: int,
    items: int,
    *,
    name: str = "<buffer>",
    use_chains: bool = True,
    ranks: RankArray | None = None,
) -> CompactedIndex:
    """Compacted bytes of a sealed writable file (``buf``: its bytes or mapping, not modified).

    Vectorised — numpy over whole columns, no per-item Python. ``bincount`` + ``cumsum`` of the
    compacted slot of every item give each slot's position and length. Each item's output row
    (its slot's start + its rank, newest first) then comes from one of three orderings:

    * **ranks** (a full file written by this process: ``ranks`` = :attr:`_LocalFile.ranks`,
      each item's count of older items in its slot, kept by the insert): the row is one
      element-wise expression, ``last row of the slot − rank``;
    * **chains** (a full file, whose compacted slots are its own slots): the writable chains
      are already newest first, so they are peeled level by level — all heads, then all their
      links, ... — about ``max chain length`` (≈ 20) vectorised steps touching each item once.
      Every step is checked (item in the chain's slot, links strictly older, chain length =
      the slot's count), so the result is a permutation or is rejected;
    * **sort** (partial files, or chains that fail a check — torn by a power loss): ONE plain
      sort of the distinct int64 keys ``slot << b | (count-1-i)``.

    Both give the same order — by slot, then by descending item index (newest first), a
    function of items ``1..count`` alone — so the bytes are deterministic either way (the tests
    compare both with a per-item reference). Then ONE pass moves the 28-byte rows (a strided
    view that skips the link): a scatter for chains, a gather for the sort.
    """
    begin, end, _, count = _read_writable_header(buf, slots, items, name)
    cslots = compacted_slots(count, slots, items)
    size = compacted_size(cslots, count)
    item_base = HEADER_SIZE + cslots * SLOT_SIZE
    if count == 0:
        out = np.zeros(size, dtype=np.uint8)
        _HEADER.pack_into(out.data, 0, MAGIC_COMPACTED, begin, end, 0, 0)
        return CompactedIndex(out, begin, end, 0, cslots, 0, None)
    min_tdiff = int(_column(buf, "tdiff", slots, count).min())
    per_slot = None
    if ranks is not None and cslots == slots and len(ranks) > count:
        per_slot = _counts_by_ranks(buf, slots, count, ranks)
    slot: U32Array | None = None
    if per_slot is None:  # no usable rank column: count the slots from the hashes
        ranks = None
        slot = _column(buf, "hash", slots, count).astype(np.uint32)
        slot %= np.uint32(cslots)
        per_slot = np.bincount(slot, minlength=cslots)
    first_row = np.cumsum(per_slot) - per_slot  # output row of each slot's newest item

    out = np.empty(size, dtype=np.uint8)  # every byte is written below
    used = int(np.count_nonzero(per_slot))
    _HEADER.pack_into(out.data, 0, MAGIC_COMPACTED, begin, end, used, count)
    table = np.ndarray((cslots, 2), dtype=">i4", buffer=out, offset=HEADER_SIZE)
    table[:, 0] = np.where(per_slot > 0, first_row * COMPACTED_ITEM_SIZE + item_base, 0)
    table[:, 1] = per_slot * COMPACTED_ITEM_SIZE
    del table
    src = np.ndarray(
        (count,),
        dtype=f"V{COMPACTED_ITEM_SIZE}",
        buffer=buf,
        offset=HEADER_SIZE + slots * SLOT_SIZE + ITEM_SIZE,
        strides=(ITEM_SIZE,),
    )
    dst = np.ndarray((count,), dtype=f"V{COMPACTED_ITEM_SIZE}", buffer=out, offset=item_base)
    # Rows move in pieces: a whole-array fancy index would first build a count*28-byte
    # temporary (fresh memory is slow to fault in); np.take(out=) is slower for void rows.
    if ranks is not None:
        # Piece by piece from the hashes: row = the slot's last row - rank. No whole-file
        # temporaries (slots, rows): their fresh memory would cost more than the arithmetic.
        del first_row
        last_row = np.cumsum(per_slot, dtype=np.int32)
        last_row -= 1
        hashes = _column(buf, "hash", slots, count)
        for a in range(0, count, _MOVE_PIECE):
            b = min(count, a + _MOVE_PIECE)
            piece = hashes[a:b].astype(np.uint32)
            piece %= np.uint32(slots)
            rows = last_row[piece]
            rows -= ranks[a + 1 : b + 1]
            dst[rows] = src[a:b]
        del hashes, src, dst
        return CompactedIndex(out, begin, end, count, cslots, used, begin + min_tdiff * 1000)
    assert slot is not None
    chain_rows = (
        _rows_by_chains(buf, slots, count, slot, per_slot, first_row)
        if cslots == slots and use_chains
        else None
    )
    del first_row
    if chain_rows is not None:  # chain_rows[i] = output row of item i+1: scatter, items in order
        for a in range(0, count, _MOVE_PIECE):
            dst[chain_rows[a : a + _MOVE_PIECE]] = src[a : a + _MOVE_PIECE]
    else:
        order = _order_by_sort(slot, count)  # order[r] = item (0-based) of output row r: gather
        del slot
        for a in range(0, count, _MOVE_PIECE):
            dst[a : a + _MOVE_PIECE] = src[order[a : a + _MOVE_PIECE]]
    del src, dst
    return CompactedIndex(out, begin, end, count, cslots, used, begin + min_tdiff * 1000)


def _counts_by_ranks(buf: Any, slots: int, count: int, ranks: RankArray) -> I64Array | None:
    """Items per slot of an intact file with a rank column: its newest item's rank + 1 (one
    read per slot instead of one per item); None if a slot head is out of range."""
    heads = np.ndarray((slots,), dtype=">i4", buffer=buf, offset=HEADER_SIZE, strides=(SLOT_SIZE,))
    newest = heads.astype(np.intp)
    del heads
    if len(newest) and (int(newest.min()) < 0 or int(newest.max()) > count):
        return None
    per_slot = ranks[newest].astype(np.int64)
    per_slot += 1
    per_slot[newest == 0] = 0
    return per_slot


def _order_by_sort(slot: U32Array, count: int) -> I64Array:
    """Item (0-based) of each output row: by slot, then newest first — one sort of distinct keys."""
    bits = max(1, (count - 1).bit_length())
    key = slot.astype(np.int64)
    key <<= bits
    key |= np.arange(count - 1, -1, -1, dtype=np.int64)  # count-1-i: newest item first
    key.sort()
    key &= (1 << bits) - 1
    return np.subtract(count - 1, key, out=key)


def _rows_by_chains(
    buf: Any, slots: int, count: int, slot: U32Array, per_slot: I64Array, first_row: I64Array
) -> npt.NDArray[np.int32] | None:
    """Output row of every item (0-based), by peeling the writable file's chains one level at
    a time; None if the chains are not exactly the slots' items (a torn file).

    Why the result is then a permutation: links are forced strictly downwards (a bad one ends
    at a sentinel that fails the next check), so a chain never revisits an item; every item
    met must belong to the chain's slot, so chains are disjoint and chain ``s`` has at most
    ``per_slot[s]`` items; if all chains together met ``count`` items, each has exactly its
    slot's items and writes exactly its slot's rows."""
    bad_link = count + 1
    prev = _column(buf, "prev", slots, count).astype(np.int32)
    prev[(prev < 0) | (prev >= np.arange(1, count + 1, dtype=np.int32))] = bad_link
    # link[i] = slot << 32 | previous item, for item i; link[0] ends a chain; link[bad_link]
    # matches no slot. One random read per item and level.
    link = np.empty(count + 2, dtype=np.int64)
    link[0] = 0
    link[bad_link] = -1
    body = link[1:bad_link]
    body[:] = slot
    body <<= 32
    body |= prev
    del prev, body
    heads = np.ndarray((slots,), dtype=">i4", buffer=buf, offset=HEADER_SIZE, strides=(SLOT_SIZE,))
    chain_slot = np.flatnonzero(per_slot)
    cur = heads[chain_slot].astype(np.int64)
    del heads
    if len(cur) and (int(cur.min()) < 1 or int(cur.max()) > count):
        return None
    row = first_row[chain_slot]
    rows = np.empty(count + 1, dtype=np.int32)  # by item index (count < 2**31); [0] unused
    met = 0
    while len(cur):
        v = link[cur]
        if not np.array_equal(v >> 32, chain_slot):
            return None
        rows[cur] = row
        met += len(cur)
        row += 1
        v &= 0xFFFFFFFF
        go = np.flatnonzero(v)
        cur, row, chain_slot = v[go], row[go], chain_slot[go]
    return rows[1:] if met == count else None


# ----------------------------------------------------------------------------- local files
class _LocalFile:
    """One writable or sealed local file. Header values are mirrored in attributes (one writer,
    on the loop thread) and published to the mapping in a crash-safe order."""

    def __init__(
        self,
        path: Path,
        mm: mmap.mmap,
        slots: int,
        items: int,
        header: tuple[int, int, int, int],
        min_item_time: int | None,
    ) -> None:
        self.path = path
        self.slots = slots
        self.items = items
        self.begin, self.end, self.used, self.count = header
        self.min_item_time = min_item_time
        self.status = FileStatus.UNSEALED
        self.item_base = HEADER_SIZE + slots * SLOT_SIZE
        self._mm: mmap.mmap | None = mm
        self._flushed_count = self.count
        #: Per item (by index; [0] unused): how many older items its slot held when it was
        #: inserted — what makes :func:`compact` one element-wise step instead of a chain walk.
        #: Kept only for a file created by this process (zeroed pages: memory only where
        #: written); None after a reopen or once a slot outgrows 16 bits (then the chains
        #: are peeled instead).
        self.ranks: RankArray | None = None
        #: Set when this process seals the file: per (topic id, queue id), the queue offsets
        #: ``[first, end)`` added by this process before the seal — all in this file or older
        #: ones. None for a file sealed before a restart (what it covers is not known).
        self.covers: dict[tuple[int, int], tuple[int, int]] | None = None

    @classmethod
    def create(cls, path: Path, slots: int, items: int, begin: int) -> _LocalFile:
        size = writable_size(slots, items)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)  # sparse: disk is used only where items and slots land
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        _HEADER.pack_into(mm, 0, MAGIC_WRITABLE, begin, begin, 0, 0)
        # The header reaches the disk now: only a crash inside create() leaves a torn file.
        mm.flush(0, min(size, mmap.PAGESIZE))
        fsync_dir(path.parent)
        f = cls(path, mm, slots, items, (begin, begin, 0, 0), None)
        f._flushed_count = -1
        f.ranks = np.zeros(items + 1, dtype=np.uint16)
        return f

    @classmethod
    def open(cls, path: Path, slots: int, items: int) -> _LocalFile:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size != writable_size(slots, items):
                raise _size_error(str(path), size, slots, items)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:
            header = _read_writable_header(mm, slots, items, str(path))
            _check_name(path, header[0])
            lo = None
            if header[3]:
                col = _column(mm, "tdiff", slots, header[3])
                lo = header[0] + int(col.min()) * 1000
                del col
        except BaseException:
            mm.close()
            raise
        return cls(path, mm, slots, items, header, lo)

    def _open_mm(self) -> mmap.mmap:
        if self._mm is None:
            raise StoreClosedError(f"index file {self.path} is closed", path=str(self.path))
        return self._mm

    @property
    def mm(self) -> mmap.mmap:
        return self._open_mm()

    @property
    def full(self) -> bool:
        return self.count >= self.items

    @property
    def dirty(self) -> bool:
        return self._mm is not None and self.count != self._flushed_count

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        return (
            self.count > 0
            and (self.min_item_time is None or self.min_item_time <= end_ms)
            and self.end >= begin_ms
        )

    def info(self) -> IndexFileInfo:
        return IndexFileInfo(self.begin, self.end, self.status, self.count, self.min_item_time)

    # ------------------------------------------------------------------ write
    def put(
        self,
        hashes: U32Array,
        topic_ids: I64Array,
        queue_ids: I64Array,
        offsets: I64Array,
        sizes: I64Array,
        timestamps: I64Array,
    ) -> int:
        """Append items in the given order; return how many leading ones fit.

        Byte-identical to inserting them one by one (chains newest first, ``used`` grows by the
        slots that were empty). Publication order: items, then count + used slots, then slot
        table, then end timestamp — a reader that follows a slot finds a written item."""
        mm = self._open_mm()
        m = min(len(hashes), self.items - self.count)
        if m <= 0:
            return 0
        h = hashes[:m]
        ts = timestamps[:m]
        count = self.count
        tdiff = np.clip((ts - self.begin) // 1000, _INT32_MIN, _INT32_MAX)
        # Group by slot keeping arrival order inside a slot: one sort of distinct keys.
        slot = (h % np.uint32(self.slots)).astype(np.int64)
        order_key = np.sort(slot * m + np.arange(m, dtype=np.int64))
        s_sorted = order_key // m
        pos_sorted = order_key - s_sorted * m
        idx_sorted = pos_sorted + count + 1  # item index of each sorted entry
        first = np.empty(m, dtype=bool)  # oldest new entry of its slot
        first[0] = True
        np.not_equal(s_sorted[1:], s_sorted[:-1], out=first[1:])
        last = np.empty(m, dtype=bool)  # newest new entry of its slot
        last[-1] = True
        last[:-1] = first[1:]

        table = np.ndarray((self.slots,), dtype=">i4", buffer=mm, offset=HEADER_SIZE, strides=(SLOT_SIZE,))
        heads = table[s_sorted[first]].astype(np.int64)
        heads[(heads < 0) | (heads > count)] = 0  # torn garbage after a power loss: new chain
        prev_sorted = np.empty(m, dtype=np.int64)
        prev_sorted[1:] = idx_sorted[:-1]
        prev_sorted[first] = heads
        prev = np.empty(m, dtype=np.int64)
        prev[pos_sorted] = prev_sorted
        if self.ranks is not None:
            self._rank(heads, first, idx_sorted)

        out = np.ndarray((m,), dtype=ITEM_DTYPE, buffer=mm, offset=self.item_base + (count + 1) * ITEM_SIZE)
        out["hash"] = h
        out["topic_id"] = topic_ids[:m]
        out["queue_id"] = queue_ids[:m]
        out["offset"] = offsets[:m]
        out["size"] = sizes[:m]
        out["tdiff"] = tdiff
        out["prev"] = prev
        self.used = min(self.slots, self.used + int(np.count_nonzero(heads == 0)))
        self.count = count + m
        _COUNTS.pack_into(mm, _OFF_USED, self.used, self.count)
        table[s_sorted[last]] = idx_sorted[last]
        self.end = max(self.end, int(ts.max()))
        _INT64.pack_into(mm, _OFF_END, self.end)
        lo = self.begin + int(tdiff.min()) * 1000
        self.min_item_time = lo if self.min_item_time is None else min(self.min_item_time, lo)
        del table, out  # an exported buffer would make mmap.close() fail
        return m

    def _rank(self, heads: I64Array, first: npt.NDArray[np.bool_], idx_sorted: I64Array) -> None:
        """Record the rank of each new item. The new items are sorted by slot, then age;
        ``first`` starts a slot's run and ``heads`` holds that slot's newest older item (0: none),
        so an item's rank is its head's rank + 1 (0 without one) + its place in the run."""
        assert self.ranks is not None
        m = len(first)
        starts = np.flatnonzero(first)
        base = self.ranks[heads].astype(np.int32)
        base += 1
        base *= heads > 0
        base -= starts.astype(np.int32)
        rank = np.repeat(base, np.diff(starts, append=m))
        rank += np.arange(m, dtype=np.int32)
        if int(rank.max()) > np.iinfo(np.uint16).max:
            log.debug("index file %s: a slot outgrew the rank column; compaction walks the chains", self.path)
            self.ranks = None
            return
        self.ranks[idx_sorted] = rank

    # ------------------------------------------------------------------ read
    def lookup(self, hash_: int, topic_id: int, begin_ms: int, end_ms: int, max_count: int) -> list[IndexHit]:
        """Walk the slot's chain (newest first). Links must point at strictly older, published
        items, so a torn chain can neither loop nor read past the item count."""
        mm = self._open_mm()
        hits: list[IndexHit] = []
        cur = int(_SLOT.unpack_from(mm, HEADER_SIZE + (hash_ % self.slots) * SLOT_SIZE)[0])
        count, begin, base = self.count, self.begin, self.item_base
        while 0 < cur <= count:
            item_hash, tid, qid, off, size, tdiff, prev = _ITEM.unpack_from(mm, base + cur * ITEM_SIZE)
            if item_hash == hash_ and tid == topic_id:
                t = begin + tdiff * 1000
                if t <= end_ms and t + 999 >= begin_ms:
                    hits.append(IndexHit(tid, qid, off, size, t))
                    if len(hits) >= max_count:
                        break
            if prev >= cur:
                break
            cur = prev
        return hits

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        """msync if anything changed since the last flush (safe from a worker thread)."""
        mm = self._mm
        if mm is not None and self.count != self._flushed_count:
            count = self.count
            mm.flush()
            self._flushed_count = count

    def close(self) -> None:
        self.ranks = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a numpy view survived (only after an error): let GC unmap it
                log.warning("index file %s is still referenced; it is unmapped when released", self.path)

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- uploaded files
class _UploadedFile:
    """An INDEX segment; geometry comes from its header (read once at load or known at upload)."""

    def __init__(
        self,
        info: SegmentInfo,
        driver: SegmentDriver,
        *,
        slots: int,
        count: int,
        end: int,
    ) -> None:
        self.info = info
        self.driver = driver
        self.begin = info.base_offset
        #: 0 = unreadable (bad header): kept for metadata and expiry, never queried.
        self.slots = slots
        self.count = count
        self.end = end
        self.item_base = HEADER_SIZE + slots * SLOT_SIZE

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        lo = self.info.min_timestamp
        return self.slots > 0 and self.count > 0 and (lo is None or lo <= end_ms) and self.end >= begin_ms

    def info_row(self) -> IndexFileInfo:
        return IndexFileInfo(self.begin, self.end, FileStatus.UPLOADED, self.count, self.info.min_timestamp)

    async def lookup(
        self, hash_: int, topic_id: int, begin_ms: int, end_ms: int, max_count: int, stats: IndexStats
    ) -> list[IndexHit]:
        raw = await self.driver.read(ByteRange(slot_position(self.slots, hash_), SLOT_SIZE))
        stats.backend_reads += 1
        stats.backend_read_bytes += SLOT_SIZE
        pos, length = slot_extent(raw, self.slots, self.count, hash_, self.driver.path)
        hits: list[IndexHit] = []
        done = 0
        while done < length and len(hits) < max_count:
            n = min(length - done, MAX_SLOT_READ)
            chunk = await self.driver.read(ByteRange(pos + done, n))
            stats.backend_reads += 1
            stats.backend_read_bytes += n
            done += n
            found = slot_hits(chunk, self.begin, hash_, topic_id, begin_ms, end_ms)
            hits.extend(found[: max_count - len(hits)])
        return hits


# ----------------------------------------------------------------------------- reading a segment
# The steps of one lookup in a compacted file, without I/O: shared by the service and by readers
# of the bucket alone (Spark), which batch the reads of many files themselves.
def segment_slots(size: int, count: int) -> int:
    """Slot count of a compacted file of ``size`` bytes holding ``count`` items (the header does
    not carry it); 0 when the two do not describe a compacted file."""
    rest = size - HEADER_SIZE - count * COMPACTED_ITEM_SIZE
    return rest // SLOT_SIZE if count >= 0 and rest > 0 and rest % SLOT_SIZE == 0 else 0


def slot_position(slots: int, hash_: int) -> int:
    """Byte position of the 8-byte slot of ``hash_`` in a compacted file of ``slots`` slots."""
    return HEADER_SIZE + (hash_ % slots) * SLOT_SIZE


def slot_extent(raw: bytes, slots: int, count: int, hash_: int, where: str) -> tuple[int, int]:
    """(byte position, byte length) of the items of ``hash_``'s slot, from the slot's 8 bytes
    ``raw``; length 0 for an empty slot. A slot pointing outside the item table is corruption."""
    pos, length = _SLOT.unpack(raw)
    if length == 0:
        return 0, 0
    item_base = HEADER_SIZE + slots * SLOT_SIZE
    end_of_items = item_base + count * COMPACTED_ITEM_SIZE
    if (
        length < 0
        or length % COMPACTED_ITEM_SIZE
        or pos < item_base
        or (pos - item_base) % COMPACTED_ITEM_SIZE
        or pos + length > end_of_items
    ):
        raise CorruptionError(
            f"index segment {where}: slot {hash_ % slots} holds position {pos} and "
            f"length {length}, outside the item table [{item_base}, {end_of_items})",
            path=where,
        )
    return pos, length


def slot_hits(
    items: bytes, begin: int, hash_: int, topic_id: int, begin_ms: int, end_ms: int
) -> list[IndexHit]:
    """The items (28-byte rows of one slot, or a whole-row piece of it) of a file that began at
    ``begin`` that carry ``hash_`` and ``topic_id`` and whose second may lie in
    ``[begin_ms, end_ms]``, in stored order (newest first)."""
    rows = np.frombuffer(items, dtype=COMPACTED_ITEM_DTYPE)
    t = begin + rows["tdiff"].astype(np.int64) * 1000
    match = (rows["hash"] == hash_) & (rows["topic_id"] == topic_id) & (t <= end_ms) & (t + 999 >= begin_ms)
    return [
        IndexHit(topic_id, int(rows[i]["queue_id"]), int(rows[i]["offset"]), int(rows[i]["size"]), int(t[i]))
        for i in np.flatnonzero(match).tolist()
    ]


# ----------------------------------------------------------------------------- key extraction
def _property_offsets(records: bytes, sizes: I64Array) -> tuple[I64Array, I64Array]:
    """(start, end) of every record's properties, computed for the whole batch with numpy.

    Only framing is checked (the flat commitlog holds records verified when tiered); a record
    whose fields do not add up is a :class:`CorruptionError`."""
    n = len(sizes)
    buf = np.frombuffer(records, dtype=np.uint8)
    ends = np.cumsum(sizes, dtype=np.int64)
    if n == 0 or int(ends[-1]) != len(records) or int(sizes.min()) < HEADER_V4 + 3:
        raise CorruptionError(
            f"record sizes {sizes.tolist()[:8]}... do not frame a batch of {len(records)} bytes",
            size=len(records),
        )
    starts = ends - sizes
    last = len(records) - 1
    magic = gather_at(buf, starts + POS_MAGIC, _U4).astype(np.int64)
    sysflag = gather_at(buf, starts + POS_SYSFLAG, _U4).astype(np.int64)
    hosts = np.where(sysflag & 0x10, 20, 8) + np.where(sysflag & 0x20, 20, 8)
    body_start = starts + (HEADER_V4 - 16) + hosts  # fixed header bytes besides the two hosts
    body_len = gather_at(buf, np.minimum(body_start - 4, last - 3), _U4).astype(np.int64)
    v2 = magic == MAGIC_V2
    tpos = np.minimum(body_start + body_len, last - 1)
    topic_len = np.where(v2, gather_at(buf, tpos, _U2).astype(np.int64), buf[tpos].astype(np.int64))
    props_start = body_start + body_len + np.where(v2, 2, 1) + topic_len + 2
    props_len = gather_at(buf, np.clip(props_start - 2, 0, last - 1), _U2).astype(np.int64)
    ok = (
        ((magic == MAGIC_V1) | v2)
        & (body_len < 2**31)
        & (body_start + body_len + 3 <= ends)
        & (props_start + props_len == ends)
    )
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise CorruptionError(
            f"record {bad} of the batch (at byte {int(starts[bad])}) has inconsistent field lengths",
            index=bad,
        )
    return props_start, ends


_KEYS_NAME = PROPERTY_KEYS.encode()
_UNIQ_NAME = PROPERTY_UNIQ_KEY.encode()
_SEP = KEY_SEPARATOR.encode()


def _record_keys(props: bytes) -> list[bytes]:
    """Indexed keys of one record: each KEYS token, then UNIQ_KEY; blanks dropped, duplicates
    once (RocketMQ's key set). Works on UTF-8 bytes: splitting on 0x01/0x02/0x20 bytes is the
    same as splitting the decoded text, and the hash is of the UTF-8 bytes anyway."""
    keys = uniq = b""
    for item in props.split(b"\x02"):
        name, sep, value = item.partition(b"\x01")
        if sep and value:  # decode_properties' rule: last value of a name wins
            if name == _KEYS_NAME:
                keys = value
            elif name == _UNIQ_NAME:
                uniq = value
    found = [k for k in keys.split(_SEP) if k] if keys else []
    if uniq:
        found.append(uniq)
    return list(dict.fromkeys(found)) if len(found) > 1 else found


def batch_keys(batch: CommittedBatch) -> tuple[list[bytes], list[int]]:
    """(``topic#key`` as UTF-8 bytes, record index) for every key of every record of ``batch``."""
    starts, ends = _property_offsets(batch.records, np.asarray(batch.sizes, dtype=np.int64))
    records = batch.records
    prefix = f"{batch.topic}#".encode()
    keys: list[bytes] = []
    owners: list[int] = []
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if a == b:
            continue
        props = records[a:b]
        if _KEYS_NAME + b"\x01" not in props and _UNIQ_NAME + b"\x01" not in props:
            continue
        for k in _record_keys(props):
            keys.append(prefix + k)
            owners.append(i)
    return keys, owners


def hash_keys(keys: Sequence[bytes]) -> U32Array:
    """mmh3 32-bit (seed 0, unsigned) of each UTF-8 key, vectorised the fastest way mmh3 allows."""
    return np.fromiter(map(mmh3.mmh3_32_uintdigest, keys), dtype=np.uint32, count=len(keys))


def _crc32c(data: U8Array, piece: int = 16 * 1024 * 1024) -> str:
    """CRC32C (8 hex digits) of ``data``; google_crc32c only takes bytes, hence the pieces."""
    crc = 0
    for pos in range(0, len(data), piece):
        crc = google_crc32c.extend(crc, data[pos : pos + piece].tobytes())
    return f"{crc:08x}"


def _append(seg: FileSegment, data: bytes, timestamp: int) -> None:
    result = seg.append(data, timestamp)
    if result is not AppendResult.SUCCESS:  # the segment is sized to fit: a bug if it happens
        raise CorruptionError(f"index segment {seg.path} refused an append: {result.name}", path=seg.path)


# ----------------------------------------------------------------------------- the service
ChangeCallback = Callable[[], Awaitable[None]]
Coverage = dict[tuple[int, int], tuple[int, int]]


def _merge_coverage(published: Coverage, covers: Coverage) -> Coverage:
    """``published`` extended by a sealed file's snapshot: per queue, the union when the two
    ranges meet, else the snapshot alone (the newer range; the offsets between them are not
    covered, and an older range beyond the gap is dropped rather than tracked)."""
    out = dict(published)
    for key, (first, end) in covers.items():
        cur = out.get(key)
        if cur is not None and first <= cur[1] and end >= cur[0]:
            out[key] = (min(cur[0], first), max(cur[1], end))
        else:
            out[key] = (first, end)
    return out


class ColdIndexService:
    """The cold key index of one broker: local files under ``{store_dir}/tiered_index`` plus
    INDEX segments under ``{cluster dir}/{broker}/rmq_sys_INDEX/0/INDEX/`` on ``root``.

    Call :meth:`load` first. ``on_change`` is awaited whenever the set of uploaded segments
    changed (upload committed, expiry, load dropped a missing one) so the caller persists
    :meth:`uploaded_infos` into metadata and manifests; a local file is deleted only after it
    returned. ``max_file_age_ms``: :meth:`maintain` seals a non-empty writable file this old.
    ``upload_piece`` bytes go out per commit. ``clock`` (epoch ms) exists for tests.
    """

    def __init__(
        self,
        store_dir: Path,
        root: DriverRoot,
        cluster: str,
        broker: str,
        slots: int,
        items: int,
        *,
        on_change: ChangeCallback | None = None,
        max_file_age_ms: int = DEFAULT_MAX_FILE_AGE_MS,
        upload_piece: int = DEFAULT_UPLOAD_PIECE,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        _check_geometry(slots, items)
        if upload_piece <= 0:
            raise InvalidArgumentError(
                f"upload_piece must be >= 1, got {upload_piece}", upload_piece=upload_piece
            )
        paths.cluster_dir(cluster)  # validates the names now rather than at the first upload
        paths.queue_path(broker, paths.INDEX_TOPIC, paths.INDEX_QUEUE_ID)
        self.directory = Path(store_dir) / DIR_NAME
        self.root = root
        self.cluster = cluster
        self.broker = broker
        self.slots = slots
        self.items = items
        self.max_file_age_ms = max_file_age_ms
        self.upload_piece = upload_piece
        self._on_change = on_change
        self._clock = clock
        self.stats = IndexStats()
        #: Oldest first; the last one is writable (UNSEALED) unless sealed by maintain/add.
        self._local: list[_LocalFile] = []
        #: Oldest first.
        self._uploaded: list[_UploadedFile] = []
        #: Local files already uploaded and recorded in memory, deleted after on_change succeeds.
        self._unlink_after_change: list[Path] = []
        self._last_begin = -1
        #: Per (topic id, queue id): queue offsets ``[first, end)`` added since this process
        #: started (contiguous; a gap restarts it).
        self._added: dict[tuple[int, int], tuple[int, int]] = {}
        #: Per (topic id, queue id): queue offsets ``[first, end)`` whose keys are all in
        #: uploaded segments (see :meth:`write_manifest`), as published in the index manifest.
        self.coverage: Coverage = {}
        #: Newest end timestamp of an index file deleted by retention (None: none yet).
        self.expired_through: int | None = None
        #: Whether :attr:`coverage` and :attr:`expired_through` were read from the bucket (done
        #: before the first publication, not at load: most start-ups never need it).
        self._manifest_read = False
        self._lock = asyncio.Lock()
        self._inflight: asyncio.Future[Any] | None = None
        self._loaded = False
        self._closed = False

    # ------------------------------------------------------------------ naming / state
    def segment_path(self, begin_timestamp: int) -> str:
        """Driver path of the INDEX segment of the file that began at ``begin_timestamp``."""
        return paths.index_segment_path("", self.cluster, self.broker, begin_timestamp)

    def uploaded_infos(self) -> list[SegmentInfo]:
        """Uploaded INDEX segments, oldest first (for metadata and manifests)."""
        return [u.info for u in self._uploaded]

    def files(self) -> list[IndexFileInfo]:
        """Every file, oldest first (diagnostics and tests)."""
        rows = [u.info_row() for u in self._uploaded] + [f.info() for f in self._local]
        return sorted(rows, key=lambda r: r.begin_timestamp)

    @property
    def needs_maintenance(self) -> bool:
        """True when a sealed local file waits for compaction and upload."""
        return any(f.status is FileStatus.SEALED for f in self._local)

    def _check_ready(self) -> None:
        if self._closed:
            raise StoreClosedError(f"cold index service for {self.directory} is closed")
        if not self._loaded:
            raise StoreClosedError(
                f"cold index service for {self.directory} is not loaded: call load() first"
            )

    def _update_gauges(self) -> None:
        self.stats.local_files = len(self._local)
        self.stats.uploaded_files = len(self._uploaded)

    # ------------------------------------------------------------------ load
    async def load(self, uploaded: list[SegmentInfo]) -> None:
        """Open local files (the newest writable, the others sealed) and register ``uploaded``
        INDEX segments (from metadata), reading each one's 28-byte header once to learn its
        geometry. A segment that is gone from the backend is dropped with a warning; one with a
        bad header is logged, kept for metadata and expiry, and never queried. A local file whose
        upload is already recorded is deleted (the upload wins). Backend errors propagate (the
        caller retries ``load``)."""
        async with self._lock:
            if self._closed:
                raise StoreClosedError(f"cold index service for {self.directory} is closed")
            for f in self._local:
                f.close()
            self._local, self._uploaded = [], []
            self.directory.mkdir(parents=True, exist_ok=True)
            remote = await self._open_uploaded([i for i in uploaded if i.file_type is FileType.INDEX])
            remote_bases = {u.begin for u in remote}
            local: list[_LocalFile] = []
            try:
                names = sorted(
                    (int(p.name), p) for p in self.directory.iterdir() if p.name.isdigit() and p.is_file()
                )
                for i, (begin, path) in enumerate(names):
                    if begin in remote_bases:
                        log.info("index file %s is already uploaded; deleting the local copy", path)
                        path.unlink()
                        continue
                    if i == len(names) - 1 and self._torn_creation(path):
                        log.warning(
                            "index file %s was never initialised (crash while creating it); removing it", path
                        )
                        path.unlink()
                        continue
                    local.append(_LocalFile.open(path, self.slots, self.items))
            except BaseException:
                for f in local:
                    f.close()
                raise
            for f in local[:-1]:
                f.status = FileStatus.SEALED
            self._local, self._uploaded = local, remote
            begins = [f.begin for f in local] + [u.begin for u in remote]
            self._last_begin = max([self._last_begin, *begins])
            self._loaded = True
            self._update_gauges()
            if len(remote) != len([i for i in uploaded if i.file_type is FileType.INDEX]):
                await self._changed()
            log.info(
                "cold index loaded: %d local file(s) (%d sealed), %d uploaded",
                len(local),
                max(0, len(local) - 1),
                len(remote),
            )

    def _torn_creation(self, path: Path) -> bool:
        size = path.stat().st_size
        if size == 0:
            return True
        if size != writable_size(self.slots, self.items):
            return False
        with path.open("rb") as fh:
            return fh.read(HEADER_SIZE) == bytes(HEADER_SIZE)

    async def _open_uploaded(self, infos: list[SegmentInfo]) -> list[_UploadedFile]:
        sem = asyncio.Semaphore(_HEADER_READ_CONCURRENCY)

        async def one(info: SegmentInfo) -> _UploadedFile | None:
            driver = self.root.driver(self.segment_path(info.base_offset))
            async with sem:
                try:
                    raw = await driver.read(ByteRange(0, HEADER_SIZE))
                except SegmentNotFoundError:
                    log.warning(
                        "index segment %s is listed in metadata but missing; dropping it", driver.path
                    )
                    return None
                except SegmentReadError:  # shorter than a header
                    raw = bytes(HEADER_SIZE)
            self.stats.header_reads += 1
            magic, begin, end, used, count = _HEADER.unpack(raw)
            slots = segment_slots(info.size, count)
            if magic != MAGIC_COMPACTED or begin != info.base_offset or not slots or not 0 <= used <= count:
                log.error(
                    "index segment %s has a bad header (magic 0x%08X, begin %d, used %d, count %d, size %d); "
                    "it is kept for expiry but not queried",
                    driver.path,
                    magic,
                    begin,
                    used,
                    count,
                    info.size,
                )
                return _UploadedFile(info, driver, slots=0, count=0, end=info.max_timestamp or begin)
            return _UploadedFile(info, driver, slots=slots, count=count, end=end)

        found = await asyncio.gather(*(one(i) for i in infos))
        return sorted((u for u in found if u is not None), key=lambda u: u.begin)

    # ------------------------------------------------------------------ write
    def add(self, batch: CommittedBatch, topic_id: int) -> int:
        """Index every record of a committed batch under each of its keys (the KEYS tokens and
        UNIQ_KEY, each once). Returns the number of items added. Synchronous: call it on the
        loop, right after the commit made the records readable."""
        self._check_ready()
        n = len(batch.sizes)
        if n == 0:
            return 0
        keys, owners = batch_keys(batch)
        added = 0
        if keys:
            rec = np.asarray(owners, dtype=np.intp)
            added = self.put_items(
                hash_keys(keys),
                topic_id,
                batch.queue_id,
                np.asarray(batch.flat_offsets, dtype=np.int64)[rec],
                np.asarray(batch.sizes, dtype=np.int64)[rec],
                np.asarray(batch.store_timestamps, dtype=np.int64)[rec],
            )
        # After the items: a file sealed while they went in (a roll inside put_items) must not
        # claim this batch, part of which went into the next file.
        key = (topic_id, batch.queue_id)
        first, end = batch.first_queue_offset, batch.first_queue_offset + n
        prev = self._added.get(key)
        joins = prev is not None and first <= prev[1] and end >= prev[0]
        self._added[key] = (min(prev[0], first), max(prev[1], end)) if prev and joins else (first, end)
        return added

    def put_items(
        self,
        hashes: npt.ArrayLike,
        topic_ids: npt.ArrayLike,
        queue_ids: npt.ArrayLike,
        flat_offsets: npt.ArrayLike,
        sizes: npt.ArrayLike,
        store_timestamps: npt.ArrayLike,
    ) -> int:
        """Append already hashed items (equal-length columns; scalars broadcast), rolling to a
        new file when the writable one fills up. The vectorised core of :meth:`add`."""
        self._check_ready()
        h = np.asarray(hashes)
        if h.dtype != np.uint32:
            if h.size and (h.dtype.kind not in "iu" or int(h.min()) < 0 or int(h.max()) > 0xFFFFFFFF):
                raise InvalidArgumentError("hashes must be unsigned 32-bit integers", dtype=str(h.dtype))
            h = h.astype(np.uint32)
        n = len(h)
        if n == 0:
            return 0
        cols = [
            np.broadcast_to(np.asarray(c, dtype=np.int64), (n,))
            for c in (topic_ids, queue_ids, flat_offsets, sizes, store_timestamps)
        ]
        tid, qid, off, size, ts = cols
        for name, col in (("topic_ids", tid), ("queue_ids", qid), ("sizes", size)):
            if int(col.min()) < 0 or int(col.max()) > _INT32_MAX:
                raise InvalidArgumentError(f"{name} must be in [0, {_INT32_MAX}]", column=name)
        if int(off.min()) < 0:
            raise InvalidArgumentError("flat_offsets must be >= 0")
        done = 0
        while done < n:
            f = self._writable()
            done += f.put(h[done:], tid[done:], qid[done:], off[done:], size[done:], ts[done:])
            if done < n:
                log.debug("index file %s is full; rolling", f.path)
                self._roll()
        self.stats.items_added += n
        return n

    def _writable(self) -> _LocalFile:
        if self._local and self._local[-1].status is FileStatus.UNSEALED:
            return self._local[-1]
        return self._roll()

    def _roll(self) -> _LocalFile:
        """Create a new writable file FIRST, then seal the current one, so that the newest local
        file on disk is always the writable one (that is how load() tells statuses apart)."""
        begin = max(self._clock(), self._last_begin + 1)
        f = _LocalFile.create(self.directory / str(begin), self.slots, self.items, begin)
        self._last_begin = begin
        if self._local and self._local[-1].status is FileStatus.UNSEALED:
            self._local[-1].status = FileStatus.SEALED
            self._local[-1].covers = dict(self._added)
        self._local.append(f)
        self._update_gauges()
        return f

    # ------------------------------------------------------------------ maintenance
    async def maintain(self) -> None:
        """Seal the writable file if full or older than ``max_file_age_ms``, flush it, then
        compact and upload every sealed file, oldest first. Stops at the first failure and
        raises it (call again later; what was done is kept, what failed is retried)."""
        async with self._lock:
            self._check_ready()
            if self._unlink_after_change:
                await self._changed()
            if self._local:
                w = self._local[-1]
                if (
                    w.status is FileStatus.UNSEALED
                    and w.count
                    and (w.full or self._clock() - w.begin >= self.max_file_age_ms)
                ):
                    self._roll()
                    log.info("sealed index file %s (%d items)", w.path, w.count)
            for f in list(self._local):
                if f.status is not FileStatus.SEALED:
                    if f.dirty:
                        await self._in_thread(f.flush)
                    continue
                if f.count == 0:
                    self._local.remove(f)
                    f.destroy()
                    continue
                await self._upload_file(f)
            self._update_gauges()

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in a worker thread; ``close()`` waits for it even if we are cancelled."""
        fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        self._inflight = fut
        try:
            return await asyncio.shield(fut)
        finally:
            if fut.done():
                self._inflight = None

    async def _upload_file(self, f: _LocalFile) -> None:
        t0 = time.perf_counter()

        def work() -> tuple[CompactedIndex, str]:
            f.flush()
            c = compact(f.mm, f.slots, f.items, name=str(f.path), ranks=f.ranks)
            return c, _crc32c(c.data)

        compacted, crc = await self._in_thread(work)
        self.stats.compactions += 1
        self.stats.compaction_seconds += time.perf_counter() - t0
        driver = self.root.driver(self.segment_path(f.begin))
        await self._upload(driver, f.begin, compacted.data)
        info = SegmentInfo(
            FileType.INDEX,
            f.begin,
            len(compacted.data),
            True,
            compacted.min_item_time,
            compacted.end_timestamp,
            f.begin,
            self._clock(),
            None,
            crc,
        )
        uploaded = _UploadedFile(
            info, driver, slots=compacted.slots, count=compacted.item_count, end=compacted.end_timestamp
        )
        # Published before the upload is recorded: if this fails, the file stays local and the
        # next maintain() uploads it again (the same bytes) and retries.
        await self._read_manifest()
        coverage = _merge_coverage(self.coverage, f.covers or {})
        await self._write_manifest(coverage, self.expired_through, [*self._uploaded, uploaded])
        self.coverage = coverage
        self._uploaded.append(uploaded)
        self._uploaded.sort(key=lambda u: u.begin)
        self._local.remove(f)
        f.close()
        self._unlink_after_change.append(f.path)
        self._update_gauges()
        log.info(
            "uploaded index file %s: %d items, %d slots, %d bytes in %.2f s",
            f.path,
            compacted.item_count,
            compacted.slots,
            len(compacted.data),
            time.perf_counter() - t0,
        )
        await self._changed()

    async def _upload(self, driver: SegmentDriver, base: int, data: U8Array) -> None:
        """Make the segment hold exactly ``data``, sealed. Safe to repeat after any failure:
        the driver's writes are idempotent, a segment already sealed is compared byte for byte,
        and one holding other bytes is deleted and written again."""
        size = len(data)
        view = data.data
        for attempt in (1, 2):
            seg = FileSegment(driver, FileType.INDEX, base, max_size=size)
            try:
                pos = 0
                while pos < size:
                    piece = view[pos : pos + self.upload_piece]
                    _append(seg, piece.tobytes(), base)
                    await seg.commit()
                    pos += len(piece)
                await seg.seal()
                if await driver.size() == size:
                    break
                problem = f"holds {await driver.size()} bytes after the upload, expected {size}"
            except SegmentSealedError:
                if await self._holds(driver, view):
                    log.info(
                        "index segment %s was already uploaded and sealed with the same bytes", driver.path
                    )
                    break
                problem = "is sealed with different bytes"
            except CorruptionError as e:
                problem = f"holds different bytes ({e})"
            if attempt == 2:
                raise CorruptionError(
                    f"index segment {driver.path} {problem} even after rewriting it", path=driver.path
                )
            log.warning("index segment %s %s; deleting and uploading it again", driver.path, problem)
            await driver.delete()
        self.stats.uploads += 1
        self.stats.uploaded_bytes += size

    async def _holds(self, driver: SegmentDriver, data: memoryview) -> bool:
        if await driver.size() != len(data):
            return False
        pos = 0
        while pos < len(data):
            n = min(self.upload_piece, len(data) - pos)
            if await driver.read(ByteRange(pos, n)) != data[pos : pos + n]:
                return False
            pos += n
        return True

    async def _changed(self) -> None:
        """Tell the owner that uploaded_infos() changed, then delete local files whose upload it
        now records."""
        if self._on_change is not None:
            await self._on_change()
        doomed, self._unlink_after_change = self._unlink_after_change, []
        for path in doomed:
            path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ index manifest
    @property
    def manifest_path(self) -> str:
        """Where the index manifest lives (relative to the root)."""
        return index_manifest_path(self.cluster, self.broker)

    async def _read_manifest(self) -> None:
        """Once per process, before the first publication: load :attr:`coverage` and
        :attr:`expired_through` from the published index manifest. A missing one is a first
        start; one that does not parse is logged and replaced (claiming less coverage is
        always safe)."""
        if self._manifest_read:
            return
        try:
            raw = await self.root.get_object(self.manifest_path)
        except SegmentNotFoundError:
            raw = None
        if raw is not None:
            try:
                m = IndexManifest.model_validate_json(raw)
            except ValueError as e:
                log.error("index manifest %s is not valid (%s); publishing a new one", self.manifest_path, e)
            else:
                self.coverage = {(c.topic_id, c.queue_id): (c.first_offset, c.end_offset) for c in m.coverage}
                self.expired_through = m.expired_through
        self._manifest_read = True

    async def _write_manifest(
        self,
        coverage: Coverage,
        expired_through: int | None,
        uploaded: Sequence[_UploadedFile],
    ) -> None:
        """Publish the index manifest (:class:`~tierd.tiered.manifest.IndexManifest`): the
        segments a bucket reader may look keys up in and, per queue, the offsets they cover.

        Coverage is only ever claimed for what is certain: the offsets a file's seal snapshot
        (:attr:`_LocalFile.covers`) names were all added by this process before the seal, so
        their items are in that file or an older one — all uploaded before it, oldest first.
        Items added before a restart are not claimed (their local file may have lost unflushed
        items to a power cut), and retention's deletions are published as
        :attr:`expired_through` before they happen."""
        segments = tuple(
            ManifestSegment(
                type="INDEX",
                base_offset=u.begin,
                size=u.info.size,
                sealed=True,
                min_store_timestamp=u.info.min_timestamp,
                max_store_timestamp=u.end,
                message_count=u.count,
                crc32c=u.info.crc32c,
            )
            for u in sorted(uploaded, key=lambda u: u.begin)
            if u.slots > 0
        )
        manifest = IndexManifest(
            cluster=self.cluster,
            broker=self.broker,
            segments=segments,
            coverage=tuple(
                IndexCoverage(topic_id=t, queue_id=q, first_offset=a, end_offset=b)
                for (t, q), (a, b) in sorted(coverage.items())
            ),
            expired_through=expired_through,
            written_at=self._clock(),
        )
        await self.root.put_object(self.manifest_path, manifest.model_dump_json(by_alias=True).encode())

    # ------------------------------------------------------------------ query
    async def query(
        self, topic: str, topic_id: int, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[IndexHit]:
        """Candidates for ``key`` of ``topic``: items with its hash and ``topic_id`` whose store
        time may lie in ``[begin_ms, end_ms]``, from every local and uploaded file whose time
        range overlaps the window; newest file first, chain order (newest first) inside a file,
        without duplicates, at most ``max_count``. Hash-only: the caller checks the key.

        An uploaded file costs 2 backend reads (1 if the slot is empty); files older than the
        point where ``max_count`` candidates were found are not read."""
        self._check_ready()
        self.stats.queries += 1
        if max_count <= 0 or begin_ms > end_ms:
            return []
        hash_ = key_hash(index_key(topic, key))
        candidates: list[_LocalFile | _UploadedFile] = [*self._local, *self._uploaded]
        files = [f for f in candidates if f.overlaps(begin_ms, end_ms)]
        files.sort(key=lambda f: f.begin, reverse=True)
        # Local files are read now, before the first await: maintain() may close one meanwhile.
        local_hits = {
            id(f): f.lookup(hash_, topic_id, begin_ms, end_ms, max_count)
            for f in files
            if isinstance(f, _LocalFile)
        }
        found: dict[tuple[int, int], IndexHit] = {}
        for f in files:
            self.stats.files_queried += 1
            if isinstance(f, _LocalFile):
                hits = local_hits[id(f)]
            else:
                try:
                    hits = await f.lookup(hash_, topic_id, begin_ms, end_ms, max_count, self.stats)
                except SegmentNotFoundError:
                    log.debug("index segment %s vanished during a query (expired)", f.driver.path)
                    continue
            for hit in hits:
                found.setdefault((hit.queue_id, hit.flat_offset), hit)
            if len(found) >= max_count:
                break
        out = list(found.values())[:max_count]
        self.stats.hits += len(out)
        return out

    # ------------------------------------------------------------------ expiry / close
    async def expire(self, before_ms: int) -> int:
        """Delete uploaded segments and sealed local files whose end timestamp (newest store
        time) is before ``before_ms``; never the writable file. Backend first, then
        ``on_change``. Returns how many files were deleted."""
        async with self._lock:
            self._check_ready()
            doomed_remote = [u for u in self._uploaded if u.end < before_ms]
            doomed_local = [f for f in self._local if f.status is FileStatus.SEALED and f.end < before_ms]
            if doomed_remote or doomed_local:
                # Readers of the bucket learn first that messages stored up to here may have
                # lost their items, then the files go.
                await self._read_manifest()
                expired = max([u.end for u in doomed_remote] + [f.end for f in doomed_local])
                through = expired if self.expired_through is None else max(self.expired_through, expired)
                kept = [u for u in self._uploaded if u not in doomed_remote]
                await self._write_manifest(self.coverage, through, kept)
                self.expired_through = through
            for u in doomed_remote:
                await u.driver.delete()
                self._uploaded.remove(u)
            for f in doomed_local:
                # A failed upload may have left part of it on the backend.
                await self.root.driver(self.segment_path(f.begin)).delete()
                self._local.remove(f)
                f.destroy()
            n = len(doomed_remote) + len(doomed_local)
            self.stats.expired_files += n
            self._update_gauges()
            if doomed_remote:
                await self._changed()
            if n:
                log.info("cold index retention deleted %d file(s) ending before %d", n, before_ms)
            return n

    async def close(self) -> None:
        """Wait for a running compaction, flush and unmap local files. Idempotent. Local files
        stay on disk (nothing is force-uploaded, unlike RocketMQ's shutdown): :meth:`load`
        picks them up again."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._inflight is not None:
                await asyncio.wait([self._inflight])
                self._inflight = None
            try:
                for f in self._local:
                    f.flush()
            finally:
                for f in self._local:
                    f.close()
                self._local = []
                self._update_gauges()
