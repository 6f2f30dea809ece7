"""Consumer groups: commits checked against the queues, lag per queue, and resets.

The offsets themselves live in :mod:`tierd.consumption.offsets`; this module decides what a valid commit or
reset is, over the merged offset range of both tiers (what :meth:`~tierd.MessageStore.get`
serves), and reports lag the way RocketMQ's ``consumerProgress`` does: per queue, the max
offset minus the committed offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from tierd.consumption.offsets import check_group
from tierd.errors import InvalidArgumentError, NotFoundError, OffsetOutOfRangeError
from tierd.local.validation import check_queue, check_topic

if TYPE_CHECKING:
    from collections.abc import Callable

    from tierd.consumption.offsets import ConsumerOffsets, QueueKey
    from tierd.router import TierRouter

ResetTo = Literal["earliest", "latest", "timestamp", "offset"]
RESET_TARGETS: tuple[str, ...] = get_args(ResetTo)


@dataclass(frozen=True, slots=True)
class QueueLag:
    """One queue of a group's topic: where the group stands and how far behind it is."""

    topic: str
    queue_id: int
    #: None when the group never committed an offset for this queue.
    committed: int | None
    min_offset: int
    max_offset: int

    @property
    def lag(self) -> int:
        """Messages after the committed offset (from the earliest when none is committed)."""
        start = self.min_offset if self.committed is None else self.committed
        return max(0, self.max_offset - start)

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "queue_id": self.queue_id,
            "committed": self.committed,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "lag": self.lag,
        }


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group: every queue of the topics it committed offsets for."""

    group: str
    queues: tuple[QueueLag, ...]

    @property
    def lag(self) -> int:
        return sum(q.lag for q in self.queues)

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "lag": self.lag, "queues": [q.as_dict() for q in self.queues]}


class ConsumerGroups:
    def __init__(
        self,
        offsets: ConsumerOffsets,
        router: TierRouter,
        topics: Callable[[], dict[str, list[int]]],
        max_queues: int,
    ) -> None:
        self.offsets = offsets
        self.router = router
        self._topics = topics
        self._max_queues = max_queues

    def check_commit(self, group: str, topic: str, queue_id: int, offset: int) -> QueueKey:
        """Validate a commit: a known queue, and an offset no further than its end (the offset
        to read next — up to the max offset; one below the min offset is accepted: retention
        may have moved past a slow consumer)."""
        check_group(group)
        check_topic(topic)
        check_queue(queue_id, self._max_queues)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidArgumentError(f"offset must be a non-negative integer, got {offset!r}")
        known, lo, hi = self.router.bounds(topic, queue_id)
        if not known:
            raise NotFoundError(f"queue {topic}/{queue_id} does not exist", topic=topic, queue_id=queue_id)
        if offset > hi:
            raise OffsetOutOfRangeError(
                f"offset {offset} is beyond the end of {topic}/{queue_id}: readable offsets are "
                f"[{lo}, {hi}), so the offset to read next is at most {hi}",
                offset=offset,
                min_offset=lo,
                max_offset=hi,
            )
        return topic, queue_id

    def info(self, group: str | None = None) -> list[GroupInfo]:
        """Every group (or ``group``: NotFoundError if it has no offsets) with its lag."""
        if group is not None:
            check_group(group)
        names = self.offsets.groups() if group is None else [group]
        topics = self._topics()
        out: list[GroupInfo] = []
        for name in names:
            committed = self.offsets.get(name)
            if not committed and group is not None:
                raise NotFoundError(f"consumer group {name!r} has no committed offsets", group=name)
            rows: list[QueueLag] = []
            for topic in sorted({t for t, _ in committed}):
                for qid in sorted({*topics.get(topic, ()), *(q for t, q in committed if t == topic)}):
                    _, lo, hi = self.router.bounds(topic, qid)
                    rows.append(QueueLag(topic, qid, committed.get((topic, qid)), lo, hi))
            out.append(GroupInfo(name, tuple(rows)))
        return out

    async def reset_plan(
        self,
        group: str,
        topic: str,
        to: str,
        *,
        timestamp: int | None = None,
        offset: int | None = None,
        queue_id: int | None = None,
    ) -> dict[QueueKey, int]:
        """The offsets a reset sets: per queue of ``topic`` (or only ``queue_id``), its earliest
        offset, its latest (max) offset, the first offset stored at/after ``timestamp`` (ms), or
        ``offset`` (one queue; it must lie within the queue's range — no silent clamp)."""
        check_group(group)
        check_topic(topic)
        if to not in RESET_TARGETS:
            raise InvalidArgumentError(f"reset target must be one of {', '.join(RESET_TARGETS)}, got {to!r}")
        if (timestamp is not None) != (to == "timestamp"):
            raise InvalidArgumentError("a timestamp goes with (and only with) a reset to 'timestamp'")
        if (offset is not None) != (to == "offset"):
            raise InvalidArgumentError("an offset goes with (and only with) a reset to 'offset'")
        queues = self._topics().get(topic)
        if not queues:
            raise NotFoundError(f"topic {topic!r} does not exist", topic=topic)
        if queue_id is not None:
            check_queue(queue_id, self._max_queues)
            if queue_id not in queues:
                raise NotFoundError(
                    f"queue {topic}/{queue_id} does not exist", topic=topic, queue_id=queue_id
                )
            queues = [queue_id]
        elif to == "offset":
            raise InvalidArgumentError("a reset to an explicit offset needs the queue id")
        if timestamp is not None and (not isinstance(timestamp, int) or timestamp < 0):
            raise InvalidArgumentError(f"timestamp must be milliseconds since the epoch, got {timestamp!r}")
        plan: dict[QueueKey, int] = {}
        for qid in queues:
            _, lo, hi = self.router.bounds(topic, qid)
            if to == "earliest":
                plan[topic, qid] = lo
            elif to == "latest":
                plan[topic, qid] = hi
            elif to == "timestamp":
                assert timestamp is not None
                plan[topic, qid] = await self.router.offset_for_time(topic, qid, timestamp, False)
            else:
                assert offset is not None
                if isinstance(offset, bool) or not isinstance(offset, int) or not lo <= offset <= hi:
                    raise OffsetOutOfRangeError(
                        f"cannot reset {group} to offset {offset!r} of {topic}/{qid}: its offsets are "
                        f"[{lo}, {hi}] (from the earliest kept to the next to be written)",
                        offset=repr(offset),
                        min_offset=lo,
                        max_offset=hi,
                    )
                plan[topic, qid] = offset
        return plan


__all__ = ["RESET_TARGETS", "ConsumerGroups", "GroupInfo", "QueueLag", "ResetTo"]
