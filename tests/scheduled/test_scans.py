"""The scheduler does not read back each scheduled message: a put due later than the lookahead
tells it the offset and delivery time and wakes nothing; the round made at least once per idle
wait takes in what it was told (docs/scheduled.md). Counted, not timed: what is read back is
bounded by the rounds the elapsed time allows, whatever the machine's speed."""

from __future__ import annotations

import collections
import math
import time
from typing import TYPE_CHECKING

from tierd import BlockingMessageStore
from tierd.message import Message
from tierd.scheduled import scheduler
from tierd.scheduled.scheduler import IDLE_WAIT

from .conftest import DEADLINE, hot_config, now_ms, read_all, wait_for_count

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import pytest

#: Scheduled puts due in an hour: reading each back would be far above the bound.
N = 3_000


def _wait_until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < deadline, f"not within {DEADLINE} s: {what}"
        time.sleep(0.02)  # polling interval; the deadline bounds the wait


def test_puts_due_later_are_not_read_back_one_by_one(tmp_path: Path) -> None:
    """N puts due in an hour, from one producer thread: each tells the scheduler its offset and
    delivery time, so the scheduler reads back only what it had not been told of when a round
    began — at most the one put between its append and its telling, per round — and makes no
    read at all otherwise. The rounds are bounded by the elapsed time (one per IDLE_WAIT, or per
    checkpoint interval when shorter, plus the first and the last). Every message is still
    taken in, and one due soon put after them is delivered without waiting for the others."""
    cfg = hot_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        sched = store.scheduler
        _wait_until("the scheduler's start", sched.started.is_set)
        start = time.monotonic()
        due = now_ms() + 3_600_000
        for i in range(N):
            store.schedule(Message(topic="later", body=b"%d" % i, queue_id=0), deliver_at=due)
        _wait_until(f"all {N} taken in", lambda: len(sched.pending) == N)
        elapsed = time.monotonic() - start

        rounds = math.ceil(elapsed / min(IDLE_WAIT, cfg.scheduled.checkpoint_interval)) + 2
        read_back = N - sched.stats.told
        assert read_back <= rounds, f"{read_back} of {N} read back in {elapsed:.1f} s ({rounds} rounds)"
        assert sched.stats.scans <= rounds

        store.schedule(Message(topic="soon", body=b"soon", queue_id=0), deliver_at=now_ms() + 500)
        assert [m.body for m in wait_for_count(store, "soon", 1)] == [b"soon"]
        assert len(sched.pending) == N  # the others wait for their time
        assert sched.stats.delivered == 1


def test_offsets_no_put_told_of_are_read_between_told_ones(tmp_path: Path) -> None:
    """What the scheduler was not told of is read from the topic, and nothing is taken in twice:
    with room for only 10 told offsets, a burst of 100 puts due in an hour overflows it (the
    oldest told are dropped, as for a stalled scheduler), and one due soon in the middle is
    never told of. All are taken in once, the one due soon is delivered once."""
    with BlockingMessageStore.open(hot_config(tmp_path)) as store:
        sched = store.scheduler
        _wait_until("the scheduler's start", sched.started.is_set)
        sched._told = collections.deque(maxlen=10)
        due = now_ms() + 3_600_000
        for i in range(50):
            store.schedule(Message(topic="later", body=b"%d" % i, queue_id=0), deliver_at=due)
        store.schedule(Message(topic="soon", body=b"soon", queue_id=0), deliver_at=now_ms() + 1_500)
        for i in range(50, 100):
            store.schedule(Message(topic="later", body=b"%d" % i, queue_id=0), deliver_at=due)

        assert [m.body for m in wait_for_count(store, "soon", 1)] == [b"soon"]
        _wait_until("all 100 taken in", lambda: len(sched.pending) == 100)
        assert sched.stats.scans >= 1  # the gaps were read
        assert sorted(sched.pending) == [o for o in range(101) if o != 50]
        assert sched.stats.delivered == 1
        assert [m.body for m in read_all(store, "soon")] == [b"soon"]


def test_told_offsets_half_filling_their_deque_wake_the_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts due later wake nothing, but once their told offsets fill half the deque they wake
    the scheduler: a producer faster than MAX_TOLD a round would otherwise overflow it, and
    every offset dropped is read back (docs/performance.md, "Scheduled messages"). With rounds
    an hour apart, only that wake can take them in."""
    monkeypatch.setattr(scheduler, "MAX_TOLD", 64)
    monkeypatch.setattr(scheduler, "IDLE_WAIT", 3600.0)
    with BlockingMessageStore.open(hot_config(tmp_path, checkpoint_interval=3600)) as store:
        sched = store.scheduler
        _wait_until("the scheduler's start", sched.started.is_set)
        due = now_ms() + 3_600_000
        for i in range(40):
            store.schedule(Message(topic="later", body=b"%d" % i, queue_id=0), deliver_at=due)
        _wait_until("the half-full deque taken in", lambda: sched.stats.told >= 32)
        assert len(sched.pending) == sched.stats.told  # taken in without reading them back
