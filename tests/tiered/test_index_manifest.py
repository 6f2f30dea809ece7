"""The index manifest (``{cluster}/{broker}/INDEX_MANIFEST.json``): which uploaded INDEX
segments a bucket reader may look keys up in, and which queue offsets they cover.

A reader of the bucket alone (Spark) can only trust a key lookup for messages whose items are
certainly in an uploaded segment; these tests check that the service never claims more:
offsets added before a restart, a batch split by a roll, and messages of expired files are not
claimed, and retention publishes before it deletes.

    add(batch) ──seal (snapshot)──▶ upload ──▶ INDEX_MANIFEST.json {segments, coverage, expired-through}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from tierd.errors import SegmentNotFoundError
from tierd.testing.faults import FaultyRoot, InjectedFault
from tierd.tiered.flatmessage import CommittedBatch
from tierd.tiered.manifest import IndexManifest, index_manifest_path

from .test_index import BROKER, CLUSTER, HOUR, T0, Clock, Meta, arun, make_service, record

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.drivers.memory import MemoryRoot
    from tierd.drivers.segment import DriverRoot
    from tierd.tiered.index import ColdIndexService


def qbatch(queue_id: int, first_offset: int, keys: list[str | None], ts: int = T0) -> CommittedBatch:
    """Records of topic ``t`` at queue offsets ``first_offset...``; None = a record without keys."""
    recs = [record("t", queue_id, {"KEYS": k} if k else {"p": "v"}, ts) for k in keys]
    sizes = np.array([len(r) for r in recs], dtype=np.int64)
    flat = 1000 * first_offset + np.cumsum(sizes) - sizes
    stamps = np.full(len(recs), ts, dtype=np.int64)
    return CommittedBatch("t", queue_id, first_offset, flat, sizes, stamps, b"".join(recs))


async def published(root: DriverRoot) -> IndexManifest:
    return IndexManifest.model_validate_json(await root.get_object(index_manifest_path(CLUSTER, BROKER)))


def coverage(m: IndexManifest) -> dict[tuple[int, int], tuple[int, int]]:
    return {(c.topic_id, c.queue_id): (c.first_offset, c.end_offset) for c in m.coverage}


async def seal_and_upload(svc: ColdIndexService, clock: Clock) -> None:
    clock.now += 2 * HOUR  # older than max_file_age: maintain() seals the writable file
    await svc.maintain()


def test_upload_publishes_segments_and_the_offsets_they_cover(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        clock = Clock()
        svc = make_service(tmp_path, mem, 8, 64, clock, Meta())
        await svc.load([])
        svc.add(qbatch(0, 0, ["a", "b"]), 1)
        svc.add(qbatch(0, 2, [None, None]), 1)  # no keys: nothing to index, still covered
        svc.add(qbatch(1, 5, ["c"]), 1)
        await seal_and_upload(svc, clock)
        m = await published(mem)
        assert [s.base_offset for s in m.segments] == [T0]
        seg = m.segments[0]
        assert (seg.type, seg.sealed, seg.message_count) == ("INDEX", True, 3)
        assert seg.size == svc.uploaded_infos()[0].size
        assert coverage(m) == {(1, 0): (0, 4), (1, 1): (5, 6)}
        assert m.expired_through is None
        # Added after the seal: in the new local file, not claimed until that one is uploaded.
        svc.add(qbatch(0, 4, ["d"]), 1)
        assert coverage(await published(mem)) == {(1, 0): (0, 4), (1, 1): (5, 6)}
        await seal_and_upload(svc, clock)
        assert coverage(await published(mem)) == {(1, 0): (0, 5), (1, 1): (5, 6)}
        await svc.close()

    arun(main())


def test_a_batch_split_by_a_full_file_is_claimed_only_by_the_next_file(
    tmp_path: Path, mem: MemoryRoot
) -> None:
    async def main() -> None:
        clock = Clock()
        svc = make_service(tmp_path, mem, 4, 3, clock, Meta())
        await svc.load([])
        svc.add(qbatch(0, 0, ["a"]), 1)
        svc.add(qbatch(0, 1, ["b", "c", "d"]), 1)  # fills the first file mid-batch: it rolls
        await svc.maintain()  # uploads the full file
        assert coverage(await published(mem)) == {(1, 0): (0, 1)}  # not offsets 1..3
        await seal_and_upload(svc, clock)
        assert coverage(await published(mem)) == {(1, 0): (0, 4)}
        await svc.close()

    arun(main())


def test_offsets_added_before_a_restart_are_never_claimed(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        clock = Clock()
        svc = make_service(tmp_path, mem, 8, 64, clock, Meta())
        await svc.load([])
        svc.add(qbatch(0, 0, ["a"]), 1)
        await seal_and_upload(svc, clock)
        svc.add(qbatch(0, 1, ["b"]), 1)  # in the writable file when the process stops
        await svc.close()

        meta = Meta()
        again = make_service(tmp_path, mem, 8, 64, clock, meta)
        await again.load(svc.uploaded_infos())
        again.add(qbatch(0, 2, ["c"]), 1)
        await seal_and_upload(again, clock)
        # Offset 1 went into a file before the restart (a power cut may have lost its item):
        # the published range stays [0, 1), and [2, 3) cannot join it across the gap.
        assert coverage(await published(mem)) == {(1, 0): (2, 3)}
        assert len((await published(mem)).segments) == 2
        await again.close()

    arun(main())


def test_retention_publishes_what_it_deletes_before_deleting(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        clock = Clock()
        root = FaultyRoot(mem)
        svc = make_service(tmp_path, root, 8, 64, clock, Meta())
        await svc.load([])
        svc.add(qbatch(0, 0, ["a"], ts=T0 + 5), 1)
        await seal_and_upload(svc, clock)
        svc.add(qbatch(0, 1, ["b"], ts=T0 + 2 * HOUR), 1)
        await seal_and_upload(svc, clock)
        root.plan.fail_nth("delete", root.plan.count("delete") + 1)
        with pytest.raises(InjectedFault):
            await svc.expire(T0 + HOUR)
        # The deletion failed, but readers were told first: T0 + 5 may have lost its items.
        assert (await published(mem)).expired_through == T0 + 5
        assert await svc.expire(T0 + HOUR) == 1
        m = await published(mem)
        assert m.expired_through == T0 + 5
        assert [s.base_offset for s in m.segments] == [svc.uploaded_infos()[0].base_offset]
        assert coverage(m) == {(1, 0): (0, 2)}  # still true for messages stored after T0 + 5
        await svc.close()

    arun(main())


def test_an_unreadable_manifest_is_replaced_and_claims_nothing_old(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        await mem.put_object(index_manifest_path(CLUSTER, BROKER), b"{not json")
        clock = Clock()
        svc = make_service(tmp_path, mem, 8, 64, clock, Meta())
        await svc.load([])
        svc.add(qbatch(3, 7, ["a"]), 2)
        await seal_and_upload(svc, clock)
        assert coverage(await published(mem)) == {(2, 3): (7, 8)}
        await svc.close()

    arun(main())


def test_no_manifest_until_the_first_upload(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        clock = Clock()
        svc = make_service(tmp_path, mem, 8, 64, clock, Meta())
        await svc.load([])
        svc.add(qbatch(0, 0, ["a"]), 1)
        await svc.maintain()  # not old enough to seal: nothing uploaded
        with pytest.raises(SegmentNotFoundError):
            await published(mem)
        await svc.close()

    arun(main())
