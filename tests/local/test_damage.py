"""Damage to one byte or one file of the hot store costs exactly the damaged messages — never
more, never silently (issue 29). Each test flips the exact byte or removes the exact file a
tester reported, and checks three things: what consumers see, what ``tierd verify`` reports
(with the location, exit 1 through ``report.ok``), and that nothing acknowledged is lost or reused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, GetStatus, Message, TierdConfig
from tierd.consumption.offsets import FILE_NAME as OFFSETS_FILE
from tierd.format.cq_unit import UNIT_SIZE
from tierd.local.index import HEADER_SIZE

from .conftest import small_config

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def _flip(path: Path, at: int, mask: int = 0x01) -> None:
    """Flip bits of the byte at ``at`` of ``path`` (negative: from the end), as bit rot would."""
    raw = bytearray(path.read_bytes())
    raw[at] ^= mask
    path.write_bytes(bytes(raw))


# ------------------------------------------------------------------------ consumer offsets
def _billing_offset(raw: bytes) -> int:
    """Where billing's committed offset (one digit) is in the file."""
    return raw.index(b'"0": 1', raw.index(b'"billing"')) + 5


@pytest.mark.parametrize(
    "where",
    [lambda raw: 0, _billing_offset],
    ids=["the JSON no longer parses", "an offset reads as another (it parses)"],
)
def test_a_flipped_byte_in_the_consumer_offsets_falls_back_to_the_backup_and_verify_reports_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: Callable[[bytes], int]
) -> None:
    cfg = small_config(tmp_path / "s")
    with BlockingMessageStore.open(cfg) as store:
        store.put(Message(topic="t", body=b"x", queue_id=0))
        store.commit_offset("billing", "t", 0, 1)
        store.commit_offset("audit", "t", 0, 1)  # the backup now holds billing's commit
    path = tmp_path / "s" / "config" / OFFSETS_FILE
    _flip(path, where(path.read_bytes()))
    caplog.set_level(logging.INFO)
    with BlockingMessageStore.open(cfg) as store:  # the store still opens ...
        assert store.committed_offsets("billing") == {("t", 0): 1}  # ... from the backup
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert str(path) in errors[0]
    assert "backup" in errors[0]
    assert not path.with_name(OFFSETS_FILE + ".corrupt").exists()  # nothing written: still damaged
    report = BlockingMessageStore.verify_store(cfg)
    assert not report.ok
    assert [(p.area, p.where) for p in report.problems] == [("consumer-offsets", str(path))]
    assert "backup" in report.problems[0].message
    repaired = BlockingMessageStore.verify_store(cfg, repair=True)
    assert repaired.ok
    assert repaired.repairs
    assert BlockingMessageStore.verify_store(cfg).ok
    with BlockingMessageStore.open(cfg) as store:
        assert store.committed_offsets("billing") == {("t", 0): 1}


# ------------------------------------------------------------------------ consume-queue units
def _queue_files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted((root / "consumequeue").rglob("*")) if p.is_file()}


def _write_two_queues(cfg: TierdConfig, count: int = 200) -> None:
    """``count`` messages in each of two queues, interleaved (a unit's neighbours are not its
    record's neighbours in the commitlog), tagged so a unit's tags code matters."""
    with BlockingMessageStore.open(cfg) as store:
        for i in range(count):
            store.put_batch(
                [
                    Message(topic="t", body=b"m%d-%d" % (q, i) * 5, tags=f"tag{i % 3}", queue_id=q)
                    for q in (0, 1)
                ]
            )


def _read_queue(store: BlockingMessageStore, qid: int) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        r = store.get("t", qid, offset, 64)
        if r.status is GetStatus.OFFSET_OVERFLOW_ONE:
            return out
        assert r.status is GetStatus.FOUND, (offset, r.status)
        out += [m.body for m in r.messages]
        offset = r.next_offset


#: Byte of unit 150 of queue 0 (its file holds units 128..191): the size's sign bit (the unit
#: no longer looks written) or the offset's low byte (it still looks valid, points elsewhere).
UNIT = 150
FLIPS = {"size sign": (8, 0x80), "offset low byte": (7, 0x01)}


@pytest.mark.parametrize("flip", FLIPS, ids=list(FLIPS))
def test_a_flipped_byte_in_a_consume_queue_unit_is_reported_read_only_and_repair_rebuilds_it(
    tmp_path: Path, flip: str
) -> None:
    root = tmp_path / "s"
    cfg = small_config(root)
    _write_two_queues(cfg)
    byte, mask = FLIPS[flip]
    _flip(
        root / "consumequeue" / "t" / "0" / f"{128 * UNIT_SIZE:020d}", (UNIT - 128) * UNIT_SIZE + byte, mask
    )
    before = _queue_files(root)
    report = BlockingMessageStore.verify_store(cfg)
    assert not report.ok
    assert [(p.area, p.where) for p in report.problems] == [("hot-consumequeue", f"t/0@{UNIT}")]
    assert report.problems[0].fix
    assert _queue_files(root) == before  # read-only: not a byte of any queue changed
    repaired = BlockingMessageStore.verify_store(cfg, repair=True)
    assert repaired.ok, repaired.problems
    assert repaired.repairs
    assert BlockingMessageStore.verify_store(cfg).ok
    with BlockingMessageStore.open(cfg) as store:
        for qid in (0, 1):
            assert _read_queue(store, qid) == [b"m%d-%d" % (qid, i) * 5 for i in range(200)]
        assert store.put(Message(topic="t", body=b"next", queue_id=0)).queue_offset == 200
        r = store.get("t", 0, UNIT, 1, tags=f"tag{UNIT % 3}")
        assert [m.queue_offset for m in r.messages] == [UNIT]  # its tags code was rebuilt too


def test_a_consume_queue_unit_that_no_longer_looks_written_is_rebuilt_when_the_store_opens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "s"
    cfg = small_config(root)
    _write_two_queues(cfg)
    _flip(root / "consumequeue" / "t" / "0" / f"{128 * UNIT_SIZE:020d}", (UNIT - 128) * UNIT_SIZE + 8, 0x80)
    caplog.set_level(logging.INFO)
    with BlockingMessageStore.open(cfg) as store:
        for qid in (0, 1):
            assert _read_queue(store, qid) == [b"m%d-%d" % (qid, i) * 5 for i in range(200)]
        assert store.put(Message(topic="t", body=b"next", queue_id=0)).queue_offset == 200
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert f"t/0 offset {UNIT}" in errors[0]
    assert BlockingMessageStore.verify_store(cfg).ok


# ------------------------------------------------------------------------ commitlog files
def test_a_missing_newest_commitlog_file_leaves_a_hole_and_no_offset_is_reused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "s"
    cfg = small_config(root)
    acks = []
    with BlockingMessageStore.open(cfg) as store:
        for i in range(1200):  # ~2.5 commitlog files of 256 KiB
            acks.append(store.put(Message(topic="t", body=b"%04d" % i * 120, queue_id=i % 2)))
        end = store.hot.end_position
    files = sorted((root / "commitlog").iterdir())
    assert len(files) >= 3
    newest = files[-1]
    lost = [a for a in acks if a.commitlog_offset >= int(newest.name)]
    assert lost
    newest.unlink()
    caplog.set_level(logging.INFO)
    with BlockingMessageStore.open(cfg) as store:
        for qid in (0, 1):
            kept = [a.queue_offset for a in acks if a.queue_id == qid and a not in lost]
            gone = [a.queue_offset for a in lost if a.queue_id == qid]
            r = store.get("t", qid, 0, 1000)
            assert [m.queue_offset for m in r.messages] == kept
            hole = store.get("t", qid, gone[0], 10)
            assert hole.status is GetStatus.OFFSET_FOUND_NULL
            assert hole.next_offset == gone[-1] + 1  # a hole of exactly the lost messages
            new = store.put(Message(topic="t", body=b"new", queue_id=qid))
            assert new.queue_offset == gone[-1] + 1  # never an offset a consumer may have passed
            assert new.commitlog_offset >= end  # nor a message id (commitlog offset) reused
        report = store.verify()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(newest.name in e and "missing" in e for e in errors), errors
    assert not report.ok
    [problem] = report.problems
    assert problem.area == "hot-quarantine"
    assert f"[{newest.name.lstrip('0')}, {end})" in problem.message
    assert "missing" in problem.message
    assert not BlockingMessageStore.verify_store(cfg).ok  # still reported after a reopen


# ------------------------------------------------------------------------ key index
@pytest.mark.parametrize("which", [0, -1], ids=["oldest file", "newest file"])
def test_a_zeroed_key_index_header_is_found_rebuilt_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: int
) -> None:
    root = tmp_path / "s"
    cfg = small_config(root)  # 400 items per index file: 1,000 keys fill three files
    with BlockingMessageStore.open(cfg) as store:
        for i in range(0, 1000, 100):
            store.put_batch([Message(topic="t", body=b"k%d" % j, keys=[f"k{j}"]) for j in range(i, i + 100)])
    files = sorted((root / "index").iterdir())
    assert len(files) >= 3
    damaged = files[which]
    with damaged.open("r+b") as fh:
        fh.write(bytes(HEADER_SIZE))
    caplog.set_level(logging.INFO)
    report = BlockingMessageStore.verify_store(cfg)
    assert not report.ok
    assert [(p.area, p.where) for p in report.problems] == [("hot-index", str(damaged))]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(str(damaged) in e for e in errors), errors
    with BlockingMessageStore.open(cfg) as store:
        for j in range(1000):
            assert [m.body for m in store.query("t", f"k{j}")] == [b"k%d" % j], j
    assert BlockingMessageStore.verify_store(cfg).ok
