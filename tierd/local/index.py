"""The hot store's local key index: RocketMQ's IndexFile layout with mmh3 key hashes.

One index file (FORMATS.md §1.3, big-endian) is a 40-byte header, a table of ``slots`` 4-byte
hash slots and an array of ``items`` 20-byte items::

    header  begin ts (8) · end ts (8) · begin phy (8) · end phy (8) · used slots (4) · item count (4)
    slot    index of the newest item whose ``hash % slots`` is this slot (0 = empty)
    item    key hash (4, unsigned) · commitlog offset (8) · seconds since begin ts (4) · previous item (4)

Items chain per slot from newest to oldest through ``previous``; item 0 is never used so that 0
can mean "no item". A lookup walks one chain and compares hashes only: a hash collision yields a
false positive, which the store facade removes by checking the message's real keys.

Writes are vectorised with numpy: one :meth:`IndexFile.put_batch` call regroups a whole batch by
slot with a single sort instead of a Python loop per key, yet produces byte-for-byte the file a
one-by-one insertion would (the tests check this against a plain reference implementation).

Thread model: exactly one writer (the reput thread) calls :meth:`IndexService.put_batch`; any
number of threads may :meth:`IndexService.query` concurrently. Changes to the file list (roll,
retention, load, truncate, close) take a readers-writer lock exclusively, queries and flushes
take it shared, so a file is never unmapped under a reader. Appends to the newest file run
without that lock: the write order (items → item count → slot table → end offset/timestamp) plus
bounds checks on every link let a reader walk a chain that is being extended without ever seeing
an item that is not fully written.

Crashes: the kernel writes mapped pages back in any order, so the write order above protects
readers, not the disk. Durability comes from the checkpoint instead (RocketMQ's rule): after an
abnormal exit :meth:`IndexService.load` destroys every file that changed after the checkpoint's
index timestamp, and the reput thread rebuilds it from the commitlog.
"""

from __future__ import annotations

import calendar
import logging
import mmap
import os
import re
import struct
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tierd.errors import CorruptionError, InvalidArgumentError, StoreClosedError
from tierd.format.key_hash import index_key, key_hash, key_hashes
from tierd.local.mapped_file import fsync_dir

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = [
    "DEFAULT_ITEMS",
    "DEFAULT_SLOTS",
    "HEADER_SIZE",
    "ITEM_SIZE",
    "SLOT_SIZE",
    "IndexFile",
    "IndexService",
    "index_file_size",
    "torn_at_creation",
]

log = logging.getLogger(__name__)

HEADER_SIZE = 40
SLOT_SIZE = 4
ITEM_SIZE = 20
#: Item indices and slot values are Java ints on disk.
_MAX_INT32 = 2**31 - 1

_HEADER = struct.Struct(">qqqqii")
_ITEM = struct.Struct(">Iqii")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_COUNTS = struct.Struct(">ii")
# Header field offsets.
_OFF_BEGIN_TS, _OFF_END_TS, _OFF_BEGIN_PHY, _OFF_END_PHY, _OFF_USED_SLOTS, _OFF_COUNT = 0, 8, 16, 24, 32, 36

#: One item as numpy sees it in the mapping (packed, big-endian; itemsize is exactly 20).
_ITEM_DTYPE = np.dtype([("hash", ">u4"), ("phy", ">i8"), ("tdiff", ">i4"), ("prev", ">i4")])
_SLOT_DTYPE = np.dtype(">i4")

# Geometry assumed by :meth:`IndexFile.open` when the caller gives none: RocketMQ's defaults,
# which are also StoreConfig.index_slots / index_items defaults.
DEFAULT_SLOTS = 5_000_000
DEFAULT_ITEMS = 20_000_000

_NAME_RE = re.compile(r"\d{17}")

U32Array = npt.NDArray[np.uint32]
I64Array = npt.NDArray[np.int64]


def index_file_size(slots: int, items: int) -> int:
    """Bytes of an index file with ``slots`` hash slots and ``items`` items (item 0 included)."""
    return HEADER_SIZE + slots * SLOT_SIZE + items * ITEM_SIZE


def torn_at_creation(path: Path, size: int, header_size: int) -> bool:
    """True for what creating a sparse, memory-mapped index file leaves when the process dies
    inside it: a file not yet sized, or sized to ``size`` but whose ``header_size``-byte header
    never reached the disk (all zeros). The cold tier's key index creates its files the same way
    and shares this check."""
    actual = path.stat().st_size
    if actual == 0:
        return True
    if actual != size:
        return False
    with path.open("rb") as fh:
        return fh.read(header_size) == bytes(header_size)


def _has_slots(path: Path, slots: int) -> bool:
    """Whether any hash slot of the index file at ``path`` is set (items were written)."""
    with path.open("rb") as fh:
        fh.seek(HEADER_SIZE)
        return any(fh.read(slots * SLOT_SIZE))


def _check_geometry(slots: int, items: int) -> None:
    if not 1 <= slots <= _MAX_INT32:
        raise InvalidArgumentError(f"index slots must be in [1, {_MAX_INT32}], got {slots}", slots=slots)
    # items counts item 0, which is never used: at least one usable item.
    if not 2 <= items <= _MAX_INT32:
        raise InvalidArgumentError(f"index items must be in [2, {_MAX_INT32}], got {items}", items=items)


class IndexFile:
    """One memory-mapped index file. Not thread-safe for writers: one writer, many readers.

    Header values are read from the mapping on every access (never cached) so that a reader
    thread always sees what the writer last published.
    """

    __slots__ = ("_flushed_count", "_item_base", "_mm", "items", "path", "slots")

    def __init__(self, path: Path, mm: mmap.mmap, slots: int, items: int) -> None:
        # Use create() or open(); this only wires up an already validated mapping.
        self.path = path
        self.slots = slots
        self.items = items
        self._mm: mmap.mmap | None = mm
        self._item_base = HEADER_SIZE + slots * SLOT_SIZE
        #: Item count at the last msync; -1 = never flushed (the header itself is dirty).
        self._flushed_count = -1

    # ------------------------------------------------------------------ life cycle
    @classmethod
    def create(
        cls, path: Path, slots: int, items: int, begin_phy_offset: int, begin_timestamp: int
    ) -> IndexFile:
        """Create a new, empty file. End offset/timestamp start equal to the begin values so that
        a rolled file continues where its predecessor ended (replays below it are skipped).
        ``begin_timestamp <= 0`` means "unknown": the first inserted item then supplies both begin
        values (RocketMQ's first-put rule)."""
        _check_geometry(slots, items)
        if begin_phy_offset < 0 or begin_timestamp < 0:
            raise InvalidArgumentError(
                f"begin_phy_offset and begin_timestamp must be >= 0, got {begin_phy_offset} and "
                f"{begin_timestamp}",
                begin_phy_offset=begin_phy_offset,
                begin_timestamp=begin_timestamp,
            )
        size = index_file_size(slots, items)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            # Sparse: the 420 MB default file costs disk only where items and slots are written.
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)  # the mapping keeps its own reference to the file
        _HEADER.pack_into(mm, 0, begin_timestamp, begin_timestamp, begin_phy_offset, begin_phy_offset, 0, 1)
        fsync_dir(path.parent)
        return cls(path, mm, slots, items)

    @classmethod
    def open(cls, path: Path, slots: int = DEFAULT_SLOTS, items: int = DEFAULT_ITEMS) -> IndexFile:
        """Map an existing file. The header does not record the geometry, so the caller passes the
        configured ``slots``/``items``; a size or header that does not fit them is a
        :class:`CorruptionError` naming the file (a truncated or torn file must never be read as
        if it were whole)."""
        _check_geometry(slots, items)
        expected = index_file_size(slots, items)
        fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if actual != expected:
                raise CorruptionError(
                    f"index file {path} is {actual} bytes, expected {expected} for slots={slots}, "
                    f"items={items}",
                    path=str(path),
                    size=actual,
                    expected=expected,
                )
            mm = mmap.mmap(fd, expected, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        f = cls(path, mm, slots, items)
        try:
            f._validate_header()
        except BaseException:
            f.close()
            raise
        f._flushed_count = f.item_count
        return f

    def _validate_header(self) -> None:
        begin_ts, end_ts, begin_phy, end_phy, used, count = _HEADER.unpack_from(self._open_mm(), 0)
        problem = None
        if not 1 <= count <= self.items:
            problem = f"item count {count} outside [1, {self.items}]"
        elif not 0 <= used <= min(self.slots, count - 1):
            problem = f"used slots {used} outside [0, {min(self.slots, count - 1)}]"
        elif begin_phy < 0 or end_phy < begin_phy:
            problem = f"physical offsets begin={begin_phy} end={end_phy} are not 0 <= begin <= end"
        elif begin_ts < 0 or end_ts < 0:
            problem = f"negative timestamps begin={begin_ts} end={end_ts}"
        if problem is not None:
            raise CorruptionError(f"index file {self.path}: bad header: {problem}", path=str(self.path))

    def _open_mm(self) -> mmap.mmap:
        mm = self._mm
        if mm is None:
            raise StoreClosedError(f"index file {self.path} is closed", path=str(self.path))
        return mm

    def flush(self) -> None:
        """msync the mapping (only dirty pages are written) if anything changed since last time."""
        mm = self._open_mm()
        count = self.item_count  # read first: everything up to it is in the mapping already
        if count != self._flushed_count:
            mm.flush()
            self._flushed_count = count

    @property
    def dirty(self) -> bool:
        """True when items (or the initial header) were written after the last :meth:`flush`."""
        return self.item_count != self._flushed_count

    def close(self) -> None:
        """Unmap. Idempotent; does not flush (the page cache keeps the data unless the OS dies)."""
        mm, self._mm = self._mm, None
        if mm is not None:
            mm.close()

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)

    @property
    def closed(self) -> bool:
        return self._mm is None

    # ------------------------------------------------------------------ header
    def _long(self, offset: int) -> int:
        return int(_INT64.unpack_from(self._open_mm(), offset)[0])

    def _int(self, offset: int) -> int:
        return int(_INT32.unpack_from(self._open_mm(), offset)[0])

    @property
    def begin_timestamp(self) -> int:
        return self._long(_OFF_BEGIN_TS)

    @property
    def end_timestamp(self) -> int:
        return self._long(_OFF_END_TS)

    @property
    def begin_phy_offset(self) -> int:
        return self._long(_OFF_BEGIN_PHY)

    @property
    def end_phy_offset(self) -> int:
        return self._long(_OFF_END_PHY)

    @property
    def used_slots(self) -> int:
        return self._int(_OFF_USED_SLOTS)

    @property
    def item_count(self) -> int:
        """Next item index to write (item 0 is never used, so an empty file says 1)."""
        return self._int(_OFF_COUNT)

    @property
    def is_full(self) -> bool:
        return self.item_count >= self.items

    # ------------------------------------------------------------------ write
    def put_batch(
        self, hashes: npt.ArrayLike, phy_offsets: npt.ArrayLike, timestamps_ms: npt.ArrayLike
    ) -> int:
        """Append items in the given (commitlog) order; return how many *leading entries were
        consumed* — inserted, or skipped as replays. The result is ``len(hashes)`` unless the file
        filled up; then entries from the returned position on belong in the next file.

        An entry whose offset is below the file's end offset (as it stands when the entry comes,
        i.e. the running maximum) is a replay of what recovery re-dispatched: it is skipped, like
        RocketMQ does. The file ends up byte-identical to inserting the entries one by one:

        * ``prev`` of an item = the previous item of the batch in the same slot, or the slot's
          current value for the first one; the newest item of each slot lands in the slot table;
        * ``used slots`` grows by the slots that were empty; ``end phy`` = the last inserted
          offset, ``end ts`` = the largest timestamp seen (a maximum rather than RocketMQ's "last"
          so that a clock step back cannot hide newer items from the time-range filter).

        Write order, for concurrent readers: items, then item count + used slots, then slot table,
        then end offset/timestamp. A reader that sees a slot value therefore sees the item behind
        it, and ignores items at or beyond the item count it reads.
        """
        mm = self._open_mm()
        h, phy, ts = _as_columns(hashes, phy_offsets, timestamps_ms)
        n = len(h)
        if n == 0:
            return 0
        begin_ts, end_ts, begin_phy, end_phy, used, count = _HEADER.unpack_from(mm, 0)

        # Replays: entry i is skipped if it is below the end offset as of entry i (end offset
        # only grows, and only by inserted entries, so it is the running maximum).
        end_before = np.empty(n, dtype=np.int64)
        end_before[0] = end_phy
        if n > 1:
            np.maximum(np.maximum.accumulate(phy[:-1]), end_phy, out=end_before[1:])
        kept = np.flatnonzero(phy >= end_before)
        free = self.items - count
        if len(kept) > free:
            consumed = int(kept[free])  # first entry that does not fit; skipped replays before it are done
            kept = kept[:free]
        else:
            consumed = n
        m = len(kept)
        if m == 0:
            return consumed
        # The usual batch has no replays and fits: skip the gather.
        h_k, phy_k, ts_k = (h, phy, ts) if m == n else (h[kept], phy[kept], ts[kept])

        if count == 1 and begin_ts <= 0:
            # Empty file without a known begin: the first item defines it (RocketMQ's first put).
            begin_ts, begin_phy = int(ts_k[0]), int(phy_k[0])
            _INT64.pack_into(mm, _OFF_BEGIN_TS, begin_ts)
            _INT64.pack_into(mm, _OFF_BEGIN_PHY, begin_phy)
        if begin_ts > 0:
            tdiff = np.clip((ts_k - begin_ts) // 1000, 0, _MAX_INT32)
        else:
            tdiff = np.zeros(m, dtype=np.int64)

        # Group the batch by slot, keeping batch order inside a slot: sorting slot*m + position
        # (all distinct) is one plain sort, no stable argsort or gather needed.
        slot = (h_k % np.uint32(self.slots)).astype(np.int64)
        order_key = np.sort(slot * m + np.arange(m, dtype=np.int64))
        s_sorted = order_key // m
        pos_sorted = order_key - s_sorted * m
        idx_sorted = pos_sorted + count  # item index of each sorted entry
        first = np.empty(m, dtype=bool)  # first (oldest) entry of its slot within the batch
        first[0] = True
        np.not_equal(s_sorted[1:], s_sorted[:-1], out=first[1:])
        last = np.empty(m, dtype=bool)  # last (newest) entry of its slot within the batch
        last[-1] = True
        last[:-1] = first[1:]

        slot_table = np.frombuffer(mm, dtype=_SLOT_DTYPE, count=self.slots, offset=HEADER_SIZE)
        first_slots = s_sorted[first]
        heads = slot_table[first_slots].astype(np.int64)
        # A head pointing at or past the item count is torn garbage from a crash: start a new chain.
        heads[(heads < 0) | (heads >= count)] = 0
        prev_sorted = np.empty(m, dtype=np.int64)
        prev_sorted[1:] = idx_sorted[:-1]
        prev_sorted[first] = heads
        prev = np.empty(m, dtype=np.int64)
        prev[pos_sorted] = prev_sorted

        item_view = np.frombuffer(mm, dtype=_ITEM_DTYPE, count=self.items, offset=self._item_base)
        out = item_view[count : count + m]
        out["hash"] = h_k
        out["phy"] = phy_k
        out["tdiff"] = tdiff
        out["prev"] = prev
        # Slots whose head was empty (or torn) become used; the clamp only matters for torn files.
        used = min(self.slots, used + int(np.count_nonzero(heads == 0)))
        _COUNTS.pack_into(mm, _OFF_USED_SLOTS, used, count + m)
        slot_table[s_sorted[last]] = idx_sorted[last]
        _INT64.pack_into(mm, _OFF_END_PHY, int(phy_k[-1]))
        _INT64.pack_into(mm, _OFF_END_TS, max(end_ts, int(ts_k.max())))
        # Drop the numpy views now: an exported buffer would make a later mmap.close() fail.
        del slot_table, item_view, out
        return consumed

    def truncate_to(self, phy_offset: int) -> None:
        """Forget every item pointing at ``phy_offset`` or beyond, as if never inserted.

        Recovery calls this after cutting a torn commitlog tail at ``phy_offset``: left alone,
        those items would make queries return offsets of records that no longer exist, and the
        end offset would make the replay rule skip the new records later written there. Items
        are in offset order, so the removed ones are a suffix; each slot touched by it gets back
        the link of its oldest removed item. The end timestamp becomes the newest remaining
        item's time at the file's one-second resolution (the exact value is not stored).
        Not for use while a writer appends. A file that *begins* at or beyond ``phy_offset`` has
        nothing left to keep and must be destroyed instead (:class:`InvalidArgumentError`).
        """
        mm = self._open_mm()
        begin_ts, end_ts, begin_phy, end_phy, used, count = _HEADER.unpack_from(mm, 0)
        if end_phy < phy_offset:
            return
        if begin_phy >= phy_offset:
            raise InvalidArgumentError(
                f"index file {self.path} begins at offset {begin_phy} >= {phy_offset}: destroy it instead",
                path=str(self.path),
            )
        item_view = np.frombuffer(mm, dtype=_ITEM_DTYPE, count=self.items, offset=self._item_base)
        beyond = np.flatnonzero(item_view["phy"][1:count] >= phy_offset)
        keep = int(beyond[0]) + 1 if len(beyond) else count  # first removed item index
        removed = item_view[keep:count]
        slots_hit, oldest = np.unique(removed["hash"] % np.uint32(self.slots), return_index=True)
        heads = removed["prev"][oldest].astype(np.int64)
        heads[(heads < 0) | (heads >= keep)] = 0
        slot_table = np.frombuffer(mm, dtype=_SLOT_DTYPE, count=self.slots, offset=HEADER_SIZE)
        # Reverse of put_batch's order: unlink from the slots first, then shrink the count.
        slot_table[slots_hit] = heads
        used = max(0, used - int(np.count_nonzero(heads == 0)))
        _COUNTS.pack_into(mm, _OFF_USED_SLOTS, used, keep)
        removed[:] = np.zeros(1, dtype=_ITEM_DTYPE)
        if keep > 1:
            end_phy = int(item_view["phy"][keep - 1])
            end_ts = begin_ts + int(item_view["tdiff"][1:keep].max()) * 1000 if begin_ts > 0 else begin_ts
        else:
            end_phy, end_ts = begin_phy, begin_ts
        _INT64.pack_into(mm, _OFF_END_PHY, end_phy)
        _INT64.pack_into(mm, _OFF_END_TS, end_ts)
        self._flushed_count = -1  # the count may be back at a flushed value, the bytes are not
        del item_view, removed, slot_table

    # ------------------------------------------------------------------ read
    def lookup(self, hash_: int, begin_ms: int, end_ms: int, max_count: int) -> list[int]:
        """Commitlog offsets of items with this hash and a time in ``[begin_ms, end_ms]``, newest
        first, at most ``max_count``.

        An item's time is ``begin_timestamp + seconds * 1000``: whole seconds after the file's
        begin, as RocketMQ stores it, so it can be up to 999 ms earlier than the store time.
        The walk stops at the first item older than ``begin_ms`` (chains run newest to oldest) and
        at any link that is not a strictly older, already published item, so a torn or concurrently
        growing chain can never loop or read past what was written.
        """
        if not 0 <= hash_ <= 0xFFFFFFFF:
            raise InvalidArgumentError(f"hash_ must be an unsigned 32-bit value, got {hash_}", hash_=hash_)
        mm = self._open_mm()
        found: list[int] = []
        if max_count <= 0 or begin_ms > end_ms:
            return found
        cur = int(_INT32.unpack_from(mm, HEADER_SIZE + (hash_ % self.slots) * SLOT_SIZE)[0])
        # Count after slot: the writer publishes the count before the slot that points at it.
        count = self.item_count
        begin_ts = self.begin_timestamp
        base = self._item_base
        while 0 < cur < count:
            item_hash, phy, tdiff, prev = _ITEM.unpack_from(mm, base + cur * ITEM_SIZE)
            t = begin_ts + tdiff * 1000
            if item_hash == hash_ and begin_ms <= t <= end_ms:
                found.append(phy)
                if len(found) >= max_count:
                    break
            if t < begin_ms or prev >= cur:
                break
            cur = prev
        return found


def _as_columns(
    hashes: npt.ArrayLike, phy_offsets: npt.ArrayLike, timestamps_ms: npt.ArrayLike
) -> tuple[U32Array, I64Array, I64Array]:
    """Validate and convert the three parallel columns of a batch."""
    phy = np.asarray(phy_offsets, dtype=np.int64)
    ts = np.asarray(timestamps_ms, dtype=np.int64)
    raw = np.asarray(hashes)
    if raw.dtype != np.uint32:
        if raw.size and (raw.dtype.kind not in "iu" or raw.min() < 0 or raw.max() > 0xFFFFFFFF):
            raise InvalidArgumentError("hashes must be unsigned 32-bit integers", dtype=str(raw.dtype))
        raw = raw.astype(np.uint32)
    if not (raw.ndim == phy.ndim == ts.ndim == 1 and len(raw) == len(phy) == len(ts)):
        raise InvalidArgumentError(
            f"hashes, phy_offsets and timestamps_ms must be 1-D of equal length, got shapes "
            f"{raw.shape}, {phy.shape}, {ts.shape}"
        )
    if phy.size and phy.min() < 0:
        raise InvalidArgumentError(f"phy_offsets must be >= 0, got {int(phy.min())}")
    return raw, phy, ts


def _name_to_ms(name: str) -> int | None:
    """Parse ``yyyyMMddHHmmssSSS`` (as UTC) back to epoch ms, None if ``name`` is not one; the
    value only serves to keep new names after existing ones."""
    if not _NAME_RE.fullmatch(name):
        return None
    try:
        return calendar.timegm(time.strptime(name[:14], "%Y%m%d%H%M%S")) * 1000 + int(name[14:])
    except ValueError:
        return None


def _ms_to_name(ms: int) -> str:
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(ms // 1000)) + f"{ms % 1000:03d}"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _SharedExclusiveLock:
    """Readers-writer lock: many shared holders or one exclusive holder. A waiting exclusive
    holder blocks new shared holders, so a steady stream of queries cannot starve a roll."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class IndexService:
    """The ordered list of index files in ``directory``: writes go to the newest, rolling to a new
    file when it is full; queries scan files newest to oldest.

    Call :meth:`load` before anything else (it also creates the directory). File names are the
    creation time ``yyyyMMddHHmmssSSS`` in UTC, bumped by 1 ms when needed so that names stay
    unique and sorted even if files are created within one millisecond or the clock steps back.
    ``clock`` (epoch ms) exists for tests.
    """

    def __init__(
        self,
        directory: Path,
        slots: int,
        items: int,
        *,
        clock: Callable[[], int] = _now_ms,
        read_only: bool = False,
    ) -> None:
        _check_geometry(slots, items)
        self.directory = Path(directory)
        #: Opened for ``tierd verify``: :meth:`load` deletes no file it would drop (it only
        #: leaves it out and says so in :attr:`damaged`), and nothing is written.
        self.read_only = read_only
        self.slots = slots
        self.items = items
        self._clock = clock
        self._files: list[IndexFile] = []
        self._last_name_ms = -1
        self._loaded = False
        self._closed = False
        #: Set by :meth:`load` after an abnormal exit: the lowest commitlog offset an index file
        #: it destroyed held entries from — recovery must re-dispatch from there (None: none).
        self.rebuild_from: int | None = None
        #: Index files :meth:`load` found damaged (bad header) and dropped to be rebuilt, with
        #: why — ``tierd verify`` reports them.
        self.damaged: list[tuple[Path, str]] = []
        self._files_lock = _SharedExclusiveLock()
        #: Serialises writers with each other and with close(); queries never take it.
        self._write_lock = threading.Lock()

    # ------------------------------------------------------------------ life cycle
    def load(self, last_exit_ok: bool, checkpoint_index_timestamp: int) -> None:
        """Open the existing files, oldest first.

        After an abnormal exit, files whose end timestamp is beyond the checkpoint's index
        timestamp may hold torn items: they are destroyed and the reput thread rebuilds them from
        the commitlog (RocketMQ's rule). A file that does not open (bad size or header) is
        dropped with a warning if it is the newest and looks like a crash while creating it
        (empty, or full size with a never-written header and no slot set). A file of the right
        size with a bad header is *damage*: it and every later file are dropped and rebuilt from
        the commitlog (from where the file before it ends; see :attr:`rebuild_from`), with an
        ERROR line and an entry in :attr:`damaged` — a key query never silently misses a
        message. A file of another size is a :class:`CorruptionError` (e.g. another
        slots/items geometry after a config change: rebuilding would not fit it).
        """
        with self._write_lock, self._files_lock.exclusive():
            self._check_open()
            for f in self._files:
                f.close()
            self._files = []
            if not self.read_only:
                self.directory.mkdir(parents=True, exist_ok=True)
            named = sorted(
                (p.name, ms)
                for p in (self.directory.iterdir() if self.directory.is_dir() else ())
                if (ms := _name_to_ms(p.name)) is not None and p.is_file()
            )
            paths = [self.directory / name for name, _ in named]
            if named:
                self._last_name_ms = max(self._last_name_ms, named[-1][1])
            files: list[IndexFile] = []
            try:
                for i, path in enumerate(paths):
                    try:
                        f = IndexFile.open(path, self.slots, self.items)
                    except CorruptionError as e:
                        size = index_file_size(self.slots, self.items)
                        torn = i == len(paths) - 1 and torn_at_creation(path, size, HEADER_SIZE)
                        if torn and _has_slots(path, self.slots):
                            torn = False  # items were written: a zeroed header, not a new file
                        if not torn and path.stat().st_size == size:
                            self._drop_damaged(paths[i:], files[-1].end_phy_offset if files else 0, str(e))
                            break
                        log.warning(
                            "index file %s does not open (%s); %s",
                            path,
                            e,
                            "removing it (torn creation)" if torn else "refusing to start",
                        )
                        if not torn:
                            raise
                        if not self.read_only:
                            path.unlink()
                        continue
                    if not last_exit_ok and f.end_timestamp > checkpoint_index_timestamp:
                        if f.item_count > 1:  # its entries must be rebuilt, from its first one
                            first = f.begin_phy_offset
                            self.rebuild_from = (
                                first if self.rebuild_from is None else min(self.rebuild_from, first)
                            )
                        log.info(
                            "abnormal exit: %s index file %s (end timestamp %d > checkpoint %d)",
                            "leaving out (read-only)" if self.read_only else "destroying",
                            path,
                            f.end_timestamp,
                            checkpoint_index_timestamp,
                        )
                        if self.read_only:
                            f.close()
                        else:
                            f.destroy()
                        continue
                    files.append(f)
            except BaseException:
                for f in files:
                    f.close()
                raise
            self._files = files
            self._loaded = True

    def _drop_damaged(self, paths: list[Path], start: int, problem: str) -> None:
        """Delete a damaged file and every later one; their entries are rebuilt from commitlog
        offset ``start`` (where the last sound file ends)."""
        self.rebuild_from = start if self.rebuild_from is None else min(self.rebuild_from, start)
        self.damaged.append((paths[0], problem))
        log.error(
            "%s; %s it and %d later index file(s), rebuilding their keys from commitlog offset %d",
            problem,
            "left as it is (read-only): the next open deletes" if self.read_only else "deleting",
            len(paths) - 1,
            start,
        )
        if self.read_only:
            return
        for p in paths:
            p.unlink()
        fsync_dir(self.directory)

    def close(self) -> None:
        """Flush what is dirty and unmap every file. Idempotent."""
        with self._write_lock, self._files_lock.exclusive():
            if self._closed:
                return
            self._closed = True
            try:
                for f in self._files:
                    if f.dirty:
                        f.flush()
            finally:
                for f in self._files:
                    f.close()
                self._files = []

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"index service for {self.directory} is closed")

    def _check_ready(self) -> None:
        self._check_open()
        if not self._loaded:
            raise StoreClosedError(f"index service for {self.directory} is not loaded: call load() first")

    @property
    def files(self) -> tuple[IndexFile, ...]:
        """Snapshot of the open files, oldest first (diagnostics and tests; retention may close
        a file of the snapshot at any time)."""
        with self._files_lock.shared():
            return tuple(self._files)

    # ------------------------------------------------------------------ write
    def put_batch(
        self,
        keys: Sequence[str],
        phy_offsets: Sequence[int] | npt.NDArray[np.int64],
        timestamps_ms: Sequence[int] | npt.NDArray[np.int64],
    ) -> None:
        """Index ``keys`` (already ``topic#key``; one entry per key, so a message with three keys
        contributes three entries with the same offset) in commitlog order. Entries below the
        newest file's end offset are replays and skipped; a batch may fill one file and continue
        in the next."""
        if len(keys):
            self.put_hashes(key_hashes(keys), phy_offsets, timestamps_ms)

    def put_hashes(
        self,
        hashes: npt.NDArray[np.uint32],
        phy_offsets: Sequence[int] | npt.NDArray[np.int64],
        timestamps_ms: Sequence[int] | npt.NDArray[np.int64],
    ) -> None:
        """:meth:`put_batch` for entries whose :func:`~tierd.format.key_hash.key_hash` the caller
        computed (the C batch encoder hashes ``topic#key`` while it encodes the records)."""
        h, phy, ts = _as_columns(hashes, phy_offsets, timestamps_ms)
        n = len(h)
        if n == 0:
            return
        with self._write_lock:
            self._check_ready()
            start = 0
            current = self._files[-1] if self._files else None
            while start < n:
                if current is None:
                    current = self._add_file(int(phy[start]), int(ts[start]))
                done = current.put_batch(h[start:], phy[start:], ts[start:])
                start += done
                if start < n:
                    if not current.is_full:  # put_batch stops early only on a full file
                        raise AssertionError(f"index file {current.path} stopped at {done} while not full")
                    log.debug("index file %s is full; rolling", current.path)
                    current = self._add_file(current.end_phy_offset, current.end_timestamp)

    def _add_file(self, begin_phy_offset: int, begin_timestamp: int) -> IndexFile:
        name_ms = max(self._clock(), self._last_name_ms + 1)
        f = IndexFile.create(
            self.directory / _ms_to_name(name_ms), self.slots, self.items, begin_phy_offset, begin_timestamp
        )
        self._last_name_ms = name_ms
        with self._files_lock.exclusive():
            self._files.append(f)
        return f

    # ------------------------------------------------------------------ read
    def query(self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commitlog offsets of messages indexed under ``topic#key`` with an index time in
        ``[begin_ms, end_ms]``, newest first, without duplicates, at most ``max_count``.

        Hashes only are compared, so an offset may belong to another key: the caller checks.
        Every file whose time range overlaps the window is scanned — including one that began
        before ``begin_ms`` (RocketMQ's query could skip it, apache/rocketmq #9233 / #10268)."""
        if max_count <= 0 or begin_ms > end_ms:
            return []
        hash_ = key_hash(index_key(topic, key))
        found: dict[int, None] = {}  # insertion-ordered set
        with self._files_lock.shared():
            self._check_ready()
            for f in reversed(self._files):
                if f.item_count <= 1 or f.begin_timestamp > end_ms or f.end_timestamp < begin_ms:
                    continue
                # Ask for max_count each time: offsets already found may come back (a message's
                # keys can span two files) and must not use up the budget.
                for off in f.lookup(hash_, begin_ms, end_ms, max_count):
                    found[off] = None
                if len(found) >= max_count:
                    break
        return list(found)[:max_count]

    def max_phy_offset(self) -> int:
        """End offset of the newest file (0 if there is none): recovery re-dispatches from here."""
        with self._files_lock.shared():
            self._check_ready()
            return self._files[-1].end_phy_offset if self._files else 0

    def flush(self) -> int:
        """msync every dirty file; return the newest file's end timestamp as read *before* the
        msync — everything indexed up to it is now durable, so it is safe for the checkpoint's
        index timestamp. 0 when there are no files."""
        with self._files_lock.shared():
            self._check_ready()
            if not self._files:
                return 0
            durable = self._files[-1].end_timestamp
            for f in self._files:
                if f.dirty:
                    f.flush()
            return durable

    def delete_files_before(self, phy_offset: int) -> int:
        """Retention: destroy the oldest files whose every item points below ``phy_offset`` (the
        commitlog's new minimum), i.e. ``end_phy_offset < phy_offset``; never the newest file.
        Returns how many were destroyed."""
        with self._files_lock.exclusive():
            self._check_ready()
            n = 0
            while n < len(self._files) - 1 and self._files[n].end_phy_offset < phy_offset:
                n += 1
            doomed, self._files = self._files[:n], self._files[n:]
        for f in doomed:
            # Safe outside the lock: no query can reach these files any more.
            log.info(
                "retention: destroying index file %s (end offset %d < %d)",
                f.path,
                f.end_phy_offset,
                phy_offset,
            )
            f.destroy()
        return len(doomed)

    def truncate_to(self, phy_offset: int) -> None:
        """Recovery: drop every index entry pointing at ``phy_offset`` (the commitlog's valid end)
        or beyond — whole files whose begin offset is there or beyond, the tail of the others —
        so that records re-appended at those offsets are indexed instead of skipped as replays.
        Call before the reput thread starts."""
        with self._write_lock, self._files_lock.exclusive():
            self._check_ready()
            while self._files and self._files[-1].begin_phy_offset >= phy_offset:
                f = self._files.pop()
                log.info(
                    "recovery: destroying index file %s (begins at offset %d >= %d)",
                    f.path,
                    f.begin_phy_offset,
                    phy_offset,
                )
                f.destroy()
            for f in self._files:
                f.truncate_to(phy_offset)
