"""Tiering fixtures: a hot store with a posix cold tier, both under the test's tmp dir."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from tierd import BlockingMessageStore, TierdConfig
from tierd.config import KiB, MiB, StoreConfig
from tierd.drivers.memory import MemoryRoot, drop_namespace

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator
    from pathlib import Path

T = TypeVar("T")

#: ``store.max_message_size`` of tests that want many cold segments from little data: their
#: bodies are small, and a smaller body limit allows smaller segments.
SMALL_BODY_LIMIT = 4 * KiB
#: The smallest flat commitlog segment allowed with :data:`SMALL_BODY_LIMIT` (a segment must hold
#: the largest record; tierd.config refuses less). Tests size segments in multiples of it.
MIN_SEGMENT = StoreConfig(max_message_size=SMALL_BODY_LIMIT).max_record_size


@pytest.fixture
def mem() -> Iterator[MemoryRoot]:
    """A memory backend root of its own, dropped after the test."""
    root = MemoryRoot(f"memory://tiered-{uuid.uuid4().hex}")
    yield root
    drop_namespace(root.name)


def cold_config(
    root: Path, backend: dict[str, Any] | None = None, *, max_message_size: int = MiB, **tiered: Any
) -> TierdConfig:
    """A store with a cold tier; ``tiered`` overrides keys of ``[tiered]``. A test with small cold
    segments passes ``max_message_size=SMALL_BODY_LIMIT`` (segments must hold the largest record)."""
    return TierdConfig.from_dict(
        {
            # Small files: the store preallocates them (fallocate), and tests must not fill the disk.
            "store": {
                "dir": str(root / "hot"),
                "index_slots": 64,
                "index_items": 4000,
                "commitlog_file_size": 4 * 1024 * 1024,
                "max_message_size": max_message_size,
                "consumequeue_file_units": 10_000,
            },
            "backend": backend or {"name": "posix", "url": str(root / "cold")},
            "tiered": {"dispatch_interval": 3600, **tiered},
        }
    )


def hot_only_config(root: Path, **store: Any) -> TierdConfig:
    """A store without a cold tier (small files, as :func:`cold_config`)."""
    data = cold_config(root).model_dump()
    data["store"].update(store)
    data["tiered"]["enabled"] = False
    return TierdConfig.from_dict(data)


def run(store: BlockingMessageStore, coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the store's tiering loop (where flat files live)."""
    assert store._loop is not None
    return asyncio.run_coroutine_threadsafe(coro, store._loop.loop).result(60)


def upload_index(store: BlockingMessageStore) -> None:
    """Seal the writable cold index file and upload it now (it would wait ``max_file_age``)."""
    assert store.tiering is not None
    index = store.tiering.index
    age, index.max_file_age_ms = index.max_file_age_ms, 0
    try:
        run(store, index.maintain())
    finally:
        index.max_file_age_ms = age
