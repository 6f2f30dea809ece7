"""Hot-store fixtures: small files so rolling, blank markers and retention happen in tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, TierdConfig

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SMALL_STORE: dict[str, Any] = {
    "commitlog_file_size": 256 * 1024,
    "max_message_size": 64 * 1024,
    "consumequeue_file_units": 64,
    "index_slots": 64,
    "index_items": 400,
    "flush_interval_ms": 10,
}


def small_config(root: Path, **store: Any) -> TierdConfig:
    """Hot store only: these tests exercise it in isolation (tiering has its own suite)."""
    return TierdConfig.from_dict(
        {"store": {"dir": str(root), **SMALL_STORE, **store}, "tiered": {"enabled": False}}
    )


@pytest.fixture
def cfg(tmp_path: Path) -> TierdConfig:
    return small_config(tmp_path / "store")


@pytest.fixture
def store(cfg: TierdConfig) -> Iterator[BlockingMessageStore]:
    with BlockingMessageStore.open(cfg) as s:
        yield s
