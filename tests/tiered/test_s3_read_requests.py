"""Request counts on a real S3 server (moto) for the two halves of tiering's object traffic:
``tier_now`` commits a backlog in chunk objects of about ``group_commit_size`` without a sliver
object for the last few messages, and a sequential cold consume fetches each stored object with
one GET — batches follow the objects instead of straddling two of them (two ranged GETs each)."""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import pytest

from tierd import BlockingMessageStore, Message
from tierd.drivers import s3 as s3_driver
from tierd.drivers.s3 import fill_from
from tierd.errors import BackendError
from tierd.testing.s3server import create_bucket
from tierd.testing.workload import list_objects, log_requests
from tierd.tiered.fetcher import READ_AHEAD_DEPTH

from .conftest import cold_config

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine
    from pathlib import Path

    from tierd.testing.s3server import S3Server
    from tierd.tiered.flatmessage import FlatMessageFile

_P = ParamSpec("_P")
_R = TypeVar("_R")

MESSAGES = 600
GROUP = 16 * 1024


def _body(i: int) -> bytes:
    return b"m%05d-" % i + bytes([i % 251]) * 200


def _tier(tmp_path: Path, server: S3Server, count: int) -> tuple[BlockingMessageStore, str]:
    """A store whose queue seq/0 holds MESSAGES (~330-byte records: ~49 per GROUP-byte chunk
    object, and 12 over the last whole chunk) tiered to a new bucket; the store is closed."""
    bucket = create_bucket(server)
    backend = {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": server.storage_options}
    cfg = cold_config(
        tmp_path, backend, group_commit_size=GROUP, group_commit_count=10_000, read_ahead_count=count
    )
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        store.put_batch([Message("seq", _body(i), queue_id=0) for i in range(MESSAGES)])
        assert store.tier_now().committed == MESSAGES
    return BlockingMessageStore.open(cfg), bucket


def _chunks(server: S3Server, bucket: str) -> dict[str, int]:
    return {
        key: size for key, size in list_objects(server, bucket, "cold/") if "/COMMIT_LOG/" in key and size
    }


def test_tiering_a_backlog_leaves_no_sliver_chunk_object(tmp_path: Path, moto_server: S3Server) -> None:
    store, bucket = _tier(tmp_path, moto_server, 4096)
    store.close()
    sizes = sorted(_chunks(moto_server, bucket).values())
    assert len(sizes) >= 5, sizes  # an open segment of several chunk objects
    # The 12 messages after the last whole chunk (~4 KB) went with it, not into a fifth object.
    assert sizes[0] >= GROUP // 2, sizes
    assert sizes[-1] <= GROUP + GROUP // 2, sizes


# 64 records per batch: more than a chunk holds, so batches cut by count end inside the next
# chunk; 42: fewer, so a batch ends inside its own chunk and leaves a few records of it behind.
@pytest.mark.parametrize("count", [64, 42])
def test_a_sequential_consume_reads_each_commitlog_object_once(
    tmp_path: Path, moto_server: S3Server, count: int
) -> None:
    store, bucket = _tier(tmp_path, moto_server, count)
    chunks = _chunks(moto_server, bucket)
    with store:  # opened after tiering: an empty read cache, as after a restart
        store.wait_ready()
        calls = log_requests(store)
        assert store.tiering is not None
        lean = store.tiering.root.inner._lean  # type: ignore[attr-defined]
        assert lean is not None
        sent_before = lean.sent
        bodies: list[bytes] = []
        offset = 0
        while offset < MESSAGES:
            r = store.get("seq", 0, offset, count, policy="FORCE")
            assert r.source == "cold"
            assert r.messages
            bodies += [m.body for m in r.messages]
            offset = r.next_offset
        assert bodies == [_body(i) for i in range(MESSAGES)]
    # Every GET (commitlog and consume queue) was tierd's lean GET, served at once: one not
    # served would have been repeated through botocore and logged twice above.
    assert (lean.sent - sent_before, lean.fell_back) == (sum(op == "GetObject" for op, _ in calls), 0)
    gets = collections.Counter(path for op, path in calls if op == "GetObject" and "/COMMIT_LOG/" in path)
    assert sorted(gets) == sorted(f"/{key}" for key in chunks)
    first = f"/{min(chunks)}"
    # The first get is not known to start a sequential read: it loads read_ahead_count records
    # and nothing more, so when the first object holds more, its rest takes a second GET.
    assert gets.pop(first) == (1 if count > 49 else 2)
    assert set(gets.values()) == {1}, gets


def test_a_sequential_consume_finds_the_next_object_loaded_ahead(
    tmp_path: Path, moto_server: S3Server
) -> None:
    """While the caller works on one result, the GET of the next stored object is the
    read-ahead's: of a sequential consume's commitlog GETs, only the first two are the reader's,
    every later one a background load (so the server's time overlaps tierd's decoding instead
    of adding to it); and no more loads run at once than the read-ahead allows. The reader lets
    the read-ahead settle after each result, as a consumer slower than the server does: a fast
    reader may catch up with a load in flight and wait for it, which is timing, not a fault."""
    store, _ = _tier(tmp_path, moto_server, 64)
    with store:
        store.wait_ready()
        calls = log_requests(store)
        fetcher = store.router.fetcher
        offset, most_in_flight = 0, 0
        while offset < MESSAGES:
            r = store.get("seq", 0, offset, 64, policy="FORCE")
            assert r.source == "cold"
            assert [m.body for m in r.messages] == [_body(i) for i in range(offset, r.next_offset)]
            deadline = time.monotonic() + 30
            while fetcher._prefetching:
                most_in_flight = max(most_in_flight, len(fetcher.cache.inflight))
                assert time.monotonic() < deadline, "the read-ahead did not settle"
                time.sleep(0.005)  # polling the loads, not waiting for a guessed time
            offset = r.next_offset
        objects = collections.Counter(
            path for op, path in calls if op == "GetObject" and "/COMMIT_LOG/" in path
        )
        assert len(objects) > 5
        assert set(objects.values()) == {1}, objects  # each object loaded once
        # The first get is not known to start a sequential read, so the reader loads the first
        # two objects itself (misses); every later one was loaded ahead of it.
        assert fetcher.cache.stats.misses == 2, fetcher.cache.stats
        assert fetcher.cache.stats.prefetches == len(objects) - 2, (fetcher.cache.stats, calls)
        assert most_in_flight <= READ_AHEAD_DEPTH


def _seq0(store: BlockingMessageStore) -> FlatMessageFile:
    """The cold files of queue seq/0 (the one :func:`_tier` fills)."""
    assert store.tiering is not None
    ff = store.tiering.flat.get("seq", 0)
    assert ff is not None
    return ff


def _foreground_only(store: BlockingMessageStore) -> None:
    """No batches loaded ahead in the background: these tests count the reads of one ``get``,
    and how many read-ahead loads get to start before the store closes depends on how the
    machine schedules the loop (on a loaded one, two more batches' reads were seen)."""
    store.router.fetcher._prefetch = lambda ff, offset: None  # type: ignore[method-assign]


def _log_reads(store: BlockingMessageStore) -> list[tuple[str, str]]:
    """(read, "start" | "end") of queue seq/0's consume-queue and commitlog reads, in order."""
    ff = _seq0(store)
    events: list[tuple[str, str]] = []

    def logged(name: str, read: Callable[_P, Awaitable[_R]]) -> Callable[_P, Coroutine[Any, Any, _R]]:
        async def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            events.append((name, "start"))
            try:
                return await read(*args, **kwargs)
            finally:
                events.append((name, "end"))

        return call

    ff.read_units = logged("units", ff.read_units)  # type: ignore[method-assign]
    ff.read_commitlog_into = logged("commitlog", ff.read_commitlog_into)  # type: ignore[method-assign]
    return events


def test_a_queues_first_batch_reads_its_commitlog_object_with_its_consume_queue(
    tmp_path: Path, moto_server: S3Server
) -> None:
    """A queue's start is where a commitlog segment starts (its metadata says so): the first
    get sends the commitlog GET without waiting for the consume-queue units, and still checks
    every record against them. Same GETs as before, one wait instead of two."""
    store, bucket = _tier(tmp_path, moto_server, 64)
    chunks = _chunks(moto_server, bucket)
    with store:
        store.wait_ready()
        _foreground_only(store)
        calls = log_requests(store)
        events = _log_reads(store)
        r = store.get("seq", 0, 0, 64, policy="FORCE")
        assert [m.body for m in r.messages] == [_body(i) for i in range(64)]
        stats = store.router.fetcher.cache.stats
        assert (stats.early_reads, stats.early_hits) == (1, 1)
    assert events.index(("commitlog", "start")) < events.index(("units", "end")), events
    assert events.count(("commitlog", "start")) == 2, str(events)  # the first object, the second's head
    gets = collections.Counter(path for op, path in calls if op == "GetObject" and "/COMMIT_LOG/" in path)
    assert gets[f"/{min(chunks)}"] == 1


def test_a_wrong_early_guess_costs_a_read_never_a_wrong_message(
    tmp_path: Path, moto_server: S3Server
) -> None:
    store, _ = _tier(tmp_path, moto_server, 64)
    with store:
        store.wait_ready()
        _foreground_only(store)
        ff = _seq0(store)
        base = ff.commitlog.segments[0].base_offset
        ff.commitlog.learn_first_queue_offset(base, 5)  # metadata claiming offset 5 starts there
        r = store.get("seq", 0, 5, 20, policy="FORCE")
        assert [m.body for m in r.messages] == [_body(i) for i in range(5, 25)]
        stats = store.router.fetcher.cache.stats
        assert (stats.early_reads, stats.early_hits) == (1, 0)


def test_a_failed_early_read_is_read_again_never_a_failed_get(tmp_path: Path, moto_server: S3Server) -> None:
    """The early commitlog read is a guess made before the units arrive: when it fails (a
    backend fault), the batch is read the normal way and the get still returns its messages,
    the failed read costing one request."""
    store, _ = _tier(tmp_path, moto_server, 64)
    with store:
        store.wait_ready()
        _foreground_only(store)
        ff = _seq0(store)
        read_into = ff.read_commitlog_into
        starts: list[int] = []

        async def first_read_fails(flat_offset: int, out: memoryview) -> int:
            starts.append(flat_offset)
            if len(starts) == 1:
                raise BackendError("injected: the early commitlog GET failed")
            return await read_into(flat_offset, out)

        ff.read_commitlog_into = first_read_fails  # type: ignore[method-assign]
        r = store.get("seq", 0, 0, 64, policy="FORCE")
        assert [m.body for m in r.messages] == [_body(i) for i in range(64)]
        stats = store.router.fetcher.cache.stats
        assert (stats.early_reads, stats.early_hits) == (1, 0)
        assert starts[1:2] == starts[:1], starts  # the failed guess, then the batch read again


def test_cold_batches_are_received_straight_into_their_buffers(
    tmp_path: Path, moto_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commitlog GET of a consume streams its body into the batch's pooled buffer (no
    joined copy of the body first), through the guard that bounds backend calls."""
    received: list[int] = []

    async def counting(piece: Callable[[], Awaitable[bytes]], out: memoryview) -> int:
        received.append(out.nbytes)
        return await fill_from(piece, out)

    monkeypatch.setattr(s3_driver, "fill_from", counting)
    store, bucket = _tier(tmp_path, moto_server, 64)
    chunks = _chunks(moto_server, bucket)
    with store:
        store.wait_ready()
        calls = log_requests(store)
        offset = 0
        while offset < MESSAGES:
            r = store.get("seq", 0, offset, 64, policy="FORCE")
            assert [m.body for m in r.messages] == [_body(i) for i in range(offset, r.next_offset)]
            offset = r.next_offset
    gets = [path for op, path in calls if op == "GetObject" and "/COMMIT_LOG/" in path]
    assert len(received) == len(gets) >= len(chunks)
    assert sum(received) == sum(chunks.values())


def test_new_queues_are_tiered_with_one_listing_per_topic(tmp_path: Path, moto_server: S3Server) -> None:
    """A round tiering new queues lists each topic's directory once before their first writes,
    instead of one confirming listing per new segment (a commitlog and a consume queue per
    queue: 48 listings for these 24 queues before); every message is then read back cold."""
    bucket = create_bucket(moto_server)
    backend = {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": moto_server.storage_options}
    cfg = cold_config(tmp_path, backend)
    keys = [(f"t{i // 8}", i % 8) for i in range(24)]
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        store.put_batch([Message(t, f"{t}/{q}".encode(), queue_id=q) for t, q in keys])
        calls = log_requests(store)
        assert store.tier_now().committed == len(keys)
    listings = sum(op == "ListObjectsV2" for op, _ in calls)
    assert listings < len(keys), collections.Counter(op for op, _ in calls)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        for t, q in keys:
            got = store.get(t, q, 0, 1, policy="FORCE")
            assert got.source == "cold"
            assert [m.body for m in got.messages] == [f"{t}/{q}".encode()]
