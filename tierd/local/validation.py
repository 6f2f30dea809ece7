"""Input rules for messages, checked once at the store's front door (docs/limits.md lists them).

Topic names: 1–255 characters from ``[A-Za-z0-9_%|-]``. Names up to 127 characters are written
as v1 records; longer ones (up to 255, the longest directory name a filesystem allows — the
consume queue lives in ``consumequeue/{topic}/``) use the v2 record magic with a 2-byte topic
length, as RocketMQ does with ``autoMessageVersionOnTopicLen``.
"""

from __future__ import annotations

import operator
import re
from typing import TYPE_CHECKING, Final

from tierd.errors import (
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidQueueError,
    InvalidTopicError,
    MessageTooLargeError,
)
from tierd.format.properties import KEY_SEPARATOR, MAX_PROPERTIES_LENGTH, PROPERTY_KEYS, PROPERTY_TAGS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

TOPIC_MAX_LENGTH: Final = 255
TOPIC_PATTERN: Final = re.compile(r"[A-Za-z0-9_%|-]{1,255}")
#: Topics the store reserves for itself (RocketMQ system topic conventions).
RESERVED_TOPIC_PREFIX: Final = "rmq_sys_"
_FORBIDDEN_PROPERTY_CHARS: Final = re.compile("[\x01\x02]")
INT32_MIN: Final = -(1 << 31)
INT32_MAX: Final = (1 << 31) - 1
INT64_MAX: Final = (1 << 63) - 1


#: Most topic names a cache of names checked once holds (this one, the encoder's topic fields,
#: the facade's schedulable topics): past it, names are checked on each use, memory stays bounded.
TOPIC_CACHE_MAX: Final = 100_000
_valid_topics: set[str] = set()


def check_topic(topic: object) -> str:
    """Return ``topic`` if valid, else raise :class:`InvalidTopicError` naming the rule broken."""
    if topic in _valid_topics:
        return str(topic)
    if not isinstance(topic, str):
        raise InvalidTopicError(f"topic must be a string, got {type(topic).__name__}", topic=repr(topic))
    if not TOPIC_PATTERN.fullmatch(topic):
        raise InvalidTopicError(
            f"topic {topic!r} is invalid: use 1-{TOPIC_MAX_LENGTH} characters from A-Z a-z 0-9 _ % | -",
            topic=topic,
        )
    if topic.startswith(RESERVED_TOPIC_PREFIX):
        raise InvalidTopicError(
            f"topic {topic!r} uses the reserved prefix {RESERVED_TOPIC_PREFIX!r}", topic=topic
        )
    if len(_valid_topics) < TOPIC_CACHE_MAX:
        _valid_topics.add(topic)
    return topic


def check_body(body: object, max_size: int) -> bytes:
    if not isinstance(body, bytes):
        if isinstance(body, bytearray | memoryview):
            body = bytes(body)
        else:
            raise InvalidArgumentError(f"body must be bytes, got {type(body).__name__}")
    if len(body) > max_size:
        raise MessageTooLargeError(
            f"body is {len(body)} bytes, the limit (store.max_message_size) is {max_size}",
            size=len(body),
            limit=max_size,
        )
    return body


def check_flag(flag: object) -> int:
    """The record's FLAG field is a signed 32-bit integer (RocketMQ's ``int flag``); any integer
    type is accepted (``operator.index``: numpy integers too, not floats)."""
    try:
        value = operator.index(flag)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"flag must be an int32, got {flag!r}", flag=repr(flag)) from None
    if not INT32_MIN <= value <= INT32_MAX:
        raise InvalidArgumentError(f"flag must be an int32, got {flag!r}", flag=repr(flag))
    return value


def check_born_timestamp(timestamp: object) -> int:
    """BORNTIMESTAMP is a signed 64-bit count of milliseconds; before 1970 is not a birth time."""
    try:
        value = -1 if isinstance(timestamp, bool) else operator.index(timestamp)  # type: ignore[arg-type]
    except TypeError:
        value = -1
    if not 0 <= value <= INT64_MAX:
        raise InvalidArgumentError(
            f"born_timestamp must be milliseconds since the epoch in [0, 2**63), got {timestamp!r}",
            born_timestamp=repr(timestamp),
        )
    return value


def check_queue(queue_id: object, max_queues: int) -> int:
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or not 0 <= queue_id < max_queues:
        raise InvalidQueueError(
            f"queue_id must be an integer in [0, {max_queues}), got {queue_id!r}", queue_id=repr(queue_id)
        )
    return queue_id


def check_key(key: object) -> str:
    """A key to look up: a non-empty string UTF-8 can encode. Keys are indexed as the UTF-8 of
    ``topic#key``; a Python string may hold a lone surrogate (JSON's ``"\\udcff"`` decodes to
    one), which has no UTF-8 form — and which the hash function's C code does not survive."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"key must be a non-empty string, got {key!r}", key=repr(key))
    if not _is_utf8(key):
        raise InvalidArgumentError(
            f"key must be valid Unicode text (no lone surrogates), got {key!r}", key=repr(key)
        )
    return key


def _is_utf8(text: str) -> bool:
    """Whether UTF-8 can encode ``text``: not when it holds a lone surrogate."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def build_properties(keys: Sequence[str], tags: str | None, properties: Mapping[str, str]) -> bytes:
    """Encode user properties plus ``KEYS``/``TAGS`` after checking every rule once."""
    if (type(keys) is tuple or type(keys) is list) and len(keys) == 1 and tags is None and not properties:
        # The usual message — one key, nothing else: the key rules below, checked directly
        # (a third of the general path's cost; anything unusual takes the general path).
        k = keys[0]
        if type(k) is str and k and " " not in k and "\x01" not in k and "\x02" not in k:
            try:
                encoded = ("KEYS\x01" + k + "\x02").encode()
            except UnicodeEncodeError:
                pass  # a lone surrogate: the general path below names it
            else:
                if len(encoded) <= MAX_PROPERTIES_LENGTH:
                    return encoded
    parts: list[str] = []
    if properties:
        for name, value in properties.items():
            if not isinstance(name, str) or not isinstance(value, str) or not name or not value:
                raise InvalidPropertiesError(
                    f"property names and values must be non-empty strings, got {name!r}={value!r}",
                    name=repr(name),
                )
            if _FORBIDDEN_PROPERTY_CHARS.search(name) or _FORBIDDEN_PROPERTY_CHARS.search(value):
                raise InvalidPropertiesError(
                    f"property {name!r} contains a reserved separator byte (0x01 or 0x02)", name=name
                )
            if (name == PROPERTY_KEYS and keys) or (name == PROPERTY_TAGS and tags):
                raise InvalidPropertiesError(
                    f"property {name!r} is set both directly and through the {name.lower()} argument",
                    name=name,
                )
            parts.append(f"{name}\x01{value}\x02")
    if keys:
        if isinstance(keys, str):
            raise InvalidArgumentError(f"keys must be a sequence of strings, got the string {keys!r}")
        try:
            joined = KEY_SEPARATOR.join(keys)
        except TypeError as e:
            raise InvalidPropertiesError(f"keys must be strings, got {list(keys)!r}") from e
        # One C-level pass instead of a Python loop per key: a key with a space or an empty key
        # changes the token count; the separators are found by substring search.
        if (
            joined.count(KEY_SEPARATOR) != len(keys) - 1
            or "" in joined.split(KEY_SEPARATOR)
            or "\x01" in joined
            or "\x02" in joined
        ):
            bad = next(
                (k for k in keys if not k or KEY_SEPARATOR in k or _FORBIDDEN_PROPERTY_CHARS.search(k)),
                joined,
            )
            raise InvalidPropertiesError(
                f"each key must be a non-empty string without spaces or 0x01/0x02, got {bad!r}", key=repr(bad)
            )
        parts.append(f"KEYS\x01{joined}\x02")
    if tags is not None:
        if not isinstance(tags, str) or not tags or _FORBIDDEN_PROPERTY_CHARS.search(tags):
            raise InvalidPropertiesError(
                f"tags must be a non-empty string without 0x01/0x02, got {tags!r}", tags=repr(tags)
            )
        parts.append(f"TAGS\x01{tags}\x02")
    try:
        encoded = "".join(parts).encode()
    except UnicodeEncodeError:
        # Python strings may hold lone surrogates (JSON's "\\udcff" decodes to one); UTF-8 cannot.
        texts = [*keys, *([tags] if tags is not None else []), *properties.keys(), *properties.values()]
        bad = next((text for text in texts if not _is_utf8(text)), "")
        raise InvalidPropertiesError(
            f"keys, tags and properties must be valid Unicode text (no lone surrogates), got {bad!r}",
            value=repr(bad),
        ) from None
    if len(encoded) > MAX_PROPERTIES_LENGTH:
        raise InvalidPropertiesError(
            f"encoded properties are {len(encoded)} bytes, the limit is {MAX_PROPERTIES_LENGTH}",
            size=len(encoded),
        )
    return encoded
