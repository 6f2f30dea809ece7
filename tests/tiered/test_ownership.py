"""One owner per bucket prefix (issue 15 part 1), on a posix directory and on S3 (moto).

store A ──claims──▶ {cluster}/{broker}/OWNER.d/00000000000000000001.json ◀── store B: refused
store C ──restore (takeover)──▶ OWNER.d/…0002.json ──▶ A is fenced: writes nothing more there
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import tierd.tiered.ownership as ownership_module
from tierd import BlockingMessageStore, Message, ReadPolicy
from tierd.drivers.memory import MemoryRoot, drop_namespace
from tierd.errors import BackendError, PrefixOwnedError
from tierd.testing.faults import FaultPlan, FaultyRoot
from tierd.testing.s3server import create_bucket
from tierd.tiered.ownership import Ownership, current_owner, list_epochs, owner_dir
from tierd.tiered.roots import open_driver_factory

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config, run
from .test_faults import open_with_root

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tierd.testing.s3server import S3Server

CLUSTER, BROKER = "DefaultCluster", "broker-a"
SMALL: dict[str, Any] = {
    "max_message_size": SMALL_BODY_LIMIT,
    "commitlog_segment_size": MIN_SEGMENT,
    "consumequeue_segment_size": 100,
}


@dataclass
class Bucket:
    """A cold-tier location and a way to see every byte in it without tierd."""

    config: dict[str, Any]
    snapshot: Callable[[], dict[str, bytes]]


def _posix(tmp_path: Path) -> Bucket:
    cold = tmp_path / "bucket"

    def snapshot() -> dict[str, bytes]:
        return {str(p.relative_to(cold)): p.read_bytes() for p in sorted(cold.rglob("*")) if p.is_file()}

    return Bucket({"name": "posix", "url": str(cold)}, snapshot)


def _s3(server: S3Server) -> Bucket:
    bucket = create_bucket(server)

    def snapshot() -> dict[str, bytes]:
        client = server.boto3_client()
        try:
            out = {}
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for o in page.get("Contents", []):
                    out[o["Key"]] = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            return out
        finally:
            client.close()

    return Bucket(
        {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": server.storage_options}, snapshot
    )


@pytest.fixture(params=["posix", "s3"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Bucket:
    if request.param == "posix":
        return _posix(tmp_path)
    return _s3(request.getfixturevalue("moto_server"))


def _bodies(store: BlockingMessageStore, topic: str, queue: int, policy: ReadPolicy) -> list[bytes]:
    res = store.get(topic, queue, 0, 100, policy=policy)
    return [m.body for m in res.messages]


def test_a_second_store_on_the_same_prefix_is_refused_and_the_first_keeps_its_data(
    tmp_path: Path, bucket: Bucket
) -> None:
    """The reported scenario: B used to log a WARNING, report "committed 0 … 5 pending", exit 0,
    and both stores then read A1 A2 A3 B4 B5."""
    with BlockingMessageStore.open(cold_config(tmp_path / "a", bucket.config)) as a:
        a.put_batch([Message(topic="t", body=b"A%d" % i, queue_id=0) for i in (1, 2, 3)])
        assert a.tier_now().committed == 3
        assert a.tiering is not None
        assert a.tiering.ownership is not None
        a_id = a.tiering.ownership.store_id
    before = bucket.snapshot()
    assert any("/t/0/COMMIT_LOG/" in k for k in before)  # the bucket holds A's segments
    with BlockingMessageStore.open(cold_config(tmp_path / "b", bucket.config)) as b:
        b.put_batch([Message(topic="t", body=b"B%d" % i, queue_id=0) for i in range(1, 6)])
        with pytest.raises(PrefixOwnedError) as refused:
            b.tier_now()
        err = refused.value
        assert err.code == "prefix_owned"
        assert err.http_status == 409
        assert err.detail["owner_store_id"] == a_id
        assert err.detail["owner_epoch"] == 1
        assert f"owned by store {a_id} on host " in str(err)
        assert " since 20" in str(err)
        assert "tierd restore" in str(err)
        # B keeps its own messages in its hot store; reads, which would need a cold tier of its
        # own to be complete, say why there is none rather than answer from the hot tier alone.
        hot_queue = b.hot.queue("t", 0)
        assert hot_queue is not None
        assert hot_queue.max_offset == 5
        with pytest.raises(PrefixOwnedError):
            _bodies(b, "t", 0, ReadPolicy.FORCE)
        assert b.tiering is not None
        status = b.tiering.status()
        assert status["ownership"]["error"]["error"] == "prefix_owned"  # type: ignore[index]
        assert status["ownership"]["owner"]["store_id"] == a_id  # type: ignore[index]
    assert bucket.snapshot() == before  # B wrote nothing: no segment, manifest or record
    with BlockingMessageStore.open(cold_config(tmp_path / "a", bucket.config)) as a:
        a.wait_ready()
        assert _bodies(a, "t", 0, ReadPolicy.FORCE) == [b"A1", b"A2", b"A3"]
        assert a.verify().ok


def test_claims_racing_for_one_prefix_have_exactly_one_winner(mem: MemoryRoot, tmp_path: Path) -> None:
    # Creates are delayed so that every claimant lists the records before any creates one: a
    # real race for the same epoch, decided by create_object alone.
    racing = FaultyRoot(mem, FaultPlan(delays={"create_object": 0.05}))

    async def main() -> None:
        stores = [Ownership(racing, CLUSTER, BROKER, f"store-{i}", tmp_path / str(i)) for i in range(5)]
        results = await asyncio.gather(*(o.claim() for o in stores), return_exceptions=True)
        winners = [o for o, r in zip(stores, results, strict=True) if not isinstance(r, BaseException)]
        assert len(winners) == 1, results
        losers = [r for r in results if isinstance(r, BaseException)]
        assert all(isinstance(r, PrefixOwnedError) for r in losers), losers
        assert {r.detail["owner_store_id"] for r in losers if isinstance(r, PrefixOwnedError)} == {
            winners[0].store_id
        }
        # Two takeovers racing: one new epoch, never a third one stacked on the winner.
        takers = [Ownership(racing, CLUSTER, BROKER, f"new-{i}", tmp_path / f"n{i}") for i in range(3)]
        results = await asyncio.gather(*(o.claim(takeover=True) for o in takers), return_exceptions=True)
        assert sum(not isinstance(r, BaseException) for r in results) == 1, results
        assert all(isinstance(r, PrefixOwnedError | ownership_module.OwnerRecord) for r in results)
        assert await list_epochs(mem, CLUSTER, BROKER) == [1, 2]
        assert len(racing.calls_of("create_object")) == 5 + 3  # every claimant really tried
        with pytest.raises(PrefixOwnedError, match="taken over by store new-"):
            await winners[0].verify()  # the first owner learns it from one listing
        assert winners[0].fenced is not None
        with pytest.raises(PrefixOwnedError):
            await winners[0].ensure()  # sticky: no more I/O needed to refuse

    asyncio.run(main())


def test_a_restarted_store_resumes_its_epoch_and_records_are_never_rewritten(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path)
    for _ in range(3):
        with BlockingMessageStore.open(cfg) as store:
            store.put(Message(topic="t", body=b"x", queue_id=0))
            assert store.tier_now().committed == 1
            assert store.tiering is not None
            assert store.tiering.ownership is not None
            assert store.tiering.ownership.epoch == 1
    records = sorted((tmp_path / "cold" / owner_dir(CLUSTER, BROKER)).iterdir())
    assert [p.name for p in records] == ["00000000000000000001.json"]
    record = json.loads(records[0].read_text())
    assert record["format-version"] == 1
    assert record["reason"] == "claim"
    assert (tmp_path / "hot" / "config" / "tieredStoreId").read_text().strip() == record["store-id"]


def test_restore_takes_ownership_and_the_old_owner_never_writes_again(
    tmp_path: Path, bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keeps running while C restores the bucket on a new machine. From then on A may not
    overwrite or delete anything: no commit, seal, retention, index upload or manifest."""
    cfg_a = cold_config(tmp_path / "a", bucket.config, **SMALL)
    seal_fails = FaultyRoot(open_driver_factory(cfg_a.backend), FaultPlan().fail_nth("seal", 1))
    a = open_with_root(cfg_a, seal_fails)
    try:
        a.put_batch(
            [Message(topic="t", body=b"a%03d" % i * 500, keys=[f"k{i}"], queue_id=0) for i in range(40)]
        )
        a.tier_now()
        assert a.tiering is not None
        flat = a.tiering.flat.get("t", 0)
        assert flat is not None
        assert flat.commitlog.unsealed_full, "the test needs a seal left to retry"
        epochs_before = run(a, list_epochs(a.tiering.root, CLUSTER, BROKER))
        assert epochs_before == [1]

        cfg_c = cold_config(tmp_path / "c", bucket.config, **SMALL)
        report = BlockingMessageStore.restore(cfg_c)
        assert report.owner is not None
        assert (report.owner.epoch, report.owner.reason) == (2, "takeover")
        assert report.owner.previous_store_id == a.tiering.ownership.store_id  # type: ignore[union-attr]
        with BlockingMessageStore.open(cfg_c) as c:
            c.wait_ready()
            assert len(_bodies(c, "t", 0, ReadPolicy.FORCE)) == 40  # the new owner reads A's history
            c.put(Message(topic="t", body=b"c-new", queue_id=0))
            assert c.tier_now().committed == 1
        after_takeover = bucket.snapshot()

        # A, still running, tries every kind of write it has — with no cached ownership check to
        # hide behind (each mutating call re-verifies), then after its next round's check.
        monkeypatch.setattr(ownership_module, "RECHECK_SECONDS", 0.0)
        run(a, flat.commitlog.seal_pending())  # retried seal: refused (logged), not composed
        assert flat.commitlog.unsealed_full
        with pytest.raises(PrefixOwnedError):
            run(a, a.tiering.apply_retention(now_ms=2**62))  # would delete expired segments
        a.tiering.index.max_file_age_ms = 0  # seal the local index file now...
        with pytest.raises(PrefixOwnedError):
            run(a, a.tiering.index.maintain())  # ...and try to upload it
        run(a, a.tiering._write_manifests())  # refused, logged
        a.put(Message(topic="t", body=b"a-late", queue_id=0))
        with pytest.raises(PrefixOwnedError, match="taken over by store") as fenced:
            a.tier_now()
        assert fenced.value.detail["owner_epoch"] == 2
        status = a.tiering.status()
        assert status["ownership"]["owned_by_this_store"] is False  # type: ignore[index]
        assert status["ownership"]["epoch"] == 1  # type: ignore[index]
        assert status["ownership"]["owner"]["epoch"] == 2  # type: ignore[index]
        assert bucket.snapshot() == after_takeover
    finally:
        a.close()
    assert bucket.snapshot() == after_takeover  # not even at close (final round, manifests)
    cfg_again = cold_config(tmp_path / "a", bucket.config, **SMALL)
    with BlockingMessageStore.open(cfg_again) as again, pytest.raises(PrefixOwnedError, match="owned by"):
        again.tier_now()  # a restart does not win the prefix back
    assert bucket.snapshot() == after_takeover


def test_without_metadata_a_bucket_with_this_brokers_data_is_refused(tmp_path: Path) -> None:
    """Both metadata files gone, several segments in the bucket: the daemon used to start over at
    epoch zero and re-tier everything on top; now it refuses, as for corrupt metadata."""
    cfg = cold_config(tmp_path, **SMALL)
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="t", body=b"m%03d" % i * 1000, queue_id=i % 2) for i in range(100)])
        store.tier_now()
    config_dir = tmp_path / "hot" / "config"
    for name in ("tieredStoreMetadata.json", "tieredStoreMetadata.json.bak"):
        (config_dir / name).unlink()
    segments = [p for p in (tmp_path / "cold").rglob("*") if p.is_file() and "COMMIT_LOG" in p.parts]
    assert len(segments) >= 6  # three per queue
    cold = tmp_path / "cold"
    files = {str(p): p.read_bytes() for p in cold.rglob("*") if p.is_file()}
    with BlockingMessageStore.open(cfg) as store:
        with pytest.raises(BackendError, match="cold tier cannot start: no tiering metadata") as refused:
            store.wait_ready(10)
        assert "this store's own owner record" in str(refused.value)
        assert "tierd restore" in str(refused.value)
    assert not (config_dir / "tieredStoreMetadata.json").exists()  # no empty file made either
    assert {str(p): p.read_bytes() for p in cold.rglob("*") if p.is_file()} == files
    # A bucket written before ownership existed (no owner record) is recognised by its manifest.
    for p in (cold / owner_dir(CLUSTER, BROKER)).iterdir():
        p.unlink()
    with BlockingMessageStore.open(cfg) as store, pytest.raises(BackendError, match="a broker manifest"):
        store.wait_ready(10)


def test_a_prefix_of_its_own_is_claimed_once_and_reported(tmp_path: Path) -> None:
    async def main() -> None:
        root = MemoryRoot(f"memory://own-{tmp_path.name}")
        try:
            assert await current_owner(root, CLUSTER, BROKER) is None
            o = Ownership(root, CLUSTER, BROKER, "s1", tmp_path)
            rec = await o.claim()
            assert (rec.epoch, rec.reason, rec.previous_store_id) == (1, "claim", None)
            assert await current_owner(root, CLUSTER, BROKER) == rec
            await o.verify()
            assert (await o.claim()).epoch == 1  # claiming again is resuming, not a new epoch
        finally:
            drop_namespace(root.name)

    asyncio.run(main())
