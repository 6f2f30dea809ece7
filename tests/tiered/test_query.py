"""Key queries across tiers: merged, de-duplicated, and never a wrong message.

``t#k17874`` and ``t#k109888`` have the same 32-bit mmh3 hash: every index (hot and cold) returns
both as candidates; only messages whose keys really match may come back.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import mmh3

from tierd import BlockingMessageStore, Message

from .conftest import cold_config, run

if TYPE_CHECKING:
    from pathlib import Path

A, B = "k17874", "k109888"


def test_crafted_keys_really_collide() -> None:
    assert mmh3.hash(f"t#{A}", 0, signed=False) == mmh3.hash(f"t#{B}", 0, signed=False)


def test_query_merges_tiers_deduplicates_and_filters_collisions(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path, index_slots=4, index_items=8)  # tiny cold index files: many uploads
    cfg = cfg.with_overrides(
        store={
            "commitlog_file_size": 256 * 1024,
            "max_message_size": 64 * 1024,
            "index_slots": 4,
            "index_items": 1000,
            "file_reserved_time": 1.0,
        }
    )
    with BlockingMessageStore.open(cfg) as store:
        hot = store.hot
        assert store.tiering is not None
        hot.commitlog.clock = functools.partial(int, 1_000)
        old = store.put_batch(
            [
                Message(
                    topic="t",
                    body=b"old-%d" % i + b"x" * 2000,
                    keys=[A if i % 2 else B, f"u{i}"],
                    queue_id=i % 2,
                )
                for i in range(200)
            ]
        )
        store.tier_now()
        run(store, store.tiering.index.maintain())  # seal + compact + upload full cold index files
        assert store.tiering.index.uploaded_infos()
        assert hot.apply_retention(now_ms=10**12) >= 1  # the oldest messages now exist only cold
        hot.commitlog.clock = functools.partial(int, 2_000)
        new = store.put_batch(
            [Message(topic="t", body=b"new-%d" % i, keys=[A if i % 2 else B], queue_id=0) for i in range(10)]
        )
        store.tier_now()  # the newest are in both tiers: must not come back twice

        hits = store.query("t", A, max_count=1000)
        expected_old = {(r.queue_id, r.queue_offset) for i, r in enumerate(old) if i % 2}
        expected_new = {(r.queue_id, r.queue_offset) for i, r in enumerate(new) if i % 2}
        got = [(m.queue_id, m.queue_offset) for m in hits]
        assert len(got) == len(set(got))  # de-duplicated
        assert set(got) == expected_old | expected_new  # both tiers, and nothing of key B
        assert all(A in m.keys for m in hits)
        assert [m.store_timestamp for m in hits] == sorted((m.store_timestamp for m in hits), reverse=True)
        assert {m.queue_offset for m in store.query("t", B, max_count=1000) if m.body.startswith(b"old")} == {
            r.queue_offset for i, r in enumerate(old) if not i % 2
        }
        assert [m.body for m in store.query("t", "u7")] == [b"old-7" + b"x" * 2000]  # cold only
        assert store.query("t", A, max_count=3) == hits[:3]
        assert store.query("t", A, begin=1_500, end=3_000, max_count=1000) == [
            m for m in hits if m.body.startswith(b"new")
        ]
