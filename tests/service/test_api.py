"""The HTTP API over a real socket (the daemon in a thread), as a client sees it.

client ──HTTP──▶ tierd (hot store) ──tier_now──▶ posix cold tier
       ◀─────── FORCE reads served cold ◀───────┘
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tierd import TierdConfig
from tierd.service.app import create_app
from tierd.service.schemas import BatchOut

from .conftest import Running, running, service_config

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """Every error: the status, the common JSON shape, the code, and no stack trace."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "message", "detail"}
    assert body["error"] == code, body
    assert isinstance(body["message"], str)
    assert body["message"]
    assert isinstance(body["detail"], dict)
    assert "Traceback" not in r.text
    return body


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Running]:
    with running(TierdConfig.from_dict(service_config(tmp_path))) as r:
        r.wait_ready()
        yield r


def test_produce_tier_and_read_back_from_the_cold_tier(svc: Running) -> None:
    c = svc.client
    one = c.post("/v1/topics/orders/messages", json={"body": b64(b"first"), "keys": ["o-1"], "tags": "paid"})
    assert one.status_code == 200, one.text
    put = one.json()
    bodies = [b"batch-%d" % i + bytes(range(256)) for i in range(5)]
    batch = c.post(
        "/v1/topics/orders/messages:batch",
        json={
            "messages": [
                {"body": b64(b), "queue_id": put["queue_id"], "properties": {"n": str(i)}}
                for i, b in enumerate(bodies)
            ]
        },
    )
    assert batch.status_code == 200, batch.text
    assert batch.headers["content-type"] == "application/json"
    BatchOut.model_validate_json(batch.content)  # the hand-built JSON has the documented shape
    results = batch.json()["results"]
    assert batch.json()["count"] == 5
    hot = c.get(
        f"/v1/topics/orders/queues/{put['queue_id']}/messages",
        params={"offset": put["queue_offset"] + 1, "max": 5, "policy": "DISABLE"},
    ).json()["messages"]
    assert [r["msg_id"] for r in results] == [m["msg_id"] for m in hot]
    assert [r["commitlog_offset"] for r in results] == [m["commitlog_offset"] for m in hot]
    assert [r["queue_offset"] for r in results] == list(
        range(put["queue_offset"] + 1, put["queue_offset"] + 6)
    )

    assert c.post("/v1/admin/tier", json={}).json() == {
        "committed": 6,
        "pending": 0,
        "queues": [{"topic": "orders", "queue_id": 0, "committed": 6, "pending": 0}],
    }
    read = c.get(
        f"/v1/topics/orders/queues/{put['queue_id']}/messages",
        params={"offset": put["queue_offset"], "max": 10, "policy": "FORCE"},
    ).json()
    assert read["status"] == "FOUND"
    assert read["source"] == "cold"
    assert read["next_offset"] == put["queue_offset"] + 6
    got = read["messages"]
    assert [base64.b64decode(m["body"]) for m in got] == [b"first", *bodies]
    assert got[0]["keys"] == ["o-1"]
    assert got[0]["tags"] == "paid"
    assert got[0]["msg_id"]
    assert got[2]["properties"]["n"] == "1"
    assert {
        "store_timestamp",
        "born_timestamp",
        "born_host",
        "store_host",
        "commitlog_offset",
        "size",
    } <= set(got[0])

    hot = c.get(
        f"/v1/topics/orders/queues/{put['queue_id']}/messages", params={"offset": 0, "policy": "DISABLE"}
    ).json()
    assert hot["source"] == "hot"
    assert [base64.b64decode(m["body"]) for m in hot["messages"]] == [b"first", *bodies]

    hits = c.get("/v1/topics/orders/keys/o-1").json()["messages"]
    assert [base64.b64decode(m["body"]) for m in hits] == [b"first"]
    assert c.get("/v1/topics/orders/keys/nobody").json() == {"messages": [], "next": None}

    assert c.get("/v1/topics").json() == {"topics": [{"name": "orders", "queues": [put["queue_id"]]}]}
    queues = c.get("/v1/topics/orders/queues").json()["queues"]
    assert [
        (q["queue_id"], q["max_offset"], q["cold_max_offset"], q["pending_messages"]) for q in queues
    ] == [(put["queue_id"], 6, 6, 0)]
    segs = c.get("/v1/segments", params={"topic": "orders"}).json()["segments"]
    assert {s["type"] for s in segs} == {"COMMIT_LOG", "CONSUME_QUEUE"}
    assert all(s["topic"] == "orders" and s["queue_id"] == put["queue_id"] for s in segs)
    cq = c.get("/v1/segments", params={"topic": "orders", "type": "CQ"}).json()["segments"]
    assert [s["type"] for s in cq] == ["CONSUME_QUEUE"]
    assert sum(s["size"] for s in cq) == 6 * 20


def test_read_statuses_are_200_with_a_status(svc: Running) -> None:
    c = svc.client
    assert c.get("/v1/topics/none/queues/0/messages").json()["status"] == "NO_MATCHED_LOGIC_QUEUE"
    c.post("/v1/topics/t/messages", json={"body": "", "queue_id": 0})
    assert (
        c.get("/v1/topics/t/queues/0/messages", params={"offset": 1}).json()["status"]
        == "OFFSET_OVERFLOW_ONE"
    )
    assert (
        c.get("/v1/topics/t/queues/0/messages", params={"offset": 9}).json()["status"]
        == "OFFSET_OVERFLOW_BADLY"
    )
    empty = c.get("/v1/topics/t/queues/0/messages").json()["messages"]
    assert [m["body"] for m in empty] == [""]


def test_bad_input_is_a_4xx_in_the_common_shape(svc: Running) -> None:
    c = svc.client
    body = assert_error(
        c.post("/v1/topics/t/messages", json={"body": "not base64!"}), 400, "invalid_argument"
    )
    assert "base64" in body["message"]
    body = assert_error(
        c.post("/v1/topics/t/messages:batch", json={"messages": [{"body": "AA=="}, {"body": "A"}]}),
        400,
        "invalid_argument",
    )
    assert "messages.1.body" in body["message"]
    assert_error(
        c.post("/v1/topics/t/messages", json={"body": "AA==", "keys": ["has space"]}),
        400,
        "invalid_properties",
    )
    assert_error(c.post("/v1/topics/rmq_sys_x/messages", json={"body": "AA=="}), 400, "invalid_topic")
    assert_error(
        c.post("/v1/topics/t/messages", json={"body": "AA==", "queue_id": 5000}), 400, "invalid_queue"
    )
    too_big = b64(bytes(1024 * 1024 + 1))
    body = assert_error(c.post("/v1/topics/t/messages", json={"body": too_big}), 413, "message_too_large")
    assert body["detail"]["limit"] == 1024 * 1024
    body = assert_error(c.post("/v1/topics/t/messages", json={}), 422, "invalid_request")
    assert body["detail"]["errors"][0]["loc"] == ["body", "body"]
    assert_error(
        c.post("/v1/topics/t/messages", content=b"{not json", headers={"content-type": "application/json"}),
        422,
        "invalid_request",
    )
    assert_error(c.post("/v1/topics/t/messages:batch", json={"messages": []}), 422, "invalid_request")
    assert_error(
        c.post("/v1/topics/t/messages:batch", json={"messages": [{"body": ""}] * 1025}),
        422,
        "invalid_request",
    )
    assert_error(c.get("/v1/topics/t/queues/0/messages", params={"max": 4097}), 422, "invalid_request")
    assert_error(c.get("/v1/topics/t/queues/0/messages", params={"offset": -1}), 422, "invalid_request")
    assert_error(
        c.get("/v1/topics/t/queues/0/messages", params={"policy": "SOMETIMES"}), 422, "invalid_request"
    )
    assert_error(c.get("/v1/topics/bad%20topic/queues/0/messages"), 422, "invalid_request")
    assert_error(c.get("/v1/segments", params={"type": "BLOB"}), 422, "invalid_request")
    # integers must be written as integers (schemathesis found `queue=0.0` accepted as 0)
    for text in ("0.0", "+1", " 1", "1_000"):
        body = assert_error(c.get("/v1/segments", params={"queue": text}), 422, "invalid_request")
        assert "decimal integer" in body["message"] + json.dumps(body["detail"])
        assert_error(c.get("/v1/topics/t/queues/0/messages", params={"offset": text}), 422, "invalid_request")
        assert_error(c.get(f"/v1/topics/t/queues/{text.strip()}.5/messages"), 422, "invalid_request")
    assert c.get("/v1/segments", params={"queue": "0"}).status_code == 200
    assert_error(c.get("/v1/topics/unknown/queues"), 404, "not_found")
    assert_error(c.get("/v1/nothing-here"), 404, "not_found")
    assert_error(c.delete("/v1/topics"), 405, "method_not_allowed")


def test_request_size_limit_is_enforced_before_reading_the_body(svc: Running) -> None:
    limit = 16 * 1024 * 1024
    # Content-Length above the limit: refused from the header alone.
    r = svc.client.post(
        "/v1/topics/t/messages:batch",
        content=b"x" * (limit + 1),
        headers={"content-type": "application/json"},
    )
    assert_error(r, 413, "request_too_large")

    # A chunked body (no Content-Length) is counted as it arrives.
    def chunks() -> Iterator[bytes]:
        for _ in range(17):
            yield b" " * (1024 * 1024)

    r = svc.client.post(
        "/v1/topics/t/messages:batch", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(r, 413, "request_too_large")


def test_unexpected_errors_are_a_500_without_a_stack_trace(
    svc: Running, caplog: pytest.LogCaptureFixture
) -> None:
    store = svc.daemon.store
    assert store is not None

    def boom(*, system: bool = False) -> dict[str, list[int]]:
        raise RuntimeError("secret internals")

    store.topics = boom  # type: ignore[method-assign]
    body = assert_error(svc.client.get("/v1/topics"), 500, "internal")
    assert "secret internals" not in body["message"]
    assert any(
        "secret internals" in r.getMessage() or (r.exc_info and "secret" in str(r.exc_info[1]))
        for r in caplog.records
    )


def test_metrics_report_the_tiered_store_set(svc: Running) -> None:
    c = svc.client
    c.post("/v1/topics/m/messages:batch", json={"messages": [{"body": b64(b"x" * 100), "queue_id": 0}] * 10})
    c.get("/v1/does-not-exist")
    before = c.get("/metrics")
    assert before.headers["content-type"].startswith("text/plain")
    assert 'tierd_dispatch_lag_messages{queue_id="0",topic="m"} 10.0' in before.text  # nothing tiered yet
    assert c.post("/v1/admin/tier", json={}).json()["committed"] == 10
    c.get("/v1/topics/m/queues/0/messages", params={"policy": "FORCE"})
    c.get("/v1/topics/m/queues/0/messages", params={"policy": "FORCE", "offset": 5})
    text = c.get("/metrics").text
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["tierd_messages_dispatched_total"] == 10
    assert values['tierd_dispatch_lag_messages{queue_id="0",topic="m"}'] == 0
    assert values['tierd_storage_size_bytes{file_type="CONSUME_QUEUE"}'] == 200
    assert values['tierd_storage_size_bytes{file_type="COMMIT_LOG"}'] > 1000
    assert values["tierd_read_ahead_cache_misses_total"] == 1
    assert values["tierd_read_ahead_cache_hits_total"] == 1
    assert values['tierd_get_requests_total{source="cold"}'] == 2
    assert values["tierd_get_fallbacks_total"] == 0
    assert values['tierd_backend_request_duration_seconds_count{operation="write",success="true"}'] >= 2
    assert values['tierd_backend_request_duration_seconds_count{operation="read",success="true"}'] >= 2
    assert values["tierd_backend_upload_bytes_sum"] > 1000
    assert values["tierd_backend_download_bytes_sum"] > 1000
    assert values["tierd_cold_tier_ready"] == 1
    assert values["tierd_draining"] == 0
    route = 'method="POST",route="/v1/topics/{topic}/messages:batch",status="200"'
    assert values[f"tierd_http_request_duration_seconds_count{{{route}}}"] == 1
    assert (
        values['tierd_http_request_duration_seconds_count{method="GET",route="unmatched",status="404"}'] == 1
    )


# --- without a socket: states a running daemon passes through only briefly


def test_readiness_and_draining_without_a_store(tmp_path: Path) -> None:
    asyncio.run(_readiness_and_draining(tmp_path))


async def _readiness_and_draining(tmp_path: Path) -> None:
    cfg = TierdConfig.from_dict(service_config(tmp_path))
    app = create_app(cfg, lambda: None)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://tierd") as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        body = assert_error(await c.get("/readyz"), 503, "not_ready")
        assert body["detail"] == {
            "store_open": False,
            "cold_metadata_loaded": False,
            "cold_tier_down": None,
            "draining": False,
        }
        assert_error(await c.get("/v1/topics"), 503, "not_ready")
        assert await app.state.service.drain(1)
        body = assert_error(await c.post("/v1/topics/t/messages", json={"body": ""}), 503, "draining")
        assert "shutting down" in body["message"]
        assert_error(await c.post("/v1/admin/tier", json={}), 503, "draining")
        assert (await c.get("/readyz")).json()["detail"]["draining"] is True
        assert (await c.get("/healthz")).status_code == 200


@pytest.mark.parametrize(
    ("headers", "expect"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": "Bearer s3cret"}, 503)],
)
def test_token_guards_every_route_but_health(tmp_path: Path, headers: dict[str, str], expect: int) -> None:
    asyncio.run(_token_guards(tmp_path, headers, expect))


async def _token_guards(tmp_path: Path, headers: dict[str, str], expect: int) -> None:
    cfg = TierdConfig.from_dict(service_config(tmp_path, server={"token": "s3cret"}))
    transport = httpx.ASGITransport(app=create_app(cfg, lambda: None))
    async with httpx.AsyncClient(transport=transport, base_url="http://tierd", headers=headers) as c:
        for path in ("/v1/topics", "/v1/segments"):
            r = await c.get(path)
            if expect == 401:
                assert_error(r, 401, "unauthorized")
                assert r.headers["www-authenticate"].startswith("Bearer")
            else:
                assert_error(r, 503, "not_ready")  # authenticated: reaches the (unopened) store
        for path in ("/metrics", "/openapi.json", "/no-such-route"):
            assert (await c.get(path)).status_code in ((401,) if expect == 401 else (200, 404))
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).status_code == 503


def test_openapi_documents_routes_errors_and_security(tmp_path: Path) -> None:
    asyncio.run(_openapi(tmp_path))


async def _openapi(tmp_path: Path) -> None:
    app = create_app(TierdConfig.from_dict(service_config(tmp_path)), lambda: None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tierd") as c:
        spec = (await c.get("/openapi.json")).json()
    assert set(spec["paths"]) == {
        "/v1/topics/{topic}/messages",
        "/v1/topics/{topic}/messages:batch",
        "/v1/topics/{topic}/queues/{queue}/messages",
        "/v1/topics/{topic}/keys/{key}",
        "/v1/topics",
        "/v1/topics/{topic}/queues",
        "/v1/segments",
        "/v1/admin/tier",
        "/v1/status",
        "/metrics",
        "/healthz",
        "/readyz",
        "/v1/topics/{topic}/queues/{queue}/offset",
        "/v1/topics/{topic}/queues/{queue}/earliest-time",
        "/v1/groups",
        "/v1/groups/{group}",
        "/v1/groups/{group}/offsets",
        "/v1/groups/{group}/topics/{topic}/queues/{queue}/offset",
        "/v1/groups/{group}/reset",
        "/v1/admin/gc",
        "/v1/admin/verify",
        "/v1/topics/{topic}",
        "/v1/messages/{msg_id}",
        "/v1/scheduled/{handle}",
        "/v1/topics/{topic}/transactions",
        "/v1/transactions",
        "/v1/transactions/{transaction_id}/commit",
        "/v1/transactions/{transaction_id}/rollback",
    }
    for path, model in (
        ("/v1/groups/{group}/topics/{topic}/queues/{queue}/offset", "CommitIn"),
        ("/v1/groups/{group}/reset", "ResetIn"),
    ):
        [op] = spec["paths"][path].values()
        body = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert body.endswith(f"/{model}")
        assert model in spec["components"]["schemas"]
    assert {"409", "502"} <= set(spec["paths"]["/v1/admin/tier"]["post"]["responses"])
    produce = spec["paths"]["/v1/topics/{topic}/messages"]["post"]
    assert {"400", "401", "413", "422", "500", "503"} <= set(produce["responses"])
    assert produce["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
    assert produce["description"]
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert spec["paths"]["/healthz"]["get"]["security"] == []
