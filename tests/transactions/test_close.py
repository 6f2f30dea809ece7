"""Closing a store stops its transaction checker: no task is left pending on a closed loop
("Task was destroyed but it is pending"), and what was pending is still pending after a
reopen."""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING

from tierd import BlockingMessageStore
from tierd.config import TierdConfig
from tierd.message import Message

from ..scheduled.conftest import SMALL_STORE

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def _config(root: Path) -> TierdConfig:
    """Hot store only: the checker runs on the store's own loop."""
    return TierdConfig.from_dict(
        {"store": {"dir": str(root / "hot"), **SMALL_STORE}, "tiered": {"enabled": False}}
    )


def test_close_stops_the_checker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    store = BlockingMessageStore.open(_config(tmp_path))
    half = store.put_half(Message(topic="orders", body=b"pending"), producer_group="pg")
    store.close()
    del store
    gc.collect()
    destroyed = [r.getMessage() for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
    assert destroyed == []

    with BlockingMessageStore.open(_config(tmp_path)) as again:
        assert again.rollback_transaction(half.transaction_id).resolution.value == "ROLLBACK"
