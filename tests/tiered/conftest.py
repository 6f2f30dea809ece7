"""Tiering fixtures: a hot store with a posix cold tier, both under the test's tmp dir."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from tierd import BlockingMessageStore, TierdConfig
from tierd.drivers.memory import MemoryRoot, drop_namespace

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator
    from pathlib import Path

T = TypeVar("T")


@pytest.fixture
def mem() -> Iterator[MemoryRoot]:
    """A memory backend root of its own, dropped after the test."""
    root = MemoryRoot(f"memory://tiered-{uuid.uuid4().hex}")
    yield root
    drop_namespace(root.name)


def cold_config(root: Path, backend: dict[str, Any] | None = None, **tiered: Any) -> TierdConfig:
    return TierdConfig.from_dict(
        {
            # Small files: the store preallocates them (fallocate), and tests must not fill the disk.
            "store": {
                "dir": str(root / "hot"),
                "index_slots": 64,
                "index_items": 4000,
                "commitlog_file_size": 4 * 1024 * 1024,
                "max_message_size": 1024 * 1024,
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
