"""Long polling: a read that finds nothing new waits for the next message of its queue.

RocketMQ parks such pulls in ``PullRequestHoldService`` and wakes them from the reput thread
(``NotifyMessageArrivingListener``). Here a waiting read is an asyncio future registered under
its (topic, queue): no thread and no timer per waiter, no polling. The hot store's dispatch
thread calls :meth:`ArrivalNotifier.arrived` after each batch of units became readable; the
waiters of those queues are woken on their own event loop and read again (a waiter whose
filter the new messages do not match goes back to waiting until its deadline).

Order makes it race-free: a waiter registers *before* its read, and dispatch notifies *after*
the units are written — a message either is seen by the read or wakes the future.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING

from tierd.systopics import is_system_topic

if TYPE_CHECKING:
    from collections.abc import Iterable

QueueKey = tuple[str, int]
#: The queue id of a waiter woken by an arrival in any queue of its topic: a RocketMQ 5 receive
#: reads every queue, including ones a producer has not written to yet when it starts waiting.
ANY_QUEUE = -1


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _wake_from_any_thread(fut: asyncio.Future[None]) -> None:
    with contextlib.suppress(RuntimeError):  # its loop is closed: nobody awaits it any more
        fut.get_loop().call_soon_threadsafe(_wake, fut)


class ArrivalNotifier:
    """Waiters per queue, woken from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[QueueKey, set[asyncio.Future[None]]] = {}
        #: Set by :meth:`release` (draining, closing): every wait ends at once, none starts.
        self.released = False
        #: Consumers' reads woken by arrivals so far (a metric; the store's own waits on its
        #: system topics, such as the scheduler's, are not counted).
        self.wakeups = 0

    def register(self, key: QueueKey) -> asyncio.Future[None]:
        """A future completed by the next arrival in ``key`` — in any queue of the topic when
        its queue id is :data:`ANY_QUEUE` — (already completed when released). Call on the
        event loop that will await it; :meth:`unregister` it afterwards."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self.released:
                fut.set_result(None)
            else:
                self._waiters.setdefault(key, set()).add(fut)
        return fut

    def unregister(self, key: QueueKey, fut: asyncio.Future[None]) -> None:
        with self._lock:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._waiters[key]

    def arrived(self, keys: Iterable[QueueKey]) -> None:
        """Messages became readable in ``keys`` (called by the dispatch thread: cheap when
        nobody waits)."""
        if not self._waiters:
            return
        with self._lock:
            woken: list[asyncio.Future[None]] = []
            for key in keys:
                waiters = [*self._waiters.pop(key, ()), *self._waiters.pop((key[0], ANY_QUEUE), ())]
                woken.extend(waiters)
                if not is_system_topic(key[0]):
                    self.wakeups += len(waiters)
        for fut in woken:
            _wake_from_any_thread(fut)

    def release(self) -> None:
        """End every wait now and refuse new ones (the daemon drains, or the store closes)."""
        with self._lock:
            self.released = True
            woken = [f for waiters in self._waiters.values() for f in waiters]
            self._waiters.clear()
        for fut in woken:
            _wake_from_any_thread(fut)

    @property
    def waiting(self) -> int:
        """Consumers' reads waiting now (a metric). The store's own waits on its system topics
        (the scheduler waiting for new scheduled messages) are not reads and are not counted."""
        with self._lock:
            return sum(len(w) for key, w in self._waiters.items() if not is_system_topic(key[0]))


__all__ = ["ANY_QUEUE", "ArrivalNotifier"]
