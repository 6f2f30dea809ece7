"""Which topics are the store's own bookkeeping, not user data: the one owner of that rule.

Scheduled messages (:mod:`tierd.scheduled.timing`) and transactions
(:mod:`tierd.transactions.names`) keep their state in topics named as RocketMQ names them, so a
RocketMQ-literate operator recognises them. Those packages own the names; this module owns the
rule that they are *system* topics: every listing and every "all topics" scan (the facade's
``topics()`` / ``list_topics()``, ``GET /v1/topics``, the Arrow reader and the Spark source)
leaves them out, so a progress record or a half message never looks like a user's message. A
read that names one explicitly still gets it — operators inspect them that way.

Dead-letter topics (``%DLQ%<group>``) are not system topics: in RocketMQ they are user-visible
by design (a consumer group reads its dead letters back), and so they are here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from tierd.message import Message
from tierd.scheduled.timing import SYSTEM_TOPICS as _SCHEDULED
from tierd.transactions.names import SYSTEM_TOPICS as _TRANSACTIONS

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Every system topic the store may write.
SYSTEM_TOPICS: Final = _SCHEDULED | _TRANSACTIONS


def is_system_topic(topic: str) -> bool:
    """Is ``topic`` one of the store's own (left out of listings and "all topics" scans)?"""
    return topic in SYSTEM_TOPICS


_new_object = object.__new__
_SET = {name: Message.__dict__[name].__set__ for name in Message.__slots__}
_set_topic, _set_body, _set_queue_id = _SET["topic"], _SET["body"], _SET["queue_id"]
_set_keys, _set_tags, _set_properties = _SET["keys"], _SET["tags"], _SET["properties"]
_set_flag, _set_born_host, _set_born_timestamp = _SET["flag"], _SET["born_host"], _SET["born_timestamp"]
if len(_SET) != 9:  # a field added to Message must be carried over below
    raise ImportError(f"system_copy does not copy every field of Message: {sorted(_SET)}")


def system_copy(message: Message, topic: str, properties: Mapping[str, str]) -> Message:
    """``message`` as its producer gave it, held in queue 0 of the system topic ``topic`` with
    ``properties`` (its own plus the ones saying where it really goes) until the store moves
    it to its real topic: a scheduled message until it is due, a half message until committed.

    Every field is carried over here, in one place, so neither path drops one. Built through
    the slots' descriptors rather than ``Message(...)`` or ``dataclasses.replace``: a frozen
    dataclass's ``__init__`` pays an ``object.__setattr__`` per field, and with nine fields that
    was a tenth of a scheduled put (docs/performance.md, "Scheduled messages"). The message was
    checked when it was built; the copy is the same values."""
    c: Message = _new_object(Message)
    _set_topic(c, topic)
    _set_body(c, message.body)
    _set_queue_id(c, 0)
    _set_keys(c, message.keys)
    _set_tags(c, message.tags)
    _set_properties(c, properties)
    _set_flag(c, message.flag)
    _set_born_host(c, message.born_host)
    _set_born_timestamp(c, message.born_timestamp)
    return c
