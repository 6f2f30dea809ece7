"""The hot store's tiering-source API (docs/design.md, "The hot store's interface to tiering"):
what the dispatcher, the read router and the facade may ask of it — queue ranges, units from
an offset split at damage, the records of those units, store timestamps — never waiting for
the dispatch thread, and reads through the asyncio facade that leave the event loop free while
they wait for it."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, GetStatus, Message, MessageStore
from tierd.errors import NotReadyError
from tierd.format.record import decode_record
from tierd.local.store import QueueRange

if TYPE_CHECKING:
    from tierd import TierdConfig


def _broken(topic: str, queue_id: int) -> Any:
    raise OSError(f"consume queue {topic}/{queue_id} unwritable")


def test_queue_keys_and_ranges(store: BlockingMessageStore) -> None:
    store.put_batch([Message(topic="t", body=b"a", queue_id=q) for q in (0, 0, 0, 1, 1)])
    hot = store.hot
    assert hot.wait_dispatched(10)
    assert hot.queue_keys() == [("t", 0), ("t", 1)]
    assert hot.queue_range("t", 0) == QueueRange(0, 3)
    assert hot.acknowledged_range("t", 1) == QueueRange(0, 2)
    assert hot.queue_range("t", 2) is None
    assert hot.acknowledged_range("nope", 0) is None
    assert not hot.dispatch_pending(("t", 0))
    assert not hot.dispatch_pending()


def test_acknowledged_offsets_are_counted_before_they_are_dispatched(store: BlockingMessageStore) -> None:
    hot = store.hot
    working = hot.reput.queue_for
    hot.reput.queue_for = _broken  # acknowledged, never dispatched until restored
    try:
        store.put_batch([Message(topic="t", body=b"a", queue_id=0)] * 2)
        assert hot.dispatch_pending(("t", 0))
        assert hot.dispatch_pending()
        assert hot.queue_range("t", 0) is None  # nothing readable yet
        assert hot.acknowledged_range("t", 0) == QueueRange(0, 2)
        assert hot.source_units("t", 0, 0, 10) is None
    finally:
        hot.reput.queue_for = working
    assert hot.wait_dispatched(10)
    assert not hot.dispatch_pending(("t", 0))
    assert hot.queue_range("t", 0) == QueueRange(0, 2)


def test_source_units_and_records_are_the_queue_messages(store: BlockingMessageStore) -> None:
    bodies = [b"x" * n for n in (10, 200, 3000, 7)]
    store.put_batch([Message(topic="t", body=b, queue_id=0, tags="paid") for b in bodies])
    hot = store.hot
    assert hot.wait_dispatched(10)
    units = hot.source_units("t", 0, 1, 10)
    assert units is not None
    assert (units.offset, units.lost, len(units)) == (1, 0, 3)
    records = hot.source_records(units)
    assert len(records) == int(units.sizes.sum())
    pos = 0
    got = store.get("t", 0, 1, 10).messages
    for i, size in enumerate(units.sizes.tolist()):
        m = decode_record(bytes(records[pos : pos + size]), 0, limit=size, check_crc=True)
        assert (m.queue_offset, m.body, m.commitlog_offset) == (1 + i, bodies[1 + i], units.positions[i])
        assert hot.store_timestamp("t", 0, 1 + i) == got[i].store_timestamp
        assert hot.position("t", 0, 1 + i) == got[i].commitlog_offset
        pos += size
    # Into a reused buffer: its first bytes when it is large enough, else a new buffer.
    big, small = bytearray(b"\xff" * (len(records) + 5)), bytearray(3)
    into_big, into_small = hot.source_records(units, big), hot.source_records(units, small)
    assert into_big.obj is big
    assert into_small.obj is not small
    assert bytes(into_big) == bytes(into_small) == bytes(records) == bytes(big[: len(records)])
    assert len(set(units.tags_codes.tolist())) == 1  # one tag, one code
    head = units.head(2)
    assert (len(head), head.positions.tolist()) == (2, units.positions[:2].tolist())
    assert hot.source_units("t", 0, 4, 10) is None  # nothing past the end
    assert hot.store_timestamp("t", 0, 4) is None
    assert hot.position("t", 0, 4) is None
    assert hot.end_position == hot.commitlog.max_offset


def test_source_units_split_at_quarantined_damage(store: BlockingMessageStore) -> None:
    store.put_batch([Message(topic="t", body=b"m%d" % i, queue_id=0) for i in range(5)])
    hot = store.hot
    assert hot.wait_dispatched(10)
    whole = hot.source_units("t", 0, 0, 10)
    assert whole is not None
    assert len(whole) == 5
    # Messages 2 and 3 lost to damage (what recovery records after a torn or rotten range).
    start, end = int(whole.positions[2]), int(whole.positions[4])
    hot.quarantine.add(start, end, b"", [])
    before = hot.source_units("t", 0, 0, 10)
    assert before is not None
    assert (before.lost, len(before)) == (0, 2)  # cut before the damage
    hole = hot.source_units("t", 0, 2, 10)
    assert hole is not None
    assert (hole.lost, len(hole)) == (2, 0)  # a hole of two, no units
    after = hot.source_units("t", 0, 4, 10)
    assert after is not None
    assert (after.lost, len(after), after.positions[0]) == (0, 1, end)
    assert hot.store_timestamp("t", 0, 2) is None  # lost: no timestamp


def test_a_read_waiting_for_dispatch_leaves_the_event_loop_free(cfg: TierdConfig) -> None:
    # A read of an acknowledged offset not yet dispatched waits for the dispatch thread. It used
    # to wait on a threading condition on the event loop (up to 5 s): nothing else ran, so the
    # task below that repairs dispatch could not run until the read had given up and answered
    # from the stale queue (NO_MATCHED_LOGIC_QUEUE). Waiting in a worker thread, the loop runs it.
    async def main() -> None:
        async with MessageStore.open(cfg) as store:
            working = store.hot.reput.queue_for
            store.hot.reput.queue_for = _broken
            await store.put(Message(topic="t", body=b"x", queue_id=0))
            reading = asyncio.create_task(store.get("t", 0, 0))
            await asyncio.sleep(0)  # one turn of the loop: the read starts and reaches its wait
            store.hot.reput.queue_for = working  # runs only while the loop is free
            r = await reading
            assert r.status is GetStatus.FOUND, r
            assert [m.body for m in r.messages] == [b"x"]

    asyncio.run(main())


def test_a_read_whose_writes_never_dispatch_ends_in_a_clear_error(
    cfg: TierdConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tierd.router

    monkeypatch.setattr(tierd.router, "READ_YOUR_WRITES_WAIT", 0.2)

    async def main() -> None:
        async with MessageStore.open(cfg) as store:
            working = store.hot.reput.queue_for
            store.hot.reput.queue_for = _broken
            try:
                await store.put(Message(topic="t", body=b"x", queue_id=0))
                with pytest.raises(NotReadyError, match=r"reading t/0: .* dispatch keeps failing"):
                    await store.get("t", 0, 0)
                with pytest.raises(NotReadyError, match=r"reading the key index: "):
                    await store.query("t", "k")
                assert store.max_offset("t", 0) == 1  # acknowledged, without waiting
            finally:
                store.hot.reput.queue_for = working
            assert await asyncio.to_thread(store.hot.wait_dispatched, 30)
            assert (await store.get("t", 0, 0)).status is GetStatus.FOUND

    asyncio.run(main())


def test_the_blocking_facade_without_a_cold_tier_waits_in_place(
    store: BlockingMessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No event loop runs its reads (they must never suspend): the wait for dispatch happens in
    # the calling thread. Dispatch is repaired once the read is waiting.
    hot = store.hot
    working = hot.reput.queue_for
    waiting = threading.Event()
    wait = hot.require_dispatched

    def spy(timeout: float, what: str) -> None:
        waiting.set()
        wait(timeout, what)

    def repair() -> None:
        if waiting.wait(30):
            hot.reput.queue_for = working

    monkeypatch.setattr(hot, "require_dispatched", spy)
    hot.reput.queue_for = _broken
    repairer = threading.Thread(target=repair, daemon=True)
    try:
        store.put(Message(topic="t", body=b"x", queue_id=0))
        repairer.start()
        assert store.get("t", 0, 0).status is GetStatus.FOUND
    finally:
        waiting.set()
        repairer.join()
        hot.reput.queue_for = working
