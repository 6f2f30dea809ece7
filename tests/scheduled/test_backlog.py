"""A large backlog of due scheduled messages drains without stalling producers: the scheduler
delivers in batches on the store's event loop and yields between them, so puts made on that same
loop keep completing while the backlog is delivered."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from tierd import BlockingMessageStore, MessageStore, TierdConfig
from tierd.message import Message

from .conftest import DEADLINE, SMALL_STORE, now_ms, read_all

if TYPE_CHECKING:
    from pathlib import Path

#: Scheduled messages all due at once when the scheduler starts.
BACKLOG = 20_000
#: Scheduled puts in flight at once while building the backlog (group commit does the rest).
WINDOW = 500


def _config(root: Path, *, enabled: bool = True) -> TierdConfig:
    """A hot store whose files hold the backlog without rolling over every few thousand; a put
    is acknowledged once durable (``sync``), as a producer that must not lose it asks."""
    store = {**SMALL_STORE, "commitlog_file_size": 16 * 1024 * 1024, "index_items": 200_000, "flush": "sync"}
    return TierdConfig.from_dict(
        {
            "store": {"dir": str(root / "hot"), **store, "consumequeue_file_units": 65_536},
            "tiered": {"enabled": False},
            "scheduled": {"enabled": enabled, "batch": 256},
        }
    )


async def _schedule_backlog(store: MessageStore) -> int:
    """Schedule BACKLOG messages 1 s ahead (delay level 1: counted from each put, so a put that
    waits its turn on a loaded machine is never refused as due in the past); the latest delivery
    time."""
    last = 0
    for start in range(0, BACKLOG, WINDOW):
        results = await asyncio.gather(
            *(
                store.schedule(Message(topic="due", body=b"d%d" % i, queue_id=0), delay_level=1)
                for i in range(start, min(BACKLOG, start + WINDOW))
            )
        )
        last = max(last, *(r.deliver_at for r in results))
    return last


def test_due_backlog_drains_while_producers_keep_putting(tmp_path: Path) -> None:
    """Built with the scheduler off, the backlog is entirely due when it is turned on. A producer
    on the same loop puts one message at a time until the backlog is delivered: its puts complete
    during the drain (a scheduler that held the loop until the backlog was empty would let none
    through) and every one is acknowledged and readable afterwards."""

    async def build() -> int:
        async with MessageStore.open(_config(tmp_path, enabled=False)) as store:
            return await _schedule_backlog(store)

    last_due = asyncio.run(build())
    deadline = time.monotonic() + DEADLINE
    while now_ms() <= last_due:  # every message due before the scheduler starts
        assert time.monotonic() < deadline
        time.sleep(0.05)  # waiting for a clock time, not for another thread

    async def drain() -> tuple[int, int, int]:
        async with MessageStore.open(_config(tmp_path)) as store:
            during = puts = 0
            end = time.monotonic() + DEADLINE
            while store.scheduler.stats.delivered < BACKLOG:
                assert time.monotonic() < end, f"{store.scheduler.stats.delivered} of {BACKLOG} delivered"
                before = store.scheduler.stats.delivered
                r = await store.put(Message(topic="live", body=b"p%d" % puts, queue_id=0))
                assert r.queue_offset == puts
                puts += 1
                if before > 0 and store.scheduler.stats.delivered < BACKLOG:
                    during += 1  # put and acknowledged while the backlog was being delivered
            return during, puts, store.scheduler.stats.delivered

    during, puts, delivered = asyncio.run(drain())
    assert delivered == BACKLOG
    assert during > 0, "no put completed while the backlog was delivered: producers stalled"
    with BlockingMessageStore.open(_config(tmp_path)) as store:
        assert [m.body for m in read_all(store, "live")] == [b"p%d" % i for i in range(puts)]
        delivered_bodies = [m.body for m in read_all(store, "due")]
        assert sorted(delivered_bodies) == sorted(b"d%d" % i for i in range(BACKLOG))  # each once
