"""Tiering thousands of queues: bounded descriptors, few metadata writes, no per-queue busywork.

hot store (10,000 queues) ──dispatcher──▶ flat files ──▶ posix cold tier
      │                        │               └──▶ metadata: one write per round of new queues
      └─ ulimit -n 1024        └─ idle queues: an offset comparison, no task
                               manifests: rewritten only when changed, across restarts too
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, Message, ReadPolicy
from tierd.tiered.dispatcher import Dispatcher, RoundResult
from tierd.tiered.flatfile import FlatAppendFile
from tierd.tiered.manifest import read_broker_manifest
from tierd.tiered.manifestwriter import LEDGER_NAME

from .conftest import cold_config, run

if TYPE_CHECKING:
    from tierd.tiered.records import LocalSegment

REPO = Path(__file__).resolve().parents[2]
#: Queues of the descriptor-limit test: 1,400 descriptors before the fix (one per file, one per
#: mapping), more than 1,024; few enough that creating and deleting the files stays quick.
QUEUES = 700


def put_one_each(store: BlockingMessageStore, queues: int, topic: str = "mq") -> list[tuple[str, int]]:
    keys = [(f"{topic}-{i // 4}", i % 4) for i in range(queues)]
    store.put_batch([Message(topic=t, body=f"{t}/{q}".encode(), queue_id=q) for t, q in keys])
    return keys


@pytest.mark.slow
def test_thousands_of_queues_under_a_1024_descriptor_limit(tmp_path: Path) -> None:
    """Default settings, 700 queues, ``ulimit -n 1024``: put, tier, reopen, read — before, the
    consume queues alone exhausted the limit at ~500 queues (bench/scale.py runs 10,000)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.tiered.many_queues", str(tmp_path), str(QUEUES), "1024"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["committed"] == QUEUES
    assert report["read_cold"] == QUEUES
    assert report["read_hot"] == QUEUES
    assert report["peak_open_files"] < 512
    assert report["rss_after_reopen_mib"] < 300
    # nothing failed, so nothing was logged at WARNING or above, let alone a flood
    assert len(proc.stderr.splitlines()) < 10, proc.stderr[-3000:]


def metadata_writes(monkeypatch: pytest.MonkeyPatch, store_dir: Path) -> list[str]:
    """Record every replacement of the tiering metadata file (each is a whole-file write)."""
    target = str(store_dir / "config" / "tieredStoreMetadata.json")
    real = os.replace
    seen: list[str] = []

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        if str(dst) == target:
            seen.append(str(src))
        real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    return seen


def test_new_queues_are_recorded_with_one_metadata_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        keys = put_one_each(store, 300)
        writes = metadata_writes(monkeypatch, Path(cfg.store.dir))
        assert store.tier_now().committed == 300
        # two whole-file rewrites per new queue before: 600 writes of a growing file, O(n²)
        assert 1 <= len(writes) <= 3
        for t, q in keys[::37]:
            res = store.get(t, q, 0, 1, policy=ReadPolicy.FORCE)
            assert (res.source, res.messages[0].body) == ("cold", f"{t}/{q}".encode())


def test_a_failed_metadata_write_leaves_no_half_created_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = cold_config(tmp_path)
    target = str(Path(cfg.store.dir) / "config" / "tieredStoreMetadata.json")
    real = os.replace

    def disk_error(src: Any, dst: Any, **kw: Any) -> None:
        if str(dst) == target:
            raise OSError(5, "Input/output error")
        real(src, dst, **kw)

    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        keys = put_one_each(store, 8)
        monkeypatch.setattr(os, "replace", disk_error)
        with pytest.raises(OSError, match="Input/output error"):
            store.tier_now()
        assert store.tiering is not None
        assert not store.tiering.flat.files  # not recorded, so not created
        monkeypatch.undo()
        # before: the queue stayed half created and never tiered ("offsets -1..-1")
        assert store.tier_now().committed == 8
        for t, q in keys:
            assert store.get(t, q, 0, 1, policy=ReadPolicy.FORCE).source == "cold"


def test_idle_rounds_do_no_work_per_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        put_one_each(store, 100)
        assert store.tier_now().committed == 100
        visited: list[tuple[str, int]] = []
        real = Dispatcher._dispatch_queue

        async def counting(
            self: Dispatcher, key: tuple[str, int], force: bool, result: RoundResult, *end: Any
        ) -> int:
            visited.append(key)
            return await real(self, key, force, result, *end)

        monkeypatch.setattr(Dispatcher, "_dispatch_queue", counting)
        assert store.tiering is not None
        dispatcher = store.tiering.dispatcher
        assert run(store, dispatcher.dispatch_round()).total == 0
        assert visited == []  # was: all 100 queues, every round
        store.put(Message(topic="mq-3", body=b"more", queue_id=1))
        store.hot.wait_dispatched(10)
        assert run(store, dispatcher.dispatch_round(force=True)).total == 1
        assert visited == [("mq-3", 1)]


def test_a_restart_does_not_rewrite_unchanged_manifests(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        put_one_each(store, 40)
        store.tier_now()
    ledger = Path(cfg.store.dir) / "config" / LEDGER_NAME

    def manifests_written_at_start() -> int:
        with BlockingMessageStore.open(cfg) as store:
            store.wait_ready()
            assert store.tiering is not None
            return store.tiering.manifests.writes

    # the broker manifest only; every queue's manifest was rewritten at every start before
    assert manifests_written_at_start() == 1
    data = json.loads(ledger.read_text())
    data["owner"][0] = "/somewhere/else"
    ledger.write_text(json.dumps(data))
    assert manifests_written_at_start() == 41  # a ledger of another bucket is not trusted
    ledger.write_text("{not json")
    assert manifests_written_at_start() == 41  # nor an unreadable one
    assert manifests_written_at_start() == 1


def test_loading_reconciles_queues_concurrently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        put_one_each(store, 40)
        store.tier_now()
    in_flight: list[int] = [0, 0]  # now, peak
    real = FlatAppendFile.load

    async def load(self: FlatAppendFile, infos: list[LocalSegment]) -> None:
        in_flight[0] += 1
        in_flight[1] = max(in_flight[1], in_flight[0])
        try:
            await asyncio.sleep(0)  # a backend round trip
            await real(self, infos)
        finally:
            in_flight[0] -= 1

    monkeypatch.setattr(FlatAppendFile, "load", load)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        assert store.get("mq-9", 3, 0, 1, policy=ReadPolicy.FORCE).source == "cold"
    assert in_flight[1] > 1  # one queue after another before: 20,000 round trips in a row


def test_a_new_reserve_time_reaches_the_broker_manifest(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        put_one_each(store, 4)
        store.tier_now()
        assert store.tiering is not None
        run(store, store.tiering.set_reserve_hours("mq-0", 5.0))
        store.tier_now()  # nothing pending: brings the manifests up to date
        broker = run(store, read_broker_manifest(store.tiering.root, cfg.tiered.cluster, cfg.tiered.broker))
        assert [(t.name, t.reserve_hours) for t in broker.topics] == [("mq-0", 5.0)]
