"""The cold read path's receive buffer pool: bounded, and never hands out a buffer still viewed."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tierd.tiered.bufferpool import BufferPool, capacity_for, unviewed


def test_a_viewed_buffer_is_not_handed_out_again_until_the_view_is_gone() -> None:
    pool = BufferPool(1 << 20, expire=3600)
    buf = pool.acquire(10_000)
    view = memoryview(buf)[:10_000]  # what a cached batch decodes from
    pool.release(buf)  # the cache dropped the batch while a reader still holds it
    other = pool.acquire(10_000)
    assert other is not buf
    assert pool.stats.busy == 1
    view.release()
    assert pool.acquire(10_000) is buf  # nothing views it any more: reused
    assert pool.stats.reused == 1


def test_a_numpy_view_or_a_slice_of_a_view_also_keeps_the_buffer_out_of_use() -> None:
    pool = BufferPool(1 << 20, expire=3600)
    buf = pool.acquire(8192)
    column = np.frombuffer(memoryview(buf)[:8192], np.uint8)
    piece = memoryview(buf)[100:200]
    pool.release(buf)
    assert pool.acquire(8192) is not buf
    del column
    assert pool.acquire(8192) is not buf  # the slice still views it
    piece.release()
    assert pool.acquire(8192) is buf


def test_checking_for_views_keeps_the_buffer_as_it_was() -> None:
    buf = bytearray(capacity_for(5000))
    size = len(buf)
    assert unviewed(buf)
    assert len(buf) == size
    with memoryview(buf):
        assert not unviewed(buf)
    assert len(buf) == size
    assert unviewed(buf)


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 300_000)), max_size=60))
def test_the_pool_never_holds_more_than_its_bound(steps: list[tuple[bool, int]]) -> None:
    pool = BufferPool(1_000_000, expire=3600)
    held: list[bytearray] = []
    for give_back, size in steps:
        if give_back and held:
            pool.release(held.pop(size % len(held)))
        else:
            buf = pool.acquire(size)
            assert len(buf) >= size
            assert not any(buf is h for h in held)  # never handed out twice
            held.append(buf)
        assert pool.bytes <= pool.max_bytes
        assert pool.bytes == sum(len(b) for b in pool._idle_buffers())


def test_a_buffer_serves_loads_a_little_larger_but_not_much_smaller() -> None:
    pool = BufferPool(1 << 24, expire=3600)
    buf = pool.acquire(4_000_000)
    pool.release(buf)
    assert pool.acquire(100_000) is not buf  # would waste most of it
    assert pool.acquire(len(buf)) is buf
    assert capacity_for(4_000_000) - 4_000_000 <= 4_000_000 // 8
