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


def test_the_facade_reports_what_metrics_and_the_daemon_read(tmp_path: Path) -> None:
    # metrics.py and daemon.py read only this surface: stats (hot, reads, cold), dispatch_lag,
    # cold_storage, tiering_status and set_backend_observer.
    calls: list[tuple[str, bool]] = []
    store = BlockingMessageStore.open(cold_config(tmp_path))
    try:
        store.wait_ready(60)
        store.set_backend_observer(lambda op, seconds, nbytes, ok: calls.append((op, ok)))
        store.put_batch([Message(topic="t", body=b"m%d" % i, queue_id=q) for i in range(3) for q in (0, 1)])
        assert store.hot.wait_dispatched(10)  # the oldest's store time is read from the hot queue
        lag = store.dispatch_lag()
        assert [(q.topic, q.queue_id, q.messages) for q in lag] == [("t", 0, 3), ("t", 1, 3)]
        assert all(q.oldest_ms is not None for q in lag)
        assert store.tier_now().committed == 6
        assert [(q.queue_id, q.messages, q.oldest_ms) for q in store.dispatch_lag()] == [
            (0, 0, None),
            (1, 0, None),
        ]
        assert ("write", True) in calls  # the commits went through the observer
        stats = store.stats
        assert stats.hot.topics == 1
        assert not stats.hot.writes_refused
        assert stats.hot.commitlog_end > 0
        assert (stats.hot.quarantined_ranges, stats.hot.corrupt_reads) == (0, 0)
        assert store.get("t", 0, 0, policy=ReadPolicy.FORCE).status is GetStatus.FOUND
        assert store.stats.reads.reads["cold"] == 1
        cold = store.stats.cold
        assert cold is not None
        assert (cold.ready, cold.metadata_loaded, cold.writes_refused, cold.prefix_owned) == (
            True,
            True,
            False,
            False,
        )
        assert cold.owner_epoch is not None
        assert cold.index.items_added == 0  # no keys in these messages
        storage = store.cold_storage()
        assert storage is not None
        assert storage.sizes["COMMIT_LOG"] > 0
        assert storage.segments["CONSUME_QUEUE"] == 2
        assert set(storage.oldest_ms) == {"t"}
        status = store.tiering_status()
        assert status is not None
        assert status["ready"] is True
    finally:
        store.close()


def test_a_hot_only_store_reports_no_cold_tier(tmp_path: Path) -> None:
    with BlockingMessageStore.open(hot_only_config(tmp_path)) as store:
        store.put(Message(topic="t", body=b"x", queue_id=0))
        assert store.stats.cold is None
        assert store.stats.hot.topics == 1
        assert store.dispatch_lag() == []
        assert store.cold_storage() is None
        assert store.tiering_status() is None
        store.set_backend_observer(lambda *a: None)  # nothing to observe: no error
