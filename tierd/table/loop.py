"""The daemon's table task: a writer pass over every opted-in topic each ``table.interval``
seconds, and maintenance about once an hour.

Passes run in a worker thread (pyiceberg and the bucket reads block). Cancelling the task at
shutdown may leave a pass unfinished: that is a crash before a commit, which the writer is built
to survive (docs/table.md, "Exactly once")."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, Final

from tierd.table.writer import TableWriter, run_passes

if TYPE_CHECKING:
    from tierd.config import TierdConfig

__all__ = ["MAINTENANCE_EVERY", "table_loop"]

log = logging.getLogger(__name__)

#: Seconds between maintenance runs (compaction, snapshot expiry, orphans, retention).
MAINTENANCE_EVERY: Final = 3600.0


def _maintain(writer: TableWriter) -> None:
    for topic in writer.topics():
        failures = writer.failure_log(f"{topic} maintenance")
        try:
            done = writer.maintain(topic)
        except Exception as e:
            failures.failed(e, "retried at the next maintenance")
            continue
        failures.succeeded()
        log.info("table %s: maintenance %s", topic, done)


async def table_loop(config: TierdConfig, writer: TableWriter | None = None) -> None:
    """Run until cancelled."""
    writer = writer or TableWriter(config)
    every = max(1, math.ceil(MAINTENANCE_EVERY / config.table.interval))
    log.info("table writer: topics %s every %.0f s", writer.topics(), config.table.interval)
    passes = 0
    while True:
        await asyncio.to_thread(run_passes, writer)
        passes += 1
        if passes % every == 0:
            await asyncio.to_thread(_maintain, writer)
        await asyncio.sleep(config.table.interval)  # pacing between passes, not a synchronisation
