"""The consume-queue unit (FORMATS §1.2): 20 bytes per message — commitlog offset (8), record
size (4), tags code (8) — and the tags code itself. The hot store's consume queues, the cold
tier's flat consume queues and Spark's unit scans all read and write this one layout.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Final

import numpy as np
import numpy.typing as npt

UNIT_SIZE: Final = 20
UNIT_DTYPE: Final = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert UNIT_DTYPE.itemsize == UNIT_SIZE


def encode_units(
    offsets: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64], tags_codes: npt.NDArray[np.int64]
) -> bytes:
    units = np.empty(len(offsets), UNIT_DTYPE)
    units["offset"] = offsets
    units["size"] = sizes
    units["tags_code"] = tags_codes
    return units.tobytes()


def decode_units(raw: bytes | memoryview) -> npt.NDArray[np.void]:
    return np.frombuffer(raw, UNIT_DTYPE, count=len(raw) // UNIT_SIZE)


def unit_location(raw: bytes) -> tuple[int, int]:
    """(commitlog offset, record size) of one unit: where its record is. (The size is read
    unsigned: a corrupt negative size shows as one too large for any segment.)"""
    return int.from_bytes(raw[:8], "big", signed=True), int.from_bytes(raw[8:12], "big")


@lru_cache(maxsize=4096)
def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, signed 32-bit wrap-around)."""
    h = 0
    data = s.encode("utf-16-be")
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """Consume-queue tags code: Java hash of the TAGS value, 0 without tags."""
    return java_string_hash(tags) if tags else 0
