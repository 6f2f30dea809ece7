"""Cold tiers for the Arrow reader, written by a real store (``tier_now``), and the store's own
view of the same messages to compare rows with.

The posix tier's key index covers every message, the S3 one's only the first two batches. The
posix tier's store stays open for the whole session — the running owner the reader must not
disturb — and the moto one is the S3 path. Shapes are a topic's usual ones: tags, keys (some
shared), a UNIQ_KEY and other properties, several queues, mostly small bodies with a large one
every 25 messages; segments are small, so a read spans many of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, Message, ReadPolicy
from tierd.testing.s3server import create_bucket

from ..tiered.conftest import cold_config, upload_index

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from tierd import TierdConfig
    from tierd.format.message_ext import MessageExt
    from tierd.testing.s3server import S3Server

TOPICS = ("orders", "audit")
QUEUES = 3
#: Messages per batch; one ``tier_now`` after each batch, the key index uploaded after the second.
BATCHES = (120, 120, 60)
#: Written for 24 kB cold segments; a segment must hold the largest record, and the large bodies
#: below need a 72 KiB body limit, so segments and records are SCALE times what they were: a read
#: spans as many segments as before, from the same messages.
SCALE = 6
SEGMENT: dict[str, Any] = {"max_message_size": 72 * 1024, "commitlog_segment_size": 24_000 * SCALE}


def history(start: int, n: int) -> list[Message]:
    """Deterministic messages: ``orders`` (2 of 3) and ``audit``, queues 0-2, keys ``k{i}`` plus
    a shared ``g{i % 7}``, UNIQ_KEY ``u{i}``, tags ``paid``/``open`` and ``rare`` every 40th."""
    return [
        Message(
            topic=TOPICS[1] if i % 3 == 0 else TOPICS[0],
            body=(b"%06d:" % i) * (10_314 if i % 25 == 0 else 234),
            keys=[f"k{i}", f"g{i % 7}"],
            tags="rare" if i % 40 == 1 else "paid" if i % 2 else "open",
            queue_id=i % QUEUES,
            properties={"seq": str(i), "UNIQ_KEY": f"u{i}", "region": "eu-west-1" if i % 4 else "us-east-1"},
        )
        for i in range(start, start + n)
    ]


def config(root: Path, backend: dict[str, Any]) -> TierdConfig:
    return cold_config(root, backend, **SEGMENT, consumequeue_segment_size=400)


def fill(
    store: BlockingMessageStore, batches: Sequence[int] = BATCHES, start: int = 0, *, index_after: int = 2
) -> int:
    """Put and tier ``batches``; the key index is uploaded after ``index_after`` of them (later
    messages stay in the writer's local index file, as the last ``max_file_age`` of them do)."""
    for i, n in enumerate(batches):
        if i == index_after:
            upload_index(store)
        store.put_batch(history(start, n))
        start += n
        assert store.tier_now().committed > 0
    if index_after >= len(batches):
        upload_index(store)
    return start


def stored(store: BlockingMessageStore) -> list[MessageExt]:
    """Every message as the store returns it from the cold tier (``FORCE``: the same flat
    offsets and message ids the bucket holds), in (topic, queue, offset) order."""
    out: list[MessageExt] = []
    for topic in sorted(TOPICS):
        for q in range(QUEUES):
            offset = 0
            while True:
                got = store.get(topic, q, offset, 64, ReadPolicy.FORCE)
                if not got.messages:
                    break
                out.extend(got.messages)
                offset = got.next_offset
    return out


@dataclass(frozen=True)
class Tier:
    url: str
    storage_options: dict[str, Any]
    #: What the store's ``get`` returned for every message.
    messages: list[MessageExt]
    #: The store that wrote it, still running (posix tier only).
    store: BlockingMessageStore | None = None


@pytest.fixture(scope="session")
def posix_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    root = tmp_path_factory.mktemp("arrow-posix")
    cfg = config(root, {"name": "posix", "url": str(root / "cold"), "storage_options": {"fsync": False}})
    with BlockingMessageStore.open(cfg) as store:
        fill(store, index_after=len(BATCHES))  # every message in an uploaded index file
        yield Tier(f"file://{root / 'cold'}", {}, stored(store), store)


@pytest.fixture(scope="session")
def s3_tier(moto_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Tier:
    root = tmp_path_factory.mktemp("arrow-s3")
    url = f"s3://{create_bucket(moto_server)}/history"
    so = moto_server.storage_options
    with BlockingMessageStore.open(config(root, {"name": "s3", "url": url, "storage_options": so})) as store:
        fill(store)
        return Tier(url, dict(so), stored(store))
