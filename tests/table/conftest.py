"""A posix cold tier a real store wrote (the Arrow reader's history: two topics, three queues,
small segments, so many of them are sealed), and table-writer configs over it with a fresh
catalog per test (SQLite under the test's own store dir)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import tierd.arrow
from tierd import BlockingMessageStore, TierdConfig
from tierd.table import TableWriter

from ..arrow.conftest import BATCHES, config, fill

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

KEY = ("topic", "queue_id", "queue_offset")


@dataclass(frozen=True)
class Tier:
    root: Path
    #: The cold tier's directory (the store's ``backend.url``).
    url: str
    store: BlockingMessageStore


def sealed(url: str, topic: str) -> pa.Table:
    """What the raw source returns for ``topic``'s sealed segments, in (queue, offset) order."""
    rows = tierd.arrow.dataset(url, topic=topic, include_open_segments=False).to_table()
    return rows.sort_by([(c, "ascending") for c in KEY])


def writer_config(tier: Tier, store_dir: Path, **topics: dict[str, Any]) -> TierdConfig:
    return TierdConfig.from_dict(
        {
            "store": {"dir": str(store_dir)},
            "backend": {"name": "posix", "url": tier.url},
            "topics": {name: {"table": "iceberg", **t} for name, t in topics.items()},
        }
    )


@pytest.fixture(scope="session")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    root = tmp_path_factory.mktemp("table-tier")
    url = str(root / "cold")
    cfg = config(root, {"name": "posix", "url": url, "storage_options": {"fsync": False}})
    with BlockingMessageStore.open(cfg) as store:
        fill(store, BATCHES, index_after=len(BATCHES))
        yield Tier(root, url, store)


@pytest.fixture
def writer(tier: Tier, tmp_path: Path) -> TableWriter:
    return TableWriter(writer_config(tier, tmp_path / "store", orders={}))
