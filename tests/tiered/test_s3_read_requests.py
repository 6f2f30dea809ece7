"""Request counts of a sequential cold consume on a real S3 server: batches follow the stored
objects (an open segment's chunks), so each object is fetched with one GET — not two ranged
GETs per batch, as when a batch of ``read_ahead_count`` records straddles two chunks."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from tierd import BlockingMessageStore, Message
from tierd.testing.s3server import create_bucket
from tierd.testing.workload import list_objects, log_requests

from .conftest import cold_config

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.testing.s3server import S3Server

MESSAGES = 600
#: Records per get and per batch: more than a chunk holds (~16 KiB / ~330 bytes ≈ 50), so
#: batches cut by count alone would end inside the next chunk every time.
COUNT = 64


def _body(i: int) -> bytes:
    return b"m%05d-" % i + bytes([i % 251]) * 200


def test_a_sequential_consume_reads_each_commitlog_object_once(tmp_path: Path, moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    backend = {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": moto_server.storage_options}
    cfg = cold_config(
        tmp_path,
        backend,
        group_commit_size=16 * 1024,  # one chunk object per ~16 KiB commit
        group_commit_count=10_000,
        read_ahead_count=COUNT,
    )
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        store.put_batch([Message("seq", _body(i), queue_id=0) for i in range(MESSAGES)])
        assert store.tier_now().committed == MESSAGES
    chunks = [
        key for key, size in list_objects(moto_server, bucket, "cold/") if "/COMMIT_LOG/" in key and size
    ]
    assert len(chunks) >= 5, chunks  # an open segment of several chunk objects
    with BlockingMessageStore.open(cfg) as store:  # an empty read cache, as after a restart
        store.wait_ready()
        calls = log_requests(store)
        bodies: list[bytes] = []
        offset = 0
        while offset < MESSAGES:
            r = store.get("seq", 0, offset, COUNT, policy="FORCE")
            assert r.source == "cold"
            assert r.messages
            bodies += [m.body for m in r.messages]
            offset = r.next_offset
        assert bodies == [_body(i) for i in range(MESSAGES)]
    gets = collections.Counter(path for op, path in calls if op == "GetObject" and "/COMMIT_LOG/" in path)
    assert sorted(gets) == sorted(f"/{key}" for key in chunks)
    assert set(gets.values()) == {1}, gets
