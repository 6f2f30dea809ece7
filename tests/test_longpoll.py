"""Long-poll accounting: the waiters and wake-ups metrics count consumers' reads only."""

from __future__ import annotations

import asyncio

from tierd.consumption.longpoll import ANY_QUEUE, ArrivalNotifier
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


def test_a_topic_wide_waiter_is_woken_by_any_of_its_queues_only() -> None:
    """A RocketMQ 5 receive waits on its whole topic: an arrival in a queue it had never seen
    wakes it; one in another topic does not."""

    async def scenario() -> tuple[bool, bool, int]:
        arrivals = ArrivalNotifier()
        read = arrivals.register(("orders", ANY_QUEUE))
        arrivals.arrived([("invoices", 0)])
        untouched = arrivals.waiting == 1  # still registered: nothing was sent to wake it
        arrivals.arrived([("orders", 7), ("orders", 3)])
        await asyncio.wait_for(read, 5)
        return untouched, read.done(), arrivals.wakeups

    assert asyncio.run(scenario()) == (True, True, 1)
