"""Compaction: a sealed writable index file into the bytes of its INDEX segment (see
:func:`compact`); numpy over whole columns, no per-item Python, and no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tierd.tiered.index.format import (
    COMPACTED_ITEM_SIZE,
    HEADER_SIZE,
    HEADER_STRUCT,
    ITEM_SIZE,
    MAGIC_COMPACTED,
    SLOT_SIZE,
    I64Array,
    RankArray,
    U8Array,
    U32Array,
    compacted_size,
    compacted_slots,
    item_column,
    read_writable_header,
)

__all__ = ["CompactedIndex", "compact"]

#: Rows moved per step by :func:`compact` (bounds its temporaries to ~28 MiB).
_MOVE_PIECE: Final = 1 << 20


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

    * **ranks** (a full file written by this process: ``ranks`` = :attr:`LocalFile.ranks`,
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
    begin, end, _, count = read_writable_header(buf, slots, items, name)
    cslots = compacted_slots(count, slots, items)
    size = compacted_size(cslots, count)
    item_base = HEADER_SIZE + cslots * SLOT_SIZE
    if count == 0:
        out = np.zeros(size, dtype=np.uint8)
        HEADER_STRUCT.pack_into(out.data, 0, MAGIC_COMPACTED, begin, end, 0, 0)
        return CompactedIndex(out, begin, end, 0, cslots, 0, None)
    min_tdiff = int(item_column(buf, "tdiff", slots, count).min())
    per_slot = None
    if ranks is not None and cslots == slots and len(ranks) > count:
        per_slot = _counts_by_ranks(buf, slots, count, ranks)
    slot: U32Array | None = None
    if per_slot is None:  # no usable rank column: count the slots from the hashes
        ranks = None
        slot = item_column(buf, "hash", slots, count).astype(np.uint32)
        slot %= np.uint32(cslots)
        per_slot = np.bincount(slot, minlength=cslots)
    first_row = np.cumsum(per_slot) - per_slot  # output row of each slot's newest item

    out = np.empty(size, dtype=np.uint8)  # every byte is written below
    used = int(np.count_nonzero(per_slot))
    HEADER_STRUCT.pack_into(out.data, 0, MAGIC_COMPACTED, begin, end, used, count)
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
        hashes = item_column(buf, "hash", slots, count)
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
    prev = item_column(buf, "prev", slots, count).astype(np.int32)
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
