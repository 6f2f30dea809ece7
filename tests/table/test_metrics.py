"""The daemon exports its table writer's lag on the ops listener's /metrics: a real daemon with
an opted-in topic, messages produced and tiered over HTTP, passes that fail and then succeed."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tierd import TierdConfig
from tierd.table import TableWriter

from ..service.conftest import running, service_config
from .conftest import sealed

if TYPE_CHECKING:
    from collections.abc import Callable

#: Cold segments of 96 KiB and 2 KiB bodies: 240 messages seal a few segments per queue.
SEGMENT = 96 * 1024


def _figures(ops: str) -> dict[tuple[str, str], float]:
    """``{(metric, topic): value}`` of the table families on the ops listener's /metrics."""
    text = httpx.get(f"{ops}/metrics", timeout=30).text
    return {
        (s.name, s.labels["topic"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("tierd_table_")
        for s in family.samples
    }


def _until(
    what: str, ops: str, done: Callable[[dict[tuple[str, str], float]], bool]
) -> dict[tuple[str, str], float]:
    deadline = time.monotonic() + 60
    while True:
        figures = _figures(ops)
        if done(figures):
            return figures
        assert time.monotonic() < deadline, f"{what} within 60 s; /metrics says {figures}"
        time.sleep(0.05)  # polling interval; the deadline bounds the wait


def test_the_lag_gauge_grows_while_passes_fail_and_drops_after_a_sync(tmp_path: Path) -> None:
    raw = service_config(
        tmp_path, server={"ops_host": "127.0.0.1", "ops_port": 0}, commitlog_segment_size=SEGMENT
    )
    raw["store"]["max_message_size"] = 16 * 1024
    raw["topics"] = {"orders": {"table": "iceberg"}}
    raw["table"] = {"interval": 0.2}
    cfg = TierdConfig.from_dict(raw)
    # The table exists, but its data directory is a file: every pass reads the watermark and the
    # sealed ends, then fails writing Parquet — a broken warehouse, as an operator meets it.
    table = TableWriter(cfg).table("orders")
    blocker = Path(urlparse(table.location()).path) / "data"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")

    with running(cfg) as svc:
        ops = svc.daemon.ops_url
        assert ops is not None
        _until("a first pass", ops, lambda f: f.get(("tierd_table_lag_messages", "orders")) == 0)
        body = base64.b64encode(b"x" * 2048).decode()
        for q in range(2):
            messages = [{"body": body, "queue_id": q}] * 120
            r = svc.client.post("/v1/topics/orders/messages:batch", json={"messages": messages})
            assert r.status_code == 200, r.text
        assert svc.client.post("/v1/admin/tier", json={}).json()["committed"] == 240
        expected = sealed(cfg.backend.url, "orders").num_rows
        assert 0 < expected < 240  # sealed segments, and an open one per queue

        before = _until(
            "the lag of failing passes",
            ops,
            lambda f: (
                f.get(("tierd_table_lag_messages", "orders")) == expected
                and f.get(("tierd_table_failed_passes", "orders"), 0) >= 2
            ),
        )
        assert before[("tierd_table_lag_messages", "orders")] == expected

        blocker.unlink()  # the warehouse repaired: the next pass commits everything sealed
        after = _until(
            "a pass that succeeds",
            ops,
            lambda f: f.get(("tierd_table_failed_passes", "orders")) == 0,
        )
        assert after[("tierd_table_lag_messages", "orders")] == 0
        assert TableWriter(cfg).table("orders").scan().to_arrow().num_rows == expected
