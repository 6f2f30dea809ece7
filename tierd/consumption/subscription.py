"""Tag subscriptions: RocketMQ's subscription expressions (``"paid || refunded"``, ``"*"``).

A consumer names the tags it wants; the store skips the rest *before* it reads them. Two
stages, as RocketMQ does it (broker ``ExpressionMessageFilter`` + client ``tagsSet`` check):

1. **Hash stage** — every consume-queue unit carries the tags code, Java ``String.hashCode`` of
   the message's ``TAGS`` (0 without tags). A unit whose code (its low 32 bits, as RocketMQ
   compares ``tagsCode.intValue()``) is not the code of a subscribed tag is skipped without
   reading its record: numpy over a whole run of units at once.
2. **String stage** — a unit that passes is read and its decoded ``TAGS`` compared with the
   subscribed strings. Two tags with the same hash (``"Aa"`` and ``"BB"``) therefore never
   deliver each other's messages.

Grammar (stricter than RocketMQ's, which silently drops empty pieces): ``*`` (or an empty or
absent expression) subscribes to everything; otherwise tags separated by ``||``, each trimmed
of surrounding whitespace, non-empty, without ``|``, ``*``-free, and without the bytes
0x01/0x02 a stored tag can never hold. ``"paid ||"``, ``"paid | refunded"`` and
``"* || paid"`` are refused with a message saying why — they are typos, and a typo in a filter
otherwise reads as "no messages".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np

from tierd.errors import InvalidSubscriptionError
from tierd.format.cq_unit import java_string_hash

if TYPE_CHECKING:
    import numpy.typing as npt

    from tierd.format.message_ext import MessageExt

#: Subscribes to every message, tagged or not (RocketMQ's ``SubscriptionData.SUB_ALL``).
SUB_ALL: Final = "*"
SEPARATOR: Final = "||"
#: Longest expression accepted (characters: URL-encoded it stays well inside what an HTTP request
#: line may hold) and most tags in one.
MAX_EXPRESSION_LENGTH: Final = 4096
MAX_TAGS: Final = 256
#: Consume-queue units one filtered read examines at most before it returns (with
#: ``NO_MATCHED_MESSAGE`` and ``next_offset`` past them when none matched): a consumer of a rare
#: tag moves through a long queue in bounded steps instead of one unbounded call.
MAX_SCAN_UNITS: Final = 65_536


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed subscription. Build it with :func:`parse_tags`."""

    #: The expression in canonical form (``"*"`` or tags joined by ``" || "``).
    expression: str
    #: Subscribed tags; empty means every message.
    tags: frozenset[str]
    #: Java hash codes of :attr:`tags`, sorted, as int32 (the hash stage).
    codes: npt.NDArray[np.int32] = field(repr=False, compare=False)

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def unit_mask(self, tags_codes: npt.NDArray[np.integer]) -> npt.NDArray[np.bool_]:
        """Hash stage over consume-queue tags codes: True where the unit *may* match."""
        if not self.tags:
            return np.ones(len(tags_codes), np.bool_)
        return np.isin(np.asarray(tags_codes).astype(np.int64).astype(np.int32), self.codes)

    def matches_tag(self, tag: str | None) -> bool:
        """String stage: the decoded ``TAGS`` value is one of the subscribed tags."""
        return not self.tags or (tag is not None and tag in self.tags)

    def matches(self, message: MessageExt) -> bool:
        return not self.tags or message.tags in self.tags

    def __str__(self) -> str:
        return self.expression


ALL: Final = TagFilter(SUB_ALL, frozenset(), np.empty(0, np.int32))


def parse_tags(expression: str | TagFilter | None) -> TagFilter:
    """Parse a subscription expression (see the module docstring for the grammar);
    :class:`InvalidSubscriptionError` names what is wrong with it."""
    if expression is None:
        return ALL
    if isinstance(expression, TagFilter):
        return expression
    if not isinstance(expression, str):
        raise InvalidSubscriptionError(
            f"tags must be a subscription expression string such as 'paid || refunded', "
            f"got {type(expression).__name__}",
            tags=repr(expression),
        )
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise InvalidSubscriptionError(
            f"tags expression is {len(expression)} characters, the limit is {MAX_EXPRESSION_LENGTH}",
            length=len(expression),
        )
    text = expression.strip()
    if not text or text == SUB_ALL:
        return ALL
    tags: list[str] = []
    for i, piece in enumerate(text.split(SEPARATOR)):
        tag = piece.strip()
        where = f"tag {i + 1} of {expression!r}"
        if not tag:
            raise InvalidSubscriptionError(
                f"{where} is empty: separate tags with '||' and put a tag on both sides of each",
                tags=expression,
            )
        if tag == SUB_ALL or SUB_ALL in tag:
            raise InvalidSubscriptionError(
                f"{where} is {tag!r}: '*' subscribes to every message on its own and is no "
                "wildcard inside a tag",
                tags=expression,
            )
        if "|" in tag:
            raise InvalidSubscriptionError(
                f"{where} is {tag!r}: a single '|' is not an operator (tags are separated by '||')",
                tags=expression,
            )
        if "\x01" in tag or "\x02" in tag:
            raise InvalidSubscriptionError(
                f"{where} contains the byte 0x01 or 0x02, which no stored tag can hold", tags=expression
            )
        tags.append(tag)
    unique = sorted(set(tags))
    if len(unique) > MAX_TAGS:
        raise InvalidSubscriptionError(
            f"tags expression names {len(unique)} tags, the limit is {MAX_TAGS}", count=len(unique)
        )
    codes = np.unique(np.array([java_string_hash(t) for t in unique], np.int32))
    return TagFilter(f" {SEPARATOR} ".join(unique), frozenset(unique), codes)


__all__ = ["ALL", "MAX_SCAN_UNITS", "SUB_ALL", "InvalidSubscriptionError", "TagFilter", "parse_tags"]
