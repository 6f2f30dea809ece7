"""Per-topic traffic: messages and body bytes produced and consumed, for /metrics.

Why the store counts, not the transports: a 1,024-message batch is one HTTP request and one
gRPC call, but 1,024 messages. Produce is counted by the store facade (:meth:`put`,
:meth:`put_batch`, :meth:`schedule`, :meth:`put_half` of :mod:`tierd.store`) once a message is
acknowledged, so HTTP, gRPC, the CLI and embedding code count alike and once. Consume is
counted where messages are handed to a consumer (the HTTP read, gRPC receive and pull): the
facade's ``get`` is also how the store reads for itself (redeliveries, dead-lettering), which
is not consumption.

Topics are created by users, so the label set is bounded: the first ``max_topics`` topics seen
get series of their own; traffic of any further topic is added to :data:`OTHER`, a label no
topic can have (``(`` is not allowed in a topic name). Memory is bounded the same way.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from tierd.format.message_ext import MessageExt
    from tierd.message import Message

#: The ``topic`` label of traffic beyond ``server.metrics_max_topics`` topics.
OTHER = "(other)"

_topic: Callable[[Message], str] = attrgetter("topic")
_body: Callable[[Message], bytes] = attrgetter("body")


@dataclass(frozen=True, slots=True)
class TopicCounts:
    """One topic's totals since the store opened."""

    produced_messages: int
    produced_bytes: int
    consumed_messages: int
    consumed_bytes: int


class TopicTraffic:
    """Counters keyed by topic label; thread-safe (the blocking facade puts from any thread)."""

    def __init__(self, max_topics: int) -> None:
        self.max_topics = max_topics
        self._lock = threading.Lock()
        #: label → [produced messages, produced bytes, consumed messages, consumed bytes]
        self._counts: dict[str, list[int]] = {}

    def _slot(self, topic: str) -> list[int]:
        """The counters of ``topic``'s label (caller holds the lock)."""
        slot = self._counts.get(topic)
        if slot is None:
            named = len(self._counts) - (OTHER in self._counts)
            label = topic if named < self.max_topics else OTHER
            slot = self._counts.setdefault(label, [0, 0, 0, 0])
        return slot

    def produced(self, topic: str, messages: int, nbytes: int) -> None:
        with self._lock:
            slot = self._slot(topic)
            slot[0] += messages
            slot[1] += nbytes

    def produced_one(self, message: Message) -> None:
        self.produced(message.topic, 1, len(message.body))

    def produced_batch(self, messages: Sequence[Message]) -> None:
        """A batch may mix topics: each message counts under its own. The usual one-topic batch
        is summed in C (``map``), a few ns a message beside the put's µs."""
        topics = set(map(_topic, messages))
        if len(topics) == 1:
            self.produced(topics.pop(), len(messages), sum(map(len, map(_body, messages))))
            return
        per: dict[str, list[int]] = {}
        for m in messages:
            c = per.get(m.topic)
            if c is None:
                c = per[m.topic] = [0, 0]
            c[0] += 1
            c[1] += len(m.body)
        for topic, (n, size) in per.items():
            self.produced(topic, n, size)

    def consumed(self, topic: str, messages: Iterable[MessageExt]) -> None:
        """``messages`` were handed to a consumer of ``topic``."""
        n = size = 0
        for m in messages:
            n += 1
            size += len(m.body)
        if not n:
            return
        with self._lock:
            slot = self._slot(topic)
            slot[2] += n
            slot[3] += size

    def snapshot(self) -> dict[str, TopicCounts]:
        """Label → totals, for a scrape."""
        with self._lock:
            return {label: TopicCounts(*c) for label, c in sorted(self._counts.items())}
