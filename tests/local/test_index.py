"""The hot store's key index (tierd/local/index.py) against FORMATS.md §1.3.

Expected bytes are built here with ``struct`` and a deliberately naive one-item-at-a-time
reference writer, never with the code under test, so the vectorised writer is checked against
an independent reading of the format.
"""

from __future__ import annotations

import itertools
import logging
import struct
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import mmh3
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierd import BlockingMessageStore, Message
from tierd.errors import CorruptionError, InvalidArgumentError, StoreClosedError
from tierd.format.key_hash import index_key, key_hash
from tierd.format.record import parse_record_view
from tierd.local.dispatch import DispatchBatch
from tierd.local.index import IndexFile, IndexService

if TYPE_CHECKING:
    from collections.abc import Callable

HEADER = struct.Struct(">qqqqii")
ITEM = struct.Struct(">Iqii")
SLOT = struct.Struct(">i")
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z in ms
CLOCK_MS = T0  # a frozen clock: every file is "created" in the same millisecond


def frozen_clock() -> int:
    return CLOCK_MS


def file_size(slots: int, items: int) -> int:
    return 40 + slots * 4 + items * 20


# --------------------------------------------------------------------------- reference writer
def empty_file(slots: int, items: int, begin_phy: int, begin_ts: int) -> bytearray:
    buf = bytearray(file_size(slots, items))
    HEADER.pack_into(buf, 0, begin_ts, begin_ts, begin_phy, begin_phy, 0, 1)
    return buf


def ref_put(buf: bytearray, slots: int, items: int, entries: list[tuple[int, int, int]]) -> int:
    """Insert (hash, phy, ts) entries one at a time, as RocketMQ's IndexFile.putKey would (with the
    tierd rules: unsigned hash, end ts = max). Returns how many leading entries were consumed."""
    begin_ts, end_ts, begin_phy, end_phy, used, count = HEADER.unpack_from(buf, 0)
    consumed = len(entries)
    for i, (h, phy, ts) in enumerate(entries):
        if phy < end_phy:
            continue  # replay
        if count >= items:
            consumed = i
            break
        if count == 1 and begin_ts <= 0:
            begin_ts, begin_phy = ts, phy
        tdiff = 0 if begin_ts <= 0 else min(max((ts - begin_ts) // 1000, 0), 2**31 - 1)
        slot_pos = 40 + (h % slots) * 4
        (head,) = SLOT.unpack_from(buf, slot_pos)
        if head <= 0 or head >= count:
            head = 0
            used += 1
        ITEM.pack_into(buf, 40 + slots * 4 + count * 20, h, phy, tdiff, head)
        SLOT.pack_into(buf, slot_pos, count)
        count += 1
        end_phy = phy
        end_ts = max(end_ts, ts)
    HEADER.pack_into(buf, 0, begin_ts, end_ts, begin_phy, end_phy, used, count)
    return consumed


def put(f: IndexFile, entries: list[tuple[int, int, int]]) -> int:
    hashes = np.array([e[0] for e in entries], dtype=np.uint32)
    phys = np.array([e[1] for e in entries], dtype=np.int64)
    tss = np.array([e[2] for e in entries], dtype=np.int64)
    return f.put_batch(hashes, phys, tss)


def make_service(directory: Path, slots: int = 8, items: int = 5) -> IndexService:
    svc = IndexService(directory, slots, items, clock=frozen_clock)
    svc.load(True, 0)
    return svc


# --------------------------------------------------------------------------- hashing
def test_key_hash_is_unsigned_mmh3_of_topic_hash_key() -> None:
    assert index_key("TopicA", "order-1") == "TopicA#order-1"
    # Published MurmurHash3_x86_32 vectors (seed 0).
    assert key_hash("hello") == 0x248BFA47
    assert key_hash("The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    # A key whose hash has the top bit set must come back unsigned (stored as 32 bits as is).
    key = next(k for k in (f"T#{i}" for i in range(100)) if mmh3.hash(k) < 0)
    assert key_hash(key) == mmh3.hash(key) + 2**32
    assert key_hash("T#héllo") == mmh3.hash("T#héllo".encode(), signed=False)


# --------------------------------------------------------------------------- golden bytes
def golden_three_items() -> bytes:
    """slots=4, items=5, begin phy 100, begin ts T0; hashes 0xFFFFFFFD and 5 collide in slot 1."""
    buf = bytearray(file_size(4, 5))
    HEADER.pack_into(buf, 0, T0, T0 + 3_999, 100, 400, 2, 4)
    for slot, value in enumerate([0, 2, 3, 0]):
        SLOT.pack_into(buf, 40 + slot * 4, value)
    base = 40 + 4 * 4
    ITEM.pack_into(buf, base + 1 * 20, 0xFFFFFFFD, 100, 0, 0)  # slot 1, chain end
    ITEM.pack_into(buf, base + 2 * 20, 5, 250, 2, 1)  # slot 1, previous = item 1
    ITEM.pack_into(buf, base + 3 * 20, 6, 400, 3, 0)  # slot 2
    return bytes(buf)


GOLDEN_ENTRIES = [(0xFFFFFFFD, 100, T0 + 500), (5, 250, T0 + 2_100), (6, 400, T0 + 3_999)]


def test_new_file_header_golden(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 4, 5, 100, T0)
    expected = bytearray(file_size(4, 5))
    expected[:40] = struct.pack(">qqqqii", T0, T0, 100, 100, 0, 1)
    assert (tmp_path / "idx").read_bytes() == bytes(expected)
    assert (f.item_count, f.used_slots, f.is_full) == (1, 0, False)
    f.close()


@pytest.mark.parametrize("split", [3, 1, 2])
def test_put_batch_golden_bytes_with_collision_chain(tmp_path: Path, split: int) -> None:
    f = IndexFile.create(tmp_path / "idx", 4, 5, 100, T0)
    assert put(f, GOLDEN_ENTRIES[:split]) == split
    assert put(f, GOLDEN_ENTRIES[split:]) == 3 - split
    f.flush()
    assert (tmp_path / "idx").read_bytes() == golden_three_items()
    f.close()


def test_open_reads_golden_file(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    path.write_bytes(golden_three_items())
    f = IndexFile.open(path, slots=4, items=5)
    assert (f.begin_timestamp, f.end_timestamp) == (T0, T0 + 3_999)
    assert (f.begin_phy_offset, f.end_phy_offset) == (100, 400)
    assert (f.used_slots, f.item_count, f.is_full) == (2, 4, False)
    everything = (0, 2**62)
    assert f.lookup(5, *everything, 10) == [250]
    assert f.lookup(0xFFFFFFFD, *everything, 10) == [100]
    assert f.lookup(6, *everything, 10) == [400]
    assert f.lookup(9, *everything, 10) == []  # same slot as 5, different hash
    assert f.lookup(7, *everything, 10) == []  # empty slot
    assert not f.dirty
    f.close()
    with pytest.raises(StoreClosedError):
        f.lookup(5, *everything, 10)


# --------------------------------------------------------------------------- vectorised == reference
entry_lists = st.lists(
    st.tuples(
        st.one_of(st.sampled_from([0, 1, 7, 8, 0xFFFFFFFF, 0x80000000]), st.integers(0, 2**32 - 1)),
        st.integers(-3, 6),  # phy step; negative steps produce replays
        st.integers(-5_000, 20_000),  # ms relative to T0 (also before the begin timestamp)
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    slots=st.integers(1, 8),
    items=st.integers(2, 40),
    begin_phy=st.integers(0, 5),
    begin_ts=st.sampled_from([0, T0]),
    batches=st.lists(entry_lists, min_size=1, max_size=4),
)
def test_put_batch_equals_one_by_one_reference(
    slots: int, items: int, begin_phy: int, begin_ts: int, batches: list[list[tuple[int, int, int]]]
) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "idx"
        f = IndexFile.create(path, slots, items, begin_phy, begin_ts)
        ref = empty_file(slots, items, begin_phy, begin_ts)
        phy = begin_phy
        for batch in batches:
            entries = []
            for h, step, dt in batch:
                phy = max(0, phy + step)
                entries.append((h, phy, T0 + dt))
            assert put(f, entries) == ref_put(ref, slots, items, entries)
            assert path.read_bytes() == bytes(ref)
        f.close()


def test_large_batch_equals_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(12345)
    n, slots, items = 20_000, 97, 15_000
    hashes = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    hashes[::3] = hashes[0]  # a long chain of identical hashes
    phys = np.cumsum(rng.integers(-2, 200, n)).clip(0)
    tss = T0 + np.cumsum(rng.integers(0, 50, n))
    entries = list(zip(hashes.tolist(), phys.tolist(), tss.tolist(), strict=True))
    f = IndexFile.create(tmp_path / "idx", slots, items, 0, T0)
    ref = empty_file(slots, items, 0, T0)
    done = f.put_batch(hashes[:7_000], phys[:7_000], tss[:7_000])
    assert done == ref_put(ref, slots, items, entries[:7_000])
    assert f.put_batch(hashes[done:], phys[done:], tss[done:]) == ref_put(ref, slots, items, entries[done:])
    assert f.is_full
    assert (tmp_path / "idx").read_bytes() == bytes(ref)
    f.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    entries=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 3_000)), min_size=1, max_size=40),
    window=st.tuples(st.integers(-1_000, 60_000), st.integers(0, 60_000)),
    max_count=st.integers(1, 50),
)
def test_lookup_equals_brute_force(
    entries: list[tuple[int, int]], window: tuple[int, int], max_count: int
) -> None:
    """With non-decreasing timestamps, a chain walk finds exactly the matching items."""
    begin, end = T0 + window[0], T0 + window[0] + window[1]
    rows, ts = [], T0
    for i, (h, dt) in enumerate(entries):
        ts += dt
        rows.append((h, i * 10, ts))
    with tempfile.TemporaryDirectory() as d:
        f = IndexFile.create(Path(d) / "idx", 4, 64, 0, T0)
        put(f, rows)
        for h in range(12):
            expected = [
                phy
                for hh, phy, t in reversed(rows)
                if hh == h and begin <= T0 + (t - T0) // 1000 * 1000 <= end
            ]
            assert f.lookup(h, begin, end, max_count) == expected[:max_count]
        f.close()


# --------------------------------------------------------------------------- IndexFile behaviour
def test_put_batch_skips_replays_within_and_across_batches(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 4, 20, 10, T0)
    assert put(f, [(1, 5, T0), (1, 10, T0), (2, 30, T0), (3, 20, T0), (4, 30, T0)]) == 5
    assert f.item_count == 4  # 5 and 20 were replays
    assert put(f, [(5, 29, T0), (6, 31, T0)]) == 2
    assert f.item_count == 5
    assert f.end_phy_offset == 31
    everything = (0, 2**62)
    assert f.lookup(1, *everything, 9) == [10]
    assert f.lookup(3, *everything, 9) == []
    f.close()


def test_full_file_stops_and_reports_consumed(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 2, 3, 0, T0)  # room for 2 items
    assert put(f, [(1, 0, T0), (2, 10, T0), (3, 20, T0)]) == 2
    assert f.is_full
    assert put(f, [(3, 20, T0)]) == 0  # nothing fits
    assert put(f, [(3, 5, T0), (3, 20, T0)]) == 1  # the replay is consumed, the rest is not
    assert put(f, [(3, 5, T0)]) == 1  # replays alone need no room
    assert f.item_count == 3
    f.close()


def test_lookup_time_window_and_max_count(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 1, 10, 0, T0)  # one slot: everything collides
    put(f, [(7, i * 100, T0 + i * 1_000) for i in range(6)] + [(8, 600, T0 + 6_000)])
    assert f.lookup(7, T0, T0 + 10_000, 10) == [500, 400, 300, 200, 100, 0]
    assert f.lookup(7, T0 + 2_000, T0 + 4_000, 10) == [400, 300, 200]  # both ends inclusive
    assert f.lookup(7, T0 + 2_001, T0 + 3_999, 10) == [300]
    assert f.lookup(7, T0 + 1_000, T0 + 10_000, 2) == [500, 400]  # newest first
    assert f.lookup(7, T0 + 7_000, T0 + 9_000, 10) == []
    assert f.lookup(7, T0 + 4_000, T0 + 2_000, 10) == []  # empty window
    assert f.lookup(7, T0, T0 + 10_000, 0) == []
    # Item times are whole seconds after the file's begin (RocketMQ's resolution).
    put(f, [(7, 700, T0 + 7_999)])
    assert f.lookup(7, T0 + 7_000, T0 + 7_000, 10) == [700]
    with pytest.raises(InvalidArgumentError):
        f.lookup(-1, T0, T0, 1)
    f.close()


@pytest.mark.parametrize("bad_prev", [4, 5, 6, 99, -3])  # self-loop, forward, >= count, negative
def test_lookup_survives_corrupt_links(tmp_path: Path, bad_prev: int) -> None:
    path = tmp_path / "idx"
    buf = empty_file(1, 6, 0, T0)
    ref_put(buf, 1, 6, [(7, i, T0) for i in range(5)])  # items 1..5 in one chain, count 6
    prev_of_item_4 = 40 + 4 + 4 * 20 + 16
    SLOT.pack_into(buf, prev_of_item_4, bad_prev)
    path.write_bytes(bytes(buf))
    f = IndexFile.open(path, 1, 6)
    assert f.lookup(7, T0, T0, 10) == [4, 3]  # item 5, then item 4 whose link is unusable
    with path.open("r+b") as fh:
        fh.seek(40)
        fh.write(SLOT.pack(99))  # slot pointing beyond the item count
    assert f.lookup(7, T0, T0, 10) == []
    f.close()


def test_put_batch_restarts_chains_from_torn_slot_values(tmp_path: Path) -> None:
    """A slot that points at or past the item count (a torn write) is treated as empty."""
    path = tmp_path / "idx"
    ref = empty_file(4, 10, 0, T0)
    ref_put(ref, 4, 10, [(1, 0, T0), (2, 10, T0)])
    SLOT.pack_into(ref, 40 + 3 * 4, 3)  # == item count
    SLOT.pack_into(ref, 40 + 0 * 4, 77)  # beyond it
    path.write_bytes(bytes(ref))
    f = IndexFile.open(path, 4, 10)
    entries = [(3, 20, T0), (4, 30, T0), (7, 40, T0), (1, 50, T0)]
    assert put(f, entries) == ref_put(ref, 4, 10, entries)
    assert path.read_bytes() == bytes(ref)
    assert f.lookup(7, T0, T0, 9) == [40]  # the chain ends at the new item, not at garbage
    f.close()


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.integers(0, 9), st.integers(-2, 5), st.integers(0, 3_000)), min_size=1, max_size=40
    ),
    cut=st.integers(1, 120),
    begin_ts=st.sampled_from([0, T0]),
)
def test_truncate_equals_never_inserting_the_tail(
    entries: list[tuple[int, int, int]], cut: int, begin_ts: int
) -> None:
    rows, phy, ts = [], 3, T0
    for h, step, dt in entries:
        phy, ts = max(0, phy + step), ts + dt
        rows.append((h, phy, ts))
    # Entries a one-by-one writer would have inserted before reaching the cut offset.
    end, kept_rows, cut_something = 3, rows, False
    for i, (_, p, _) in enumerate(rows):
        if p >= end:
            if p >= cut:
                kept_rows, cut_something = rows[:i], True
                break
            end = p
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "idx"
        f = IndexFile.create(path, 3, 64, 3, begin_ts)
        put(f, rows)
        f.flush()
        if cut <= f.begin_phy_offset:
            with pytest.raises(InvalidArgumentError, match="destroy it instead"):
                f.truncate_to(cut)
            f.close()
            return
        f.truncate_to(cut)
        ref = empty_file(3, 64, 3, begin_ts)
        ref_put(ref, 3, 64, kept_rows)
        if cut_something:
            # The end timestamp is rebuilt from the items' one-second resolution.
            ref_begin_ts, _, _, _, _, count = HEADER.unpack_from(ref, 0)
            tdiffs = [ITEM.unpack_from(ref, 40 + 3 * 4 + i * 20)[2] for i in range(1, count)]
            end_ts = ref_begin_ts + max(tdiffs) * 1000 if tdiffs and ref_begin_ts > 0 else ref_begin_ts
            struct.pack_into(">q", ref, 8, end_ts)
        assert path.read_bytes() == bytes(ref)
        assert f.dirty == cut_something
        f.close()


def test_bad_input_is_rejected(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 2, 3, 0, T0)
    with pytest.raises(InvalidArgumentError, match="equal length"):
        f.put_batch(np.array([1, 2], np.uint32), np.array([1], np.int64), np.array([1, 2], np.int64))
    with pytest.raises(InvalidArgumentError, match="unsigned 32-bit"):
        f.put_batch(np.array([-1]), np.array([1]), np.array([1]))
    with pytest.raises(InvalidArgumentError, match="phy_offsets"):
        f.put_batch(np.array([1], np.uint32), np.array([-1]), np.array([1]))
    assert f.item_count == 1
    f.close()
    with pytest.raises(InvalidArgumentError, match="items"):
        IndexFile.create(tmp_path / "x", 2, 1, 0, T0)
    with pytest.raises(InvalidArgumentError, match="slots"):
        IndexFile.create(tmp_path / "x", 0, 2, 0, T0)
    with pytest.raises(FileExistsError):
        IndexFile.create(tmp_path / "idx", 2, 3, 0, T0)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b[:-1], "bytes, expected"),
        (lambda b: b + b"\0", "bytes, expected"),
        (lambda b: b[:36] + struct.pack(">i", 0) + b[40:], "item count 0"),
        (lambda b: b[:36] + struct.pack(">i", 6) + b[40:], "item count 6"),
        (lambda b: b[:32] + struct.pack(">i", 4) + b[36:], "used slots 4"),
        (lambda b: b[:16] + struct.pack(">qq", 500, 400) + b[32:], "physical offsets"),
    ],
)
def test_open_rejects_truncated_or_corrupt_file(
    tmp_path: Path, mutate: Callable[[bytes], bytes], reason: str
) -> None:
    path = tmp_path / "20240101000000000"
    path.write_bytes(mutate(golden_three_items()))
    with pytest.raises(CorruptionError, match=reason) as info:
        IndexFile.open(path, slots=4, items=5)
    assert str(path) in str(info.value)
    assert info.value.detail["path"] == str(path)


def test_flush_and_dirty(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 2, 5, 0, T0)
    assert f.dirty  # a new header is not durable yet
    f.flush()
    assert not f.dirty
    put(f, [(1, 0, T0)])
    assert f.dirty
    f.flush()
    assert not f.dirty
    f.destroy()
    assert not (tmp_path / "idx").exists()
    f.destroy()  # idempotent


# --------------------------------------------------------------------------- IndexService
def test_service_rolls_when_full_and_carries_begin_over(tmp_path: Path) -> None:
    svc = make_service(tmp_path)  # slots=8, items=5: four items per file
    keys = [f"T#k{i}" for i in range(10)]
    svc.put_batch(keys, [i * 100 for i in range(10)], [T0 + i * 1_000 for i in range(10)])
    files = svc.files
    assert [f.item_count for f in files] == [5, 5, 3]
    # Same frozen millisecond: names are still unique and sorted.
    assert [f.path.name for f in files] == ["20231114221320000", "20231114221320001", "20231114221320002"]
    assert (files[0].begin_phy_offset, files[0].begin_timestamp) == (0, T0)
    for older, newer in itertools.pairwise(files):
        assert newer.begin_phy_offset == older.end_phy_offset
        assert newer.begin_timestamp == older.end_timestamp
    assert (files[2].end_phy_offset, files[2].end_timestamp) == (900, T0 + 9_000)
    assert svc.max_phy_offset() == 900
    for i in range(10):
        assert svc.query("T", f"k{i}", 10, 0, 2**62) == [i * 100]
    assert svc.query("T", "nope", 10, 0, 2**62) == []
    svc.close()


def test_service_batch_spanning_files_and_duplicate_offsets(tmp_path: Path) -> None:
    svc = make_service(tmp_path, slots=4, items=3)  # two items per file
    # One message (offset 0) with keys a, b, a (duplicate) and a second message with key a.
    svc.put_batch(["T#a", "T#b", "T#a", "T#a"], [0, 0, 0, 50], [T0, T0, T0, T0 + 1_000])
    assert [f.item_count for f in svc.files] == [3, 3]
    assert svc.query("T", "a", 10, 0, 2**62) == [50, 0]  # offset 0 found in both files, once
    assert svc.query("T", "a", 1, 0, 2**62) == [50]
    assert svc.query("T", "b", 10, 0, 2**62) == [0]
    svc.close()


def test_query_scans_files_that_started_before_the_range(tmp_path: Path) -> None:
    svc = make_service(tmp_path, slots=8, items=3)
    rows = [("A", 10), ("B", 20), ("C", 30), ("A", 40), ("A", 50)]  # (key, seconds)
    svc.put_batch([f"T#{k}" for k, _ in rows], [s * 10 for _, s in rows], [T0 + s * 1_000 for _, s in rows])
    files = svc.files
    assert [(f.begin_timestamp - T0, f.end_timestamp - T0) for f in files] == [
        (10_000, 20_000),
        (20_000, 40_000),
        (40_000, 50_000),
    ]
    # File 2 began at 20 s, before the window: it must still be scanned.
    assert svc.query("T", "A", 10, T0 + 35_000, T0 + 45_000) == [400]
    assert svc.query("T", "A", 10, T0 + 15_000, T0 + 45_000) == [400]
    assert svc.query("T", "A", 10, T0, T0 + 100_000) == [500, 400, 100]
    assert svc.query("T", "A", 2, T0, T0 + 100_000) == [500, 400]
    assert svc.query("T", "A", 10, T0 + 10_000, T0 + 10_000) == [100]
    assert svc.query("T", "A", 10, T0 + 51_000, T0 + 90_000) == []
    assert svc.query("T", "A", 0, T0, T0 + 100_000) == []
    svc.close()


def test_replays_after_reopen_are_skipped(tmp_path: Path) -> None:
    svc = make_service(tmp_path, slots=8, items=10)
    svc.put_batch(["T#a", "T#b", "T#c"], [0, 100, 200], [T0, T0 + 1, T0 + 2])
    svc.close()
    svc = make_service(tmp_path, slots=8, items=10)
    assert svc.max_phy_offset() == 200
    # Recovery re-dispatches from an earlier offset: 100 is a replay and skipped; 200 equals the
    # end offset (more keys of that message could follow), so it is indexed again.
    svc.put_batch(["T#b", "T#c", "T#d", "T#a"], [100, 200, 300, 400], [T0 + 1, T0 + 2, T0 + 3, T0 + 4])
    (f,) = svc.files
    assert f.item_count == 1 + 3 + 3
    assert svc.query("T", "b", 10, 0, 2**62) == [100]
    assert svc.query("T", "c", 10, 0, 2**62) == [200]  # found twice, reported once
    assert svc.query("T", "a", 10, 0, 2**62) == [400, 0]
    assert svc.max_phy_offset() == 400
    svc.close()


def test_abnormal_load_destroys_files_newer_than_checkpoint(tmp_path: Path) -> None:
    svc = make_service(tmp_path, slots=8, items=3)
    svc.put_batch(["T#a", "T#b", "T#c", "T#d"], [0, 10, 20, 30], [T0, T0 + 1_000, T0 + 2_000, T0 + 3_000])
    checkpoint = svc.flush()
    assert checkpoint == T0 + 3_000
    svc.put_batch(["T#e", "T#f"], [40, 50], [T0 + 4_000, T0 + 5_000])  # a third file, never flushed
    names = [f.path.name for f in svc.files]
    svc.close()

    svc = IndexService(tmp_path, 8, 3)
    svc.load(True, checkpoint)  # normal exit: everything kept
    assert [f.path.name for f in svc.files] == names
    svc.close()

    svc = IndexService(tmp_path, 8, 3)
    svc.load(False, checkpoint)
    assert [f.path.name for f in svc.files] == names[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == names[:2]
    assert svc.max_phy_offset() == 30
    assert svc.query("T", "e", 10, 0, 2**62) == []
    # The reput thread re-dispatches from the checkpoint: 20 is a replay and skipped; 30 equals
    # the end offset (another key of the last message could follow), so it is indexed again.
    svc.put_batch(
        ["T#c", "T#d", "T#e", "T#f"], [20, 30, 40, 50], [T0 + 2_000, T0 + 3_000, T0 + 4_000, T0 + 5_000]
    )
    assert svc.query("T", "e", 10, 0, 2**62) == [40]
    assert svc.query("T", "d", 10, 0, 2**62) == [30]
    assert [f.item_count for f in svc.files] == [3, 3, 3, 2]
    svc.close()

    svc = IndexService(tmp_path, 8, 3)
    svc.load(False, T0 + 1_000)  # an older checkpoint: the second file goes too
    assert [f.path.name for f in svc.files] == names[:1]
    svc.close()


@pytest.mark.parametrize("torn_size", [0, 40 + 8 * 4 + 3 * 20])
def test_load_removes_torn_newest_file_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, torn_size: int
) -> None:
    svc = make_service(tmp_path, slots=8, items=3)
    svc.put_batch(["T#a", "T#b", "T#c"], [0, 10, 20], [T0, T0, T0])
    names = [f.path.name for f in svc.files]
    svc.close()
    torn = tmp_path / "20231114221320002"  # created, then the process died: never sized or never written
    torn.write_bytes(b"\0" * torn_size)
    (tmp_path / "not-an-index-file").write_bytes(b"x")
    (tmp_path / "20231399000000000").write_bytes(b"x")  # no 13th month: not an index file name
    with caplog.at_level(logging.WARNING, logger="tierd.local.index"):
        svc = make_service(tmp_path, slots=8, items=3)
    assert str(torn) in caplog.text
    assert not torn.exists()
    assert [f.path.name for f in svc.files] == names
    svc.put_batch(["T#d", "T#e"], [30, 40], [T0, T0])
    assert svc.files[-1].path.name == "20231114221320003"  # never reuses a name seen at load
    svc.close()


def test_load_refuses_newest_file_of_other_geometry(tmp_path: Path) -> None:
    svc = make_service(tmp_path, slots=8, items=3)
    svc.put_batch(["T#a"], [0], [T0])
    (path,) = (f.path for f in svc.files)
    svc.close()
    svc = IndexService(tmp_path, 16, 3)  # config changed under existing files
    with pytest.raises(CorruptionError, match="slots=16"):
        svc.load(True, 0)
    assert path.exists()


def test_load_refuses_corrupt_older_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    svc = make_service(tmp_path, slots=8, items=3)
    svc.put_batch(["T#a", "T#b", "T#c", "T#d", "T#e"], [0, 10, 20, 30, 40], [T0] * 5)
    first = svc.files[0].path
    svc.close()
    with first.open("r+b") as fh:
        fh.truncate(50)
    svc = IndexService(tmp_path, 8, 3)
    with caplog.at_level(logging.WARNING), pytest.raises(CorruptionError) as info:
        svc.load(True, 0)
    assert str(first) in str(info.value)
    assert str(first) in caplog.text
    assert first.exists()  # evidence is kept
    svc.close()


def test_delete_files_before(tmp_path: Path) -> None:
    svc = make_service(tmp_path, slots=8, items=3)
    svc.put_batch([f"T#k{i}" for i in range(6)], [i * 10 for i in range(6)], [T0 + i for i in range(6)])
    files = svc.files
    assert [f.end_phy_offset for f in files] == [10, 30, 50]
    # A file whose last item points at the new minimum still indexes a live message.
    assert svc.delete_files_before(10) == 0
    assert svc.delete_files_before(11) == 1
    assert not files[0].path.exists()
    assert svc.query("T", "k0", 10, 0, 2**62) == []
    assert svc.query("T", "k2", 10, 0, 2**62) == [20]
    assert svc.delete_files_before(10**9) == 1  # never the newest file
    assert svc.files == (files[2],)
    assert svc.query("T", "k5", 10, 0, 2**62) == [50]
    svc.close()


def test_truncate_to_drops_entries_at_and_beyond_the_commitlog_end(tmp_path: Path) -> None:
    """Recovery cut the commitlog at 45: entries at 50.. go, whole files beginning there too, and
    records re-appended at those offsets are indexed, not skipped as replays."""
    keys = [f"T#k{i % 3}" for i in range(12)]
    offs = [i * 10 for i in range(12)]
    tss = [T0 + i * 1_000 for i in range(12)]  # whole seconds: end timestamps survive exactly
    svc = make_service(tmp_path / "a", slots=4, items=5)  # four items per file
    svc.put_batch(keys, offs, tss)
    assert [f.begin_phy_offset for f in svc.files] == [0, 30, 70]
    svc.truncate_to(45)
    assert [f.item_count for f in svc.files] == [5, 2]
    assert svc.max_phy_offset() == 40
    assert svc.query("T", "k2", 10, 0, 2**62) == [20]
    new_keys, new_offs, new_tss = (
        ["T#k9", "T#k2", "T#k0"],
        [45, 45, 60],
        [T0 + 20_000, T0 + 20_000, T0 + 21_000],
    )
    svc.put_batch(new_keys, new_offs, new_tss)
    assert svc.query("T", "k2", 10, 0, 2**62) == [45, 20]
    svc.truncate_to(1_000)  # nothing beyond: no change
    svc.close()

    fresh = make_service(tmp_path / "b", slots=4, items=5)
    fresh.put_batch(keys[:5] + new_keys, offs[:5] + new_offs, tss[:5] + new_tss)
    fresh.close()
    for a, b in itertools.zip_longest(sorted((tmp_path / "a").iterdir()), sorted((tmp_path / "b").iterdir())):
        assert a is not None
        assert b is not None
        assert a.name == b.name
        assert a.read_bytes() == b.read_bytes()

    svc = make_service(tmp_path / "a", slots=4, items=5)
    svc.truncate_to(0)
    assert svc.files == ()
    assert list((tmp_path / "a").iterdir()) == []
    svc.close()


def test_flush_returns_durable_index_timestamp(tmp_path: Path) -> None:
    svc = make_service(tmp_path, slots=8, items=3)
    assert svc.flush() == 0  # no files yet
    assert svc.max_phy_offset() == 0
    svc.put_batch(["T#a", "T#b", "T#c"], [0, 10, 20], [T0, T0 + 5, T0 + 7])
    assert [f.dirty for f in svc.files] == [True, True]
    assert svc.flush() == T0 + 7
    assert [f.dirty for f in svc.files] == [False, False]
    assert svc.flush() == T0 + 7
    svc.close()


def test_service_state_errors(tmp_path: Path) -> None:
    svc = IndexService(tmp_path / "index", 8, 3)
    with pytest.raises(StoreClosedError, match="load"):
        svc.put_batch(["T#a"], [0], [T0])
    svc.load(True, 0)
    assert (tmp_path / "index").is_dir()
    svc.put_batch([], [], [])
    assert svc.files == ()
    with pytest.raises(InvalidArgumentError, match="equal length"):
        svc.put_batch(["T#a", "T#b"], [0], [T0, T0])
    svc.close()
    svc.close()
    with pytest.raises(StoreClosedError):
        svc.query("T", "a", 1, 0, 1)
    with pytest.raises(StoreClosedError):
        svc.put_batch(["T#a"], [0], [T0])
    with pytest.raises(InvalidArgumentError):
        IndexService(tmp_path, 8, 1)


def test_concurrent_writer_and_readers(tmp_path: Path) -> None:
    """One reput-like writer rolling through many files, readers querying and flushing meanwhile."""
    svc = make_service(tmp_path, slots=16, items=64)
    n_keys, batches, per_batch = 40, 150, 13
    expected: dict[str, list[int]] = {f"k{i}": [] for i in range(n_keys)}
    plan = []
    offset = 0
    for b in range(batches):
        keys, offs, tss = [], [], []
        for j in range(per_batch):
            k = f"k{(b * per_batch + j) * 7 % n_keys}"
            keys.append(f"T#{k}")
            offs.append(offset)
            tss.append(T0 + offset)
            expected[k].append(offset)
            offset += 10
        plan.append((keys, offs, tss))
    done = threading.Event()
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            start.wait()
            for keys, offs, tss in plan:
                svc.put_batch(keys, offs, tss)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            start.wait()
            while not done.is_set():
                k = f"k{int(rng.integers(n_keys))}"
                found = svc.query("T", k, 1_000, 0, 2**62)
                assert set(found) <= set(expected[k])
                assert found == sorted(found, reverse=True)
                svc.max_phy_offset()
                svc.flush()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer), *(threading.Thread(target=reader, args=(s,)) for s in (1, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(svc.files) == -(-batches * per_batch // 63)
    for k, offs in expected.items():
        assert svc.query("T", k, 1_000, 0, 2**62) == offs[::-1]
    svc.close()


# --------------------------------------------------------------------------- RocketMQ's item order
# RocketMQ's IndexService indexes a message's UNIQ_KEY first, then each token of its KEYS in
# order (ROCKETMQ.md §1.3): the items of a message follow one another in that order.
UNIQ_AND_KEYS = {"keys": ("k1", "k2"), "properties": {"UNIQ_KEY": "u", "p": "v"}}
ROCKETMQ_ORDER = [key_hash("t#u"), key_hash("t#k1"), key_hash("t#k2")]


def index_items(svc: IndexService) -> list[tuple[int, int]]:
    """(hash, commitlog offset) of every item in the index files, in file order, read from
    the bytes on disk with this file's own struct layouts."""
    out = []
    for f in svc._files:
        data = f.path.read_bytes()
        count = HEADER.unpack_from(data, 0)[5]
        base = 40 + f.slots * 4
        for i in range(1, count):
            h, phy, _, _ = ITEM.unpack_from(data, base + i * 20)
            out.append((h, phy))
    return out


def test_uniq_key_is_indexed_before_the_keys_on_every_path(store: BlockingMessageStore) -> None:
    """Single put (C and the Python fallback, which a bytearray body takes), put_batch (C and
    the Python general loop, which a bytearray body takes) and recovery's rebuild from the
    commitlog: a message's items are its UNIQ_KEY, then its KEYS, as RocketMQ writes them."""
    results = [
        store.put(Message(topic="t", body=b"c single", **UNIQ_AND_KEYS)),  # type: ignore[arg-type]
        store.put(Message(topic="t", body=bytearray(b"py single"), **UNIQ_AND_KEYS)),  # type: ignore[arg-type]
        *store.put_batch([Message(topic="t", body=b"c batch", **UNIQ_AND_KEYS)] * 2),  # type: ignore[arg-type]
        *store.put_batch([Message(topic="t", body=bytearray(b"py batch"), **UNIQ_AND_KEYS)] * 2),  # type: ignore[arg-type]
    ]
    assert store.hot.wait_dispatched(10)
    offsets = [r.commitlog_offset for r in results]
    items = index_items(store.hot.index)
    assert items == [(h, off) for off in offsets for h in ROCKETMQ_ORDER]
    files = store.hot.commitlog.files
    views = []
    for off in offsets:
        f = files.find(off)
        assert f is not None
        views.append((off, parse_record_view(f.view, off - f.file_from_offset, f.wrote)))
    rebuilt = DispatchBatch.from_records(views, store.hot.commitlog.max_offset)
    assert [key_hash(k) for k in rebuilt.index_keys] == ROCKETMQ_ORDER * len(offsets)
