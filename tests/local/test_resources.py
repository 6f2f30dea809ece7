"""Resources that run out: descriptors, disk blocks and memory follow use, not queue count.

thousands of queues ──▶ consume-queue files: sparse, at most store.max_open_queue_files open
producers' bytes    ──▶ commitlog: sparse, blocks reserved in steps ahead of the writer
out of descriptors  ──▶ one ResourceExhaustedError naming the limit, then recovery
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.errors import ResourceExhaustedError
from tierd.local.mapped_file import CachedFile, FileCache

from .conftest import small_config

if TYPE_CHECKING:
    from pathlib import Path

MiB = 1024 * 1024


def allocated(path: Path) -> int:
    """Bytes of disk blocks allocated under ``path`` (what ``du`` counts), directories excluded."""
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(x.split()[1]) * 1024 for x in fh if x.startswith("VmRSS:"))


def default_config(root: Path, **store: Any) -> TierdConfig:
    """Default file sizes (1 GiB commitlog files, 300,000-unit consume-queue files, 5 M-slot
    index): what a user gets."""
    return TierdConfig.from_dict({"store": {"dir": str(root), **store}, "tiered": {"enabled": False}})


def test_disk_use_follows_the_data_not_the_file_sizes(tmp_path: Path) -> None:
    cfg = default_config(tmp_path / "hot")
    for rnd in range(2):  # a new store, then the same store reopened
        with BlockingMessageStore.open(cfg) as store:
            for q in range(50):
                store.put(Message(topic="tiny", body=b"x", queue_id=q))
            assert store.hot.wait_dispatched(30)
            assert store.get("tiny", 49, rnd).messages[0].body == b"x"
        # 100 one-byte messages: a few pages per file, not 1 GiB + 50 x 6 MB (1.3 GB before)
        assert allocated(tmp_path / "hot") < 4 * MiB, rnd
    # the files keep their logical sizes: the layout is RocketMQ's
    (commitlog,) = (tmp_path / "hot" / "commitlog").iterdir()
    assert commitlog.stat().st_size == cfg.store.commitlog_file_size
    (cq,) = (tmp_path / "hot" / "consumequeue" / "tiny" / "7").iterdir()
    assert cq.stat().st_size == cfg.store.consumequeue_file_units * 20


def test_thousands_of_queues_keep_a_bounded_number_of_files_open(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "s", max_open_queue_files=16)
    keys = [(f"many-{i // 4}", i % 4) for i in range(600)]
    before = open_fds()
    for rnd in range(2):  # writing 600 new queues, then reopening and writing them again
        with BlockingMessageStore.open(cfg) as store:
            store.put_batch([Message(topic=t, body=f"{t}/{q}/{rnd}".encode(), queue_id=q) for t, q in keys])
            assert store.hot.wait_dispatched(60)
            for t, q in keys:
                assert store.get(t, q, rnd, 1).messages[0].body == f"{t}/{q}/{rnd}".encode()
            assert store.hot.queue_files.open_files <= 16
            # 600 queues used to hold 1,200 descriptors (a file and its mapping each)
            assert open_fds() - before <= 16 + 24
    assert open_fds() <= before + 2


def test_reopen_reads_only_the_written_part_of_queue_files(tmp_path: Path) -> None:
    cfg = default_config(tmp_path / "hot")
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="rss", body=b"x", queue_id=q) for q in range(64)])
        assert store.hot.wait_dispatched(30)
    start = rss()
    with BlockingMessageStore.open(cfg) as store:
        # recovery scanned each 6 MB queue file through a mapping: +384 MB resident for 64 queues
        assert rss() - start < 64 * MiB
        assert store.get("rss", 63, 0).messages[0].body == b"x"


def test_out_of_descriptors_is_one_clear_error_then_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_open = os.open
    attempts: list[str] = []

    def no_descriptors(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if "consumequeue" in str(path) and not flags & os.O_DIRECTORY:
            attempts.append(str(path))
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, **kw)

    with BlockingMessageStore.open(small_config(tmp_path / "s")) as store:
        store.put(Message(topic="fd", body=b"before", queue_id=0))
        assert store.hot.wait_dispatched(10)
        caplog.set_level(logging.ERROR, logger="tierd")
        monkeypatch.setattr(os, "open", no_descriptors)
        r = store.put(Message(topic="fd-new", body=b"waits", queue_id=0))  # the commitlog is open
        deadline = time.monotonic() + 30
        while len(attempts) < 6 and time.monotonic() < deadline:  # the reput thread retries
            time.sleep(0.05)
        assert len(attempts) >= 6
        err = store.hot.reput.last_error
        assert isinstance(err, ResourceExhaustedError)
        assert "too many open files" in str(err)
        assert "RLIMIT_NOFILE" in str(err)
        assert "store.max_open_queue_files" in str(err)
        assert err.http_status == 503
        # every retry failed alike: one error in the log, not one per attempt
        assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
        monkeypatch.undo()
        assert store.hot.wait_dispatched(30)
        assert store.get("fd-new", 0, r.queue_offset).messages[0].body == b"waits"


def test_file_cache_closes_idle_files_when_descriptors_run_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = FileCache(limit=100)
    files = [CachedFile(tmp_path / f"{i:020d}", 4096, True, cache) for i in range(5)]
    for f in files:
        f.write(b"data", 0)
    assert cache.open_files == 5
    real_open = os.open
    failures = [OSError(errno.EMFILE, "Too many open files")]

    def once(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if failures:
            raise failures.pop()
        return real_open(path, flags, mode, **kw)

    files[0].close()
    monkeypatch.setattr(os, "open", once)
    reopened = CachedFile(tmp_path / f"{0:020d}", 4096, False, cache)
    assert reopened.read(0, 4) == b"data"  # the first open failed; idle files were closed instead
    assert cache.open_files == 1
    for f in files[1:]:
        assert f.read(0, 4) == b"data"  # and reopen on their next use
    assert cache.open_files == 5


def test_a_housekeeping_failure_that_repeats_is_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with BlockingMessageStore.open(small_config(tmp_path / "s")) as store:
        calls: list[float] = []

        def failing() -> None:
            calls.append(time.monotonic())
            raise OSError(errno.EMFILE, "Too many open files")

        caplog.set_level(logging.WARNING, logger="tierd")
        monkeypatch.setattr(store.hot, "_checkpoint_now", failing)
        deadline = time.monotonic() + 30
        while len(calls) < 4 and time.monotonic() < deadline:  # housekeeping runs every second
            time.sleep(0.05)
        assert len(calls) >= 4
        failed = [r for r in caplog.records if "housekeeping" in r.getMessage()]
        assert len(failed) == 1  # was: one line with a traceback per second
        assert "Too many open files" in failed[0].getMessage()
        monkeypatch.undo()
        deadline = time.monotonic() + 30
        while not any("recovered" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [r.getMessage() for r in caplog.records if "housekeeping" in r.getMessage()][-1] == (
            f"housekeeping (flush, checkpoint, retention) recovered after {len(calls)} failure(s)"
        )


def test_a_failing_commitlog_flush_is_logged_once_and_close_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = BlockingMessageStore.open(small_config(tmp_path / "s"))  # flushes every 10 ms
    attempts: list[int] = []

    def disk_error(fd: int) -> None:
        attempts.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    caplog.set_level(logging.WARNING, logger="tierd")
    monkeypatch.setattr(os, "fdatasync", disk_error)
    store.put(Message(topic="io", body=b"unflushed", queue_id=0))
    deadline = time.monotonic() + 30
    while len(attempts) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(attempts) >= 20
    lines = [r.getMessage() for r in caplog.records if "commitlog flush" in r.getMessage()]
    assert lines == ["commitlog flush failed: [Errno 5] Input/output error; retrying every 10 ms"]
    monkeypatch.undo()
    flusher, end = store.hot.flusher, store.hot.commitlog.max_offset
    deadline = time.monotonic() + 30
    while flusher.flushed_offset < end and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flusher.flushed_offset == end
    store.put(Message(topic="io", body=b"unflushed again", queue_id=0))
    monkeypatch.setattr(os, "fdatasync", disk_error)
    # the flusher's last flush fails: an error for the closer, not a loop that never ends
    with pytest.raises(OSError, match="Input/output error"):
        store.close()
