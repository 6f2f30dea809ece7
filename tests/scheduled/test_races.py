"""Races between the delivery loop and callers on the same loop: a recall scans the schedule topic
too, and a scan whose read finishes late must not put back what the other already delivered.
The interleavings are driven by gating the scheduler's reads on events (no sleeps)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from tierd import BlockingMessageStore
from tierd.message import GetStatus, Message
from tierd.scheduled.timing import SCHEDULE_TOPIC

from .conftest import DEADLINE, now_ms, read_all, tiered_config

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import pytest

    from tierd.format.message_ext import MessageExt


async def _gate(opened: threading.Event) -> None:
    """Hold a read (off the loop's thread, so the loop runs on) until the test opens the gate."""
    if not await asyncio.to_thread(opened.wait, DEADLINE):
        raise AssertionError(f"the test did not open the gate within {DEADLINE} s")


def _wait_until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < deadline, f"not within {DEADLINE} s: {what}"
        time.sleep(0.02)  # polling interval; the deadline bounds the wait


def test_a_recall_scanning_beside_the_delivery_loop_never_delivers_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's scan and a recall's scan both read the message; the loop's finishes first and
    the message is delivered; then the recall's (stale) read comes back. The message must not
    enter the pending set a second time: it is in its topic exactly once."""
    with BlockingMessageStore.open(tiered_config(tmp_path)) as store:
        sched = store.scheduler
        loop_read, loop_go = threading.Event(), threading.Event()
        recall_read, recall_go = threading.Event(), threading.Event()
        real_read = sched._read

        async def gated_read(topic: str, offset: int, count: int) -> tuple[GetStatus, list[MessageExt], int]:
            result = await real_read(topic, offset, count)
            if topic != SCHEDULE_TOPIC or not result[1]:
                return result
            if asyncio.current_task() is sched._task:
                if not loop_read.is_set():
                    loop_read.set()
                    await _gate(loop_go)
            elif not recall_read.is_set():
                recall_read.set()
                await _gate(recall_go)
            return result

        monkeypatch.setattr(sched, "_read", gated_read)
        once = store.schedule(Message(topic="t", body=b"once", queue_id=0), deliver_at=now_ms() + 1_000)
        later = store.schedule(Message(topic="t", body=b"later", queue_id=0), deliver_at=now_ms() + 3_600_000)
        assert loop_read.wait(DEADLINE), "the delivery loop never read the scheduled message"

        with ThreadPoolExecutor(1) as pool:
            recalled = pool.submit(store.recall, later.handle)
            assert recall_read.wait(DEADLINE), "the recall never scanned the schedule topic"
            loop_go.set()  # the loop's scan lands first: the message is delivered...
            _wait_until("the first delivery", lambda: sched.stats.delivered >= 1)
            recall_go.set()  # ...then the recall's read of the same offsets comes back
            assert recalled.result(DEADLINE) is True

        # A message due after the first one is delivered after any copy of it (delivery order):
        # once it is in the topic, a second copy would be there too.
        store.schedule(Message(topic="t", body=b"after", queue_id=0), deliver_at=now_ms() + 1_000)
        _wait_until("the barrier message", lambda: b"after" in [m.body for m in read_all(store, "t")])
        msgs = read_all(store, "t")
        assert [m.body for m in msgs] == [b"once", b"after"], "delivered twice (or lost)"
        assert msgs[0].uniq_key == once.msg_id
        assert sched.stats.delivered == 2
        assert sched.stats.recalls == 1
