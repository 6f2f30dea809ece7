"""What a scheduled message is made of, and when it may be delivered.

Storage keeps RocketMQ's shape, so a RocketMQ-literate operator recognises it: a scheduled message
is stored at once in the system topic :data:`SCHEDULE_TOPIC` (RocketMQ 4's name for delay-level
messages; RocketMQ 5 uses ``rmq_sys_wheel_timer`` for timer messages, but tierd reserves the
``rmq_sys_`` prefix against every read and write) with its real topic and queue in the
``REAL_TOPIC`` / ``REAL_QID`` properties and its delivery time in ``TIMER_DELIVER_MS`` (and
``DELAY`` when a level was asked for). This module owns those names and the time rules; the
scheduler (:mod:`tierd.scheduled.scheduler`) and the facade take them from here.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from tierd.errors import ConfigError, DeliveryTimeError, InvalidArgumentError, UnknownHandleError

if TYPE_CHECKING:
    from collections.abc import Mapping

#: The system topic holding scheduled messages (queue 0), RocketMQ's SCHEDULE_TOPIC_XXXX.
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
#: Recall tombstones (queue 0): one message per recalled handle, the handle as its body.
RECALL_TOPIC: Final = "SCHEDULE_TOPIC_XXXX_RECALL"
#: Scheduler progress records (queue 0): the last one says what is delivered for sure.
PROGRESS_TOPIC: Final = "SCHEDULE_TOPIC_XXXX_PROGRESS"
SYSTEM_TOPICS: Final = frozenset({SCHEDULE_TOPIC, RECALL_TOPIC, PROGRESS_TOPIC})

#: RocketMQ's MessageConst names.
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QID: Final = "REAL_QID"
PROPERTY_DELAY: Final = "DELAY"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
#: tierd's own: on a delivered message, the handle of the schedule that delivered it. With the
#: message's UNIQ_KEY (indexed) it is how a restart tells "delivered already" from "still due".
PROPERTY_TIMER_HANDLE: Final = "TIMER_HANDLE"
#: Properties that belong to the schedule, not to the delivered message.
SCHEDULE_ONLY: Final = frozenset({PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID})

#: RocketMQ's default ``messageDelayLevel``.
DEFAULT_DELAY_LEVELS: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS: Final = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL: Final = re.compile(r"([0-9]+)([smhd])")
_DIGITS: Final = re.compile(r"[0-9]{1,18}")


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """The delays in ms of levels 1, 2, … from RocketMQ's ``messageDelayLevel`` syntax."""
    out = []
    for token in text.split():
        m = _LEVEL.fullmatch(token)
        if m is None or int(m.group(1)) == 0:
            raise ConfigError(
                f"scheduled.delay_levels: {token!r} is not a positive delay such as 5s, 2m, 1h or 1d",
                token=token,
            )
        out.append(int(m.group(1)) * _UNITS[m.group(2)])
    if not out:
        raise ConfigError("scheduled.delay_levels: at least one level is needed", delay_levels=text)
    return tuple(out)


def delivery_time(
    now_ms: int,
    *,
    deliver_at: int | None,
    delay_level: int | None,
    levels: tuple[int, ...],
    max_delay_ms: int,
) -> int:
    """The delivery time (ms since the epoch) of a message put at ``now_ms``: ``deliver_at``
    itself, or ``now_ms`` plus the delay of ``delay_level`` — one of the two. A time in the past
    (or now: it would not be a scheduled message) or more than ``max_delay_ms`` ahead is refused
    with the value and the bound, as is a level outside 1…len(levels)."""
    if (deliver_at is None) == (delay_level is None):
        raise InvalidArgumentError("give a delivery time or a delay level (one of the two)")
    if delay_level is not None:
        valid = isinstance(delay_level, int) and not isinstance(delay_level, bool)
        if not valid or not 1 <= delay_level <= len(levels):
            raise DeliveryTimeError(
                f"delay level must be an integer in [1, {len(levels)}] (scheduled.delay_levels), "
                f"got {delay_level!r}",
                delay_level=repr(delay_level),
                levels=len(levels),
            )
        deliver_at = now_ms + levels[delay_level - 1]
    assert deliver_at is not None
    if isinstance(deliver_at, bool) or not isinstance(deliver_at, int):
        raise DeliveryTimeError(
            f"deliver_at must be integer milliseconds since the epoch, got {deliver_at!r}",
            deliver_at=repr(deliver_at),
        )
    if deliver_at <= now_ms:
        raise DeliveryTimeError(
            f"deliver_at {deliver_at} is not in the future (now is {now_ms}): put the message "
            "without a delivery time to make it visible at once",
            deliver_at=deliver_at,
            now=now_ms,
        )
    if deliver_at - now_ms > max_delay_ms:
        raise DeliveryTimeError(
            f"deliver_at {deliver_at} is {(deliver_at - now_ms) / 1000:.0f} s ahead, beyond the "
            f"longest delay accepted, {max_delay_ms / 1000:.0f} s (scheduled.max_delay)",
            deliver_at=deliver_at,
            now=now_ms,
            max_delay_ms=max_delay_ms,
        )
    return deliver_at


#: Hex digits of the counter part of :func:`new_uniq_key` (the rest is the process's prefix).
_UNIQ_COUNTER_DIGITS: Final = 12


class _UniqKeys:
    """Source of :func:`new_uniq_key`: 80 random bits drawn once per process (and again in a
    forked child, and when the counter runs out) followed by a counter.

    Why not ``uuid4`` per key: it reads 16 bytes from the kernel each time, and that system call
    was 40 % of a scheduled put's time (docs/performance.md, "Scheduled messages"). The keys are
    as unique in practice — two processes share a prefix with probability 2**-80 — and they need
    not be secret: a delivered copy is matched by its key *and* its handle after a crash."""

    __slots__ = ("counter", "pattern", "prefix")

    def __init__(self) -> None:
        self.prefix = ""
        self.pattern = ""
        self.counter: itertools.count[int] = itertools.count()
        self.reseed()

    def reseed(self) -> None:
        self.prefix = os.urandom(10).hex().upper()
        # One %-format with the prefix in it: a nested f-string spec costs twice as much.
        self.pattern = f"{self.prefix}%0{_UNIQ_COUNTER_DIGITS}X"  # the prefix is hex: no %
        self.counter = itertools.count()

    def next(self) -> str:
        n = next(self.counter)  # atomic under the GIL: no two threads get the same n
        if n >> (4 * _UNIQ_COUNTER_DIGITS):
            self.reseed()
            return self.next()
        return self.pattern % n


_UNIQ = _UniqKeys()
os.register_at_fork(after_in_child=_UNIQ.reseed)


def new_uniq_key() -> str:
    """A client message id for a scheduled message that came without one: the delivered copy
    keeps it, and it is what the key index finds the copy by. 32 upper-case hex digits, the
    length of RocketMQ's client ids. :meth:`_UniqKeys.next`'s common case written out: a call
    fewer on every scheduled put."""
    u = _UNIQ
    n = next(u.counter)
    return u.pattern % n if not n >> (4 * _UNIQ_COUNTER_DIGITS) else u.next()


def handle_text(offset: int, deliver_at: int) -> str:
    """The text of :class:`Handle` ``(offset, deliver_at)``, without building one (a scheduled
    put answers it: a frozen dataclass costs a microsecond, a twentieth of that put)."""
    return f"{offset}-{deliver_at}"


@dataclass(frozen=True, slots=True)
class Handle:
    """What identifies one scheduled message: its offset in :data:`SCHEDULE_TOPIC` and its
    delivery time. Both are checked against the stored message, so a handle of another store or
    a typo is "unknown", never some other message recalled."""

    offset: int
    deliver_at: int

    def __str__(self) -> str:
        return handle_text(self.offset, self.deliver_at)

    @classmethod
    def parse(cls, text: object) -> Handle:
        parts = text.split("-") if isinstance(text, str) else []
        if len(parts) != 2 or not all(_DIGITS.fullmatch(p) for p in parts):
            raise UnknownHandleError(
                f"{text!r} is not a scheduled-message handle (OFFSET-DELIVER_AT, as a scheduled "
                "put returns it)",
                handle=repr(text),
            )
        return cls(int(parts[0]), int(parts[1]))


def scheduled_deliver_at(props: Mapping[str, str]) -> int | None:
    """A stored scheduled message's delivery time, None when it carries none (not one of ours)."""
    raw = props.get(PROPERTY_TIMER_DELIVER_MS)
    return int(raw) if raw is not None and _DIGITS.fullmatch(raw) else None
