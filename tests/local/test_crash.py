"""kill -9 during synchronous writes never loses an acknowledged message.

producer (subprocess, flush=sync) ──ack over pipe──▶ test ──SIGKILL──▶ producer
                                                      └─ reopen: acked ⊆ stored, CQ/index == commitlog
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

from .conftest import small_config
from .test_store import assert_queues_agree_with_commitlog

REPO = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("TIERD_CRASH_TRIALS", "20"))


def _read_acks(proc: subprocess.Popen[bytes], want: int, deadline: float) -> bytes:
    """Read stdout until ``want`` acknowledgements arrived (or the deadline passes)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    while buf.count(b"\n") < want and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            buf += chunk
    return buf


def test_sigkill_during_sync_writes_loses_no_acknowledged_message(tmp_path: Path) -> None:
    root = tmp_path / "store"
    rng = random.Random(1234)
    acked: dict[tuple[str, int, int], bytes] = {}
    truncations = 0
    for trial in range(TRIALS):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.local.crash_producer", str(root), str(trial)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out = _read_acks(proc, 1, time.monotonic() + 60)
            assert out.startswith(b"ready\n"), proc.stderr.read() if proc.stderr else out
            out += _read_acks(proc, rng.randint(1, 400), time.monotonic() + 60)
        finally:
            proc.send_signal(signal.SIGKILL)
            rest, err = proc.communicate(timeout=60)
        out += rest
        # Only complete lines are acknowledgements; a torn last line was never acknowledged.
        for line in out.split(b"\n")[1:-1]:
            raw_qid, raw_off, raw_topic, raw_body = line.split(b" ")
            acked[raw_topic.decode(), int(raw_qid), int(raw_off)] = bytes.fromhex(raw_body.decode())
        with BlockingMessageStore.open(small_config(root)) as store:
            hot = store.hot
            assert not hot.last_exit_ok, f"producer exited on its own: {err.decode()[-3000:]}"
            truncations += hot.recovery_truncated
            for (topic, qid, off), body in acked.items():
                res = store.get(topic, qid, off, 1)
                assert res.messages, (trial, topic, qid, off, res.status)
                assert res.messages[0].body == body, (trial, topic, qid, off)
            stored = assert_queues_agree_with_commitlog(store)
            assert stored >= len(acked)
            # no duplicates: every stored body is unique
            bodies = [
                m.body for (t, q) in hot.cqs for m in store.get(t, q, store.min_offset(t, q), 4096).messages
            ]
            assert len(bodies) == len(set(bodies))
            # the key index finds an acknowledged message of this trial
            sample = [(k, b) for k, b in acked.items() if b.startswith(b"%d:" % trial)]
            if sample:
                (topic, _, _), body = sample[-1]
                i = int(body.split(b":")[1])
                assert [m.body for m in store.query(topic, f"k{trial}-{i}")] == [body]
            # whatever followed the last valid record is gone
            last = hot.commitlog.files.files[-1]
            at = hot.commitlog.max_offset - last.file_from_offset
            assert last.mm[at : at + 4096].count(0) == len(last.mm[at : at + 4096])
    print(f"acked={len(acked)} truncations={truncations}")
    assert len(acked) > TRIALS
