"""Two ``tierd restore`` of one bucket at once: exactly one owns the prefix, the other fails with
``prefix_owned`` — and writes nothing: no owner record of its own, no metadata.

restore A: reads manifests ─────(B runs whole, claims epoch 2)───── claim → prefix_owned
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, Message
from tierd.errors import PrefixOwnedError
from tierd.tiered.metadata import MetadataStore
from tierd.tiered.ownership import OWNER_DIR, OwnerRecord, store_id

from .conftest import cold_config

if TYPE_CHECKING:
    from pathlib import Path


def _owner_records(bucket: Path) -> list[OwnerRecord]:
    return [
        OwnerRecord.model_validate_json(p.read_bytes())
        for p in sorted(bucket.rglob("*.json"))
        if p.parent.name == OWNER_DIR
    ]


def test_a_restore_overtaken_by_another_fails_and_fences_nobody(tmp_path: Path) -> None:
    bucket = {"name": "posix", "url": str(tmp_path / "bucket")}
    with BlockingMessageStore.open(cold_config(tmp_path / "old", backend=bucket)) as store:
        store.put_batch([Message(topic="t", body=b"m%d" % i, queue_id=i % 2) for i in range(20)])
        store.tier_now()
    cfg_a = cold_config(tmp_path / "a", backend=bucket)
    cfg_b = cold_config(tmp_path / "b", backend=bucket)
    finished: list[object] = []

    def other() -> None:
        finished.append(BlockingMessageStore.restore(cfg_b))

    def progress(done: int, total: int, what: str) -> None:
        if done == 1:  # A has begun reading the bucket: B runs from start to end meanwhile
            thread = threading.Thread(target=other)
            thread.start()
            thread.join(60)
            assert not thread.is_alive()

    with pytest.raises(PrefixOwnedError) as lost:
        BlockingMessageStore.restore(cfg_a, progress)
    assert len(finished) == 1  # B restored
    b_id = store_id(tmp_path / "b" / "hot", create=False)
    assert lost.value.detail["owner_store_id"] == b_id
    records = _owner_records(tmp_path / "bucket")
    assert [(r.epoch, r.store_id) for r in records][1:] == [(2, b_id)]  # no epoch 3: A fenced nobody
    assert not MetadataStore(tmp_path / "a" / "hot").path.exists()  # A's directory stays restorable
    with BlockingMessageStore.open(cfg_b) as store:  # B owns the prefix and tiers
        store.put(Message(topic="t", body=b"after", queue_id=0))
        assert store.tier_now().committed == 1
