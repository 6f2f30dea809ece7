"""A store that fails to open leaves nothing behind: no threads, no tasks, no lock.

corrupt consumer-offsets.json ──▶ open raises one CorruptionError naming the file
                              ──▶ hot store closed (threads joined, lock released), cold tier stopped
fix the file                  ──▶ the same directory opens at once, in the same process
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from tierd import BlockingMessageStore, Message

from .conftest import cold_config

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


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
