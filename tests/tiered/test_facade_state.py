"""The facade's own view of its state — ``closed``, ``ready``, ``stats`` — which the HTTP layer and
the metrics read instead of reaching into the hot store, the tiering service and the router."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierd import BlockingMessageStore, GetStatus, Message, ReadPolicy

from .conftest import cold_config, hot_only_config

if TYPE_CHECKING:
    from pathlib import Path


def test_a_tiering_store_reports_ready_closed_and_live_stats(tmp_path: Path) -> None:
    store = BlockingMessageStore.open(cold_config(tmp_path))
    try:
        store.wait_ready(60)  # the cold tier loads in the background after open
        assert store.ready
        assert not store.closed
        store.put_batch([Message(topic="t", body=b"m%d" % i, queue_id=0) for i in range(5)])
        store.tier_now()
        stats = store.stats
        assert stats.dispatch is not None
        assert stats.dispatch.messages_dispatched == 5
        assert stats.cache.misses == 0
        got = store.get("t", 0, 0, policy=ReadPolicy.FORCE)
        assert got.status is GetStatus.FOUND
        assert [m.body for m in got.messages] == [b"m%d" % i for i in range(5)]
        after = store.stats
        assert after.cache.misses == 1
        assert after.cache_batches == 1
        assert after.cache_bytes > 0
    finally:
        store.close()
    assert store.closed


def test_a_hot_only_store_is_ready_and_has_no_dispatch_stats(tmp_path: Path) -> None:
    with BlockingMessageStore.open(hot_only_config(tmp_path)) as store:
        assert store.ready  # nothing to load
        assert store.stats.dispatch is None
        assert store.stats.cache_batches == 0
    assert store.closed
