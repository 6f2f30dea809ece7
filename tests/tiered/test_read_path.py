"""Reads across tiers: statuses, policies, the cold fetcher and its read-ahead cache.

offsets:  0 ........ cold_max ........ hot_max
cold:     [=======================)
hot:                 [=============================)   (after hot retention)
"""

from __future__ import annotations

import asyncio
import functools
import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, GetStatus, Message, MessageStore, ReadPolicy
from tierd.tiered.fetcher import GC_PAUSE_MIN, ColdFetcher, gc_paused

from .conftest import cold_config, run

if TYPE_CHECKING:
    from tierd.tiered.flatmessage import FlatMessageFile

BODY = 1000


def _store_with_history(tmp_path: Path, **tiered: Any) -> BlockingMessageStore:
    """600 messages in queue h/0: 0..399 cold, 0..599 hot, then hot retention drops its oldest
    files so the hot tier starts well after 0."""
    cfg = cold_config(  # several cold segments
        tmp_path, max_message_size=64 * 1024, commitlog_segment_size=150_000, **tiered
    )
    cfg = cfg.with_overrides(store={"commitlog_file_size": 256 * 1024, "file_reserved_time": 1.0})
    store = BlockingMessageStore.open(cfg)
    hot = store.hot
    hot.commitlog.clock = functools.partial(int, 1_000)
    store.put_batch([Message(topic="h", body=b"%04d" % i * (BODY // 4), queue_id=0) for i in range(400)])
    store.tier_now()
    hot.commitlog.clock = functools.partial(int, 2_000)
    assert store.tiering is not None
    store.tiering.dispatcher.stop()  # keep 400..599 hot only
    store.put_batch([Message(topic="h", body=b"%04d" % i * (BODY // 4), queue_id=0) for i in range(400, 600)])
    store.hot.wait_dispatched(10)
    assert hot.apply_retention(now_ms=10**12) >= 1
    return store


def _body(i: int) -> bytes:
    return b"%04d" % i * (BODY // 4)


def _flat_and_fetcher(store: BlockingMessageStore) -> tuple[FlatMessageFile, ColdFetcher]:
    """Queue h/0's cold flat file and a fresh fetcher with the store's tiered settings."""
    assert store.tiering is not None
    ff = store.tiering.flat.get("h", 0)
    assert ff is not None
    return ff, ColdFetcher(store.config.tiered)


async def _settle(fetcher: ColdFetcher, prefetches: int) -> None:
    """Wait (with a deadline) for ``prefetches`` background loads, then for every load they
    started in turn."""
    deadline = asyncio.get_running_loop().time() + 10
    while fetcher.cache.stats.prefetches < prefetches:
        assert asyncio.get_running_loop().time() < deadline, "read-ahead did not happen"
        await asyncio.sleep(0.01)
    while fetcher._prefetching:  # a finished load may start the next one: wait for all
        await asyncio.gather(*fetcher._prefetching)


def test_status_table_over_both_tiers(tmp_path: Path) -> None:
    with _store_with_history(tmp_path) as store:
        hot_min = store.hot.min_offset("h", 0)
        assert 0 < hot_min < 400
        assert (store.min_offset("h", 0), store.max_offset("h", 0)) == (0, 600)
        r = store.get("h", 0, 0, 5)  # only the cold tier has it
        assert (r.status, r.source, [m.body for m in r.messages]) == (
            GetStatus.FOUND,
            "cold",
            [_body(i) for i in range(5)],
        )
        assert (r.next_offset, r.min_offset, r.max_offset) == (5, 0, 600)
        r = store.get("h", 0, 599, 5)
        assert (r.status, r.source, r.messages[0].body, r.next_offset) == (
            GetStatus.FOUND,
            "hot",
            _body(599),
            600,
        )
        assert store.get("h", 0, 600).status is GetStatus.OFFSET_OVERFLOW_ONE
        r = store.get("h", 0, 700)
        assert (r.status, r.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 600)
        assert store.get("nope", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE


@pytest.mark.parametrize(
    ("policy", "offset", "source"),
    [
        (ReadPolicy.DISABLE, 450, "hot"),  # hot only
        (ReadPolicy.NOT_IN_DISK, 450, "hot"),  # hot has it, not cold
        (ReadPolicy.NOT_IN_DISK, 10, "cold"),  # hot no longer has it
        (ReadPolicy.FORCE, 10, "cold"),
        (ReadPolicy.FORCE, 399, "cold"),  # both have it: forced cold
        (ReadPolicy.FORCE, 450, "hot"),  # not committed cold yet: always hot
        (ReadPolicy.NOT_IN_MEM, 10, "cold"),
    ],
)
def test_policy_by_location(tmp_path: Path, policy: ReadPolicy, offset: int, source: str) -> None:
    with _store_with_history(tmp_path) as store:
        r = store.get("h", 0, offset, 3, policy=policy)
        assert r.status is GetStatus.FOUND
        assert r.source == source
        assert [m.body for m in r.messages] == [_body(i) for i in range(offset, offset + len(r.messages))]
        assert r.messages[0].queue_offset == offset


def test_disable_policy_still_serves_history_only_the_cold_tier_holds(tmp_path: Path) -> None:
    with _store_with_history(tmp_path) as store:
        r = store.get("h", 0, 10, 3, policy="DISABLE")
        # the hot store no longer has it: "too small" would send a consumer past it
        assert (r.status, r.source) == (GetStatus.FOUND, "cold")
        assert [m.body for m in r.messages] == [_body(i) for i in range(10, 13)]


def test_not_in_mem_reads_cold_outside_the_hot_window(tmp_path: Path) -> None:
    with _store_with_history(tmp_path) as store:
        store.router.hot_window_bytes = 10 * BODY  # only the newest ~10 messages count as "in memory"
        hot_min = store.hot.min_offset("h", 0)
        assert store.get("h", 0, hot_min, 1, policy="NOT_IN_MEM").source == "cold"
        assert store.get("h", 0, 595, 1, policy="NOT_IN_MEM").source == "hot"


def test_reads_span_cold_segments_and_batches(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, read_ahead_count=50, read_ahead_size=20 * BODY) as store:
        assert store.tiering is not None
        ff = store.tiering.flat.get("h", 0)
        assert ff is not None
        assert len(ff.commitlog.segments) >= 2
        seen: list[bytes] = []
        offset = 0
        while offset < 400:
            r = store.get("h", 0, offset, 64, policy="FORCE")
            assert r.source == "cold"
            assert len(r.messages) <= 64
            seen += [m.body for m in r.messages]
            offset = r.next_offset
        assert seen == [_body(i) for i in range(400)]


def _corrupt_on_disk(store: BlockingMessageStore, segment_path: str, position: int) -> None:
    """Flip one byte of a cold segment file behind the driver's back, and forget cached reads."""
    path = Path(store.config.backend.url) / segment_path
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0xFF
    path.chmod(0o644)  # sealed posix segments are read-only
    path.write_bytes(bytes(raw))
    store.router.fetcher.cache.invalidate(("h", 0))


def test_cold_read_error_falls_back_to_hot_or_reports_found_null(tmp_path: Path) -> None:
    with _store_with_history(tmp_path) as store:
        assert store.tiering is not None
        ff = store.tiering.flat.get("h", 0)
        assert ff is not None
        seg = ff.commitlog.segments[-1]
        _corrupt_on_disk(store, seg.path, 200)
        first_in_last = ff.commitlog.first_queue_offset(seg.base_offset)
        assert first_in_last is not None
        r = store.get("h", 0, first_in_last, 1, policy="FORCE")  # hot still has it
        assert (r.status, r.source, r.messages[0].body) == (GetStatus.FOUND, "hot", _body(first_in_last))
        assert store.router.fallbacks == 1
        # a cold-only offset with a corrupt record is never returned
        _corrupt_on_disk(store, ff.commitlog.segments[0].path, 150)
        r = store.get("h", 0, 0, 5)
        assert (r.status, r.messages) == (GetStatus.OFFSET_FOUND_NULL, ())


def test_cache_stays_within_its_byte_bound_and_concurrent_readers_share_a_read(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, cache_max_bytes=50 * BODY, read_ahead_count=16) as store:
        ff, fetcher = _flat_and_fetcher(store)
        for offset in range(0, 400, 16):  # a flood of distinct offsets
            run(store, fetcher.read(ff, offset, 1))
            assert fetcher.cache.bytes <= 50 * BODY + 16 * 20
        assert fetcher.cache.stats.evictions > 0

        fresh = ColdFetcher(store.config.tiered)

        async def many() -> list[list[bytes]]:
            results = await asyncio.gather(*(fresh.read(ff, 100, 5) for _ in range(20)))
            return [[m.body for m in r] for r in results]

        bodies = run(store, many())
        assert all(b == [_body(i) for i in range(100, 105)] for b in bodies)
        assert fresh.cache.stats.backend_reads == 2  # one CQ range read + one commitlog range read


def test_offset_for_time_and_earliest_time_across_tiers(tmp_path: Path) -> None:
    with _store_with_history(tmp_path) as store:
        assert store.earliest_time("h", 0) == 1_000  # from the cold tier
        assert store.offset_for_time("h", 0, 500) == 0
        assert store.offset_for_time("h", 0, 1_500) == 400
        assert store.offset_for_time("h", 0, 1_000, "upper") == 399
        assert store.offset_for_time("h", 0, 9_999) == 600


def test_async_facade_reads_cold(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with MessageStore.open(cold_config(tmp_path)) as store:
            await store.put_batch([Message(topic="a", body=b"%d" % i, queue_id=0) for i in range(10)])
            await store.tier_now()
            r = await store.get("a", 0, 3, 2, policy=ReadPolicy.FORCE)
            assert (r.source, [m.body for m in r.messages]) == ("cold", [b"3", b"4"])
            assert await store.offset_for_time("a", 0, 0) == 0

    asyncio.run(scenario())


def test_a_sequential_reader_finds_the_next_batch_loaded_ahead(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> tuple[int, int, int, list[bytes]]:
            first = await fetcher.read(ff, 0, 10)  # not past the middle: nothing loaded ahead
            assert fetcher.cache.stats.prefetches == 0
            assert not fetcher._prefetching
            first += await fetcher.read(ff, 10, 30)  # past the middle of batch [0, 50)
            deadline = asyncio.get_running_loop().time() + 10
            while fetcher.cache.stats.prefetches < 1:
                assert asyncio.get_running_loop().time() < deadline, "no prefetch happened"
                await asyncio.sleep(0.01)
            misses = fetcher.cache.stats.misses
            rest = await fetcher.read(ff, 40, 20)  # crosses into [50, 100): served from the cache
            await fetcher.aclose()
            return (
                misses,
                fetcher.cache.stats.misses,
                fetcher.cache.stats.prefetches,
                [m.body for m in first + rest],
            )

        misses_before, misses_after, prefetches, bodies = run(store, scenario())
        assert misses_after == misses_before == 1
        assert prefetches >= 1
        assert bodies == [_body(i) for i in range(60)]


def _batch_of(n: int) -> tuple[bytes, list[int], list[int]]:
    from tierd.format.host import encode_host
    from tierd.format.properties import encode_properties
    from tierd.format.record import encode_record, topic_field

    magic, topic = topic_field(b"h")
    records, offsets = [], []
    pos = 0
    for i in range(n):
        r = encode_record(
            _body(i),
            topic,
            magic,
            encode_properties({"KEYS": f"k{i}", "UNIQ_KEY": f"U{i:08d}"}) if i % 2 else b"",
            0,
            0,
            i,
            pos,
            0,
            1_000,
            encode_host("127.0.0.1:1"),
            2_000,
            encode_host("127.0.0.1:10911"),
        )
        records.append(r)
        offsets.append(pos)
        pos += len(r)
    return b"".join(records), offsets, [len(r) for r in records]


def test_large_batches_decode_with_the_collector_paused_and_always_resume_it() -> None:
    import gc

    import numpy as np

    from tierd.errors import CorruptRecordError
    from tierd.tiered.fetcher import GC_PAUSE_MIN, ColdBatch

    n = GC_PAUSE_MIN * 4
    data, offsets, sizes = _batch_of(n)

    def batch(raw: bytes) -> ColdBatch:
        return ColdBatch("h", 0, 0, np.array(offsets, np.int64), np.array(sizes, np.int64), raw)

    assert gc.isenabled()
    assert [m.body for m in batch(data).messages(0, n)] == [_body(i) for i in range(n)]
    assert gc.isenabled()
    broken = bytearray(data)
    broken[offsets[n // 2] + sizes[n // 2] - 10] ^= 0xFF  # inside record n/2
    # the good messages before the bad record, then (starting at it) the error
    assert len(batch(bytes(broken)).messages(0, n)) == n // 2
    assert gc.isenabled()
    with pytest.raises(CorruptRecordError, match=f"offset {n // 2}"):
        batch(bytes(broken)).messages(n // 2, n)
    assert gc.isenabled()
    gc.disable()  # a caller that turned the collector off keeps it off
    try:
        batch(data).messages(0, n)
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("topic", "queue_id", "first", "message"),
    [
        ("other", 0, 0, "but the consume queue says other/0 offset 0"),
        ("h", 3, 0, "but the consume queue says h/3 offset 0"),
        ("h", 0, 7, "but the consume queue says h/0 offset 7"),
    ],
)
def test_a_batch_holding_another_queues_records_is_refused_naming_both(
    topic: str, queue_id: int, first: int, message: str
) -> None:
    import numpy as np

    from tierd.errors import CorruptRecordError
    from tierd.tiered.fetcher import ColdBatch

    data, offsets, sizes = _batch_of(300)  # records of h/0 at offsets 0..299
    batch = ColdBatch(topic, queue_id, first, np.array(offsets, np.int64), np.array(sizes, np.int64), data)
    with pytest.raises(CorruptRecordError, match=message):
        batch.messages(first, first + 300)
    good = ColdBatch("h", 0, 0, np.array(offsets, np.int64), np.array(sizes, np.int64), data)
    got = good.messages(10, 300)
    assert [m.queue_offset for m in got] == list(range(10, 300))
    assert {(m.topic, m.queue_id, m.born_host, m.store_host) for m in got} == {
        ("h", 0, "127.0.0.1:1", "127.0.0.1:10911")
    }
    assert all(m.size == s for m, s in zip(got, sizes[10:], strict=True))
    assert good.records is not None  # the batch-wise path gives what the per-record decoder gives
    assert got == [good.records.message(i) for i in range(10, 300)]


def test_consume_queue_units_read_ahead_serve_the_next_batches(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, read_ahead_count=200, read_ahead_size=20 * BODY) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> tuple[list[int], list[bytes]]:
            reads, bodies = [], []
            offset = 0
            for _ in range(5):  # batches are cut by read_ahead_size (< 20 messages each)
                got = await fetcher._load_shared(ff, offset)
                reads.append(fetcher.cache.stats.backend_reads)
                bodies += [m.body for m in got.messages(offset, got.end)]
                offset = got.end
            return reads, bodies

        reads, bodies = run(store, scenario())
        # one consume-queue read (200 units) + one commitlog read, then commitlog reads only
        assert reads == [2, 3, 4, 5, 6]
        assert bodies == [_body(i) for i in range(len(bodies))]
        assert len(bodies) > 40


def test_a_sequential_reader_keeps_two_batches_loading_ahead_and_no_more(tmp_path: Path) -> None:
    """The next request goes out when the previous one lands, not when the reader arrives: a
    reader in batch k has k+1 and k+2 loaded (READ_AHEAD_DEPTH), never k+3."""
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)
        key = ("h", 0)

        async def scenario() -> tuple[list[int], int, list[bytes]]:
            got = await fetcher.read(ff, 0, 10)
            got += await fetcher.read(ff, 10, 10)  # continues where the last read ended
            await _settle(fetcher, 2)
            loaded = [b.first for b in (fetcher.cache.find(key, o) for o in (50, 100, 150)) if b]
            prefetches = fetcher.cache.stats.prefetches
            got += await fetcher.read(ff, 20, 100)  # to 120: served from the cache, k+3 follows
            await fetcher.aclose()
            return loaded, prefetches, [m.body for m in got]

        loaded, prefetches, bodies = run(store, scenario())
        assert loaded == [50, 100]
        assert prefetches == 2
        assert bodies == [_body(i) for i in range(120)]


def test_read_ahead_depth_shrinks_to_what_the_cache_holds(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> list[int]:
            first = await fetcher._load_shared(ff, 0)
            fetcher.cache.max_bytes = first.nbytes * 2  # room for the reader's batch + one
            await fetcher.read(ff, 0, 10)
            await fetcher.read(ff, 10, 10)
            await _settle(fetcher, 1)
            await fetcher.aclose()
            return [o for o in (0, 50, 100) if fetcher.cache.find(("h", 0), o) is not None]

        assert run(store, scenario()) == [0, 50]


def test_no_read_ahead_when_the_cache_holds_only_the_readers_batch(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> tuple[int, int, list[bytes]]:
            first = await fetcher._load_shared(ff, 0)
            fetcher.cache.max_bytes = first.nbytes * 2 - 1  # one batch fits, two do not
            got = await fetcher.read(ff, 0, 10)
            got += await fetcher.read(ff, 10, 40)  # sequential, past the middle
            started = len(fetcher._prefetching)
            got += await fetcher.read(ff, 50, 50)
            await fetcher.aclose()
            return started, fetcher.cache.stats.prefetches, [m.body for m in got]

        started, prefetches, bodies = run(store, scenario())
        assert (started, prefetches) == (0, 0)
        assert bodies == [_body(i) for i in range(100)]


def test_batches_are_full_wherever_unit_reads_or_cq_segments_end(tmp_path: Path) -> None:
    """A batch spans read_ahead_size (or its commitlog segment's end, stretched by at most an
    eighth to swallow a short tail) however the consume queue is cut: unit reads of 7 and CQ
    segments of 30 units do not produce short batches and extra commitlog round trips."""
    size = 20 * BODY
    tiered = {"read_ahead_count": 7 * 40, "read_ahead_size": size, "consumequeue_segment_size": 30 * 20}
    with _store_with_history(tmp_path, **tiered) as store:
        ff, fetcher = _flat_and_fetcher(store)
        record = max(len(_body(0)) + 200, 1)  # a record's size, generously

        async def scenario() -> tuple[list[tuple[int, int, int]], list[bytes]]:
            shapes, bodies, offset = [], [], 0
            while offset < ff.max_offset:
                b = await fetcher._load_shared(ff, offset)
                start = int(b.flat_offsets[0])
                shapes.append((len(b.data), ff.commitlog.segment_end(start) - start, b.end))
                bodies += [m.body for m in b.messages(offset, b.end)]
                offset = b.end
            return shapes, bodies

        shapes, bodies = run(store, scenario())
        assert bodies == [_body(i) for i in range(400)]
        assert len(ff.consumequeue.segments) > 5  # the CQ really is cut in many places
        for nbytes, to_segment_end, end in shapes:
            assert nbytes <= size + size // 8
            assert nbytes > size - record or nbytes == to_segment_end or end == ff.max_offset


def test_no_background_load_starts_after_the_fetcher_is_closed(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> tuple[int, list[bytes]]:
            got = await fetcher.read(ff, 0, 10)
            await fetcher.aclose()
            got += await fetcher.read(ff, 10, 40)  # reads still work, sequential, past the middle
            return len(fetcher._prefetching), [m.body for m in got]

        pending, bodies = run(store, scenario())
        assert pending == 0
        assert bodies == [_body(i) for i in range(50)]


def test_a_sequential_readers_consume_queue_reads_cover_several_batches(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> tuple[int, int, int, int]:
            one = await fetcher._load_shared(ff, 0)  # a random read: 50 units, all used
            after_random = fetcher.units.take(("h", 0), one.end)
            ahead = await fetcher._load_shared(ff, 100, ahead=True)  # a sequential reader's load
            run_ = fetcher.units.take(("h", 0), ahead.end)
            left_random = 0 if after_random is None else len(after_random[0])
            return len(one.sizes), left_random, ahead.end, 0 if run_ is None else len(run_[0])

        batch, left_random, ahead_end, left_ahead = run(store, scenario())
        assert batch == 50
        assert left_random == 0
        # SEQUENTIAL_UNIT_READ (4) batches' worth of units from 100; the batch used its part
        assert left_ahead == 100 + 50 * 4 - ahead_end > 50


def test_gc_pause_restores_the_collector_and_respects_a_disabled_one() -> None:
    """Cold reads pause the cyclic collector while they build messages: it is back on after
    the pause (also when the read raises), a nested pause leaves it to the outer one, small
    reads do not pause, and a collector the application turned off stays off."""

    def read_that_fails() -> None:
        with gc_paused(GC_PAUSE_MIN):
            assert not gc.isenabled()
            with gc_paused(GC_PAUSE_MIN):
                pass
            assert not gc.isenabled()  # the inner pause did not switch it back on
            raise RuntimeError("a corrupt record")

    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        read_that_fails()
    assert gc.isenabled()
    with gc_paused(GC_PAUSE_MIN - 1):
        assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused(GC_PAUSE_MIN):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_two_read_aheads_of_one_batch_load_it_once(tmp_path: Path) -> None:
    """The reader's read-ahead and a completed load's can both ask for the same batch before
    either task runs: the batch is loaded once and counted once (the second joined the first's
    load and was counted as a load of its own, or loaded it again once it was cached)."""
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)
        loads: list[int] = []
        load = fetcher._load

        async def counted(ff: FlatMessageFile, offset: int, ahead: bool = False) -> Any:
            loads.append(offset)
            return await load(ff, offset, ahead)

        fetcher._load = counted  # type: ignore[method-assign]

        async def scenario() -> tuple[list[int], int]:
            fetcher._prefetch(ff, 50)
            fetcher._prefetch(ff, 50)  # scheduled before the first one ran
            while fetcher._prefetching:
                await asyncio.gather(*fetcher._prefetching)
            assert fetcher.cache.find(("h", 0), 50) is not None
            fetcher._prefetch(ff, 50)  # already cached: nothing to load
            while fetcher._prefetching:
                await asyncio.gather(*fetcher._prefetching)
            await fetcher.aclose()
            return loads, fetcher.cache.stats.prefetches

        assert run(store, scenario()) == ([50], 1)


def test_a_batch_still_in_use_keeps_its_buffer_when_the_cache_drops_it(tmp_path: Path) -> None:
    """Batches decode from pooled receive buffers: one dropped from the cache while a reader
    still holds it must not be overwritten by the next load (same size: it would fit)."""
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> tuple[list[bytes], list[bytes], bool, int]:
            held = await fetcher._load_shared(ff, 0)  # a reader's batch, not decoded yet
            fetcher.cache.invalidate(("h", 0))  # dropped: its buffer goes back to the pool
            assert fetcher.pool.bytes > 0
            nxt = await fetcher._load_shared(ff, 50)  # same size: the idle buffer would fit
            same = nxt.buffer is held.buffer
            old = [m.body for m in held.messages(0, 50)]
            new = [m.body for m in nxt.messages(50, 100)]
            busy = fetcher.pool.stats.busy
            await fetcher.aclose()
            return old, new, same, busy

        old, new, same, busy = run(store, scenario())
        assert not same
        assert busy >= 1
        assert old == [_body(i) for i in range(50)]
        assert new == [_body(i) for i in range(50, 100)]


def test_a_sequential_consume_reuses_the_buffers_of_batches_it_has_read(tmp_path: Path) -> None:
    # read_ahead_size bounds the pool and the batches kept once read (4 x 60 kB here)
    with _store_with_history(tmp_path, read_ahead_count=50, read_ahead_size=60_000) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> list[bytes]:
            got = []
            offset = 0
            while offset < 400:
                msgs = await fetcher.read(ff, offset, 32)
                got += [m.body for m in msgs]
                offset += len(msgs)
                assert fetcher.pool.bytes <= fetcher.pool.max_bytes
                assert fetcher.cache.passed_bytes <= 240_000
                assert fetcher.cache.bytes <= fetcher.cache.max_bytes
            await fetcher.aclose()
            return got

        bodies = run(store, scenario())
        assert bodies == [_body(i) for i in range(400)]
        assert fetcher.pool.stats.reused >= 2  # later batches received into earlier ones' memory
        assert fetcher.pool.stats.allocated < fetcher.cache.stats.backend_reads


def test_a_reader_behind_finds_a_batch_another_reader_has_read(tmp_path: Path) -> None:
    with _store_with_history(tmp_path, read_ahead_count=50) as store:
        ff, fetcher = _flat_and_fetcher(store)

        async def scenario() -> tuple[int, int, list[bytes]]:
            await fetcher.read(ff, 0, 50)  # read to the end of batch [0, 50)
            misses = fetcher.cache.stats.misses
            behind = await fetcher.read(ff, 10, 20)  # another group, behind it
            await fetcher.aclose()
            return misses, fetcher.cache.stats.misses, [m.body for m in behind]

        before, after, bodies = run(store, scenario())
        assert after == before
        assert bodies == [_body(i) for i in range(10, 30)]
