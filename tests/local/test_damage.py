"""Damage to one byte or one file of the hot store costs exactly the damaged messages — never
more, never silently (issue 29). Each test flips the exact byte or removes the exact file a
tester reported, and checks three things: what consumers see, what ``tierd verify`` reports
(with the location, exit 1 through ``report.ok``), and that nothing acknowledged is lost or reused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, Message
from tierd.offsets import FILE_NAME as OFFSETS_FILE

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
