"""Consumer groups through the facade: commits checked against both tiers, lag, resets (by
offset, time, earliest, latest), durability across restarts, crashes and ``restore``.

offsets:  0 ........ 400 ........ 600      stored at t=1000 (0..399) and t=2000 (400..599)
cold:     [==========)
hot:      [==========================)
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.consumption.offsets import FILE_NAME
from tierd.errors import (
    CorruptionError,
    InvalidArgumentError,
    InvalidGroupError,
    NotFoundError,
    OffsetOutOfRangeError,
)

from .conftest import cold_config, hot_only_config


def _fill(store: BlockingMessageStore) -> None:
    store.hot.commitlog.clock = functools.partial(int, 1_000)
    store.put_batch([Message(topic="t", body=b"m%d" % i, queue_id=0) for i in range(400)])
    store.put_batch([Message(topic="t", body=b"q1", queue_id=1)])
    store.tier_now()
    store.hot.commitlog.clock = functools.partial(int, 2_000)
    assert store.tiering is not None
    store.tiering.dispatcher.stop()
    store.put_batch([Message(topic="t", body=b"m%d" % i, queue_id=0) for i in range(400, 600)])
    store.hot.wait_dispatched(10)


@pytest.fixture
def cfg(tmp_path: Path) -> TierdConfig:
    return cold_config(tmp_path)


def test_commit_read_lag_and_delete(cfg: TierdConfig) -> None:
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        assert store.committed_offsets("billing") == {}
        assert store.consumer_groups() == []
        store.commit_offset("billing", "t", 0, 350)
        store.commit_offset("audit", "t", 1, 1)
        assert store.committed_offsets("billing") == {("t", 0): 350}
        [audit, billing] = store.consumer_groups()
        assert billing.group == "billing"
        assert [(q.queue_id, q.committed, q.max_offset, q.lag) for q in billing.queues] == [
            (0, 350, 600, 250),
            (1, None, 1, 1),  # every queue of the topic is shown; this one never committed
        ]
        assert billing.lag == 251
        assert (audit.group, audit.lag) == ("audit", 600)
        assert store.delete_group("billing") == 1
        assert [g.group for g in store.consumer_groups()] == ["audit"]
        with pytest.raises(NotFoundError, match="'billing' has no committed offsets"):
            store.consumer_groups("billing")


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (
            ("billing", "t", 0, 601),
            OffsetOutOfRangeError,
            r"beyond the end of t/0: readable offsets are \[0, 600\)",
        ),
        (("billing", "t", 7, 0), NotFoundError, "queue t/7 does not exist"),
        (("bad group!", "t", 0, 0), InvalidGroupError, "consumer group must be"),
        (("billing", "t", 0, -1), InvalidArgumentError, "non-negative"),
    ],
)
def test_bad_commits_are_refused(cfg: TierdConfig, args: tuple[Any, ...], error: type, message: str) -> None:
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        with pytest.raises(error, match=message):
            store.commit_offset(*args)
        assert store.committed_offsets("billing") == {}


def test_reset_to_earliest_latest_a_time_and_an_offset(cfg: TierdConfig) -> None:
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        assert store.reset_offsets("g", "t", "latest") == {("t", 0): 600, ("t", 1): 1}
        assert store.reset_offsets("g", "t", "earliest", queue_id=0) == {("t", 0): 0}
        # by time: the first message stored at/after 1500 is 400 (the cold tier answers below)
        assert store.reset_offsets("g", "t", "timestamp", timestamp=1_500) == {("t", 0): 400, ("t", 1): 1}
        assert store.reset_offsets("g", "t", "timestamp", timestamp=500, queue_id=0) == {("t", 0): 0}
        assert store.reset_offsets("g", "t", "offset", offset=123, queue_id=0) == {("t", 0): 123}
        assert store.committed_offsets("g") == {("t", 0): 123, ("t", 1): 1}
        r = store.get("t", 0, store.committed_offsets("g")[("t", 0)], 1)
        assert r.messages[0].body == b"m123"


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        (
            {"to": "offset", "offset": 601, "queue_id": 0},
            OffsetOutOfRangeError,
            r"its offsets are \[0, 600\]",
        ),
        ({"to": "offset", "offset": 5}, InvalidArgumentError, "needs the queue id"),
        ({"to": "timestamp"}, InvalidArgumentError, "timestamp goes with"),
        ({"to": "latest", "offset": 5}, InvalidArgumentError, "offset goes with"),
        ({"to": "yesterday"}, InvalidArgumentError, "must be one of earliest, latest, timestamp, offset"),
        ({"to": "earliest", "queue_id": 9}, NotFoundError, "queue t/9 does not exist"),
    ],
)
def test_bad_resets_are_refused_not_clamped(
    cfg: TierdConfig, kw: dict[str, Any], error: type, message: str
) -> None:
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        to = kw.pop("to")
        with pytest.raises(error, match=message):
            store.reset_offsets("g", "t", to, **kw)
        with pytest.raises(NotFoundError, match="topic 'nope' does not exist"):
            store.reset_offsets("g", "nope", "earliest")
        assert store.committed_offsets("g") == {}


def test_a_reset_below_the_retained_range_is_an_error(tmp_path: Path) -> None:
    cfg = hot_only_config(
        tmp_path, commitlog_file_size=256 * 1024, max_message_size=64 * 1024, file_reserved_time=1.0
    )
    with BlockingMessageStore.open(cfg) as store:
        store.hot.commitlog.clock = functools.partial(int, 1_000)
        store.put_batch([Message(topic="t", body=b"x" * 1000, queue_id=0) for i in range(600)])
        store.hot.wait_dispatched(10)
        assert store.hot.apply_retention(now_ms=10**12) >= 1
        lo = store.min_offset("t", 0)
        assert lo > 0
        with pytest.raises(OffsetOutOfRangeError, match=rf"\[{lo}, 600\]"):
            store.reset_offsets("g", "t", "offset", offset=lo - 1, queue_id=0)
        assert store.reset_offsets("g", "t", "earliest") == {("t", 0): lo}


def test_offsets_survive_a_restart_and_concurrent_commits_all_land(cfg: TierdConfig) -> None:
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)

        def consumer(n: int) -> None:
            for offset in range(0, 600, 25):
                store.commit_offset(f"g{n}", "t", 0, offset + n)

        threads = [threading.Thread(target=consumer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with BlockingMessageStore.open(cfg) as store:
        assert {g: store.committed_offsets(g) for g in (f"g{n}" for n in range(8))} == {
            f"g{n}": {("t", 0): 575 + n} for n in range(8)
        }
    table = json.loads((cfg.store.dir / "config" / FILE_NAME).read_text())
    assert table["format-version"] == 1
    assert table["groups"]["g3"] == {"t": {"0": 578}}


def test_a_corrupt_offsets_file_is_reported_naming_it(cfg: TierdConfig) -> None:
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        store.commit_offset("g", "t", 0, 5)
    path = cfg.store.dir / "config" / FILE_NAME
    (path.parent / (FILE_NAME + ".tmp")).write_text("{torn")  # a crash mid-write leaves this: ignored
    with BlockingMessageStore.open(cfg) as store:
        assert store.committed_offsets("g") == {("t", 0): 5}
    path.write_text('{"format-version": 2, "groups": {}}')
    with pytest.raises(CorruptionError, match=f"consumer offsets {path} are not valid"):
        BlockingMessageStore.open(cfg)


def test_the_number_of_groups_is_bounded(cfg: TierdConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    import tierd.consumption.offsets

    monkeypatch.setattr(tierd.consumption.offsets, "MAX_GROUPS", 2)
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        store.commit_offset("a", "t", 0, 1)
        store.commit_offset("b", "t", 0, 1)
        with pytest.raises(InvalidGroupError, match="2 consumer groups"):
            store.commit_offset("c", "t", 0, 1)
        store.commit_offset("a", "t", 0, 2)  # known groups keep committing
        store.delete_group("b")
        store.commit_offset("c", "t", 0, 1)


_COMMITTER = """
import sys
from pathlib import Path
from tests.tiered.conftest import hot_only_config
from tierd import BlockingMessageStore, Message
store = BlockingMessageStore.open(hot_only_config(Path(sys.argv[1])))
store.put_batch([Message(topic="t", body=b"x", queue_id=q) for q in (0, 1) for _ in range(20_000)])
store.commit_offset("g", "t", 1, 10)
for i in range(1, 20_000):
    store.commit_offset("g", "t", 0, i)
    print(i, flush=True)
"""


def test_committed_offsets_survive_kill_9_mid_commit(tmp_path: Path) -> None:
    """A process committing as fast as it can is killed; every commit it acknowledged (printed
    after ``commit_offset`` returned) is there, and the table is whole."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _COMMITTER, str(tmp_path)],
        cwd=Path(__file__).parents[2],  # the repository: the script imports tests.tiered.conftest
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        last = 0
        for line in proc.stdout:
            last = int(line)
            if last >= 300:
                break
        assert last >= 300, "the committing process stopped early"
    finally:
        proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    cfg = hot_only_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        committed = store.committed_offsets("g")
    assert committed[("t", 0)] >= last
    assert committed[("t", 1)] == 10


def test_restore_brings_committed_offsets_back_lowering_what_was_never_tiered(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path)
    store = BlockingMessageStore.open(cfg)
    _fill(store)
    store.commit_offset("billing", "t", 0, 350)  # within the cold tier
    store.commit_offset("audit", "t", 0, 550)  # consumed from the hot tier only
    store.commit_offset("audit", "t", 1, 1)
    store.close(grace=0)  # uploads the table; 400..599 are never tiered (the hot disk is "lost")
    fresh = cfg.with_overrides(store={"dir": str(tmp_path / "restored")})
    report = BlockingMessageStore.restore(fresh)
    assert (report.groups, report.offsets_lowered) == (2, 1)
    with BlockingMessageStore.open(fresh) as store:
        assert store.committed_offsets("billing") == {("t", 0): 350}
        assert store.committed_offsets("audit") == {("t", 0): 400, ("t", 1): 1}
        assert store.max_offset("t", 0) == 400  # new messages continue where "audit" resumes
        store.put(Message(topic="t", body=b"after", queue_id=0))
        assert store.get("t", 0, 400, 1).messages[0].body == b"after"


def test_offsets_reach_the_bucket_on_close(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        store.commit_offset("billing", "t", 0, 10)
    copies = [p for p in (tmp_path / "cold").rglob(FILE_NAME)]
    assert len(copies) == 1
    assert json.loads(copies[0].read_text())["groups"] == {"billing": {"t": {"0": 10}}}
    assert os.path.exists(cfg.store.dir / "config" / FILE_NAME)


def test_restore_goes_on_without_an_unreadable_offsets_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        store.commit_offset("billing", "t", 0, 10)
    [copy] = list((tmp_path / "cold").rglob(FILE_NAME))
    copy.write_text("{not json")
    fresh = cfg.with_overrides(store={"dir": str(tmp_path / "restored")})
    report = BlockingMessageStore.restore(fresh)
    assert (report.messages, report.groups) == (601, 0)
    assert "restoring without them" in caplog.text
    with BlockingMessageStore.open(fresh) as store:
        assert store.consumer_groups() == []


_LAST_COMMIT = """
import sys
from pathlib import Path
from tests.tiered.conftest import cold_config
from tierd import BlockingMessageStore
store = BlockingMessageStore.open(cold_config(Path(sys.argv[1])))
store.wait_ready()
store.commit_offset("billing", "t", 0, 7)
print("committed", flush=True)
sys.stdin.read()  # killed here, before the manifest interval uploads the table
"""


def test_a_commit_made_before_kill_9_reaches_the_bucket_after_the_restart(tmp_path: Path) -> None:
    """The bucket copy holds 3; a process commits 7 and is killed before its next upload. The
    restarted store must bring the copy up to its local table, so ``restore`` moves nobody back."""
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        _fill(store)
        store.commit_offset("billing", "t", 0, 3)
    [copy] = list((tmp_path / "cold").rglob(FILE_NAME))
    assert json.loads(copy.read_text())["groups"] == {"billing": {"t": {"0": 3}}}
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAST_COMMIT, str(tmp_path)],
        cwd=Path(__file__).parents[2],  # the repository: the script imports tests.tiered.conftest
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "committed"
    finally:
        proc.kill()
        proc.wait(30)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
    assert json.loads(copy.read_text())["groups"] == {"billing": {"t": {"0": 3}}}, "the kill came first"
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        assert store.committed_offsets("billing") == {("t", 0): 7}
    assert json.loads(copy.read_text())["groups"] == {"billing": {"t": {"0": 7}}}
    fresh = cfg.with_overrides(store={"dir": str(tmp_path / "restored")})
    BlockingMessageStore.restore(fresh)
    with BlockingMessageStore.open(fresh) as store:
        assert store.committed_offsets("billing") == {("t", 0): 7}
