"""A corrupt record in one tier is served from the other; with no good copy the read stops
before it with an error status — never a gap inside FOUND, never a next_offset past it.

hot:   0 1 2 3 [4] 5 [6] [7] 8 9 ... 19     (bit rot in the hot commitlog)
cold:  0 1 2 3  4  5  6   7  8 9            (committed before the rot) → get(0, 20) = 0..19
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, GetStatus, Message, ReadPolicy

from .conftest import cold_config

if TYPE_CHECKING:
    from pathlib import Path

BAD = (4, 6, 7)


def _rot_hot(store: BlockingMessageStore, commitlog_offset: int) -> None:
    f = store.hot.commitlog.files.find(commitlog_offset)
    assert f is not None
    f.mm[commitlog_offset - f.file_from_offset + 88] ^= 0x01  # a body byte


def _bodies(n: int, start: int = 0) -> list[bytes]:
    return [b"message-%03d" % i * 9 for i in range(start, start + n)]


def test_corrupt_hot_records_are_served_from_the_cold_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with BlockingMessageStore.open(cold_config(tmp_path)) as store:
        results = store.put_batch([Message(topic="c", body=b, queue_id=0) for b in _bodies(10)])
        store.tier_now()  # 0..9 have a good cold copy
        store.put_batch([Message(topic="c", body=b, queue_id=0) for b in _bodies(10, 10)])
        for i in BAD:
            _rot_hot(store, results[i].commitlog_offset)
        for policy in (ReadPolicy.DISABLE, ReadPolicy.NOT_IN_DISK, ReadPolicy.NOT_IN_MEM):
            got: list[bytes] = []
            offset = 0
            while offset < 20:  # as a consumer reads: every answer FOUND, contiguous
                r = store.get("c", 0, offset, 20, policy)
                assert r.status is GetStatus.FOUND, (policy, offset, r)
                assert [m.queue_offset for m in r.messages] == list(range(offset, r.next_offset))
                got += [m.body for m in r.messages]
                offset = r.next_offset
            assert got == _bodies(20), policy
        r = store.get("c", 0, 4, 1)  # the corrupt one alone
        assert ([m.body for m in r.messages], r.source) == (_bodies(1, 4), "cold")
        assert store.router.corrupt_served_cold >= 4
        # logged once per record, however often it is read (the copy from 4 on covers 6 and 7)
        served = [rec.getMessage() for rec in caplog.records if "served the cold copy" in rec.getMessage()]
        assert served == ["c/0 offset 4 is unreadable in the hot store; served the cold copy"]


def test_a_corrupt_record_without_a_cold_copy_ends_the_read_with_an_error_status(tmp_path: Path) -> None:
    with BlockingMessageStore.open(cold_config(tmp_path)) as store:
        store.put_batch([Message(topic="c", body=b, queue_id=0) for b in _bodies(5)])
        store.tier_now()
        results = store.put_batch([Message(topic="c", body=b, queue_id=0) for b in _bodies(10, 5)])
        _rot_hot(store, results[3].commitlog_offset)  # queue offset 8: not tiered yet
        r = store.get("c", 0, 0, 20)
        assert (r.status, [m.queue_offset for m in r.messages], r.next_offset) == (
            GetStatus.FOUND,
            list(range(8)),
            8,
        )
        r = store.get("c", 0, 8, 20)
        assert (r.status, r.messages, r.next_offset) == (GetStatus.OFFSET_FOUND_NULL, (), 8)
        assert store.get("c", 0, 9, 20).messages[0].body == _bodies(1, 9)[0]


def test_after_a_restore_a_corrupt_cold_record_ends_the_read_after_the_good_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = {"name": "posix", "url": str(tmp_path / "bucket")}
    with BlockingMessageStore.open(cold_config(tmp_path / "a", backend=bucket)) as store:
        store.put_batch([Message(topic="c", body=b, queue_id=0) for b in _bodies(20)])
        store.tier_now()
    segment = next(p for p in (tmp_path / "bucket").rglob("*") if p.is_file() and "COMMIT_LOG" in p.parts)
    raw = bytearray(segment.read_bytes())
    at = raw.index(_bodies(1, 12)[0])  # the body of queue offset 12
    raw[at] ^= 0x01
    segment.chmod(0o644)
    segment.write_bytes(bytes(raw))
    cfg = cold_config(tmp_path / "b", backend=bucket)
    BlockingMessageStore.restore(cfg)
    with BlockingMessageStore.open(cfg) as store:
        for policy in ReadPolicy:
            r = store.get("c", 0, 0, 32, policy)
            assert (r.status, [m.body for m in r.messages], r.next_offset) == (
                GetStatus.FOUND,
                _bodies(12),
                12,
            ), policy
            r = store.get("c", 0, 12, 32, policy)
            assert (r.status, r.messages, r.next_offset) == (GetStatus.OFFSET_FOUND_NULL, (), 12), policy
            r = store.get("c", 0, 13, 32, policy)
            assert [m.body for m in r.messages] == _bodies(7, 13)
    assert sum("offset 12 (flat commitlog" in rec.getMessage() for rec in caplog.records) == 1
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR and rec.exc_info]


def test_filtered_reads_stop_at_an_unreadable_candidate_too(tmp_path: Path) -> None:
    """With a tag subscription, units of other tags are skipped unread — but a candidate that
    cannot be read is not: the read ends before it, and a read at it reports it."""
    bucket = {"name": "posix", "url": str(tmp_path / "bucket")}
    with BlockingMessageStore.open(cold_config(tmp_path / "a", backend=bucket)) as store:
        results = store.put_batch(
            [
                Message(topic="c", body=b, tags="a" if i % 2 else "b", queue_id=0)
                for i, b in enumerate(_bodies(20))
            ]
        )
        store.tier_now()
        store.put_batch([Message(topic="c", body=b, tags="a", queue_id=0) for b in _bodies(10, 20)])
        _rot_hot(store, results[13].commitlog_offset)  # tag a, with a good cold copy
        later = store.get("c", 0, 25, 1).messages[0]
        _rot_hot(store, later.commitlog_offset)  # tag a, not tiered
        got: list[int] = []
        offset = 0
        while offset < 25:  # the corrupt hot one (13) is served from its cold copy
            r = store.get("c", 0, offset, 100, ReadPolicy.DISABLE, tags="a")
            assert r.status is GetStatus.FOUND, r
            got += [m.queue_offset for m in r.messages]
            offset = r.next_offset
        assert (got, offset) == ([*range(1, 20, 2), 20, 21, 22, 23, 24], 25)
        r = store.get("c", 0, 25, 100, tags="a")
        assert (r.status, r.messages, r.next_offset) == (GetStatus.OFFSET_FOUND_NULL, (), 25)
    segment = next(p for p in (tmp_path / "bucket").rglob("*") if p.is_file() and "COMMIT_LOG" in p.parts)
    raw = bytearray(segment.read_bytes())
    raw[raw.index(_bodies(1, 13)[0])] ^= 0x01
    segment.chmod(0o644)
    segment.write_bytes(bytes(raw))
    cfg = cold_config(tmp_path / "b", backend=bucket)
    BlockingMessageStore.restore(cfg)
    with BlockingMessageStore.open(cfg) as store:
        r = store.get("c", 0, 0, 100, tags="a")
        assert (r.status, [m.queue_offset for m in r.messages], r.next_offset) == (
            GetStatus.FOUND,
            [1, 3, 5, 7, 9, 11],
            13,
        )
        r = store.get("c", 0, 13, 100, tags="a")
        assert (r.status, r.messages, r.next_offset) == (GetStatus.OFFSET_FOUND_NULL, (), 13)


def _flip_cold_unit(bucket: Path, unit: int, byte: int) -> None:
    """Flip one bit of byte ``byte`` (0..19) of cold consume-queue unit ``unit`` (one segment)."""
    segment = next(p for p in bucket.rglob("*") if p.is_file() and "CONSUME_QUEUE" in p.parts)
    raw = bytearray(segment.read_bytes())
    raw[unit * 20 + byte] ^= 0x01
    segment.chmod(0o644)
    segment.write_bytes(bytes(raw))


@pytest.mark.parametrize(("field", "byte"), [("commitlog offset", 5), ("size", 11)])
def test_a_corrupt_cold_unit_costs_only_its_own_message(tmp_path: Path, field: str, byte: int) -> None:
    """One damaged consume-queue unit (92) after a restore: the 92 messages before it are read
    (they used to be refused with it, OFFSET_FOUND_NULL at 0), a read at it reports it, and the
    queue goes on after it. ``tierd verify`` names the unit."""
    bucket = {"name": "posix", "url": str(tmp_path / "bucket")}
    with BlockingMessageStore.open(cold_config(tmp_path / "a", backend=bucket)) as store:
        store.put_batch([Message(topic="c", body=b, queue_id=0) for b in _bodies(120)])
        store.tier_now()
    _flip_cold_unit(tmp_path / "bucket", 92, byte)
    cfg = cold_config(tmp_path / "b", backend=bucket)
    BlockingMessageStore.restore(cfg)
    with BlockingMessageStore.open(cfg) as store:
        for policy in ReadPolicy:
            got: list[bytes] = []
            offset = 0
            while offset < 92:
                r = store.get("c", 0, offset, 32, policy)
                assert r.status is GetStatus.FOUND, (field, policy, offset, r)
                assert [m.queue_offset for m in r.messages] == list(range(offset, r.next_offset))
                got += [m.body for m in r.messages]
                offset = r.next_offset
            assert (got, offset) == (_bodies(92), 92), policy
            r = store.get("c", 0, 92, 32, policy)
            assert (r.status, r.messages, r.next_offset) == (GetStatus.OFFSET_FOUND_NULL, (), 92), policy
            r = store.get("c", 0, 93, 32, policy)
            assert (r.status, [m.body for m in r.messages]) == (GetStatus.FOUND, _bodies(27, 93)), policy
    report = BlockingMessageStore.verify_store(cfg)
    assert not report.ok
    assert [(p.area, p.where) for p in report.problems] == [("cold-consumequeue", "c/0@92")], report.problems
