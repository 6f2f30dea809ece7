"""Readiness, `/v1/status` and the admin tier call over real sockets (issue 15 parts 1–2).

client ──HTTP──▶ tierd serve ──▶ [ TcpProxy: refuse | pass ] ──▶ moto S3
                     │
                     └── /readyz: hot store + metadata   /v1/status: backend, owner, lag
"""

from __future__ import annotations

import base64
import shutil
import time
from typing import TYPE_CHECKING, Any

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.service.schemas import ServiceStatusOut
from tierd.testing.s3server import create_bucket

from ..tcp_proxy import TcpProxy
from .conftest import running, service_config
from .test_api import assert_error

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import httpx
    import pytest

    from tierd.testing.s3server import S3Server


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def poll(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen within {timeout} s")
        time.sleep(0.05)  # polling interval; the deadline bounds the wait


def status(c: httpx.Client) -> dict[str, Any]:
    r = c.get("/v1/status")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    ServiceStatusOut.model_validate(body)  # the documented shape
    return body


def metric(c: httpx.Client, name: str) -> float | None:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_an_s3_outage_keeps_the_pod_ready_and_shows_in_status_and_metrics(
    tmp_path: Path, moto_server: S3Server
) -> None:
    """An S3 outage during a rollout used to mark every new pod NotReady while produce answered
    200. Readiness now means "serves its local clients"; the outage is reported where alerts
    belong, and tiering catches up when S3 is back."""
    proxy = TcpProxy("127.0.0.1", int(moto_server.endpoint_url.rsplit(":", 1)[1]))
    proxy.refuse()  # S3 is down before the pod starts
    bucket = create_bucket(moto_server)
    options = {
        **moto_server.storage_options,
        "endpoint_url": proxy.url,
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    backend = {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": options}
    try:
        with running(TierdConfig.from_dict(service_config(tmp_path, backend)), cold_ready=False) as svc:
            c = svc.client
            poll(lambda: c.get("/readyz").status_code == 200, "/readyz 200")
            r = c.post("/v1/topics/orders/messages", json={"body": b64(b"during the outage"), "queue_id": 0})
            assert r.status_code == 200, r.text
            poll(lambda: status(c)["tiering"]["backend"]["reachable"] is False, "backend unreachable")
            body = status(c)
            assert body["status"] == "degraded"
            assert body["tiering"]["metadata_loaded"] is True
            assert body["tiering"]["ready"] is False
            assert "cannot connect to the S3 endpoint" in body["tiering"]["start_error"]["message"]
            assert body["tiering"]["errors"]
            assert body["tiering"]["backend"]["capabilities"] is None  # not probed yet
            assert metric(c, "tierd_backend_reachable") == 0.0
            assert metric(c, "tierd_cold_metadata_loaded") == 1.0
            # The cold tier has not loaded: a retriable 503 at once, naming the backend's error.
            tier = assert_error(c.post("/v1/admin/tier", json={}), 503, "not_ready")
            assert "cannot connect to the S3 endpoint" in tier["message"]

            proxy.resume()
            poll(lambda: status(c)["status"] == "ok", "status ok after the outage")
            done = c.post("/v1/admin/tier", json={})
            assert done.status_code == 200, done.text
            assert done.json()["committed"] == 1
            after = status(c)["tiering"]
            assert after["backend"]["reachable"] is True
            # The S3 capability probe's verdict, as the write policy it chose (moto: full S3).
            capabilities = after["backend"]["capabilities"]
            assert capabilities["driver"] == "s3"
            assert capabilities["conditional_create"] is True
            assert capabilities["policy"]["mode"] == "multi-writer"
            assert after["last_commit"] is not None
            assert after["lag"] == {"messages": 0, "seconds": 0.0}
            assert after["ownership"]["owned_by_this_store"] is True
            assert after["ownership"]["owner"]["epoch"] == 1
            assert metric(c, "tierd_backend_reachable") == 1.0
            assert metric(c, "tierd_owner_epoch") == 1.0
            assert metric(c, "tierd_last_commit_timestamp_seconds") is not None
    finally:
        proxy.close()


def test_admin_tier_is_409_prefix_owned_when_another_store_owns_the_prefix(tmp_path: Path) -> None:
    shared = {"name": "posix", "url": str(tmp_path / "bucket")}
    first = TierdConfig.from_dict(service_config(tmp_path / "a", shared))
    with BlockingMessageStore.open(first) as a:
        a.put(Message(topic="orders", body=b"A1", queue_id=0))
        a.tier_now()
        assert a.tiering is not None
        assert a.tiering.ownership is not None
        owner_id = a.tiering.ownership.store_id
    with running(TierdConfig.from_dict(service_config(tmp_path / "b", shared)), cold_ready=False) as svc:
        c = svc.client
        # B acknowledges its producers (the hot store keeps the messages) but cannot serve its
        # consumers until an operator resolves the ownership: unready, saying why.
        poll(lambda: c.get("/readyz").status_code == 503, "/readyz 503")
        ready = c.get("/readyz").json()
        assert ready["detail"]["cold_tier_down"]["error"] == "prefix_owned"
        assert "the cold tier cannot start" in ready["message"]
        assert (
            c.post("/v1/topics/orders/messages", json={"body": b64(b"B1"), "queue_id": 0}).status_code == 200
        )
        assert_error(c.get("/v1/topics/orders/queues/0/messages"), 409, "prefix_owned")
        body = assert_error(c.post("/v1/admin/tier", json={}), 409, "prefix_owned")
        assert body["detail"]["owner_store_id"] == owner_id
        assert f"owned by store {owner_id} on host" in body["message"]
        st = status(c)
        assert st["status"] == "degraded"
        assert st["tiering"]["ownership"]["error"]["error"] == "prefix_owned"
        assert st["cold_tier_down"]["error"] == "prefix_owned"
        assert st["tiering"]["ownership"]["owner"]["store_id"] == owner_id
        assert st["tiering"]["ownership"]["owned_by_this_store"] is False
        assert metric(c, "tierd_prefix_owned") == 1.0


def test_admin_tier_is_502_naming_the_queue_when_the_cold_path_breaks(tmp_path: Path) -> None:
    with running(TierdConfig.from_dict(service_config(tmp_path))) as svc:
        c = svc.client
        batch = {"messages": [{"body": b64(b"m%d" % i), "queue_id": i % 2} for i in range(6)]}
        assert c.post("/v1/topics/orders/messages:batch", json=batch).status_code == 200
        assert c.post("/v1/admin/tier", json={}).json()["committed"] == 6
        assert c.post("/v1/topics/orders/messages:batch", json=batch).status_code == 200
        broken = next((tmp_path / "cold").rglob("orders/1"))
        shutil.rmtree(broken)
        broken.write_bytes(b"")
        body = assert_error(c.post("/v1/admin/tier", json={}), 502, "backend_error")
        assert "tiering failed for 1 queue(s)" in body["message"]
        assert list(body["detail"]["failed"]) == ["orders/1"]
        assert body["detail"]["committed"] == 3
        assert body["detail"]["queues"] == [
            {"topic": "orders", "queue_id": 0, "committed": 3, "pending": 0},
            {"topic": "orders", "queue_id": 1, "committed": 0, "pending": 3},
        ]
        st = status(c)["tiering"]
        assert st["lag"]["messages"] == 3
        assert any(e["operation"] == "commit orders/1" for e in st["errors"])


def test_a_pod_stopped_while_its_cold_tier_starts_still_commits_what_it_accepted(
    tmp_path: Path, moto_server: S3Server
) -> None:
    """/readyz no longer waits for the backend, so a pod can take traffic and get SIGTERM before
    its cold tier is up; the shutdown gives the cold tier its grace to come up, then commits."""
    proxy = TcpProxy("127.0.0.1", int(moto_server.endpoint_url.rsplit(":", 1)[1]))
    proxy.refuse()
    bucket = create_bucket(moto_server)
    options = {
        **moto_server.storage_options,
        "endpoint_url": proxy.url,
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    backend = {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": options}
    cfg = TierdConfig.from_dict(service_config(tmp_path, backend))
    try:
        with running(cfg, cold_ready=False) as svc:
            c = svc.client
            poll(lambda: c.get("/readyz").status_code == 200, "/readyz 200")
            batch = {"messages": [{"body": b64(b"m%d" % i), "queue_id": 0} for i in range(10)]}
            assert c.post("/v1/topics/orders/messages:batch", json=batch).status_code == 200
            poll(lambda: status(c)["tiering"]["start_error"] is not None, "a failed start")
            proxy.resume()  # S3 comes back as the pod is being stopped
        with BlockingMessageStore.open(cfg) as store:
            store.wait_ready()
            [queue] = store.queues("orders")
            assert (queue.cold_max_offset, queue.pending_messages) == (10, 0)
    finally:
        proxy.close()


def test_a_cold_tier_that_cannot_start_is_unready_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tiering metadata is gone while the bucket holds this broker's data: the cold tier
    refuses to start (tiering would write over it) and every read fails until an operator acts.
    Produce is still acknowledged (the hot store is fine), but /readyz, /v1/status and the log
    must say the cold tier is down and why — not a ready pod whose consumers all get errors."""
    from tierd.tiered.metadata import MetadataStore

    cfg = TierdConfig.from_dict(service_config(tmp_path))
    with BlockingMessageStore.open(cfg) as store:
        store.put(Message(topic="orders", body=b"tiered", queue_id=0))
        assert store.tier_now().committed == 1
    meta = MetadataStore(cfg.store.dir)
    meta.path.unlink()
    meta.backup.unlink(missing_ok=True)
    with running(cfg, cold_ready=False) as svc:
        c = svc.client
        poll(lambda: status(c)["tiering"]["start_error"] is not None, "a failed start")
        put = c.post("/v1/topics/orders/messages", json={"body": b64(b"after"), "queue_id": 0})
        assert put.status_code == 200, put.text  # acknowledged: the hot store keeps it
        read = c.get("/v1/topics/orders/queues/0/messages", params={"offset": 0})
        assert read.status_code == 502, read.text
        ready = c.get("/readyz")
        assert ready.status_code == 503, ready.text
        body = ready.json()
        assert body["error"] == "not_ready"
        assert "the cold tier cannot start" in body["message"]
        assert "tierd restore" in body["message"]  # the reason, with what to do
        assert body["detail"]["cold_tier_down"]["error"] == "corruption"
        st = status(c)
        assert st["status"] == "degraded"
        assert st["cold_tier_down"]["error"] == "corruption"
        assert "no tiering metadata" in st["cold_tier_down"]["message"]
        poll(lambda: any("reads fail until" in r.getMessage() for r in caplog.records), "the log line")
    lines = [r.getMessage() for r in caplog.records if "reads fail until" in r.getMessage()]
    assert len(lines) == 1, lines  # said once, not once per check
    assert "no tiering metadata" in lines[0]
