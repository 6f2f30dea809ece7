"""The daemon's table task commits what was sealed without being asked, and stops when cancelled."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from tierd.table import TableWriter
from tierd.table.loop import table_loop

from .conftest import Tier, sealed, writer_config

if TYPE_CHECKING:
    from pathlib import Path


def test_the_table_task_commits_sealed_messages(tier: Tier, tmp_path: Path) -> None:
    cfg = writer_config(tier, tmp_path / "store", orders={})
    writer = TableWriter(cfg)
    expected = sealed(tier.url, "orders").num_rows

    async def run() -> int:
        task = asyncio.create_task(table_loop(cfg, writer))
        deadline = time.monotonic() + 60
        try:
            while writer.last_lag().get("orders") != 0:
                assert time.monotonic() < deadline, "the table task committed nothing within 60 s"
                assert not task.done(), task
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
        return int(writer.table("orders").scan().to_arrow().num_rows)

    assert asyncio.run(run()) == expected
