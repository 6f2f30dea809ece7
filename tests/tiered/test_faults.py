"""Tiering to S3 (moto) through a backend that fails 30 % of its calls.

    produce ──▶ hot store ──dispatcher──▶ FaultyRoot(S3Root) ──▶ moto bucket
                                         (errors before/after the call, half writes, delays)

After the dispatcher has caught up, every queue's cold consume queue covers exactly the hot
offsets, every cold record equals its hot record except PHYSICALOFFSET (= its flat offset), the
flat commitlog is tiled by the consume queue with no byte twice, and the objects in the bucket
(read with boto3, not through tierd) hold exactly those bytes. The FaultyRoot call log proves the
faults happened. A restart on a healthy root over the same bucket must agree and continue.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from tierd import BlockingMessageStore, Message
from tierd.local.codec import POS_PHYSICAL_OFFSET
from tierd.local.store import HotStore
from tierd.store import _LoopThread
from tierd.testing.faults import Fault, FaultPlan, FaultyRoot
from tierd.testing.s3server import create_bucket
from tierd.tiered.registry import open_driver_factory
from tierd.tiered.service import TieringService

from .conftest import cold_config, run

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.config import TierdConfig
    from tierd.testing.faults import Call
    from tierd.testing.s3server import S3Server
    from tierd.tiered.flatfile import FlatAppendFile
    from tierd.tiered.segment import DriverRoot

pytestmark = pytest.mark.timeout(120)

PREFIX = "cold"
TOPICS = ("fa", "fb")
QUEUES = 4  # per topic: 8 queues
SMALL: dict[str, Any] = {
    # Small segments so that both files roll (and seal, through the faults) many times.
    "commitlog_segment_size": 96 * 1024,
    "consumequeue_segment_size": 1000,  # 50 units
    "group_commit_size": 24 * 1024,
    "group_commit_count": 64,
    "manifest_interval": 3600,  # seals are retried by the test, not by a timer
}


def s3_config(tmp_path: Path, server: S3Server, bucket: str, **tiered: Any) -> TierdConfig:
    backend = {"name": "s3", "url": f"s3://{bucket}/{PREFIX}", "storage_options": server.storage_options}
    return cold_config(tmp_path, backend, **{**SMALL, **tiered})


def open_with_root(cfg: TierdConfig, root: DriverRoot) -> BlockingMessageStore:
    """``BlockingMessageStore.open`` with a cold-tier root of our choosing (the facade builds its
    root from ``[backend]``; this builds the same pieces around ``root``)."""
    loop = _LoopThread()
    hot = HotStore.open(cfg.store)

    async def start() -> TieringService:
        tiering = TieringService(cfg, hot, root=root)
        await tiering.start()
        await asyncio.wait_for(tiering.ready.wait(), 30)
        return tiering

    try:
        tiering = loop.run(start())
    except BaseException:
        loop.stop()
        hot.close()
        raise
    return BlockingMessageStore(cfg, hot, tiering, loop)


def _files(store: BlockingMessageStore) -> list[FlatAppendFile]:
    assert store.tiering is not None
    return [f for ff in store.tiering.flat.files.values() for f in (ff.commitlog, ff.consumequeue)]


def caught_up(store: BlockingMessageStore) -> bool:
    assert store.tiering is not None
    for (topic, qid), hot_cq in store.hot.cqs.items():
        ff = store.tiering.flat.get(topic, qid)
        if ff is None or ff.max_offset != hot_cq.max_offset or ff.needs_commit:
            return False
    return all(not f.unsealed_full for f in _files(store))


def tier_until_caught_up(store: BlockingMessageStore, deadline_s: float = 45.0) -> int:
    """Drive tiering (``tier_now`` clears the retry backoff) and retry failed seals — what the
    maintenance task does every ``manifest_interval`` — until everything is cold and sealed.
    Returns the number of rounds it took."""
    deadline = time.monotonic() + deadline_s
    rounds = 0
    while not caught_up(store):
        if time.monotonic() > deadline:
            raise AssertionError(f"tiering did not catch up within {deadline_s} s ({rounds} rounds)")
        store.tier_now()
        for f in _files(store):
            run(store, f.seal_pending())
        rounds += 1
    return rounds


# ---------------------------------------------------------------------------- verification
def backend_segments(server: S3Server, bucket: str) -> dict[str, bytes]:
    """Every segment in the bucket, read with boto3: path → bytes. A sealed segment is its
    object; an open one the concatenation of its chunks, which must tile it exactly."""
    client = server.boto3_client()
    try:
        objects: dict[str, int] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX + "/"):
            for o in page.get("Contents", []):
                objects[o["Key"]] = int(o["Size"])
        sealed = {k for k in objects if ".chunks/" not in k}
        chunks: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
        for k in objects:
            if ".chunks/" in k:
                seg, pos = k.split(".chunks/")
                chunks[seg].append((int(pos), k))
        out: dict[str, bytes] = {}
        for key in sealed:
            assert key not in chunks, f"sealed segment {key} still has chunks"
            out[key[len(PREFIX) + 1 :]] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        for key, parts in chunks.items():
            data = b""
            for pos, k in sorted(parts):
                assert pos == len(data), f"{k}: chunk at {pos} after {len(data)} bytes (gap or overlap)"
                data += client.get_object(Bucket=bucket, Key=k)["Body"].read()
            out[key[len(PREFIX) + 1 :]] = data
        return out
    finally:
        client.close()


def verify(store: BlockingMessageStore, backend: dict[str, bytes]) -> int:
    """Cold == hot for every queue; flat commitlog tiled by the cold CQ; bucket == flat files.
    Returns the number of messages checked."""
    assert store.tiering is not None
    total = 0
    seen_paths: set[str] = set()
    for (topic, qid), hot_cq in sorted(store.hot.cqs.items()):
        ff = store.tiering.flat.get(topic, qid)
        assert ff is not None, (topic, qid)
        assert (ff.min_offset, ff.max_offset) == (hot_cq.min_offset, hot_cq.max_offset), (topic, qid)
        n = ff.max_offset - ff.min_offset
        cold_units = run(store, ff.read_units(ff.min_offset, n))
        assert len(cold_units) == n
        base = ff.commitlog.min_offset
        flat = run(store, ff.commitlog.read(base, ff.commitlog.commit_offset - base))
        offsets = cold_units["offset"].astype(np.int64)
        sizes = cold_units["size"].astype(np.int64)
        # The units tile the flat commitlog exactly: no byte twice, none unreferenced.
        assert int(offsets[0]) == base, (topic, qid)
        assert np.array_equal(offsets[1:], offsets[:-1] + sizes[:-1]), (topic, qid)
        assert int(offsets[-1] + sizes[-1]) == ff.commitlog.commit_offset, (topic, qid)
        hot_units = hot_cq.read_units(ff.min_offset, n)
        assert np.array_equal(sizes, hot_units["size"].astype(np.int64))
        assert np.array_equal(cold_units["tags_code"], hot_units["tags_code"])
        for off, size, phys in zip(
            offsets.tolist(), sizes.tolist(), hot_units["offset"].tolist(), strict=True
        ):
            raw = flat[off - base : off - base + size]
            hot_raw = store.hot.commitlog.read_bytes(phys, size)
            assert raw[:POS_PHYSICAL_OFFSET] == hot_raw[:POS_PHYSICAL_OFFSET]
            assert raw[POS_PHYSICAL_OFFSET + 8 :] == hot_raw[POS_PHYSICAL_OFFSET + 8 :]
            assert int.from_bytes(raw[POS_PHYSICAL_OFFSET : POS_PHYSICAL_OFFSET + 8], "big") == off
        total += n
        # What tierd reads is what the bucket holds, segment by segment; all but the last sealed.
        for file, content in ((ff.commitlog, flat), (ff.consumequeue, None)):
            for i, seg in enumerate(file.segments):
                assert seg.path in backend, seg.path
                seen_paths.add(seg.path)
                stored = backend[seg.path]
                assert len(stored) == seg.commit_position, seg
                if content is not None:
                    start = seg.base_offset - base
                    assert stored == content[start : start + seg.commit_position], seg
                assert seg.sealed or i == len(file.segments) - 1 or not seg.closed, seg
        cq_bytes = b"".join(backend[s.path] for s in ff.consumequeue.segments)
        assert cq_bytes == cold_units.tobytes()
    assert seen_paths == set(backend), "objects in the bucket that no flat file owns"
    return total


def _messages(rng: random.Random, n: int, first: int) -> list[Message]:
    out = []
    for i in range(first, first + n):
        size = rng.choice((rng.randint(1, 200), rng.randint(200, 3000), rng.randint(3000, 12000)))
        out.append(
            Message(
                topic=TOPICS[i % len(TOPICS)],
                body=rng.randbytes(size),
                queue_id=rng.randrange(QUEUES),
                keys=[f"k{i}"],
                tags=rng.choice(("a", "b", None)),
            )
        )
    return out


def _outcomes(calls: list[Call], method: str) -> collections.Counter[str]:
    return collections.Counter(c.outcome for c in calls if c.method == method)


# ---------------------------------------------------------------------------- tests
def test_tiering_through_30_percent_faults_loses_and_duplicates_nothing(
    tmp_path: Path, moto_server: S3Server
) -> None:
    bucket = create_bucket(moto_server)
    cfg = s3_config(tmp_path, moto_server, bucket)
    plan = FaultPlan(
        probability=0.3,
        methods=frozenset({"write", "seal", "size", "create"}),
        modes=(Fault.BEFORE, Fault.AFTER, Fault.HALF),
        seed=1234,
        delays={"write": 0.002, "seal": 0.004, "size": 0.001},
    )
    faulty = FaultyRoot(open_driver_factory(cfg.backend), plan)
    rng = random.Random(42)
    produced = 0
    with open_with_root(cfg, faulty) as store:
        # Tier while producing: every round leaves some queues mid-failure.
        for _ in range(12):
            batch = _messages(rng, 300, produced)
            store.put_batch(batch)
            produced += len(batch)
            store.tier_now()
        rounds = tier_until_caught_up(store)
        assert rounds >= 1
        checked = verify(store, backend_segments(moto_server, bucket))
        assert checked == produced == 3600
        assert len(store.hot.cqs) == len(TOPICS) * QUEUES
        assert store.tiering is not None
        stats = store.tiering.dispatcher.stats
        assert stats.commit_failures >= 20, stats
    # The faults really happened, on writes (all three kinds) and on seals.
    writes, seals = _outcomes(faulty.calls, "write"), _outcomes(faulty.calls, "seal")
    assert writes["fault:before"] >= 10, writes
    assert writes["fault:after"] >= 10, writes
    assert writes["fault:half"] >= 10, writes
    assert seals["fault:before"] + seals["fault:after"] >= 5, seals
    assert seals["ok"] >= 20, seals  # many rolls sealed in the end
    assert sum(_outcomes(faulty.calls, "size").values()) >= 20  # reconciliations after failures

    # Restart on a healthy root (the plain facade) over the same bucket and local metadata.
    with BlockingMessageStore.open(cfg) as store:
        assert store.tiering is not None
        run(store, store.tiering.ready.wait())
        assert store.tier_now() == 0  # nothing was left behind
        assert verify(store, backend_segments(moto_server, bucket)) == produced
        more = _messages(rng, 400, produced)
        store.put_batch(more)
        produced += len(more)
        tier_until_caught_up(store)
        assert verify(store, backend_segments(moto_server, bucket)) == produced


def test_half_write_is_completed_by_the_commit_retry_without_duplicating_bytes(
    tmp_path: Path, moto_server: S3Server
) -> None:
    """Write #3 is the flat commitlog commit of the second batch (writes go CL, CQ, CL, CQ…):
    half of it lands as a short chunk, then the call fails. The next commit asks the backend how
    much landed and writes only the rest."""
    bucket = create_bucket(moto_server)
    cfg = s3_config(tmp_path, moto_server, bucket, group_commit_count=10, commitlog_segment_size=1 << 30)
    faulty = FaultyRoot(open_driver_factory(cfg.backend), FaultPlan().fail_nth("write", 3, Fault.HALF))
    bodies = [bytes([65 + i % 26]) * (100 + 7 * i) for i in range(30)]
    with open_with_root(cfg, faulty) as store:
        store.put_batch([Message(topic="half", body=b, queue_id=0) for b in bodies])
        assert store.tier_now() == 10  # batch 1 committed; batch 2's commitlog write half-failed
        assert store.tiering is not None
        ff = store.tiering.flat.get("half", 0)
        assert ff is not None
        seg = ff.commitlog.segments[-1]
        first = seg.commit_position
        second = seg.append_position - first
        key = f"{PREFIX}/{seg.path}"
        client = moto_server.boto3_client()

        def chunks() -> list[tuple[int, int]]:
            resp = client.list_objects_v2(Bucket=bucket, Prefix=key + ".chunks/")
            return [(int(o["Key"].rsplit("/", 1)[1]), int(o["Size"])) for o in resp.get("Contents", [])]

        try:
            assert [c for c in faulty.calls if c.method == "write"][-1].outcome == "fault:half"
            assert chunks() == [(0, first), (first, second // 2)]  # the short chunk is there
            assert store.tier_now() == 20
            writes = [(c.args, c.outcome) for c in faulty.calls if c.method == "write"]
            assert writes[2] == (f"{first}+{second}", "fault:half")
            # The retry sent exactly the missing half, at the backend's end.
            assert writes[3] == (f"{first + second // 2}+{second - second // 2}", "ok")
            layout = chunks()
            assert layout[:3] == [
                (0, first),
                (first, second // 2),
                (first + second // 2, second - second // 2),
            ]
            stored = b"".join(
                client.get_object(Bucket=bucket, Key=f"{key}.chunks/{pos:020d}")["Body"].read()
                for pos, _ in layout
            )
        finally:
            client.close()
        assert len(stored) == seg.commit_position == ff.commitlog.commit_offset
        assert stored == run(store, ff.commitlog.read(0, len(stored)))
        assert verify(store, backend_segments(moto_server, bucket)) == 30
