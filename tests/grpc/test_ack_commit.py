"""Acks move the committed offset lazily (``COMMIT_DELAY``), one write for many acks; the
journal keeps every ack durable meanwhile. A crash inside the window redelivers exactly the
un-acked messages, and compacting the journal writes the prefixes it covers first.

In-process, on a real store: a second :class:`Inflight` on the same store, its first state
read back from disk, is what the restarted daemon builds — and the abandoned one never writes
again, as after a crash."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from tests.grpc.conftest import run_async
from tierd import MessageStore, TierdConfig
from tierd.consumption import inflight as inflight_module
from tierd.consumption.inflight import Delivery, Inflight
from tierd.message import Message

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

GROUP, TOPIC = "workers", "jobs"


async def _receive(inflight: Inflight, count: int) -> list[Delivery]:
    """Deliveries until ``count`` came (the store dispatches puts in the background)."""
    got: list[Delivery] = []
    deadline = asyncio.get_running_loop().time() + 30
    while len(got) < count:
        assert asyncio.get_running_loop().time() < deadline, f"{len(got)} of {count} delivered in 30 s"
        got += await inflight.receive(GROUP, TOPIC, None, 32, 30.0, 5.0)
    return got


def _config(root: Path) -> TierdConfig:
    return TierdConfig.from_dict(
        {"store": {"dir": str(root), "default_queues": 1}, "tiered": {"enabled": False}}
    )


def _crash(inflight: Inflight) -> None:
    """The daemon dies: nothing ``inflight`` holds in memory reaches the disk any more."""
    if inflight._writer is not None:
        inflight._writer.cancel()


async def _acked_then_crashed(
    root: Path, count: int, acked: int
) -> tuple[int | None, int | None, list[bytes]]:
    """``count`` messages, all delivered, the first ``acked`` acked one call each, then a crash
    at once: the committed offset on disk before and after the restart's first receive, and
    what that receive delivers."""
    async with MessageStore.open(_config(root)) as store:
        await store.put_batch([Message(TOPIC, f"m{i}".encode()) for i in range(count)])
        first = Inflight(store, 16)
        got = await _receive(first, count)
        assert [d.message.body for d in got] == [f"m{i}".encode() for i in range(count)]
        for d in got[:acked]:
            assert await first.ack(GROUP, TOPIC, [d.handle]) == [None]
        before = store.committed_offsets(GROUP).get((TOPIC, 0))
        _crash(first)
        again = Inflight(store, 16)
        # The leases died with the process: every un-acked message is visible at once.
        redelivered = await again.receive(GROUP, TOPIC, None, 32, 30.0, 0.0)
        after = store.committed_offsets(GROUP).get((TOPIC, 0))
        await again.close()
    return before, after, [d.message.body for d in redelivered]


def test_a_crash_before_the_lazy_commit_loses_no_ack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The crash comes inside the window however slow the acks' fsyncs are on a busy machine.
    monkeypatch.setattr(inflight_module, "COMMIT_DELAY", 3600.0)
    before, after, redelivered = run_async(_acked_then_crashed(tmp_path, 5, 3))
    assert before == 0  # acked, but the committed offset was not written yet (the window)
    assert redelivered == [b"m3", b"m4"]  # exactly the un-acked ones
    assert after == 3  # the restart moved the prefix over the journaled acks


def test_the_lazy_commit_is_written_within_its_delay(tmp_path: Path) -> None:
    async def run() -> list[int | None]:
        async with MessageStore.open(_config(tmp_path)) as store:
            inflight = Inflight(store, 16)
            await store.put_batch([Message(TOPIC, b"x"), Message(TOPIC, b"y")])
            got = await _receive(inflight, 2)
            await inflight.ack(GROUP, TOPIC, [d.handle for d in got])
            seen = [store.committed_offsets(GROUP).get((TOPIC, 0))]
            deadline = asyncio.get_running_loop().time() + 30
            while store.committed_offsets(GROUP).get((TOPIC, 0)) != 2:
                assert asyncio.get_running_loop().time() < deadline, "committed offset not written in 30 s"
                await asyncio.sleep(0.05)
            seen.append(store.committed_offsets(GROUP).get((TOPIC, 0)))
            await inflight.close()
            return seen

    assert run_async(run()) == [0, 2]


def test_compacting_the_journal_writes_the_offsets_it_covers_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction drops the lines of acks below the committed prefix: were that prefix not
    written yet, a crash would redeliver them. So it is written first."""
    # Compact once the journal holds more than 4 lines per live one: at the 5th ack here (the
    # ack being applied is live), which drops the lines of the first four.
    monkeypatch.setattr(inflight_module, "COMPACT_SLACK", 0)
    monkeypatch.setattr(inflight_module, "COMMIT_DELAY", 3600.0)  # only the compaction writes
    before, after, redelivered = run_async(_acked_then_crashed(tmp_path, 10, 8))
    assert before == 5  # written by the compaction, not COMMIT_DELAY later
    lines = (tmp_path / "consumption" / "acks.log").read_text().splitlines()
    assert len(lines) == 4  # the 5th ack's line, kept by the compaction, and the three after
    assert redelivered == [b"m8", b"m9"]
    assert after == 8
