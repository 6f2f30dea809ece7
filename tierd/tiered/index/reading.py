"""The steps of one lookup in a compacted INDEX segment, without I/O: shared by the service and
by readers of the bucket alone (Spark), which batch the reads of many files themselves."""

from __future__ import annotations

from typing import Final

import numpy as np

from tierd.errors import CorruptionError
from tierd.tiered.index.format import (
    COMPACTED_ITEM_DTYPE,
    COMPACTED_ITEM_SIZE,
    HEADER_SIZE,
    SLOT_SIZE,
    SLOT_STRUCT,
)
from tierd.tiered.index.results import IndexHit

__all__ = ["MAX_SLOT_READ", "segment_slots", "slot_extent", "slot_hits", "slot_position"]

#: Largest slot run read in one request; longer runs (a very hot key) are read in pieces of this
#: size until ``max_count`` hits are found.
MAX_SLOT_READ: Final = 37_449 * COMPACTED_ITEM_SIZE  # just under 1 MiB


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
    pos, length = SLOT_STRUCT.unpack(raw)
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
