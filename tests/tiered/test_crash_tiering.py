"""kill -9 while tiering: after restart no gap, no duplicate in any cold consume queue, cold
records equal hot ones, and metadata agrees with the backend.

    daemon (put + tier_now in a loop) ──SIGKILL──▶ reopen ──tier_now──▶ verify cold == hot
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tierd import BlockingMessageStore
from tierd.local.codec import decode_record
from tierd.tiered.metadata import MetadataStore

from .conftest import cold_config, run
from .test_write_path import cold_records
from .tiering_daemon import SMALL

REPO = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("TIERD_TIERING_CRASH_TRIALS", "10"))


def _wait_lines(proc: subprocess.Popen[bytes], want: int, deadline: float) -> int:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = 0
    while seen < want and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        seen += chunk.count(b"\n")
    return seen


def _verify(store: BlockingMessageStore, root: Path) -> int:
    assert store.tiering is not None
    total = 0
    for (topic, qid), hot_cq in sorted(store.hot.cqs.items()):
        ff = store.tiering.flat.get(topic, qid)
        assert ff is not None
        assert (ff.min_offset, ff.max_offset) == (hot_cq.min_offset, hot_cq.max_offset)
        cold = cold_records(store, topic, qid)
        assert [q for q, _ in cold] == list(range(ff.min_offset, ff.max_offset))  # no gap, no duplicate
        hot_units = hot_cq.read_units(ff.min_offset, ff.max_offset - ff.min_offset)
        flat = ff.commitlog.min_offset
        for (qoff, raw), phys in zip(cold, hot_units["offset"].tolist(), strict=True):
            hot_raw = store.hot.commitlog.read_bytes(phys, len(raw))
            assert raw[:28] == hot_raw[:28]
            assert raw[36:] == hot_raw[36:]
            m = decode_record(raw)
            assert (m.queue_offset, m.commitlog_offset) == (qoff, flat)
            flat += len(raw)
        # the flat commitlog holds nothing beyond what the consume queue references
        assert flat == ff.commitlog.commit_offset
        total += len(cold)
    return total


def _verify_metadata_matches_backend(root: Path) -> None:
    meta = MetadataStore(root / "hot").load()
    assert meta is not None
    for q in meta.queues:
        for seg in (*q.commitlog, *q.consumequeue):
            files = [
                f
                for f in (root / "cold").rglob(f"*{seg.base_offset:020d}")
                if f.parent.name == seg.type
                and f.parent.parent.name == str(q.queue_id)
                and f.parent.parent.parent.name == q.topic
            ]
            assert len(files) == 1, seg
            assert files[0].stat().st_size == seg.size, (q.topic, q.queue_id, seg)


def test_sigkill_while_tiering_leaves_no_gap_duplicate_or_disagreement(tmp_path: Path) -> None:
    rng = random.Random(99)
    tiered = 0
    for trial in range(TRIALS):
        with subprocess.Popen(
            [sys.executable, "-m", "tests.tiered.tiering_daemon", str(tmp_path), str(trial)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as proc:
            try:
                assert _wait_lines(proc, 1, time.monotonic() + 60) >= 1, (
                    proc.stderr.read() if proc.stderr else ""
                )
                _wait_lines(proc, rng.randint(1, 25), time.monotonic() + 60)
            finally:
                proc.send_signal(signal.SIGKILL)
                _, err = proc.communicate(timeout=60)
            assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        with BlockingMessageStore.open(cold_config(tmp_path, **SMALL)) as store:
            assert not store.hot.last_exit_ok
            run(store, store.tiering.ready.wait())  # type: ignore[union-attr]
            store.tier_now()
            tiered = _verify(store, tmp_path)
        _verify_metadata_matches_backend(tmp_path)
    assert tiered > TRIALS
