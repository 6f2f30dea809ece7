"""Scheduled messages over HTTP: produce with `deliver_at` / `delay_level`, recall with
`DELETE /v1/scheduled/{handle}`, bad input as 4xx with a stable error code."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

from tierd.config import TierdConfig

from ..service.conftest import running, service_config
from .conftest import DEADLINE, now_ms

if TYPE_CHECKING:
    from pathlib import Path

    import httpx


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wait_messages(client: httpx.Client, topic: str, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + DEADLINE
    while True:
        r = client.get(f"/v1/topics/{topic}/queues/0/messages", params={"offset": 0, "max_count": 64})
        assert r.status_code == 200, r.text
        msgs: list[dict[str, Any]] = r.json()["messages"]
        if len(msgs) >= n:
            return msgs
        assert time.monotonic() < deadline, f"{len(msgs)} of {n} delivered"
        time.sleep(0.02)  # polling interval; the deadline bounds the wait


def test_produce_scheduled_recall_and_errors(tmp_path: Path) -> None:
    cfg = TierdConfig.from_dict(service_config(tmp_path))
    with running(cfg) as d:
        c = d.client
        due = now_ms() + 1200
        r = c.post("/v1/topics/t/messages", json={"body": b64(b"a"), "queue_id": 0, "deliver_at": due})
        assert r.status_code == 200, r.text
        sent = r.json()
        assert sent["deliver_at"] == due
        assert sent["topic"] == "t"
        r = c.post("/v1/topics/t/messages", json={"body": b64(b"b"), "queue_id": 0, "delay_level": 18})
        assert r.status_code == 200, r.text
        later = r.json()["handle"]

        recalled = c.delete(f"/v1/scheduled/{later}")
        assert recalled.status_code == 200, recalled.text
        assert recalled.json() == {"handle": later, "recalled": True}
        again = c.delete(f"/v1/scheduled/{later}")
        assert again.json()["recalled"] is False

        (m,) = wait_messages(c, "t", 1)
        assert base64.b64decode(m["body"]) == b"a"
        assert m["store_timestamp"] >= due
        assert m["properties"]["TIMER_HANDLE"] == sent["handle"]

        late = c.delete(f"/v1/scheduled/{sent['handle']}")
        assert late.status_code == 409, late.text
        assert late.json()["error"] == "already_delivered"

        for body, code in (
            ({"deliver_at": now_ms() - 10_000}, "invalid_delivery_time"),
            ({"deliver_at": now_ms() + 10 * 24 * 3600 * 1000}, "invalid_delivery_time"),
            ({"delay_level": 19}, "invalid_delivery_time"),
        ):
            bad = c.post("/v1/topics/t/messages", json={"body": b64(b"x"), **body})
            assert bad.status_code == 400, bad.text
            assert bad.json()["error"] == code
            assert "Traceback" not in bad.text
        both = c.post("/v1/topics/t/messages", json={"body": b64(b"x"), "delay_level": 1, "deliver_at": due})
        assert both.status_code == 400, both.text
        batch = c.post(
            "/v1/topics/t/messages:batch", json={"messages": [{"body": b64(b"x"), "delay_level": 1}]}
        )
        assert batch.status_code == 400, batch.text
        unknown = c.delete("/v1/scheduled/999-123")
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["error"] == "unknown_handle"
        garbage = c.delete("/v1/scheduled/not-a-handle")
        assert garbage.status_code == 404
        assert garbage.json()["error"] == "unknown_handle"


def test_metrics_count_pending_recalls_and_lateness(tmp_path: Path) -> None:
    cfg = TierdConfig.from_dict(service_config(tmp_path))
    with running(cfg) as d:
        c = d.client
        # Due a little ahead, with room for a loaded machine: a time that has passed by the time
        # the request arrives is refused (400), which is not what this test is about.
        due = now_ms() + 2_000
        assert c.post(
            "/v1/topics/t/messages", json={"body": b64(b"a"), "queue_id": 0, "deliver_at": due}
        ).is_success
        far = c.post("/v1/topics/t/messages", json={"body": b64(b"b"), "queue_id": 0, "delay_level": 18})
        wait_messages(c, "t", 1)
        assert c.delete(f"/v1/scheduled/{far.json()['handle']}").is_success
        text = c.get("/metrics").text
        assert "tierd_scheduled_pending 0.0" in text
        assert "tierd_scheduled_recalls_total 1.0" in text
        assert "tierd_scheduled_delivered_total 1.0" in text
        assert 'tierd_scheduled_lateness_seconds_bucket{le="+Inf"} 1.0' in text
