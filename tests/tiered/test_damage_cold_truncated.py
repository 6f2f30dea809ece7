"""One truncated cold object — a queue's open commitlog segment — costs that queue's lost
messages and nothing more: the cold tier starts with the queue fenced, every other queue reads and
tiers, ``restore`` restores the rest, and status, restore and verify name the damaged range.

bucket: c/0 [0 ........ 59 | lost 60..79]   c/1 [0..79]   d/0 [0..79]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, GetStatus, Message
from tierd.errors import BackendError

from .conftest import cold_config

if TYPE_CHECKING:
    from pathlib import Path

    from tierd import TierdConfig

N = 80
KEPT = 60
QUEUES = (("c", 0), ("c", 1), ("d", 0))


def _body(topic: str, qid: int, i: int) -> bytes:
    return b"%s-%d-%03d-" % (topic.encode(), qid, i) + b"x" * 100


def _fill(cfg: TierdConfig) -> None:
    """Every queue of QUEUES gets N messages, all tiered (one open commitlog segment each)."""
    with BlockingMessageStore.open(cfg) as store:
        for topic, qid in QUEUES:
            store.put_batch([Message(topic=topic, body=_body(topic, qid, i), queue_id=qid) for i in range(N)])
        assert store.tier_now().committed == N * len(QUEUES)


def _truncate_c0(bucket: Path) -> None:
    """Cut c/0's cold commitlog inside message KEPT: KEPT..N-1 lose (part of) their bytes."""
    (segment,) = [
        p
        for p in bucket.rglob("*")
        if p.is_file() and p.parts[-4:-2] == ("c", "0") and "COMMIT_LOG" in p.parts
    ]
    raw = segment.read_bytes()
    cut = raw.index(_body("c", 0, KEPT)) + 3  # inside the body of message KEPT
    segment.chmod(0o644)
    segment.write_bytes(raw[:cut])


def _read_all(store: BlockingMessageStore, topic: str, qid: int) -> list[bytes]:
    got: list[bytes] = []
    offset = 0
    while True:
        r = store.get(topic, qid, offset, 32)
        if r.status is not GetStatus.FOUND:
            return got
        got += [m.body for m in r.messages]
        offset = r.next_offset


def _check_fenced(store: BlockingMessageStore, *, hot_copies: bool) -> None:
    """Reads, status and tiering of a store whose c/0 lost its cold bytes from KEPT on; the
    store that wrote them still has their hot copies and serves those."""
    for topic, qid in QUEUES[1:]:  # every other queue reads in full, and tiers
        assert _read_all(store, topic, qid) == [_body(topic, qid, i) for i in range(N)]
    if hot_copies:
        assert _read_all(store, "c", 0) == [_body("c", 0, i) for i in range(N)]
    else:
        assert _read_all(store, "c", 0) == [_body("c", 0, i) for i in range(KEPT)]
        for lost in (KEPT, N - 1):
            r = store.get("c", 0, lost, 32)
            assert (r.status, r.messages, r.next_offset) == (GetStatus.OFFSET_FOUND_NULL, (), lost)
    status = store.tiering_status()
    assert status is not None
    assert status["ready"] is True
    damaged = status["damaged"]
    assert isinstance(damaged, list)
    assert [(d["topic"], d["queue_id"], d["first"], d["end"]) for d in damaged] == [("c", 0, KEPT, N)]
    # producers are still acknowledged; the damaged queue is not tiered into, the others are
    store.put_batch([Message(topic=t, body=b"new", queue_id=q) for t, q in QUEUES])
    with pytest.raises(BackendError, match="c/0") as failed:
        store.tier_now()
    assert failed.value.detail["committed"] == 2
    assert store.get("c", 0, N, 1).messages[0].body == b"new"  # served hot


def test_the_store_that_wrote_it_starts_with_the_queue_fenced(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path)
    _fill(cfg)
    _truncate_c0(tmp_path / "cold")
    with BlockingMessageStore.open(cfg) as store:
        _check_fenced(store, hot_copies=True)


def test_restore_restores_the_rest_and_names_the_damaged_range(tmp_path: Path) -> None:
    bucket = {"name": "posix", "url": str(tmp_path / "bucket")}
    _fill(cold_config(tmp_path / "a", backend=bucket))
    _truncate_c0(tmp_path / "bucket")
    cfg = cold_config(tmp_path / "b", backend=bucket)
    report = BlockingMessageStore.restore(cfg)
    assert report.queues == len(QUEUES)
    assert [(d.topic, d.queue_id, d.first, d.end) for d in report.damaged] == [("c", 0, KEPT, N)]
    with BlockingMessageStore.open(cfg) as store:
        _check_fenced(store, hot_copies=False)
    verified = BlockingMessageStore.verify_store(cfg)
    assert not verified.ok
    (problem,) = verified.problems  # one problem, naming the object and the lost range
    assert problem.area == "cold-segment", problem
    assert "/c/0/COMMIT_LOG/" in problem.where, problem
    assert f"queue offsets {KEPT}..{N - 1} ({N - KEPT} message(s)) are lost" in problem.message
