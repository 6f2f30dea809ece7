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


def system_copy(message: Message, topic: str, properties: Mapping[str, str]) -> Message:
    """``message`` as its producer gave it, held in queue 0 of the system topic ``topic`` with
    ``properties`` (its own plus the ones saying where it really goes) until the store moves
    it to its real topic: a scheduled message until it is due, a half message until committed.

    Built field by field, not with ``dataclasses.replace``: that cost a tenth of a scheduled
    put (docs/performance.md, "Scheduled messages"). Every field a message has is carried over
    here, in one place, so a field added to :class:`~tierd.message.Message` is not dropped by
    one of the two paths."""
    return Message(
        topic=topic,
        body=message.body,
        queue_id=0,
        keys=message.keys,
        tags=message.tags,
        properties=properties,
        flag=message.flag,
        born_host=message.born_host,
        born_timestamp=message.born_timestamp,
    )
