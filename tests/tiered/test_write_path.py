"""Tiered write path, spec style: produce → expect offloaded → expect cold bytes.

hot commitlog ──dispatcher──▶ flat commitlog (PHYSICALOFFSET rewritten) + flat consume queue
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from tierd import BlockingMessageStore, Message
from tierd.format.record import decode_record
from tierd.tiered.metadata import MetadataStore

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config, run

if TYPE_CHECKING:
    from tierd.tiered.flatmessage import CommittedBatch, FlatMessageFile
    from tierd.tiered.service import TieringService


def cold_records(store: BlockingMessageStore, topic: str, qid: int) -> list[tuple[int, bytes]]:
    """(queue offset, raw cold record) for every committed message of a queue, via the cold CQ."""
    assert store.tiering is not None
    ff = store.tiering.flat.get(topic, qid)
    assert ff is not None
    out = []
    for qoff in range(ff.min_offset, ff.max_offset):
        unit = run(store, ff.read_units(qoff, 1))[0]
        raw = run(store, ff.read_commitlog(int(unit["offset"]), int(unit["size"])))
        assert len(raw) == int(unit["size"])
        out.append((qoff, raw))
    return out


def test_every_cold_record_equals_its_hot_record_except_physical_offset(tmp_path: Path) -> None:
    with BlockingMessageStore.open(cold_config(tmp_path)) as store:
        res = store.put_batch(
            [
                Message(
                    topic="orders",
                    body=os.urandom(700 + i),
                    keys=[f"o-{i}"],
                    tags="t",
                    queue_id=i % 3,
                    born_host="[2001:db8::9]:77" if i % 5 == 0 else None,
                )
                for i in range(600)
            ]
        )
        assert store.tier_now().committed == 600
        hot_by_queue: dict[int, dict[int, int]] = {}
        for r in res:
            hot_by_queue.setdefault(r.queue_id, {})[r.queue_offset] = r.commitlog_offset
        for qid, offsets in hot_by_queue.items():
            cold = cold_records(store, "orders", qid)
            assert [q for q, _ in cold] == sorted(offsets)
            flat = 0
            for qoff, raw in cold:
                hot_raw = store.hot.commitlog.read_bytes(offsets[qoff], len(raw))
                assert raw[:28] == hot_raw[:28]
                assert raw[36:] == hot_raw[36:]
                m = decode_record(raw)
                assert m.commitlog_offset == flat  # rewritten to the flat offset
                assert m.queue_offset == qoff
                flat += len(raw)


def test_cold_consume_queue_units_point_at_flat_offsets_and_carry_tags(tmp_path: Path) -> None:
    with BlockingMessageStore.open(cold_config(tmp_path)) as store:
        store.put_batch([Message(topic="t", body=b"x" * n, tags="A", queue_id=0) for n in (10, 20, 30)])
        store.tier_now()
        assert store.tiering is not None
        ff = store.tiering.flat.get("t", 0)
        assert ff is not None
        units = run(store, ff.read_units(0, 3))
        sizes = units["size"].tolist()
        assert units["offset"].tolist() == [0, sizes[0], sizes[0] + sizes[1]]
        hot = store.hot.queue("t", 0).read_units(0, 3)  # type: ignore[union-attr]
        assert units["tags_code"].tolist() == hot["tags_code"].tolist()
        assert sizes == hot["size"].tolist()


def _round(store: BlockingMessageStore) -> int:
    assert store.tiering is not None
    store.hot.wait_dispatched(10)
    run(store, store.tiering.ready.wait())
    return run(store, store.tiering.dispatcher.dispatch_round()).total


@pytest.mark.parametrize(
    ("tiered", "hold", "trigger"),
    [
        ({"group_commit_count": 10}, 9, 1),  # count threshold
        ({"group_commit_size": 5_000}, 4, 1),  # size threshold (1,000-byte bodies)
    ],
)
def test_count_and_size_thresholds_trigger_a_commit(
    tmp_path: Path, tiered: dict[str, Any], hold: int, trigger: int
) -> None:
    with BlockingMessageStore.open(cold_config(tmp_path, **tiered)) as store:
        store.put_batch([Message(topic="g", body=b"b" * 1000, queue_id=0)] * hold)
        assert _round(store) == 0  # held back
        store.put_batch([Message(topic="g", body=b"b" * 1000, queue_id=0)] * trigger)
        assert _round(store) > 0


def test_timeout_threshold_and_oversized_message(tmp_path: Path) -> None:
    with BlockingMessageStore.open(cold_config(tmp_path, group_commit_size=1_000)) as store:
        assert store.tiering is not None
        disp = store.tiering.dispatcher
        store.put(Message(topic="slow", body=b"tiny", queue_id=0))
        assert _round(store) == 0
        disp.clock = lambda: 10**12  # the pending message is now very old
        assert _round(store) == 1
        # a single message larger than the whole group size still goes (RocketMQ #10998)
        store.put(Message(topic="big", body=b"B" * 50_000, queue_id=0))
        assert _round(store) == 1
        assert decode_record(cold_records(store, "big", 0)[0][1]).body == b"B" * 50_000


def test_restart_resumes_without_gap_or_duplicate_and_metadata_matches_backend(tmp_path: Path) -> None:
    cfg = cold_config(
        tmp_path,
        max_message_size=SMALL_BODY_LIMIT,
        commitlog_segment_size=MIN_SEGMENT,  # ~7 segments for the 500 messages below
        consumequeue_segment_size=400,
    )
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="r", body=b"%05d" % i * 180, queue_id=0) for i in range(300)])
        store.tier_now()
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="r", body=b"%05d" % i * 180, queue_id=0) for i in range(300, 500)])
        store.tier_now()
        cold = cold_records(store, "r", 0)
        assert [q for q, _ in cold] == list(range(500))
        assert [decode_record(raw).body for _, raw in cold] == [b"%05d" % i * 180 for i in range(500)]
    meta = MetadataStore(Path(cfg.store.dir)).load()
    assert meta is not None
    (q,) = meta.queues
    assert (q.min_offset, q.max_offset) == (0, 500)
    cold_root = Path(cfg.backend.url)
    for seg in (*q.commitlog, *q.consumequeue):
        files = list(cold_root.rglob(f"*{seg.base_offset:020d}"))
        files = [f for f in files if f.parent.name == seg.type]
        assert len(files) == 1, seg
        assert files[0].stat().st_size == seg.size, seg
    assert sum(s.sealed for s in q.commitlog) == len(q.commitlog) - 1  # all but the open one


def test_roll_forward_of_commitlog_records_the_consume_queue_missed(tmp_path: Path) -> None:
    """Crash between the commitlog commit and the consume-queue commit."""
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="rf", body=b"m%d" % i, queue_id=0) for i in range(20)])
        store.tier_now()
        assert store.tiering is not None
        ff = store.tiering.flat.get("rf", 0)
        assert ff is not None
        store.put_batch([Message(topic="rf", body=b"n%d" % i, queue_id=0) for i in range(5)])
        store.hot.wait_dispatched(10)
        hot_cq = store.hot.queue("rf", 0)
        assert hot_cq is not None
        units = hot_cq.read_units(20, 5)
        sizes = units["size"].astype(np.int64)
        raw = b"".join(
            store.hot.commitlog.read_bytes(int(o), int(s))
            for o, s in zip(units["offset"], sizes, strict=False)
        )
        from tierd.tiered.dispatcher import store_timestamps

        async def half_commit(f: FlatMessageFile) -> None:
            await f.append_batch(
                raw,
                sizes,
                20,
                units["tags_code"].astype(np.int64),
                store_timestamps(raw, np.cumsum(sizes) - sizes),
            )
            await f.commitlog.commit()  # ... and the process dies before the CQ commit

        run(store, half_commit(ff))
        run(store, _crash(store.tiering))
        store.tiering = store.router.tiering = None
    with BlockingMessageStore.open(cfg) as store:
        run(store, store.tiering.ready.wait())  # type: ignore[union-attr]
        ff = store.tiering.flat.get("rf", 0)  # type: ignore[union-attr]
        assert ff is not None
        assert ff.max_offset == 25
        store.tier_now()
        assert [decode_record(r).body for _, r in cold_records(store, "rf", 0)] == [
            b"m%d" % i for i in range(20)
        ] + [b"n%d" % i for i in range(5)]


async def _crash(tiering: TieringService) -> None:
    """Stop the tiering tasks the way a crash would: no final round, no metadata save."""
    tiering.dispatcher.stop()
    for task in tiering._tasks:
        task.cancel()
    await asyncio.gather(*tiering._tasks, return_exceptions=True)
    await tiering.root.aclose()


def test_corrupt_metadata_falls_back_to_backup(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="m", body=b"1", queue_id=0)] * 3)
        store.tier_now()
    path = Path(cfg.store.dir) / "config" / "tieredStoreMetadata.json"
    assert (
        json.loads(path.read_text())["format-version"] == 2
    )  # version 2: one segment record (docs/formats.md §2.7)
    assert (path.parent / "tieredStoreMetadata.json.bak").exists()
    path.write_text("{ not json")
    with BlockingMessageStore.open(cfg) as store:
        run(store, store.tiering.ready.wait())  # type: ignore[union-attr]
        assert store.tiering.flat.get("m", 0) is not None  # type: ignore[union-attr]
    assert "using the backup" in caplog.text


def test_hot_retention_waits_for_tiering(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path, group_commit_count=10**6, group_commit_timeout=10**6)
    cfg = cfg.with_overrides(
        store={"commitlog_file_size": 256 * 1024, "max_message_size": 64 * 1024, "file_reserved_time": 1.0}
    )
    with BlockingMessageStore.open(cfg) as store:
        hot = store.hot
        hot.commitlog.clock = lambda: 1_000
        assert store.tiering is not None
        store.tiering.dispatcher.clock = lambda: 1.0  # same instant: nothing is old enough to force
        store.put_batch([Message(topic="h", body=b"z" * 1000, queue_id=0) for _ in range(600)])
        assert _round(store) == 0  # held back by the thresholds: nothing is cold
        assert hot.apply_retention(now_ms=10**12) == 0
        store.tier_now()
        assert hot.apply_retention(now_ms=10**12) >= 1
        assert hot.min_offset("h", 0) > 0  # the hot tier let go of its oldest file...
        assert store.min_offset("h", 0) == 0  # ...but the store still serves all history, cold


def test_tier_now_on_async_store(tmp_path: Path) -> None:
    from tierd import MessageStore

    async def scenario() -> None:
        async with MessageStore.open(cold_config(tmp_path)) as store:
            await store.put_batch([Message(topic="a", body=b"1", queue_id=0)] * 7)
            assert (await store.tier_now()).committed == 7
            assert store.tiering is not None
            assert store.tiering.flat.get("a", 0).max_offset == 7  # type: ignore[union-attr]

    asyncio.run(scenario())


def test_cold_retention_expires_consume_queue_and_commitlog_together(tmp_path: Path) -> None:
    cfg = cold_config(
        tmp_path,
        max_message_size=SMALL_BODY_LIMIT,
        commitlog_segment_size=MIN_SEGMENT,  # a segment holds ~2.5 of the batches below
        consumequeue_segment_size=100,
        file_reserved_time=1.0,
    )
    with BlockingMessageStore.open(cfg) as store:
        assert store.tiering is not None
        hot = store.hot
        for t in range(6):  # six batches, an hour apart
            hot.commitlog.clock = functools.partial(int, 1_000 + t * 3_600_000)
            store.put_batch(
                [Message(topic="ret", body=b"%d-%d" % (t, i) * 870, queue_id=0) for i in range(10)]
            )
            store.tier_now()
        ff = store.tiering.flat.get("ret", 0)
        assert ff is not None
        cl_before, cq_before = len(ff.commitlog.segments), len(ff.consumequeue.segments)
        # everything older than ~3 h before the newest batch expires
        deleted = run(store, store.tiering.apply_retention(now_ms=1_000 + 6 * 3_600_000 + 1_800_000))
        assert deleted > 0
        assert len(ff.consumequeue.segments) < cq_before
        assert len(ff.commitlog.segments) < cl_before
        # the first remaining unit points into the first remaining commitlog segment
        first = run(store, ff.read_units(ff.min_offset, 1))[0]
        assert ff.commitlog.min_offset <= int(first["offset"]) < ff.commitlog.segments[0].commit_offset
        # every remaining message is readable, in order, and the oldest batches are gone
        bodies = [decode_record(raw).body for _, raw in cold_records(store, "ret", 0)]
        assert bodies[-1] == b"5-9" * 870
        assert all(not b.startswith(b"0-") for b in bodies)
        # per-topic override: keep everything longer
        run(store, store.tiering.set_reserve_hours("ret", 1000.0))
        segments = (len(ff.commitlog.segments), len(ff.consumequeue.segments))
        assert run(store, store.tiering.apply_retention(now_ms=1_000 + 8 * 3_600_000)) == 0
        assert (len(ff.commitlog.segments), len(ff.consumequeue.segments)) == segments
        with pytest.raises(ValueError, match="positive"):
            run(store, store.tiering.set_reserve_hours("ret", -1))


def test_disk_nearly_full_and_tiering_behind_refuses_writes_until_tiered(tmp_path: Path) -> None:
    from tierd.errors import StoreFullError

    cfg = cold_config(tmp_path, group_commit_count=10**6, group_commit_timeout=10**6)
    cfg = cfg.with_overrides(
        store={"commitlog_file_size": 256 * 1024, "max_message_size": 64 * 1024, "disk_max_used_ratio": 0.5}
    )
    with BlockingMessageStore.open(cfg) as store:
        hot = store.hot
        assert store.tiering is not None
        store.tiering.dispatcher.clock = lambda: hot.commitlog.last_store_timestamp / 1000
        store.put_batch([Message(topic="d", body=b"z" * 1000, queue_id=0) for _ in range(600)])
        assert _round(store) == 0  # tiering is behind: nothing is cold
        full = True
        hot.disk_usage = lambda path: 0.9 if full else 0.1
        hot.apply_retention()
        with pytest.raises(StoreFullError, match="not yet moved to the cold tier"):
            store.put(Message(topic="d", body=b"refused"))
        store.tier_now()  # now everything is cold: retention may free space
        assert hot.apply_retention() >= 1
        full = False
        hot.apply_retention()
        store.put(Message(topic="d", body=b"accepted"))


def test_saving_over_a_corrupt_main_file_keeps_the_good_backup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tierd.tiered.metadata import TieredMetadata, TopicMeta

    def meta(n: int) -> TieredMetadata:
        return TieredMetadata(cluster="c", broker="b", topics=(TopicMeta(name=f"t{n}", id=n),))

    MetadataStore(tmp_path).save(meta(1))
    MetadataStore(tmp_path).save(meta(2))  # main: 2, backup: 1
    store = MetadataStore(tmp_path)
    store.path.write_text('{"format-version": 1, "clu')  # torn / rotten
    store.save(meta(3))
    assert "does not parse; keeping the backup" in caplog.text
    assert store.path.exists()
    assert store.corrupt.read_text().startswith('{"format-version": 1, "clu')
    store.path.write_text("rotten again")
    loaded = MetadataStore(tmp_path).load()  # falls back to the backup: the last good one before
    assert loaded is not None
    assert loaded.topics[0].name == "t1"
    MetadataStore(tmp_path).save(meta(4))
    store.save(meta(5))  # the main file is its own write: rotated as usual
    assert MetadataStore(tmp_path).load() == meta(5)
    store.path.write_text("rotten")
    assert MetadataStore(tmp_path).load() == meta(4)


def test_an_old_commitlog_segment_is_rolled_and_sealed_once_big_enough(tmp_path: Path) -> None:
    """tiered.rolling_interval / rolling_min_size (RocketMQ's commitLogRollingInterval and
    MinimumSize): a quiet queue's segment is rolled by age, not only when full."""
    cfg = cold_config(tmp_path, rolling_interval=1.0, rolling_min_size=3_000)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready(60)
        assert store.tiering is not None

        def put_and_tier(n: int) -> list[Any]:
            store.put_batch([Message(topic="r", body=b"b" * 1000, queue_id=0)] * n)
            store.tier_now()
            ff = store.tiering.flat.get("r", 0)  # type: ignore[union-attr]
            assert ff is not None
            return ff.commitlog.infos()

        (first,) = put_and_tier(2)
        ff = store.tiering.flat.get("r", 0)
        assert ff is not None
        ff.commitlog._state[first.base_offset].create_timestamp -= 3_600_000  # an hour old, ~2 kB: too small
        assert len(put_and_tier(1)) == 1
        rolled, new = put_and_tier(1)  # now over 3,000 bytes and old: rolled before the append
        assert rolled.sealed
        assert rolled.crc32c is not None
        assert not new.sealed
        assert new.base_offset == rolled.base_offset + rolled.size
        assert len(put_and_tier(3)) == 2  # the new segment is young: no roll
        assert [decode_record(raw).body for _, raw in cold_records(store, "r", 0)] == [b"b" * 1000] * 7


def test_a_segment_rolled_by_age_keeps_the_timestamps_of_its_own_records(tmp_path: Path) -> None:
    """A batch arriving at a segment old enough to roll goes into the new segment, and so does its
    newest store timestamp: the rolled segment's range stays that of its own records (a reader
    of the manifests prunes segments by it — Spark's time filters)."""
    cfg = cold_config(tmp_path, rolling_interval=1.0, rolling_min_size=1)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready(60)
        assert store.tiering is not None
        store.put(Message(topic="r", body=b"old", queue_id=0))
        store.tier_now()
        ff = store.tiering.flat.get("r", 0)
        assert ff is not None
        ff.commitlog._state[0].create_timestamp -= 3_600_000  # an hour old: the next append rolls
        [(_, raw)] = cold_records(store, "r", 0)
        deadline = time.monotonic() + 5
        while time.time() * 1000 <= decode_record(raw).store_timestamp + 1:  # newer records: a later ms
            assert time.monotonic() < deadline
        store.put_batch([Message(topic="r", body=b"new", queue_id=0)] * 3)
        store.tier_now()
        records = [decode_record(raw) for _, raw in cold_records(store, "r", 0)]
        infos = ff.commitlog.infos()
        assert len(infos) == 2
        for info in infos:
            mine = [
                r.store_timestamp
                for r in records
                if info.base_offset <= r.commitlog_offset < info.base_offset + info.size
            ]
            assert mine
            assert (info.min_store_timestamp, info.max_store_timestamp) == (min(mine), max(mine)), info


def test_batches_handed_over_keep_their_records_when_the_gather_buffer_is_reused(tmp_path: Path) -> None:
    """The dispatcher gathers every batch into one reused buffer: what it hands on (the flat
    commitlog's bytes, the index's CommittedBatch) must be copies, not views of that buffer,
    or the next batch's gather would rewrite them."""
    with BlockingMessageStore.open(cold_config(tmp_path, group_commit_size=5_000)) as store:
        assert store.tiering is not None
        handed: list[CommittedBatch] = []
        store.tiering.dispatcher.on_committed.append(handed.append)
        store.put_batch([Message(topic="g", body=b"%04d" % i * 250, queue_id=i % 2) for i in range(40)])
        assert store.tier_now().committed == 40
        # Reused, not one per batch: a queue's batches came out of the same buffer.
        assert store.tiering.dispatcher._scratch is not None
        assert len(handed) >= 8
        for b in handed:
            ends = np.cumsum(b.sizes)
            bodies = [decode_record(b.records[e - s : e]).body for s, e in zip(b.sizes, ends, strict=True)]
            first = 2 * b.first_queue_offset + b.queue_id
            assert bodies == [b"%04d" % (first + 2 * j) * 250 for j in range(len(b.sizes))]
        for qid in (0, 1):
            bodies = [decode_record(raw).body for _, raw in cold_records(store, "g", qid)]
            assert bodies == [b"%04d" % i * 250 for i in range(qid, 40, 2)]
