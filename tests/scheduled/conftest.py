"""Scheduled-message fixtures: small stores, short delays, polling with deadlines (never sleeps
as synchronisation: a delivery is waited for by reading the topic until it shows up)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tierd import BlockingMessageStore, TierdConfig
from tierd.message import GetStatus

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.format.message_ext import MessageExt

SMALL_STORE: dict[str, Any] = {
    "commitlog_file_size": 256 * 1024,
    "max_message_size": 64 * 1024,
    "consumequeue_file_units": 4096,
    "index_slots": 256,
    "index_items": 20_000,
    "flush_interval_ms": 10,
}
#: Longest wait for a delivery that is due: generous, the machine is shared.
DEADLINE = 60.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def hot_config(root: Path, **scheduled: Any) -> TierdConfig:
    """Hot store only (the scheduler gets a loop of its own)."""
    return TierdConfig.from_dict(
        {
            "store": {"dir": str(root / "hot"), **SMALL_STORE},
            "tiered": {"enabled": False},
            "scheduled": scheduled,
        }
    )


def tiered_config(
    root: Path, hot_dir: str = "hot", store: dict[str, Any] | None = None, **scheduled: Any
) -> TierdConfig:
    """A posix cold tier beside the hot store; dispatch only when asked (``tier_now``)."""
    return TierdConfig.from_dict(
        {
            "store": {"dir": str(root / hot_dir), **SMALL_STORE, **(store or {})},
            "backend": {"name": "posix", "url": str(root / "cold")},
            "tiered": {"dispatch_interval": 3600, "commitlog_segment_size": 1024 * 1024},
            "scheduled": scheduled,
        }
    )


def read_all(store: BlockingMessageStore, topic: str, queue_id: int = 0) -> list[MessageExt]:
    out: list[MessageExt] = []
    offset = 0
    while True:
        r = store.get(topic, queue_id, offset, 256)
        if r.status is not GetStatus.FOUND:
            return out
        out.extend(r.messages)
        offset = r.next_offset


def wait_for_count(store: BlockingMessageStore, topic: str, n: int, queue_id: int = 0) -> list[MessageExt]:
    """The topic's messages once it holds at least ``n`` (AssertionError at the deadline)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        msgs = read_all(store, topic, queue_id)
        if len(msgs) >= n:
            return msgs
        assert time.monotonic() < deadline, f"{topic}: {len(msgs)} of {n} messages delivered"
        time.sleep(0.02)  # polling interval; the deadline bounds the wait
