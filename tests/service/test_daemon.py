"""``tierd serve`` end to end: a real subprocess, a real S3 server (moto), real signals.

producers ──HTTP──▶ tierd serve ──▶ hot store (tmp dir)
                        │ tier_now / SIGTERM
                        ▼
                   moto S3 bucket ◀── FORCE reads, /v1/segments
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx

from tierd import BlockingMessageStore, TierdConfig
from tierd.testing.s3server import create_bucket

from ..tiered.conftest import run
from .conftest import TIERD, TierdProcess, service_config, toml

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from tierd.testing.s3server import S3Server

TOKEN = "t0ken-for-tests"


def s3_config(tmp_path: Path, s3: S3Server, **config: Any) -> Path:
    bucket = create_bucket(s3)
    backend = {"name": "s3", "url": f"s3://{bucket}/tierd", "storage_options": s3.storage_options}
    data = service_config(tmp_path, backend, **config)
    path = tmp_path / "tierd.toml"
    path.write_text(toml(data))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wait_ready(url: str, headers: dict[str, str] | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/readyz", headers=headers).status_code == 200:
            return
        time.sleep(0.05)  # polling interval, not synchronisation: the deadline bounds it
    raise AssertionError("/readyz never became 200")


def test_serve_over_s3_with_a_token(
    tmp_path: Path, moto_server: S3Server, request: pytest.FixtureRequest
) -> None:
    cfg = s3_config(tmp_path, moto_server, server={"token": TOKEN})
    tierd = TierdProcess(cfg)
    try:
        wait_ready(tierd.url)  # health probes need no token
        assert httpx.get(f"{tierd.url}/healthz").json() == {"status": "ok"}
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
            r = httpx.get(f"{tierd.url}/v1/topics", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"] == "unauthorized"
            assert httpx.get(f"{tierd.url}/metrics", headers=headers).status_code == 401
        c = httpx.Client(base_url=tierd.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        request.addfinalizer(c.close)
        single = c.post(
            "/v1/topics/orders/messages", json={"body": b64(b"one"), "keys": ["k-1"], "queue_id": 2}
        )
        assert single.status_code == 200, single.text
        bodies = [b"m%03d" % i * 50 for i in range(64)]
        batch = c.post(
            "/v1/topics/orders/messages:batch",
            json={"messages": [{"body": b64(b), "queue_id": 2} for b in bodies]},
        )
        assert batch.status_code == 200, batch.text
        assert batch.json()["count"] == 64
        assert c.post("/v1/admin/tier", json={}).json() == {
            "committed": 65,
            "pending": 0,
            "queues": [{"topic": "orders", "queue_id": 2, "committed": 65, "pending": 0}],
        }

        got: list[bytes] = []
        offset = 0
        while True:
            r = c.get(
                "/v1/topics/orders/queues/2/messages", params={"offset": offset, "max": 16, "policy": "FORCE"}
            ).json()
            if r["status"] != "FOUND":
                assert r["status"] == "OFFSET_OVERFLOW_ONE"
                break
            assert r["source"] == "cold"
            got += [base64.b64decode(m["body"]) for m in r["messages"]]
            offset = r["next_offset"]
        assert got == [b"one", *bodies]

        segments = c.get("/v1/segments", params={"topic": "orders", "queue": 2}).json()["segments"]
        assert {s["type"] for s in segments} == {"COMMIT_LOG", "CONSUME_QUEUE"}
        cq = [s for s in segments if s["type"] == "CONSUME_QUEUE"]
        assert sum(s["size"] for s in cq) == 65 * 20
        s3 = moto_server.boto3_client()
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=cfg_bucket(cfg))["Contents"]]
        s3.close()
        for seg in segments:  # each listed segment is really in the bucket (whole or as chunks)
            assert any(k.startswith(f"tierd/{seg['path']}") for k in keys), (seg["path"], keys)
        assert "tierd_messages_dispatched_total 65.0" in c.get("/metrics").text

        # The admin CLI reads the same bucket straight from its manifests while the daemon runs.
        ls = subprocess.run(
            [
                *TIERD,
                "--config",
                str(cfg),
                "--output",
                "json",
                "segments",
                "ls",
                "--topic",
                "orders",
                "--queue",
                "2",
                "--backend-url",
                TierdConfig.load(cfg, env={}).backend.url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ls.returncode == 0, ls.stderr
        listed = {(r["type"], r["base_offset"], r["size"], r["path"]) for r in json.loads(ls.stdout)}
        assert listed == {(s["type"], s["base_offset"], s["size"], s["path"]) for s in segments}

        assert tierd.terminate() == 0
    finally:
        tierd.kill()
    out = tierd.output
    for line in ("listening on http://127.0.0.1:", "ready: 0 topic(s)", "draining", "stopped cleanly"):
        assert line in out, out
    assert "Traceback" not in out


def cfg_bucket(path: Path) -> str:
    return TierdConfig.load(path, env={}).backend.url.split("/")[2]


def test_sigterm_during_load_loses_no_acknowledged_message(tmp_path: Path, moto_server: S3Server) -> None:
    """Producers keep sending while the daemon gets SIGTERM. Every message acknowledged with a
    200 must be readable after a restart, with its body, at the offset the ack named — and
    committed to the cold tier by the shutdown (none left pending)."""
    cfg = s3_config(tmp_path, moto_server)
    tierd = TierdProcess(cfg)
    acked: dict[tuple[int, int], bytes] = {}
    refused: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def producer(p: int) -> None:
        with httpx.Client(base_url=tierd.url, timeout=60) as c:
            i = 0
            while not stop.is_set():
                bodies = [b"p%d-%d-%d" % (p, i, j) for j in range(8)]
                try:
                    if i % 2:
                        r = c.post("/v1/topics/load/messages", json={"body": b64(bodies[0]), "queue_id": p})
                        sent = bodies[:1]
                        results = [r.json()] if r.status_code == 200 else []
                    else:
                        r = c.post(
                            "/v1/topics/load/messages:batch",
                            json={"messages": [{"body": b64(b), "queue_id": p} for b in bodies]},
                        )
                        sent = bodies
                        results = r.json()["results"] if r.status_code == 200 else []
                except httpx.TransportError:
                    return  # the server went away: nothing more can be acknowledged
                if r.status_code != 200:
                    assert r.status_code == 503, r.text
                    assert r.json()["error"] in ("draining", "not_ready")
                    with lock:
                        refused.append(p)
                    return
                with lock:
                    for res, body in zip(results, sent, strict=True):
                        acked[res["queue_id"], res["queue_offset"]] = body
                i += 1

    try:
        wait_ready(tierd.url)
        threads = [threading.Thread(target=producer, args=(p,)) for p in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acked) < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(acked) >= 300, "producers made no progress"
        code = tierd.terminate()
        stop.set()
        for t in threads:
            t.join(60)
        assert code == 0, tierd.output
    finally:
        stop.set()
        tierd.kill()
    assert "stopped cleanly" in tierd.output
    assert "committed" in tierd.output

    with BlockingMessageStore.open(TierdConfig.load(cfg, env={})) as store:
        assert store.hot.last_exit_ok
        assert store.tiering is not None
        run(store, store.tiering.wait_ready())
        for q in store.queues("load"):
            assert q.pending_messages == 0, q  # the shutdown committed everything to S3
            assert q.cold_max_offset == q.hot_max_offset
        for (qid, offset), body in sorted(acked.items()):
            res = store.get("load", qid, offset, 1, policy="FORCE")
            assert res.status.value == "FOUND", (qid, offset)
            assert res.source == "cold"
            assert res.messages[0].body == body
