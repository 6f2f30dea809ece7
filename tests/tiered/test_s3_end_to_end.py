"""Produce → tier → FORCE read through the public facade, on every real S3 server (moto,
SeaweedFS, LocalStack): the capability probe accepts each of them, segments roll and are sealed
(composed on the server), and every message comes back from the cold tier byte for byte."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierd import BlockingMessageStore, Message

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.testing.s3server import S3Server

QUEUES = 2
PER_QUEUE = 300


def _body(q: int, i: int) -> bytes:
    return b"q%d-m%04d-" % (q, i) + bytes([i % 251]) * (i % 700)


def test_produce_tier_and_read_everything_back_forced_cold(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    backend = {"name": "s3", "url": f"s3://{s3_bucket}/cold", "storage_options": s3_server.storage_options}
    cfg = cold_config(
        tmp_path,
        backend,
        max_message_size=SMALL_BODY_LIMIT,
        commitlog_segment_size=MIN_SEGMENT,  # several segments per queue: rolls and seals
        consumequeue_segment_size=2000,
        group_commit_size=16 * 1024,
        group_commit_count=50,
    )
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        for q in range(QUEUES):
            store.put_batch([Message("e2e", _body(q, i), queue_id=q) for i in range(PER_QUEUE)])
        assert store.tier_now().committed == QUEUES * PER_QUEUE
        assert store.tiering is not None
        report = store.tiering.root.capability_report()
        assert report is not None
        assert report["policy"]["mode"] == "multi-writer"
        sealed = [
            seg for ff in store.tiering.flat.files.values() for seg in ff.commitlog.segments if seg.sealed
        ]
        assert sealed, "segments rolled and were sealed"
        for q in range(QUEUES):
            seen: list[bytes] = []
            offset = 0
            while offset < PER_QUEUE:
                r = store.get("e2e", q, offset, 64, policy="FORCE")
                assert r.source == "cold"
                assert r.messages
                seen += [m.body for m in r.messages]
                offset = r.next_offset
            assert seen == [_body(q, i) for i in range(PER_QUEUE)]
