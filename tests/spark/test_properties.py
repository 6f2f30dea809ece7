"""The properties column: a fast split for uniform batches must equal the general split.

``decode._uniform_pairs`` splits a batch by separator positions when every row holds the same
number of whole ``name 0x01 value 0x02`` items; ``decode._split_pairs`` handles anything. Random
batches — uniform ones, and ones broken in every way the format allows (empty names or values,
a missing separator, 0x01 inside a value, empty rows, trailing pieces) — must split the same.
Batches whose rows name their items in one order (as one producer writes them) take
``decode._same_names``'s columns and ``decode._single_keys``; they must give the codec's values
too, also when one row breaks the order or holds several keys.
"""

from __future__ import annotations

import random

import pyarrow as pa

from tierd.format.properties import decode_properties
from tierd.spark.decode import _properties, _single_keys, _split_keys, _split_pairs, _uniform_pairs

NAMES = ["a", "KEYS", "TAGS", "UNIQ_KEY", "é"]
VALUES = ["1", "k1 k2", "  x  y ", "é", " "]
PIECES = ["a", "KEYS", "TAGS", "UNIQ_KEY", "k1 k2", "  x  y ", "", "\x01", "é", "\x02"]


def _batches(seed: int) -> list[pa.Array]:
    rnd = random.Random(seed)
    out = []
    for _ in range(400):
        k, rows = rnd.randint(1, 3), rnd.randint(1, 6)

        def part(good: list[str]) -> str:  # now and then empty, or holding a separator
            return rnd.choice(good) if rnd.random() > 0.03 else rnd.choice(["", "\x01", "a\x01b"])

        uniform = ["".join(f"{part(NAMES)}\x01{part(VALUES)}\x02" for _ in range(k)) for _ in range(rows)]
        free = ["".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 7))) for _ in range(rows)]
        for texts in (uniform, free):
            arr = pa.array(["pad", *texts], pa.string())
            out.append(arr.slice(1))  # a sliced array: offsets that do not start at 0
    return out


def _ordered_batches(seed: int) -> list[pa.Array]:
    """Rows naming their items in one order (names may repeat); values random, now and then one
    row with its names in another order, or a KEYS value holding several keys or a long one."""
    rnd = random.Random(seed)
    out = []
    for _ in range(300):
        names = [rnd.choice(NAMES) for _ in range(rnd.randint(1, 4))]
        rows = []
        for _ in range(rnd.randint(1, 8)):
            order = names if rnd.random() > 0.1 else rnd.sample(names, len(names))
            values = [rnd.choice(["k1", "k22", "é", "x", "k1 k2", "  x  y "]) for _ in order]
            rows.append("".join(f"{k}\x01{v}\x02" for k, v in zip(order, values, strict=True)))
        arr = pa.array(["pad", *rows], pa.string())
        out.append(arr.slice(1))
    return out


def _check_against_codec(arr: pa.Array) -> None:
    props, tags, keys, uniq = _properties(arr, len(arr))
    for text, got, tag, key, u in zip(
        arr.to_pylist(), props.to_pylist(), tags.to_pylist(), keys.to_pylist(), uniq.to_pylist(), strict=True
    ):
        want = decode_properties(text)
        assert dict(got) == want, text  # the map may repeat a name; the codec keeps the last one
        assert tag == want.get("TAGS"), text
        assert key == [t for t in want.get("KEYS", "").split(" ") if t], text
        assert u == want.get("UNIQ_KEY"), text


def test_rows_naming_items_in_one_order_give_the_codecs_columns() -> None:
    columnar = 0
    for arr in _ordered_batches(seed=3):
        pairs = _uniform_pairs(arr, len(arr))
        columnar += pairs is not None and pairs[4] is not None
        _check_against_codec(arr)
    assert columnar > 150  # the column cut is exercised, not bypassed


def test_rows_naming_items_in_different_orders_are_not_cut_as_columns() -> None:
    arr = pa.array(["TAGS\x01a\x02KEYS\x01k\x02", "KEYS\x01j\x02TAGS\x01b\x02"], pa.string())
    pairs = _uniform_pairs(arr, 2)
    assert pairs is not None
    assert pairs[4] is None
    assert _properties(arr, 2)[1].to_pylist() == ["a", "b"]
    arr = pa.array(["TAGS\x01a\x02", "TAGX\x01b\x02"], pa.string())  # same length, other name
    pairs = _uniform_pairs(arr, 2)
    assert pairs is not None
    assert pairs[4] is None
    assert _properties(arr, 2)[1].to_pylist() == ["a", None]


def test_single_keys_equal_the_split_wherever_they_apply() -> None:
    rnd = random.Random(4)
    taken = 0
    for _ in range(400):
        values = [rnd.choice(["k1", "é", "k1 k2", " ", "", None]) for _ in range(rnd.randint(0, 6))]
        if rnd.random() < 0.5:  # mostly single keys, so the shortcut applies often
            values = [rnd.choice(["k1", "é", "key"]) for _ in values]
        if rnd.random() < 0.1:
            values = [None] * len(values)
        arr = pa.array(["pad", *values], pa.string()).slice(1)
        single = _single_keys(arr, len(arr))
        if single is None:
            continue
        taken += 1
        assert single.to_pylist() == _split_keys(arr, len(arr)).to_pylist(), values
    assert taken > 150


def test_the_uniform_split_equals_the_general_one_wherever_it_applies() -> None:
    taken = 0
    for arr in _batches(seed=1):
        fast = _uniform_pairs(arr, len(arr))
        if fast is None:
            continue
        taken += 1
        slow = _split_pairs(arr, len(arr))
        assert fast[0].equals(slow[0]), arr
        assert fast[1].equals(slow[1]), arr
        assert fast[2].tolist() == slow[2].tolist(), arr
        assert fast[3].tolist() == slow[3].tolist(), arr
    assert taken > 100  # the fast split is exercised, not bypassed


def test_properties_columns_match_the_codec() -> None:
    for arr in _batches(seed=2):
        _check_against_codec(arr)


def test_a_batch_with_an_empty_row_takes_the_general_split() -> None:
    arr = pa.array(["a\x01b\x02", "", "c\x01d\x02"], pa.string())
    assert _uniform_pairs(arr, 3) is None
    assert _properties(arr, 3)[0].to_pylist() == [[("a", "b")], [], [("c", "d")]]
