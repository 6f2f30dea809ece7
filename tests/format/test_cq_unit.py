"""The consume-queue unit: 20 bytes, written and read by one layout."""

from __future__ import annotations

import numpy as np

from tierd.format.cq_unit import UNIT_SIZE, decode_units, encode_units, tags_code, unit_location


def test_units_round_trip_and_locate_their_records() -> None:
    offsets = np.array([0, 4096, 2**40], np.int64)
    sizes = np.array([91, 1200, 65536], np.int64)
    codes = np.array([0, tags_code("paid"), -1], np.int64)
    raw = encode_units(offsets, sizes, codes)
    assert len(raw) == 3 * UNIT_SIZE
    paid = tags_code("paid").to_bytes(8, "big", signed=True)
    assert raw[UNIT_SIZE : 2 * UNIT_SIZE] == (4096).to_bytes(8, "big") + (1200).to_bytes(4, "big") + paid
    units = decode_units(raw)
    assert units["offset"].tolist() == offsets.tolist()
    assert units["size"].tolist() == sizes.tolist()
    assert units["tags_code"].tolist() == codes.tolist()
    assert [unit_location(raw[i : i + UNIT_SIZE]) for i in range(0, len(raw), UNIT_SIZE)] == list(
        zip(offsets.tolist(), sizes.tolist(), strict=True)
    )
