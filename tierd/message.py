"""Public message types: what producers hand in and what a read or put reports back.

These are plain frozen dataclasses with ``slots`` so that creating millions of them stays cheap;
validation happens once in the store (``tierd.local.validation``), not in ``__post_init__``.
The message a read returns, :class:`~tierd.format.message_ext.MessageExt`, is what decoding a
record yields, so it lives with the record format (this module imports it; the format imports
nothing of tierd above it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from tierd.format.message_ext import MessageExt

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Message:
    """A message to store.

    ``keys`` are indexed for :meth:`MessageStore.query` (each must be non-empty and free of
    spaces: RocketMQ stores them space-separated in the ``KEYS`` property). ``tags`` becomes the
    ``TAGS`` property and the consume-queue tags code. ``queue_id=None`` lets the store pick a
    queue round-robin. ``born_host``/``born_timestamp`` default to the store host and the put time.
    """

    topic: str
    body: bytes
    queue_id: int | None = None
    keys: Sequence[str] = ()
    tags: str | None = None
    properties: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    flag: int = 0
    born_host: str | None = None
    born_timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class PutResult:
    """Where an acknowledged message landed."""

    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str


_new_object = object.__new__
_set_queue_id = PutResult.__dict__["queue_id"].__set__
_set_queue_offset = PutResult.__dict__["queue_offset"].__set__
_set_commitlog_offset = PutResult.__dict__["commitlog_offset"].__set__
_set_msg_id = PutResult.__dict__["msg_id"].__set__


def new_put_result(queue_id: int, queue_offset: int, commitlog_offset: int, msg_id: str) -> PutResult:
    """``PutResult(...)`` for the single-put path. A frozen dataclass's ``__init__`` pays an
    ``object.__setattr__`` call per field (0.5 µs, a twentieth of a put); setting the slots
    through their descriptors makes the same object in half the time."""
    r: PutResult = _new_object(PutResult)
    _set_queue_id(r, queue_id)
    _set_queue_offset(r, queue_offset)
    _set_commitlog_offset(r, commitlog_offset)
    _set_msg_id(r, msg_id)
    return r


class GetStatus(enum.Enum):
    """Outcome of :meth:`MessageStore.get`, with RocketMQ's GetMessageStatus semantics."""

    FOUND = "FOUND"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    #: A filtered read (``tags=``) examined units but none matched; ``next_offset`` is past them.
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"


class ReadPolicy(enum.Enum):
    """Which tier serves a read (RocketMQ's ``tieredStorageLevel``)."""

    DISABLE = "DISABLE"
    NOT_IN_DISK = "NOT_IN_DISK"
    NOT_IN_MEM = "NOT_IN_MEM"
    FORCE = "FORCE"


@dataclass(frozen=True, slots=True)
class GetResult:
    """Result of a queue read. ``next_offset`` is where the consumer should continue."""

    status: GetStatus
    messages: tuple[MessageExt, ...]
    next_offset: int
    min_offset: int
    max_offset: int
    source: str = "hot"
    #: With ``OFFSET_FOUND_NULL`` at an offset the cold tier lost to damage in the bucket (a
    #: fenced queue, docs/tiering.md "Damage in the bucket"): the lost queue offsets
    #: ``(first, end)``, so a consumer learns the whole range (and can decide to skip it, from
    #: ``end``) instead of meeting it one offset at a time. None otherwise.
    lost: tuple[int, int] | None = None
