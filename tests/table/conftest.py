"""A posix cold tier a real store wrote (the Arrow reader's history: two topics, three queues,
small segments, so many of them are sealed), and table-writer configs over it with a fresh
catalog per test (SQLite under the test's own store dir)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import tierd.arrow
from tierd import BlockingMessageStore, TierdConfig
from tierd.table import TableWriter

from ..arrow.conftest import BATCHES, SEGMENT, config, fill

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import pyarrow as pa

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


#: The ``events`` topic: JSON bodies with an ``id`` (long) and a ``name``, and every 10th body
#: not decodable into them (not JSON, a JSON list, or a string ``id``).
EVENTS = "events"
#: Padding of a decodable body: 400 of them fill several of the shared tier's cold segments
#: (tests/arrow/conftest.py sizes those), so most of ``events`` is sealed.
EVENT_PAD = SEGMENT["commitlog_segment_size"] // 100


def event_body(i: int) -> bytes:
    if i % 10 == 3:
        return b"not json %d" % i
    if i % 10 == 6:
        return b"[1, 2]"
    if i % 10 == 9:
        return b'{"id": "%d"}' % i
    return b'{"id": %d, "name": "n%d", "pad": "%s"}' % (i, i, b"x" * EVENT_PAD)


@pytest.fixture(scope="session")
def events(tier: Tier) -> pa.Table:
    """``events`` written and tiered into the shared tier (queue 0, several sealed segments);
    what the raw source returns for its sealed segments."""
    from tierd import Message

    tier.store.put_batch([Message(topic=EVENTS, body=event_body(i), queue_id=0) for i in range(400)])
    assert tier.store.tier_now().committed > 0
    rows = sealed(tier.url, EVENTS)
    assert rows.num_rows > 100
    return rows
