"""Pull-style consumption (RocketMQ 5's ``QueryOffset``, ``GetOffset``, ``UpdateOffset``,
``PullMessage``): the client keeps its own position per queue and commits it to the group's
committed offset — the same store as HTTP consumer groups and receive / ack groups, so
``tierd groups`` shows all of them and ``tierd groups reset`` moves any of them.

Pulls read across both tiers (the store's read policy decides), so an offset reset back into
tiered data is pulled exactly like hot data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tierd.consumption.inflight import MAX_BATCH
from tierd.consumption.offsets import check_group
from tierd.errors import InvalidArgumentError, InvalidQueueError, NotFoundError
from tierd.message import GetStatus

if TYPE_CHECKING:
    from tierd.consumption.subscription import TagFilter
    from tierd.format.message_ext import MessageExt
    from tierd.store import MessageStore


class OffsetNotFoundError(NotFoundError):
    """The group has committed nothing for the queue yet (the client picks a start itself,
    e.g. with ``QueryOffset``)."""

    code = "offset_not_found"


class PulledOffsetError(InvalidArgumentError):
    """A pull from an offset that is not readable: below the oldest message kept (retention
    removed it) or past the end. ``next_offset`` is where the client should continue."""

    code = "offset_out_of_range"

    def __init__(self, message: str, next_offset: int, **details: object) -> None:
        super().__init__(message, next_offset=next_offset, **details)
        self.next_offset = next_offset


class LostOffsetError(PulledOffsetError):
    """A pull at an offset lost to damage in the bucket (a fenced cold queue, docs/tiering.md
    "Damage in the bucket"): names the lost range; ``next_offset`` stays at the offset — never
    past a message the client did not get — and the client decides to skip (from ``end``)."""

    code = "lost_offset"


#: Which end of a queue ``QueryOffset`` answers (the protocol's ``QueryOffsetPolicy``).
OffsetPolicy = Literal["beginning", "end", "timestamp"]

#: Statuses of a read that mean "nothing (matching) there yet": an empty pull, not an error.
_CAUGHT_UP = frozenset(
    {
        GetStatus.NO_MESSAGE_IN_QUEUE,
        GetStatus.OFFSET_OVERFLOW_ONE,
        GetStatus.NO_MATCHED_MESSAGE,
        GetStatus.OFFSET_FOUND_NULL,
    }
)


def check_queue_of(topic: str, queue_id: int, queues: int) -> None:
    """``queue_id`` is one of the ``queues`` queues of ``topic``."""
    if not 0 <= queue_id < queues:
        raise InvalidQueueError(
            f"queue {queue_id} does not exist: {topic} has queues 0 to {queues - 1}",
            topic=topic,
            queue_id=queue_id,
        )


async def query_offset(
    store: MessageStore, topic: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int | None
) -> int:
    """The queue's first readable offset (both tiers), its end (the next offset to be
    written), or the first offset stored at/after ``timestamp_ms``."""
    if policy == "beginning":
        await store.wait_ready()
        return store.min_offset(topic, queue_id)
    if policy == "end":
        return store.max_offset(topic, queue_id)
    if timestamp_ms is None:
        raise InvalidArgumentError("QueryOffset with policy TIMESTAMP needs a timestamp")
    return await store.offset_for_time(topic, queue_id, timestamp_ms)


def get_offset(store: MessageStore, group: str, topic: str, queue_id: int) -> int:
    """The group's committed offset (the next to read) on the queue."""
    offset = store.committed_offsets(check_group(group)).get((topic, queue_id))
    if offset is None:
        raise OffsetNotFoundError(
            f"group {group!r} has no committed offset on {topic}/{queue_id}",
            group=group,
            topic=topic,
            queue_id=queue_id,
        )
    return offset


@dataclass(frozen=True, slots=True)
class Pulled:
    """What one pull returns: the messages (maybe none) and where to continue."""

    messages: tuple[MessageExt, ...]
    next_offset: int


async def pull(
    store: MessageStore,
    topic: str,
    queue_id: int,
    offset: int,
    batch: int,
    tags: str | TagFilter | None,
    wait: float,
) -> Pulled:
    """Up to ``batch`` messages of the queue from ``offset`` (matching ``tags``); when caught up,
    wait up to ``wait`` seconds for one. Does not commit: the client says what it consumed
    with ``UpdateOffset``."""
    if not 1 <= batch <= MAX_BATCH:
        raise InvalidArgumentError(f"batch size must be 1 to {MAX_BATCH}, got {batch}", batch=batch)
    if offset < 0:
        raise PulledOffsetError(f"offset must not be negative, got {offset}", 0, offset=offset)
    wait_ms = int(min(max(0.0, wait), store.config.server.long_poll_max_ms / 1000) * 1000)
    r = await store.get(topic, queue_id, offset, batch, tags=tags, wait_ms=wait_ms)
    if r.lost is not None and not r.messages:
        first, end = r.lost
        raise LostOffsetError(
            f"offset {offset} of {topic}/{queue_id} is lost: queue offsets {first}..{end - 1} were "
            f"lost to damage in the bucket; continue at {end} to skip them",
            offset,
            offset=offset,
            first=first,
            end=end,
        )
    if r.messages or r.status in _CAUGHT_UP or (r.status is GetStatus.NO_MATCHED_LOGIC_QUEUE and offset == 0):
        return Pulled(r.messages, r.next_offset)
    raise PulledOffsetError(
        f"offset {offset} of {topic}/{queue_id} is not readable: readable offsets are "
        f"[{r.min_offset}, {r.max_offset}); continue at {r.next_offset}",
        r.next_offset,
        offset=offset,
        min_offset=r.min_offset,
        max_offset=r.max_offset,
    )


async def update_offset(store: MessageStore, group: str, topic: str, queue_id: int, offset: int) -> None:
    """Commit ``offset`` (the next to read) for ``group``; durable when this returns. A
    receive / ack consumer of the same group restarts there (its leases on the queue drop)."""
    await store.commit_offset(check_group(group), topic, queue_id, offset)
