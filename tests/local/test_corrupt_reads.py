"""A corrupt hot record is never returned, never skipped silently, never stepped over.

queue:  0 1 2 3 [4] 5 [6] [7] 8 9        [n] = record whose body bytes rotted on disk
get(0, 10) → FOUND 0..3, next 4   get(4) → OFFSET_FOUND_NULL, next 4   get(5) → FOUND 5, next 6

Without a cold tier there is no good copy: the read ends before the bad record with an error
status whose ``next_offset`` is the bad record itself. (With one, the cold copy is served:
tests/tiered/test_corruption.py.)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tierd import GetStatus, Message

if TYPE_CHECKING:
    import pytest

    from tierd import BlockingMessageStore

BAD = (4, 6, 7)


def rot(store: BlockingMessageStore, commitlog_offset: int) -> None:
    """Flip one byte of the body of the record at ``commitlog_offset`` (IPv4 hosts: the body
    starts at byte 88), as bit rot on disk would."""
    f = store.hot.commitlog.files.find(commitlog_offset)
    assert f is not None
    f.mm[commitlog_offset - f.file_from_offset + 88] ^= 0x01


def test_reads_stop_before_a_corrupt_record_and_never_step_over_it(
    store: BlockingMessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    results = store.put_batch([Message(topic="c", body=b"body-%d" % i, queue_id=0) for i in range(10)])
    for i in BAD:
        rot(store, results[i].commitlog_offset)
    r = store.get("c", 0, 0, 10)
    assert (r.status, [m.queue_offset for m in r.messages], r.next_offset) == (
        GetStatus.FOUND,
        [0, 1, 2, 3],
        4,
    )
    for _ in range(3):  # a consumer retrying
        r = store.get("c", 0, 4, 10)
        assert (r.status, r.messages, r.next_offset) == (GetStatus.OFFSET_FOUND_NULL, (), 4)
    r = store.get("c", 0, 5, 10)
    assert (r.status, [m.body for m in r.messages], r.next_offset) == (GetStatus.FOUND, [b"body-5"], 6)
    r = store.get("c", 0, 8, 10)
    assert (r.status, [m.queue_offset for m in r.messages], r.next_offset) == (GetStatus.FOUND, [8, 9], 10)
    # counted, and logged once per record however often it is read
    assert store.hot.corrupt_reads == 5
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 2
    assert all(rec.exc_info is None for rec in errors)  # one line each, no traceback
    assert f"hot commitlog offset {results[4].commitlog_offset}: c/0 offset 4 is a corrupt record" in (
        errors[0].getMessage()
    )
