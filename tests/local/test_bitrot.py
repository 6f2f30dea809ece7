"""Bit rot in the commitlog tail: recovery resyncs past the damage, keeps every later record,
quarantines the damaged bytes and leaves a visible hole of exactly the damaged message(s).

writer (sync puts ×3000) ──SIGKILL──▶ flip a byte mid-log ──reopen──▶ 2999 messages + 1 hole
                                                                      quarantine/ranges.json
RocketMQ (and tierd before) ended recovery at the bad record and truncated the log there: 1,499
acknowledged messages gone, one WARNING.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, GetStatus, Message, ReadPolicy
from tierd.local.checkpoint import DISPATCHED_POS
from tierd.local.quarantine import QUARANTINE_DIR, RANGES_FILE

from .bitrot_writer import writer_config

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(__file__).resolve().parents[2]
COUNT = 3000
MIDDLE = COUNT // 2


@dataclass(frozen=True)
class Ack:
    queue_id: int
    offset: int
    phys: int
    body: bytes


def _write_and_kill(root: Path, tiered: Path | None = None, *, keys: bool = False) -> list[Ack]:
    """Run the writer until it acknowledged COUNT messages, then SIGKILL it."""
    args = [sys.executable, "-m", "tests.local.bitrot_writer", str(root), str(COUNT)]
    env = {**os.environ, "TIERD_ROT_KEYS": "1" if keys else "0"}
    with subprocess.Popen(
        [*args, *([str(tiered)] if tiered else [])],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        out = b""
        deadline = time.monotonic() + 120
        try:
            while not out.endswith(b"done\n") and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                if ready:
                    chunk = os.read(proc.stdout.fileno(), 1 << 16)
                    if not chunk:
                        break
                    out += chunk
        finally:
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate(timeout=60)
        assert out.endswith(b"done\n"), err.decode()[-2000:]
    acks = []
    for line in out.split(b"\n")[:-2]:
        qid, off, phys, body = line.split(b" ")
        acks.append(Ack(int(qid), int(off), int(phys), bytes.fromhex(body.decode())))
    assert len(acks) == COUNT
    return acks


def _patch(root: Path, offset: int, change: Callable[[bytes], bytes]) -> None:
    """Rewrite commitlog bytes at ``offset`` on disk (the store is closed; ``change`` maps the
    bytes there to their replacement, at most up to the end of the file)."""
    path = max(
        (p for p in (root / "commitlog").iterdir() if int(p.name) <= offset), key=lambda p: int(p.name)
    )
    at = offset - int(path.name)
    with path.open("r+b") as fh:
        fh.seek(at)
        old = fh.read(1024)
        fh.seek(at)
        fh.write(change(old))


def _flip_body_byte(acks: list[Ack], root: Path) -> list[int]:
    _patch(root, acks[MIDDLE].phys + 88 + 3, lambda b: bytes([b[0] ^ 0x10]))  # rot in the body
    return [MIDDLE]


def _flip_size_byte(acks: list[Ack], root: Path) -> list[int]:
    _patch(root, acks[MIDDLE].phys + 3, lambda b: bytes([b[0] ^ 0x04]))  # TOTALSIZE no longer fits
    return [MIDDLE]


def _lose_a_page(acks: list[Ack], root: Path) -> list[int]:
    """700 bytes read back as zeros from a record's first byte on (a lost write)."""
    start = acks[MIDDLE].phys
    _patch(root, start, lambda b: bytes(min(700, len(b))))
    return [i for i, a in enumerate(acks) if a.phys < start + 700 and acks[i + 1].phys > start]


def _checkpoint(root: Path) -> int:
    raw = (root / "checkpoint").read_bytes()
    return int.from_bytes(raw[DISPATCHED_POS : DISPATCHED_POS + 8], "big", signed=True)


def _read_all(
    store: BlockingMessageStore, qid: int, policy: ReadPolicy | None = None
) -> tuple[dict[int, bytes], list[int]]:
    """Every message of queue ``qid`` as a consumer reads it, and the offsets reported as holes
    (every answer FOUND without a gap, or a hole with next_offset past it)."""
    got: dict[int, bytes] = {}
    holes: list[int] = []
    offset = store.min_offset("rot", qid)
    while True:
        r = store.get("rot", qid, offset, 100, policy)
        if r.status is GetStatus.OFFSET_OVERFLOW_ONE:
            return got, holes
        if r.status is GetStatus.OFFSET_FOUND_NULL:
            assert r.next_offset > offset, (qid, offset, r)
            holes += range(offset, r.next_offset)
        else:
            assert r.status is GetStatus.FOUND, (qid, offset, r)
            assert [m.queue_offset for m in r.messages] == list(range(offset, r.next_offset))
            got.update((m.queue_offset, m.body) for m in r.messages)
        offset = r.next_offset


@pytest.mark.parametrize("keys", [False, True], ids=["no keys", "keys"])
@pytest.mark.parametrize("damage", [_flip_body_byte, _flip_size_byte, _lose_a_page])
def test_recovery_resyncs_past_damage_and_leaves_a_hole_of_exactly_the_damaged_messages(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[list[Ack], Path], list[int]],
    keys: bool,
) -> None:
    root = tmp_path / "s"
    acks = _write_and_kill(root, keys=keys)
    # The checkpoint follows what is durable (the old 1-second tick left it at 0 here).
    assert _checkpoint(root) >= acks[COUNT - 1000].phys
    lost = damage(acks, root)
    assert lost
    lost_keys = {(acks[i].queue_id, acks[i].offset) for i in lost}
    caplog.set_level(logging.INFO)
    with BlockingMessageStore.open(writer_config(root)) as store:
        assert not store.hot.last_exit_ok
        for qid in (0, 1):
            got, holes = _read_all(store, qid)
            assert sorted(holes) == sorted(o for q, o in lost_keys if q == qid)
            assert got == {
                a.offset: a.body for a in acks if a.queue_id == qid and (qid, a.offset) not in lost_keys
            }
        # quarantined: recorded with the messages lost, the bytes copied aside, logged once, counted
        doc = json.loads((root / QUARANTINE_DIR / RANGES_FILE).read_text())
        [entry] = doc["ranges"]
        after = acks[max(lost) + 1].phys
        assert (entry["start"], entry["end"]) == (acks[min(lost)].phys, after)
        assert sorted((q, o) for _, q, o in entry["lost"]) == sorted(lost_keys)
        copy = (root / QUARANTINE_DIR / entry["copy"]).read_bytes()
        assert len(copy) == after - acks[min(lost)].phys
        assert store.hot.quarantine.lost_messages == len(lost)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1
        assert "damaged and quarantined" in errors[0]
        assert "every record after it was kept" in errors[0]
        redispatched = [r.getMessage() for r in caplog.records if "re-dispatched" in r.getMessage()]
        if not keys:  # (with keys, the index written since its last flush is rebuilt too)
            assert all(int(m.split()[2]) <= 1000 for m in redispatched)  # recovery scanned little
        # tierd verify reports the range (and nothing else: the holes are not corrupt units)
        report = store.verify()
        assert [p.area for p in report.problems] == ["hot-quarantine"]
        assert f"[{entry['start']}, {entry['end']})" in report.problems[0].message
        # writing continues after the holes; no offset is reused
        r = store.put(Message(topic="rot", body=b"after", queue_id=acks[lost[0]].queue_id))
        assert r.queue_offset == max(a.offset for a in acks if a.queue_id == r.queue_id) + 1
    caplog.clear()
    with BlockingMessageStore.open(writer_config(root)) as store:  # a clean reopen keeps it all
        assert len(store.hot.quarantine.ranges) == 1
        assert sorted(_read_all(store, acks[lost[0]].queue_id)[1]) == sorted(
            o for q, o in lost_keys if q == acks[lost[0]].queue_id
        )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_holes_reach_the_cold_tier_and_a_restored_store(tmp_path: Path) -> None:
    root, bucket = tmp_path / "s", tmp_path / "bucket"
    acks = _write_and_kill(root, tiered=bucket)
    lost = _flip_body_byte(acks, root)
    key = (acks[lost[0]].queue_id, acks[lost[0]].offset)
    with BlockingMessageStore.open(writer_config(root, bucket)) as store:
        store.tier_now()
        for policy in (ReadPolicy.FORCE, ReadPolicy.NOT_IN_DISK):
            got, holes = _read_all(store, key[0], policy)
            assert holes == [key[1]]
            assert len(got) == sum(a.queue_id == key[0] for a in acks) - 1
        r = store.get("rot", key[0], key[1], 10, ReadPolicy.FORCE)
        assert (r.status, r.next_offset, r.source) == (GetStatus.OFFSET_FOUND_NULL, key[1] + 1, "cold")
    fresh = writer_config(tmp_path / "restored", bucket)
    BlockingMessageStore.restore(fresh)
    with BlockingMessageStore.open(fresh) as store:
        for qid in (0, 1):
            got, holes = _read_all(store, qid)
            assert holes == ([key[1]] if qid == key[0] else [])
            assert got == {a.offset: a.body for a in acks if a.queue_id == qid and (qid, a.offset) != key}
        report = store.verify()
        assert [(p.area, p.where) for p in report.problems] == [("cold-hole", f"rot/{key[0]}@{key[1]}")]


def test_a_torn_last_append_with_its_end_written_first_is_cut_not_quarantined(tmp_path: Path) -> None:
    """A kill during the last append can leave its last records written and its middle not
    (memcpy may copy the end first). Those records were never acknowledged and are no damage
    to resync past: the append is cut like any torn tail."""
    root = tmp_path / "s"
    with BlockingMessageStore.open(writer_config(root)) as store:
        for i in range(50):
            store.put(Message(topic="rot", body=b"single %d" % i, queue_id=0))
        batch = store.put_batch(
            [Message(topic="rot", body=b"batch %d" % i * 9, queue_id=0) for i in range(20)]
        )
    (root / "abort").write_text("crashed")  # killed during that append ...
    ck = (root / "checkpoint").read_bytes()  # ... which the checkpoint had not reached
    start = batch[0].commitlog_offset
    (root / "checkpoint").write_bytes(
        ck[:DISPATCHED_POS] + start.to_bytes(8, "big") + ck[DISPATCHED_POS + 8 :]
    )
    hole = batch[12].commitlog_offset - batch[5].commitlog_offset
    _patch(root, batch[5].commitlog_offset, lambda b: bytes(hole))
    with BlockingMessageStore.open(writer_config(root)) as store:
        assert store.hot.recovery_truncated
        assert not store.hot.quarantine.ranges
        assert store.max_offset("rot", 0) == 55
        got, holes = _read_all(store, 0)
        assert (len(got), holes) == (55, [])
        assert store.put(Message(topic="rot", body=b"next", queue_id=0)).queue_offset == 55
