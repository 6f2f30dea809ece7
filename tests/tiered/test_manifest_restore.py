"""The bucket describes itself: manifests after tiering, and restore from the bucket alone.

store A ──tier──▶ bucket (segments + MANIFEST.json) ──restore──▶ empty store B ──▶ same offsets
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import google_crc32c
import pytest

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.errors import InvalidArgumentError, NotFoundError
from tierd.format.record import decode_record
from tierd.inventory import bucket_segments
from tierd.tiered.manifest import BrokerManifest, QueueManifest, broker_manifest_path, queue_manifest_path
from tierd.tiered.metadata import MetadataStore
from tierd.tiered.roots import open_driver_factory

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config, run, upload_index
from .test_write_path import cold_records

if TYPE_CHECKING:
    from pathlib import Path

SMALL: dict[str, Any] = {
    "max_message_size": SMALL_BODY_LIMIT,
    "commitlog_segment_size": MIN_SEGMENT,
    "consumequeue_segment_size": 200,
}


def _body(i: int) -> bytes:
    """1,500 bytes: the smallest queue below (50 messages) fills more than one segment."""
    return b"%06d" % i * 250


def _produce_and_tier(store: BlockingMessageStore, start: int, n: int) -> None:
    store.put_batch(
        [
            Message(topic="orders" if i % 3 else "audit", body=_body(i), keys=[f"k{i}"], queue_id=i % 2)
            for i in range(start, start + n)
        ]
    )
    store.tier_now()


def test_manifests_describe_every_queue_and_sealed_checksums_match(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path, **SMALL)
    with BlockingMessageStore.open(cfg) as store:
        _produce_and_tier(store, 0, 300)
    cold = tmp_path / "cold"
    broker_raw = (cold / broker_manifest_path("DefaultCluster", "broker-a")).read_bytes()
    assert json.loads(broker_raw)["format-version"] == 1
    broker = BrokerManifest.model_validate_json(broker_raw)
    assert {(t.name, t.queues) for t in broker.topics} == {("orders", (0, 1)), ("audit", (0, 1))}
    for t in broker.topics:
        for qid in t.queues:
            path = cold / queue_manifest_path("DefaultCluster", "broker-a", t.name, qid)
            qm = QueueManifest.model_validate_json(path.read_bytes())
            cls = [s for s in qm.segments if s.type == "COMMIT_LOG"]
            cqs = [s for s in qm.segments if s.type == "CONSUME_QUEUE"]
            assert len(cls) > 1  # segments rolled and were sealed
            assert len(cqs) > 1
            assert sum(s.message_count for s in cls) == qm.max_offset - qm.min_offset
            assert sum(s.message_count for s in cqs) == qm.max_offset - qm.min_offset
            expected_first = qm.min_offset
            for s in cls:
                assert s.first_queue_offset == expected_first
                assert s.last_queue_offset == expected_first + s.message_count - 1
                expected_first += s.message_count
                obj = path.parent / "COMMIT_LOG" / f"{google_hash(s.base_offset)}{s.base_offset:020d}"
                data = obj.read_bytes()
                assert len(data) == s.size
                if s.sealed:
                    assert s.crc32c == f"{google_crc32c.value(data):08x}"
                else:
                    assert s.crc32c is None
                # the first record of the segment carries the queue offset the manifest claims
                assert decode_record(data).queue_offset == s.first_queue_offset


def google_hash(offset: int) -> str:
    from tierd.drivers.paths import get_hash

    return get_hash(str(offset))


def test_restore_into_an_empty_directory_reproduces_segments_and_offsets(tmp_path: Path) -> None:
    cfg_a = cold_config(tmp_path / "a", backend={"name": "posix", "url": str(tmp_path / "bucket")}, **SMALL)
    with BlockingMessageStore.open(cfg_a) as store:
        _produce_and_tier(store, 0, 300)
        # committed after the last manifest write: restore must still find it (roll forward)
        store.put_batch([Message(topic="orders", body=b"late", queue_id=1)])
        store.hot.wait_dispatched(10)
        assert store.tiering is not None
        run(store, store.tiering.dispatcher.tier_now())
        store.tiering.manifests.write_changed = _never  # type: ignore[method-assign]
    meta_a = MetadataStore(tmp_path / "a" / "hot").load()
    assert meta_a is not None

    cfg_b = cold_config(tmp_path / "b", backend={"name": "posix", "url": str(tmp_path / "bucket")}, **SMALL)
    seen: list[tuple[int, int, str]] = []
    report = BlockingMessageStore.restore(cfg_b, progress=lambda d, t, w: seen.append((d, t, w)))
    assert (report.topics, report.queues) == (2, 4)
    assert seen[-1][:2] == (4, 4)
    with BlockingMessageStore.open(cfg_b) as store:
        assert store.tiering is not None
        run(store, store.tiering.ready.wait())
        meta_b = store.tiering.flat.snapshot()
        by_key = {(q.topic, q.queue_id): q for q in meta_b.queues}
        for qa in meta_a.queues:
            qb = by_key[qa.topic, qa.queue_id]
            assert (qb.min_offset, qb.max_offset) == (qa.min_offset, qa.max_offset)
            assert [(s.base_offset, s.size, s.sealed) for s in qb.commitlog] == [
                (s.base_offset, s.size, s.sealed) for s in qa.commitlog
            ]
            assert [(s.base_offset, s.size) for s in qb.consumequeue] == [
                (s.base_offset, s.size) for s in qa.consumequeue
            ]
        # the late record was rolled forward into the restored view
        assert decode_record(cold_records(store, "orders", 1)[-1][1]).body == b"late"
        # new messages continue each queue where the bucket ends, and tier without a gap
        end = by_key["orders", 1].max_offset
        r = store.put(Message(topic="orders", body=b"after-restore", queue_id=1))
        assert r.queue_offset == end
        store.tier_now()
        cold = cold_records(store, "orders", 1)
        assert [q for q, _ in cold] == list(range(cold[0][0], end + 1))
        assert decode_record(cold[-1][1]).body == b"after-restore"


async def _never() -> int:
    return 0


def test_restore_refuses_a_non_empty_directory_and_explains_a_missing_manifest(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path, **SMALL)
    with BlockingMessageStore.open(cfg) as store:
        _produce_and_tier(store, 0, 10)
    with pytest.raises(InvalidArgumentError, match="empty store directory"):
        BlockingMessageStore.restore(cfg)
    empty = cold_config(tmp_path / "fresh", backend={"name": "posix", "url": str(tmp_path / "nothing")})
    with pytest.raises(NotFoundError, match="no tierd manifest"):
        BlockingMessageStore.restore(empty)


def test_restore_finds_segments_and_queues_committed_after_the_last_manifest_write(tmp_path: Path) -> None:
    """A writer killed between commits and its next manifest write leaves a bucket whose
    manifests are stale: newer (rolled) segments and a whole new queue are not listed. Restore
    must find them; trusting the manifests alone lost that history and then wrote different
    records into the segments that already held it."""
    bucket = {"name": "posix", "url": str(tmp_path / "bucket")}
    cfg_a = cold_config(tmp_path / "a", backend=bucket, **SMALL)
    with BlockingMessageStore.open(cfg_a) as store:
        _produce_and_tier(store, 0, 60)
        assert store.tiering is not None
        store.tiering.manifests.write_changed = _never  # type: ignore[method-assign]
        store.put_batch([Message(topic="orders", body=_body(i), queue_id=1) for i in range(200)])
        store.put_batch([Message(topic="late", body=b"new queue %d" % i, queue_id=0) for i in range(5)])
        store.hot.wait_dispatched(10)
        run(store, store.tiering.dispatcher.tier_now())
        expected = {
            key: [decode_record(raw).body for _, raw in cold_records(store, *key)]
            for key in (("orders", 1), ("late", 0))
        }
    cfg_b = cold_config(tmp_path / "b", backend=bucket, **SMALL)
    report = BlockingMessageStore.restore(cfg_b)
    assert (report.topics, report.queues) == (3, 5)
    with BlockingMessageStore.open(cfg_b) as store:
        for (topic, qid), bodies in expected.items():
            got = store.get(topic, qid, 0, 1000).messages
            assert [m.body for m in got] == bodies
            assert store.max_offset(topic, qid) == len(bodies)
        r = store.put(Message(topic="orders", body=b"after-restore", queue_id=1))
        assert r.queue_offset == len(expected["orders", 1])
        store.tier_now()
        assert store.get("orders", 1, r.queue_offset, 1).messages[0].body == b"after-restore"


def test_restore_brings_back_the_cold_key_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys tiered before the restore are found through the restored cold index — also those of
    an index segment uploaded after the index manifest's last write."""
    bucket = {"name": "posix", "url": str(tmp_path / "bucket")}
    cfg_a = cold_config(tmp_path / "a", backend=bucket, **SMALL)
    with BlockingMessageStore.open(cfg_a) as store:
        _produce_and_tier(store, 0, 150)
        upload_index(store)
        _produce_and_tier(store, 150, 150)
        assert store.tiering is not None
        monkeypatch.setattr(store.tiering.index, "_write_manifest", _no_manifest)
        upload_index(store)
        uploaded = [i.base_offset for i in store.tiering.index.uploaded_infos()]
        assert len(uploaded) == 2
    monkeypatch.undo()
    # `tierd segments --from URL --type INDEX` lists what the index manifest lists
    assert asyncio.run(_bucket_index(cfg_a)) == uploaded[:1]
    cfg_b = cold_config(tmp_path / "b", backend=bucket, **SMALL)
    BlockingMessageStore.restore(cfg_b)
    with BlockingMessageStore.open(cfg_b) as store:
        store.wait_ready(60)
        assert store.tiering is not None
        assert [i.base_offset for i in store.tiering.index.uploaded_infos()] == uploaded
        for i in (4, 17, 151, 299):  # in the first and in the second index segment
            topic = "orders" if i % 3 else "audit"
            (found,) = store.query(topic, f"k{i}")
            assert (found.keys, found.body) == ((f"k{i}",), _body(i))
        assert store.query("orders", "k-none") == []


async def _no_manifest(*args: object) -> None:
    return None


async def _bucket_index(cfg: TierdConfig) -> list[int]:
    root = open_driver_factory(cfg.backend)
    try:
        rows = await bucket_segments(root, cfg.tiered.cluster, cfg.tiered.broker, kind="INDEX")
    finally:
        await root.aclose()
    return [r.base_offset for r in rows]
