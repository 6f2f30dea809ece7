"""``tier_now`` tells the truth (issue 15 part 2): it fails when pending messages could not be
committed — posix path unusable, bucket wiped, S3 refusing connections, S3 hung — within bounded
time, and every message is still committed once the backend is back.

hot store ──tier_now──▶ [ TcpProxy: pass | refuse | hang ] ──▶ moto S3
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, Message, ReadPolicy
from tierd.errors import BackendError
from tierd.testing.faults import FaultPlan, FaultyRoot
from tierd.testing.s3server import create_bucket

from ..tcp_proxy import TcpProxy
from .conftest import cold_config
from .test_faults import open_with_root

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tierd.drivers.memory import MemoryRoot
    from tierd.testing.s3server import S3Server

#: One botocore attempt per request (s3fs still retries a few times, ~2 s): the outage tests
#: measure tierd's bounds, not the retry schedules.
NO_RETRIES: dict[str, Any] = {"config_kwargs": {"retries": {"max_attempts": 1}}}


def _produce(store: BlockingMessageStore, n: int, start: int = 0, queues: int = 2) -> None:
    store.put_batch(
        [Message(topic="t", body=b"m%04d" % i, queue_id=i % queues) for i in range(start, start + n)]
    )


def _cold(store: BlockingMessageStore, queue: int) -> list[bytes]:
    return [m.body for m in store.get("t", queue, 0, 1000, policy=ReadPolicy.FORCE).messages]


def test_tier_now_fails_when_the_posix_path_is_unusable(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        _produce(store, 10)
        assert store.tier_now().committed == 10
        _produce(store, 6, start=10)
        # One queue's directory becomes a file: that queue cannot be written, the other can.
        broken = next((tmp_path / "cold").rglob("t/1"))
        shutil.rmtree(broken)
        broken.write_bytes(b"not a directory")
        with pytest.raises(BackendError) as failed:
            store.tier_now()
        err = failed.value
        assert (err.code, err.http_status) == ("backend_error", 502)
        assert "tiering failed for 1 queue(s)" in str(err)
        assert "t/1: segment " in str(err)  # the queue, and the backend's own words
        assert err.detail["committed"] == 3  # queue 0 went through, and says so
        assert err.detail["pending"] == 3
        assert set(err.detail["failed"]) == {"t/1"}
        # The whole cold directory unusable (a file where the directory was):
        shutil.rmtree(tmp_path / "cold")
        (tmp_path / "cold").write_bytes(b"")
        _produce(store, 2, start=16)
        with pytest.raises(BackendError, match=r"owner record .* is gone"):
            store.tier_now()
        assert store.tiering is not None
        assert store.tiering.status()["errors"]  # and /v1/status lists them


@pytest.mark.parametrize("where", ["posix", "s3"])
def test_tier_now_fails_when_the_bucket_was_wiped(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    if where == "posix":
        backend: dict[str, Any] | None = None

        def wipe() -> None:
            shutil.rmtree(tmp_path / "cold")
            (tmp_path / "cold").mkdir()
    else:
        server: S3Server = request.getfixturevalue("moto_server")
        bucket = create_bucket(server)
        backend = {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": server.storage_options}

        def wipe() -> None:
            client = server.boto3_client()
            try:
                keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
                client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
            finally:
                client.close()

    with BlockingMessageStore.open(cold_config(tmp_path, backend)) as store:
        _produce(store, 8)
        assert store.tier_now().committed == 8
        wipe()
        _produce(store, 4, start=8)
        with pytest.raises(BackendError, match="wiped"):
            store.tier_now()
        # Nothing was written into the empty prefix: no half store on top of nothing.
        assert store.tiering is not None
        assert run_list(store) == []


def run_list(store: BlockingMessageStore) -> list[str]:
    from .conftest import run

    assert store.tiering is not None
    return run(store, store.tiering.root.inner.list_objects(""))


@pytest.fixture
def proxied(moto_server: S3Server, tmp_path: Path) -> Iterator[tuple[TcpProxy, dict[str, Any]]]:
    proxy = TcpProxy("127.0.0.1", int(moto_server.endpoint_url.rsplit(":", 1)[1]))
    bucket = create_bucket(moto_server)
    options = {**moto_server.storage_options, "endpoint_url": proxy.url, **NO_RETRIES}
    yield proxy, {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": options}
    proxy.close()


def test_tier_now_fails_when_s3_refuses_connections_and_catches_up_after(
    tmp_path: Path, proxied: tuple[TcpProxy, dict[str, Any]]
) -> None:
    proxy, backend = proxied
    with BlockingMessageStore.open(cold_config(tmp_path, backend, backend_timeout=20)) as store:
        _produce(store, 10)
        assert store.tier_now().committed == 10
        _produce(store, 10, start=10)
        proxy.refuse()
        with pytest.raises(BackendError, match="cannot connect to the S3 endpoint") as failed:
            store.tier_now()
        assert failed.value.http_status == 502
        assert store.tiering is not None
        assert store.tiering.health.reachable is False
        proxy.resume()
        report = store.tier_now()
        assert report.committed == 10
        assert report.pending == 0
        assert store.tiering.health.reachable is True
        assert _cold(store, 0) == [b"m%04d" % i for i in range(0, 20, 2)]


def test_a_hung_s3_fails_tier_now_within_the_backend_timeout(
    tmp_path: Path, proxied: tuple[TcpProxy, dict[str, Any]]
) -> None:
    proxy, backend = proxied
    with BlockingMessageStore.open(cold_config(tmp_path, backend, backend_timeout=2)) as store:
        _produce(store, 4)
        assert store.tier_now().committed == 4
        _produce(store, 4, start=4)
        proxy.hang()
        started = time.monotonic()
        with pytest.raises(BackendError, match=r"did not finish within 2 s \(tiered.backend_timeout\)"):
            store.tier_now()
        # Bounded: not a timing assertion on speed, a check that it did not wait for ever (the
        # server never answers; before the fix this call did not return at all).
        assert time.monotonic() - started < 60
        assert store.tiering is not None
        assert store.tiering.health.timeouts >= 1
        proxy.resume()
        assert store.tier_now().committed == 4
        assert _cold(store, 1) == [b"m0001", b"m0003", b"m0005", b"m0007"]


def test_a_round_running_past_the_backend_timeout_is_logged_as_stuck(
    tmp_path: Path, mem: MemoryRoot, caplog: pytest.LogCaptureFixture
) -> None:
    # Every write takes 0.4 s and each message is its own commit: a round of 4 commits runs past
    # the 0.5 s timeout although no single call does.
    slow = FaultyRoot(mem, FaultPlan(delays={"write": 0.4}))
    cfg = cold_config(tmp_path, backend_timeout=0.5, group_commit_count=1)
    store = open_with_root(cfg, slow)
    try:
        store.put_batch([Message(topic="slow", body=b"x", queue_id=0) for _ in range(4)])
        with caplog.at_level(logging.WARNING, logger="tierd.tiered.dispatcher"):
            assert store.tier_now().committed == 4
        stuck = [r.getMessage() for r in caplog.records if "still running after" in r.getMessage()]
        assert stuck
        assert "(tier_now)" in stuck[0]
        assert "slow/0" in stuck[0]
        assert store.tiering is not None
        assert store.tiering.dispatcher.stats.stuck_rounds == 1
    finally:
        store.close()


def test_a_conflicting_write_makes_tier_now_fail_and_is_never_adopted(tmp_path: Path) -> None:
    """The reported scenario's mechanism: another writer's bytes where the next commit goes. It
    used to log a WARNING, report "committed 0", and later splice the rest of the batch onto
    the other writer's bytes; now every attempt fails, naming the conflict, and nothing is
    appended to the foreign bytes."""
    with BlockingMessageStore.open(cold_config(tmp_path)) as store:
        _produce(store, 2, queues=1)
        assert store.tier_now().committed == 2
        segment = next(p for p in (tmp_path / "cold").rglob("*") if p.is_file() and "COMMIT_LOG" in p.parts)
        committed = segment.read_bytes()
        foreign = b"F" * 100  # shorter than the next commit: the old reconcile took it for ours
        with segment.open("ab") as f:  # someone else appended here, behind tierd's back
            f.write(foreign)
        _produce(store, 3, start=2, queues=1)
        for _ in range(2):
            with pytest.raises(BackendError, match=r"t/0: write at \d+ of segment .* conflicts with"):
                store.tier_now()
        assert segment.read_bytes() == committed + foreign  # not one byte of ours after theirs
        assert _cold(store, 0) == [b"m0000", b"m0001"]


def test_failing_queues_are_one_rate_limited_line_per_round_not_one_per_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tierd.tiered.flatmessage import FlatMessageFile

    from .conftest import run

    async def down(self: FlatMessageFile) -> list[Any]:
        raise BackendError(f"{self.topic}/{self.queue_id}: backend down")

    with BlockingMessageStore.open(cold_config(tmp_path)) as store:
        store.wait_ready(60)
        assert store.tiering is not None
        dispatcher = store.tiering.dispatcher
        _produce(store, 300, queues=150)
        assert store.hot.wait_dispatched(60)
        monkeypatch.setattr(FlatMessageFile, "commit", down)
        monkeypatch.setattr(FlatMessageFile, "commit_commitlog", down)
        with caplog.at_level(logging.DEBUG, logger="tierd.tiered.dispatcher"):
            for _ in range(3):
                assert len(run(store, dispatcher.tier_now()).failed) == 150
            monkeypatch.undo()
            assert sum(run(store, dispatcher.tier_now()).committed.values()) == 300
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage() for r in lines] == [
            "tiering failed: t/0: backend down; 150 queue(s) failed this round (t/0, t/1, t/2, t/3, t/4, "
            "and 145 more; shown: t/0); their messages stay in the hot store and are retried with backoff",
            "tiering recovered after 3 failure(s)",
        ]
        assert not [r for r in lines if r.exc_info]
        assert len([r for r in caplog.records if r.levelno == logging.DEBUG]) >= 3 * 150  # the detail


def test_tier_now_fails_when_the_hot_store_cannot_index_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tier_now waits a bounded time for the hot store's dispatch; past it, NotReadyError naming
    the cause — not a success that tiered only part of what was written. Both facades."""
    import asyncio

    import tierd.store
    from tierd import MessageStore
    from tierd.errors import NotReadyError

    monkeypatch.setattr(tierd.store, "DISPATCH_WAIT", 0.2)

    def broken(topic: str, queue_id: int) -> Any:
        raise OSError(f"consume queue {topic}/{queue_id} unwritable")

    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready(60)
        working = store.hot.reput.queue_for
        store.hot.reput.queue_for = broken
        _produce(store, 4)
        with pytest.raises(
            NotReadyError, match=r"tier_now: .* dispatch keeps failing: consume queue t/\d unwritable"
        ):
            store.tier_now()
        store.hot.reput.queue_for = working
        assert store.tier_now().committed == 4

    async def main() -> None:
        async with MessageStore.open(cfg) as store:
            working = store.hot.reput.queue_for
            store.hot.reput.queue_for = broken
            await store.put(Message(topic="t", body=b"x", queue_id=0))
            with pytest.raises(NotReadyError, match=r"tier_now: .* dispatch keeps failing"):
                await store.tier_now()
            store.hot.reput.queue_for = working
            assert (await store.tier_now()).committed == 1

    asyncio.run(main())
