"""Tiering to S3 (moto) through a backend that fails 30 % of its calls.

    produce ──▶ hot store ──dispatcher──▶ FaultyRoot(S3Root) ──▶ moto bucket
                                         (errors before/after the call, half writes, delays)

After the dispatcher has caught up, every queue's cold consume queue covers exactly the hot
offsets, every cold record equals its hot record except PHYSICALOFFSET (= its flat offset), the
consume-queue units tile the flat commitlog (no record stored twice, no unreferenced byte),
every message was handed to the index exactly once, and the objects in the bucket (read with
boto3, not through tierd) hold exactly the bytes tierd reads, every full segment sealed. The
FaultyRoot call log proves the faults happened. A restart on a healthy root over the same bucket
must agree and continue.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from tierd import BlockingMessageStore, Message
from tierd.errors import BackendError
from tierd.format.record import POS_PHYSICAL_OFFSET
from tierd.local.store import HotStore
from tierd.store import _LoopThread
from tierd.testing.faults import Fault, FaultPlan, FaultyRoot
from tierd.testing.s3server import create_bucket
from tierd.tiered.roots import open_driver_factory
from tierd.tiered.service import TieringService

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config, run

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.config import TierdConfig
    from tierd.drivers.segment import DriverRoot
    from tierd.testing.faults import Call
    from tierd.testing.s3server import S3Server
    from tierd.tiered.flatfile import FlatAppendFile
    from tierd.tiered.flatmessage import CommittedBatch

pytestmark = pytest.mark.timeout(120)

PREFIX = "cold"
SEGMENT_NAME = re.compile(r"[0-9a-f]{8}[0-9]{20}")
TOPICS = ("fa", "fb")
QUEUES = 4  # per topic: 8 queues
SMALL: dict[str, Any] = {
    # Small segments so that both files roll (and seal, through the faults) many times.
    "max_message_size": SMALL_BODY_LIMIT,
    "commitlog_segment_size": MIN_SEGMENT,
    "consumequeue_segment_size": 1600,  # 80 units
    "group_commit_size": 32 * 1024,
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
    assert store.hot.wait_dispatched(30)  # the hot consume queues hold everything produced
    while not caught_up(store):
        if time.monotonic() > deadline:
            raise AssertionError(f"tiering did not catch up within {deadline_s} s ({rounds} rounds)")
        with contextlib.suppress(BackendError):  # a round that met a fault says so; retried next
            store.tier_now()
        for f in _files(store):
            run(store, f.seal_pending())
        rounds += 1
    return rounds


# ---------------------------------------------------------------------------- verification
def backend_segments(server: S3Server, bucket: str) -> dict[str, tuple[bytes, bool]]:
    """Every segment in the bucket, read with boto3: path → (bytes, sealed). A sealed segment is
    its object; an open one the concatenation of its chunks, which must tile it exactly."""
    client = server.boto3_client()
    try:
        objects: dict[str, int] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX + "/"):
            for o in page.get("Contents", []):
                objects[o["Key"]] = int(o["Size"])
        # Segments only: bucket manifests (``…/MANIFEST.json``) are not segments.
        sealed = {k for k in objects if ".chunks/" not in k and SEGMENT_NAME.fullmatch(k.rsplit("/", 1)[1])}
        chunks: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
        for k in objects:
            if ".chunks/" in k:
                seg, name = k.split(".chunks/")
                chunks[seg].append((int(name), k))
        out: dict[str, tuple[bytes, bool]] = {}
        for key in sealed:
            assert key not in chunks, f"sealed segment {key} still has chunks"
            out[key[len(PREFIX) + 1 :]] = (client.get_object(Bucket=bucket, Key=key)["Body"].read(), True)
        for key, parts in chunks.items():
            data = b""
            for pos, k in sorted(parts):
                assert pos == len(data), f"{k}: chunk at {pos} after {len(data)} bytes (gap or overlap)"
                data += client.get_object(Bucket=bucket, Key=k)["Body"].read()
            out[key[len(PREFIX) + 1 :]] = (data, False)
        return out
    finally:
        client.close()


@dataclass
class Verified:
    messages: int = 0
    #: Flat-commitlog bytes no cold consume-queue unit references, per queue (records stored
    #: twice; see test_failed_commit_across_a_roll_stores_no_record_twice).
    orphan_bytes: dict[tuple[str, int], int] = field(default_factory=dict)


def verify(store: BlockingMessageStore, backend: dict[str, tuple[bytes, bool]]) -> Verified:
    """Cold == hot for every queue; bucket == what tierd reads, segment by segment."""
    assert store.tiering is not None
    out = Verified()
    seen_paths: set[str] = set()
    for (topic, qid), hot_cq in sorted(store.hot.cqs.items()):
        key = (topic, qid)
        ff = store.tiering.flat.get(topic, qid)
        assert ff is not None, key
        # The cold consume queue covers exactly the hot offsets: no gap, nothing extra.
        assert (ff.min_offset, ff.max_offset) == (hot_cq.min_offset, hot_cq.max_offset), key
        n = ff.max_offset - ff.min_offset
        cold_units = run(store, ff.read_units(ff.min_offset, n))
        assert len(cold_units) == n, key
        base = ff.commitlog.min_offset
        flat = run(store, ff.commitlog.read(base, ff.commitlog.commit_offset - base))
        assert len(flat) == ff.commitlog.commit_offset - base, key
        offsets = cold_units["offset"].astype(np.int64)
        sizes = cold_units["size"].astype(np.int64)
        # Units point at disjoint, increasing ranges inside the committed flat commitlog.
        assert int(offsets[0]) >= base, key
        assert bool(np.all(offsets[1:] >= offsets[:-1] + sizes[:-1])), key
        assert int(offsets[-1] + sizes[-1]) <= ff.commitlog.commit_offset, key
        unreferenced = ff.commitlog.commit_offset - base - int(sizes.sum())
        if unreferenced:
            out.orphan_bytes[key] = unreferenced
        hot_units = hot_cq.read_units(ff.min_offset, n)
        assert np.array_equal(sizes, hot_units["size"].astype(np.int64)), key
        assert np.array_equal(cold_units["tags_code"], hot_units["tags_code"]), key
        hot_offsets = hot_units["offset"].tolist()
        for off, size, phys in zip(offsets.tolist(), sizes.tolist(), hot_offsets, strict=True):
            raw = flat[off - base : off - base + size]
            hot_raw = store.hot.commitlog.read_bytes(phys, size)
            # Byte-identical to the hot record (hence same queue offset) but PHYSICALOFFSET,
            # which is the record's own flat offset.
            assert raw[:POS_PHYSICAL_OFFSET] == hot_raw[:POS_PHYSICAL_OFFSET], (key, off)
            assert raw[POS_PHYSICAL_OFFSET + 8 :] == hot_raw[POS_PHYSICAL_OFFSET + 8 :], (key, off)
            assert int.from_bytes(raw[POS_PHYSICAL_OFFSET : POS_PHYSICAL_OFFSET + 8], "big") == off
        out.messages += n
        # The bucket (read with boto3) holds exactly what tierd reads, segment by segment, and
        # every segment but the last of each file is sealed.
        for file in (ff.commitlog, ff.consumequeue):
            infos = file.infos()
            for i, seg in enumerate(file.segments):
                assert seg.path in backend, seg.path
                seen_paths.add(seg.path)
                data, sealed = backend[seg.path]
                assert len(data) == seg.commit_position == infos[i].size, seg
                assert sealed == infos[i].sealed == (i < len(file.segments) - 1), seg
        cl_bytes = b"".join(backend[s.path][0] for s in ff.commitlog.segments)
        assert cl_bytes == flat, key
        cq_bytes = b"".join(backend[s.path][0] for s in ff.consumequeue.segments)
        assert cq_bytes == cold_units.tobytes(), key
    assert seen_paths == set(backend), "segments in the bucket that no flat file owns"
    return out


def _messages(rng: random.Random, n: int, first: int) -> list[Message]:
    out = []
    for i in range(first, first + n):
        size = rng.choice((rng.randint(1, 100), rng.randint(100, 800), rng.randint(800, 3000)))
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
class HandOff:
    """Records what the dispatcher hands to the index (``on_committed``): every queue offset
    must be handed over exactly once."""

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, int], list[int]] = collections.defaultdict(list)

    def __call__(self, batch: CommittedBatch) -> None:
        first = batch.first_queue_offset
        self.offsets[batch.topic, batch.queue_id].extend(range(first, first + len(batch.flat_offsets)))

    def problems(self, store: BlockingMessageStore) -> dict[tuple[str, int], tuple[int, int]]:
        """Per queue with a problem: (offsets never handed over, offsets handed over twice)."""
        out = {}
        for key, hot_cq in store.hot.cqs.items():
            got = collections.Counter(self.offsets.get(key, []))
            missing = sum(1 for q in range(hot_cq.min_offset, hot_cq.max_offset) if q not in got)
            twice = sum(c - 1 for c in got.values() if c > 1)
            if missing or twice:
                out[key] = (missing, twice)
        return out


def test_tiering_through_30_percent_faults_loses_and_duplicates_nothing(
    tmp_path: Path, moto_server: S3Server
) -> None:
    bucket = create_bucket(moto_server)
    cfg = s3_config(tmp_path, moto_server, bucket)
    plan = FaultPlan(
        probability=0.3,
        methods=frozenset({"write", "seal", "size", "create"}),
        modes=(Fault.BEFORE, Fault.AFTER, Fault.HALF),  # HALF is drawn for writes only
        seed=1234,
        delays={"write": 0.002, "seal": 0.004, "size": 0.001},
    )
    faulty = FaultyRoot(open_driver_factory(cfg.backend), plan)
    rng = random.Random(42)
    handoff = HandOff()
    produced = 0
    with open_with_root(cfg, faulty) as store:
        assert store.tiering is not None
        store.tiering.dispatcher.on_committed.append(handoff)
        # Tier while producing: every round leaves some queues in the middle of a failure.
        for _ in range(10):
            batch = _messages(rng, 250, produced)
            store.put_batch(batch)
            produced += len(batch)
            with contextlib.suppress(BackendError):  # and tier_now reports it
                store.tier_now()
        tier_until_caught_up(store)
        first = verify(store, backend_segments(moto_server, bucket))
        assert first.messages == produced == 2500
        assert len(store.hot.cqs) == len(TOPICS) * QUEUES
        assert store.tiering.dispatcher.stats.commit_failures >= 20
        lost_handoffs = handoff.problems(store)
    # The faults really happened: on writes (all three kinds), seals and reconciliations.
    writes, seals = _outcomes(faulty.calls, "write"), _outcomes(faulty.calls, "seal")
    assert writes["fault:before"] >= 10, writes
    assert writes["fault:after"] >= 10, writes
    assert writes["fault:half"] >= 10, writes
    assert seals["fault:before"] + seals["fault:after"] >= 5, seals
    assert seals["ok"] >= 40, seals  # segments rolled and were sealed in the end
    assert _outcomes(faulty.calls, "size")["ok"] >= 20  # FileSegment reconciled after failures

    # Restart on a healthy root (the plain facade) over the same bucket and local metadata:
    # it agrees with what was written, then continues without a gap.
    with BlockingMessageStore.open(cfg) as store:
        assert store.tiering is not None
        run(store, store.tiering.ready.wait())
        assert store.tier_now().committed == 0  # nothing was left behind
        again = verify(store, backend_segments(moto_server, bucket))
        assert again == first
        more = _messages(rng, 300, produced)
        store.put_batch(more)
        produced += len(more)
        tier_until_caught_up(store)
        final = verify(store, backend_segments(moto_server, bucket))
        assert final.messages == produced
    # No record stored twice in any flat commitlog (every byte referenced by exactly one unit),
    # and every message handed to the index exactly once.
    assert first.orphan_bytes == final.orphan_bytes == {}
    assert lost_handoffs == {}


def test_half_write_is_completed_by_the_commit_retry_without_duplicating_bytes(
    tmp_path: Path, moto_server: S3Server
) -> None:
    """Write #2 is the flat commitlog commit of the second batch (within a round writes go CL, CL,
    …, then one CQ): half of it lands as a short chunk, then the call fails. The next commit asks
    the backend how much landed and writes only the rest."""
    bucket = create_bucket(moto_server)
    cfg = s3_config(tmp_path, moto_server, bucket, group_commit_count=10, commitlog_segment_size=1 << 30)
    faulty = FaultyRoot(open_driver_factory(cfg.backend), FaultPlan().fail_nth("write", 2, Fault.HALF))
    bodies = [bytes([65 + i % 26]) * (100 + 7 * i) for i in range(30)]
    with open_with_root(cfg, faulty) as store:
        store.put_batch([Message(topic="half", body=b, queue_id=0) for b in bodies])
        # Batch 1's commitlog is durable, batch 2's commitlog write half-failed, and the round
        # stopped before the consume-queue commit: nothing is readable cold yet — and tier_now
        # says so instead of answering "0 committed".
        with pytest.raises(BackendError, match=r"30 message\(s\) still pending \(committed 0\)"):
            store.tier_now()
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
            assert store.tier_now().committed == 30  # the retry makes every message readable, counted once
            assert ff.max_offset == 30
            writes = [(c.args, c.outcome) for c in faulty.calls if c.method == "write"]
            assert writes[1] == (f"{first}+{second}", "fault:half")
            # The retry sent exactly the missing half, at the backend's end.
            assert writes[2] == (f"{first + second // 2}+{second - second // 2}", "ok")
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
        assert verify(store, backend_segments(moto_server, bucket)) == Verified(messages=30)


@pytest.mark.parametrize("rolling", ["commitlog", "consumequeue"])
def test_failed_commit_across_a_roll_stores_no_record_twice(
    tmp_path: Path, moto_server: S3Server, rolling: str
) -> None:
    """A batch that crosses a segment boundary is appended in two runs with a roll in between.
    Regression: the roll used to commit the old segment itself, so when that commit failed the
    first run stayed appended while the rest of the batch (and its consume-queue units, and its
    index hand-off) did not, and the retry appended those messages again — records stored twice,
    one copy referenced by no unit, and hand-offs lost. Now the roll does no I/O and the next
    commit uploads both segments, oldest first; fail exactly that upload of the old segment."""
    bucket = create_bucket(moto_server)
    body = 15_000  # 5.5 records make a segment that holds the largest (a 16 KiB body)
    record = body + 95  # encoded size of the messages below (checked)
    # Batch 1 (4 messages) fits the first segment; batch 2 (2 messages) crosses its end.
    sizes = (
        {"commitlog_segment_size": record * 11 // 2}
        if rolling == "commitlog"
        else {"commitlog_segment_size": 1 << 20, "consumequeue_segment_size": 5 * 20}
    )
    sizes["max_message_size"] = 16 * 1024
    cfg = s3_config(tmp_path, moto_server, bucket, group_commit_count=4, group_commit_size=1 << 20, **sizes)
    # Writes within the round: #1 commitlog batch 1, #2 commitlog batch 2 — the old segment's tail
    # when the commitlog rolls —, then the consume queue once at the end of the round (old
    # segment, new segment). Fail the old segment's upload.
    nth = 2 if rolling == "commitlog" else 3
    faulty = FaultyRoot(open_driver_factory(cfg.backend), FaultPlan().fail_nth("write", nth))
    handoff = HandOff()
    with open_with_root(cfg, faulty) as store:
        assert store.tiering is not None
        store.tiering.dispatcher.on_committed.append(handoff)
        store.put_batch([Message(topic="roll", body=b"x" * body, queue_id=0) for _ in range(6)])
        with pytest.raises(BackendError, match="injected fault before write"):
            store.tier_now()  # the failed commit is reported, not hidden behind a partial count
        hot_cq = store.hot.queue("roll", 0)
        assert hot_cq is not None
        assert hot_cq.read_units(0, 6)["size"].tolist() == [record] * 6
        old_tail = f"{4 * record}+{record}" if rolling == "commitlog" else "0+100"
        writes = [c for c in faulty.calls if c.method == "write"]
        assert writes[nth - 1] == ("write", old_tail, "fault:before")
        tier_until_caught_up(store)
        result = verify(store, backend_segments(moto_server, bucket))
        assert result == Verified(messages=6)  # every message readable once, no byte stored twice
        assert handoff.problems(store) == {}
        # The old segment was completed by the retry, then sealed; the new one holds the rest.
        file = store.tiering.flat.get("roll", 0)
        assert file is not None
        rolled = file.commitlog if rolling == "commitlog" else file.consumequeue
        assert [s.base_offset for s in rolled.segments] == [0, 5 * (record if rolling == "commitlog" else 20)]
