"""Long-poll accounting: the waiters and wake-ups metrics count consumers' reads only."""

from __future__ import annotations

import asyncio

from tierd.consumption.longpoll import ArrivalNotifier
from tierd.scheduled.timing import SCHEDULE_TOPIC


def test_the_stores_own_waits_on_system_topics_are_not_reads() -> None:
    async def scenario() -> tuple[int, int, int]:
        arrivals = ArrivalNotifier()
        internal = arrivals.register((SCHEDULE_TOPIC, 0))  # the scheduler's wait
        read = arrivals.register(("orders", 0))  # a consumer's long poll
        waiting = arrivals.waiting
        arrivals.arrived([(SCHEDULE_TOPIC, 0), ("orders", 0)])
        await asyncio.wait_for(asyncio.gather(internal, read), 5)
        return waiting, arrivals.wakeups, arrivals.waiting

    assert asyncio.run(scenario()) == (1, 1, 0)
