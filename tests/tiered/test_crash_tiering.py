"""kill -9 while tiering: after restart no gap, no duplicate in any cold consume queue, cold
records equal hot ones, metadata agrees with the backend — and a store restored from the bucket
returns every acknowledged message exactly once.

    daemon (put + tier_now in a loop) ──SIGKILL──▶ reopen ──tier_now──▶ verify cold == hot
    writer (sync puts, tier_now / ~100) ──SIGKILL ×30──▶ reopen ──tier_now──▶ restore ──▶ read all
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

import tierd.tiered.service as tiering_service
from tierd import BlockingMessageStore, GetStatus, Message
from tierd.errors import BackendError
from tierd.format.record import decode_record
from tierd.testing.faults import Fault, FaultPlan, FaultyRoot
from tierd.tiered.metadata import MetadataStore
from tierd.tiered.roots import open_driver_factory

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config, run
from .test_write_path import cold_records
from .tiering_daemon import SMALL
from .tiering_writer import QUEUES, TOPICS, writer_config

if TYPE_CHECKING:
    from collections.abc import Callable

    from tierd.config import BackendConfig
    from tierd.drivers.segment import DriverRoot

REPO = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("TIERD_TIERING_CRASH_TRIALS", "10"))
KILL_CYCLES = int(os.environ.get("TIERD_TIERING_KILL_CYCLES", "30"))
T = TypeVar("T")


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


def _bounded(call: Callable[[], T], seconds: float, what: str) -> T:
    """``call()`` on a daemon thread; a test failure instead of a hung test when it has not
    returned within ``seconds`` (every wait in the tiering path must end)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # re-raised in the test's thread
            box["error"] = e

    thread = threading.Thread(target=target, name=f"bounded-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{what} did not return within {seconds:.0f} s"
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


@pytest.mark.parametrize("fault", [Fault.BEFORE, Fault.AFTER])
def test_tier_now_returns_after_a_crash_between_a_roll_and_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: Fault
) -> None:
    """The state a kill -9 leaves after a flat file rolled (the new segment is recorded) but
    before the old segment's buffered bytes were committed (BEFORE: they never landed) or
    recorded (AFTER: they landed, the metadata still has the old size). It used to keep the
    cold tier from ever loading, and tier_now() waited for it for ever."""
    plan = FaultPlan()

    def faulty(backend: BackendConfig) -> DriverRoot:
        return FaultyRoot(open_driver_factory(backend), plan)

    monkeypatch.setattr(tiering_service, "open_driver_factory", faulty)
    cfg = cold_config(
        tmp_path,
        max_message_size=SMALL_BODY_LIMIT,
        commitlog_segment_size=MIN_SEGMENT,
        consumequeue_segment_size=200,
    )
    body = b"r" * 2600  # 10 fit a segment, 50 do not
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="roll", body=body, queue_id=0) for _ in range(10)])
        store.tier_now()
        assert store.tiering is not None
        ff = store.tiering.flat.get("roll", 0)
        assert ff is not None
        segments = len(ff.commitlog.segments)
        plan.probability, plan.modes = 1.0, (fault,)  # every write from now on "fails"
        store.put_batch([Message(topic="roll", body=body, queue_id=0) for _ in range(40)])
        with pytest.raises(BackendError, match="injected fault"):  # and tier_now says so
            store.tier_now()
        assert len(ff.commitlog.segments) > segments  # it rolled ...
        assert ff.commitlog.segments[-2].commit_position < ff.commitlog.segments[-1].base_offset - (
            ff.commitlog.segments[-2].base_offset
        )  # ... before the rolled segment's bytes were acknowledged
        store.close(grace=0)  # records exactly that state (the same a kill leaves)
    plan.probability = 0.0
    with BlockingMessageStore.open(cfg) as store:
        _bounded(store.tier_now, 60, "tier_now after the crash")
        assert _verify(store, tmp_path) == 50
    _verify_metadata_matches_backend(tmp_path)


def _acks(proc: subprocess.Popen[bytes], seconds: float) -> bytes:
    """Everything the writer printed during ``seconds`` (it keeps writing meanwhile)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    out = b""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            out += chunk
    return out


def _read_all(store: BlockingMessageStore, topic: str, qid: int) -> dict[int, bytes]:
    """Every message of a queue from offset 0, read as a consumer reads."""
    got: dict[int, bytes] = {}
    offset = 0
    while True:
        r = store.get(topic, qid, offset, 256)
        if r.status is GetStatus.OFFSET_OVERFLOW_ONE:
            return got
        assert r.status is GetStatus.FOUND, (topic, qid, offset, r)
        for m in r.messages:
            assert m.queue_offset not in got
            got[m.queue_offset] = m.body
        assert r.next_offset == offset + len(r.messages)
        offset = r.next_offset


def test_sigkill_while_tiering_then_restore_returns_every_acknowledged_message_once(tmp_path: Path) -> None:
    """Issue 14, case 4: sync puts with a tier_now every ~100 puts, killed 30 times at random
    moments; one reopen must tier everything (tier_now returns), and a store restored from the
    bucket alone into a fresh directory must return every acknowledged message exactly once."""
    root = tmp_path / "w"
    rng = random.Random(1404)
    acked: dict[tuple[str, int, int], bytes] = {}
    for cycle in range(KILL_CYCLES):
        with subprocess.Popen(
            [sys.executable, "-m", "tests.tiered.tiering_writer", str(root), str(cycle)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as proc:
            try:
                out = b""
                deadline = time.monotonic() + 60
                while not out.startswith(b"ready\n") and time.monotonic() < deadline:
                    out += _acks(proc, 0.05)
                assert out.startswith(b"ready\n"), proc.stderr.read() if proc.stderr else out
                out += _acks(proc, rng.uniform(0.05, 0.8))
            finally:
                proc.send_signal(signal.SIGKILL)
                rest, err = proc.communicate(timeout=60)
            assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        # Only complete lines are acknowledgements; a torn last line was never acknowledged.
        for line in (out + rest).split(b"\n")[1:-1]:
            _, topic, qid, qoff, body = line.split(b" ")
            acked[topic.decode(), int(qid), int(qoff)] = bytes.fromhex(body.decode())
    with BlockingMessageStore.open(writer_config(root)) as store:
        _bounded(store.tier_now, 120, "tier_now after the kills")
    fresh = writer_config(root).with_overrides(store={"dir": str(tmp_path / "restored")})
    BlockingMessageStore.restore(fresh)
    with BlockingMessageStore.open(fresh) as store:
        stored = {(t, q): _read_all(store, t, q) for t in TOPICS for q in range(QUEUES)}  # at once
        bodies = [b for queue in stored.values() for b in queue.values()]
        assert len(bodies) == len(set(bodies))  # nothing twice (bodies are unique per put)
        lost = [(k, b) for k, b in acked.items() if stored[k[0], k[1]].get(k[2]) != b]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages wrong or missing: {lost[:3]}"
        # the restored store keeps tiering where the bucket ends (no collision with its segments)
        r = store.put(Message(topic=TOPICS[0], body=b"after restore", queue_id=0))
        _bounded(store.tier_now, 60, "tier_now after restore")
        assert store.tiering is not None
        ff = store.tiering.flat.get(TOPICS[0], 0)
        assert ff is not None
        assert ff.max_offset == r.queue_offset + 1
    assert len(acked) > 10 * KILL_CYCLES
