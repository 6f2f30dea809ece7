"""A store that fails to open leaves nothing behind: no threads, no tasks, no lock.

corrupt consumer-offsets.json ──▶ open raises one CorruptionError naming the file
                              ──▶ hot store closed (threads joined, lock released), cold tier stopped
fix the file                  ──▶ the same directory opens at once, in the same process
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, Message, MessageStore, TierdConfig
from tierd.consumption.offsets import FILE_NAME
from tierd.errors import CorruptionError

from .conftest import cold_config, hot_only_config

if TYPE_CHECKING:
    from pathlib import Path


def _config(root: Path, tiered: bool) -> TierdConfig:
    return cold_config(root) if tiered else hot_only_config(root)


def _store_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("tierd-")}


def _corrupt_offsets(cfg: TierdConfig) -> tuple[Path, bytes]:
    """Commit an offset, then garble the offsets file; returns its path and good content."""
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready(60)
        store.put(Message(topic="t", body=b"kept", queue_id=0))
        store.commit_offset("g", "t", 0, 1)
    path = cfg.store.dir / "config" / FILE_NAME
    good = path.read_bytes()
    path.write_text("{not json")
    return path, good


def _check_reopens(cfg: TierdConfig, path: Path, good: bytes) -> None:
    path.write_bytes(good)
    with BlockingMessageStore.open(cfg) as store:  # the lock was released: no StoreLockedError
        assert store.committed_offsets("g") == {("t", 0): 1}
        assert store.get("t", 0, 0).messages[0].body == b"kept"


@pytest.mark.parametrize("tiered", [True, False], ids=["tiered", "hot-only"])
def test_a_failed_blocking_open_closes_what_it_opened(
    tmp_path: Path, tiered: bool, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path, tiered)
    path, good = _corrupt_offsets(cfg)
    before = _store_threads()
    with caplog.at_level(logging.WARNING), pytest.raises(CorruptionError) as err:
        BlockingMessageStore.open(cfg)
    assert str(path) in str(err.value)
    assert _store_threads() <= before, "the failed open left store threads running"
    assert not [r for r in caplog.records if "housekeeping" in r.getMessage()]
    _check_reopens(cfg, path, good)


@pytest.mark.parametrize("tiered", [True, False], ids=["tiered", "hot-only"])
def test_a_failed_async_open_closes_what_it_opened(tmp_path: Path, tiered: bool) -> None:
    cfg = _config(tmp_path, tiered)
    path, good = _corrupt_offsets(cfg)
    before = _store_threads()

    async def main() -> set[str]:
        with pytest.raises(CorruptionError) as err:
            async with MessageStore.open(cfg):
                pass
        assert str(path) in str(err.value)
        with pytest.raises(CorruptionError):
            await MessageStore.open(cfg)
        current = asyncio.current_task()
        return {t.get_name() for t in asyncio.all_tasks() if t is not current}

    assert asyncio.run(main()) == set(), "the failed open left tasks running"
    assert _store_threads() <= before, "the failed open left store threads running"
    _check_reopens(cfg, path, good)


def test_an_open_cancelled_while_the_cold_tier_loads_closes_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after the hot store opened (waiting for the cold tier): closed, reopenable."""
    cfg = cold_config(tmp_path)
    from tierd.tiered.service import TieringService

    async def never_ready(self: TieringService, timeout: float | None = None) -> None:
        waiting.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(TieringService, "wait_ready", never_ready)
    waiting = asyncio.Event()
    before = _store_threads()

    async def main() -> None:
        opening = asyncio.create_task(MessageStore.open(cfg, ready_timeout=60)._open())
        await asyncio.wait_for(waiting.wait(), 60)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening

    asyncio.run(main())
    assert _store_threads() <= before
    monkeypatch.undo()
    with BlockingMessageStore.open(cfg) as store:
        store.put(Message(topic="t", body=b"x", queue_id=0))


def test_a_store_closed_while_its_cold_tier_loads_reopens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closed after the prefix was claimed but before the cold tier finished loading: the next
    open must not mistake the store's own owner record for someone else's data."""
    from tierd.tiered.flatstore import FlatFileStore

    cfg = cold_config(tmp_path)
    claimed = threading.Event()

    async def stuck(self: FlatFileStore, meta: object) -> int:
        claimed.set()
        await asyncio.Event().wait()
        return 0

    monkeypatch.setattr(FlatFileStore, "load_from", stuck)
    with BlockingMessageStore.open(cfg) as store:
        store.put(Message(topic="t", body=b"kept", queue_id=0))
        assert claimed.wait(60)
    monkeypatch.undo()
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready(60)
        assert store.get("t", 0, 0).messages[0].body == b"kept"
