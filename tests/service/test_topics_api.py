"""Topic admin over HTTP against a real ``tierd serve`` process: create, describe, grow-only
update, delete from both tiers (posix and moto S3), a kill -9 halfway through a delete, topics
declared in the configuration, and message groups on one queue in order (docs/topics.md)."""

from __future__ import annotations

import base64
import json
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tierd.testing.s3server import create_bucket
from tierd.topics import CRASH_ENV

from .conftest import TierdProcess, service_config, toml
from .test_daemon import wait_ready

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tierd.testing.s3server import S3Server


#: Requests that change something are JSON (the service refuses others: CSRF, docs/http.md).
JSON = {"Content-Type": "application/json"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "tierd.toml"
    path.write_text(toml(data))
    return path


@pytest.fixture
def posix_daemon(tmp_path: Path) -> Iterator[tuple[TierdProcess, httpx.Client]]:
    proc = TierdProcess(write_config(tmp_path, service_config(tmp_path)))
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            yield proc, c
        assert proc.terminate() == 0
    finally:
        proc.kill()


def produce(c: httpx.Client, topic: str, n: int, **fields: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        r = c.post(f"/v1/topics/{topic}/messages", json={"body": b64(b"m%d" % i), **fields})
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def test_message_group_goes_to_one_queue_in_order(posix_daemon: tuple[TierdProcess, httpx.Client]) -> None:
    _, c = posix_daemon
    produce(c, "fifo", 3)  # round-robin state moves: the group must not follow it
    one = produce(c, "fifo", 6, message_group="order-17")
    assert len({r["queue_id"] for r in one}) == 1, one
    offsets = [r["queue_offset"] for r in one]
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == 6
    batch = c.post(
        "/v1/topics/fifo/messages:batch",
        json={"messages": [{"body": b64(b"b%d" % i), "message_group": "order-17"} for i in range(4)]},
    )
    assert batch.status_code == 200, batch.text
    assert {r["queue_id"] for r in batch.json()["results"]} == {one[0]["queue_id"]}
    r = c.post("/v1/topics/fifo/messages", json={"body": b64(b"x"), "message_group": "g", "queue_id": 1})
    assert r.status_code == 422  # one target, not two


def test_create_describe_and_grow_only(posix_daemon: tuple[TierdProcess, httpx.Client]) -> None:
    _, c = posix_daemon
    r = c.post("/v1/topics", json={"name": "wide", "queues": 8, "cold_retention_hours": 12})
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["queues"] == 8
    assert info["origin"] == "created"
    assert info["cold_retention_hours"] == 12
    assert info["cold_retention_own"] is True
    assert [q["queue_id"] for q in info["queue_ranges"]] == list(range(8))
    assert c.post("/v1/topics", json={"name": "wide", "queues": 2}).json()["error"] == "topic_exists"
    assert {r["queue_id"] for r in produce(c, "wide", 16)} == set(range(8))
    assert "wide" in [t["name"] for t in c.get("/v1/topics").json()["topics"]]
    shrink = c.patch("/v1/topics/wide", json={"queues": 4})
    assert shrink.status_code == 400
    assert shrink.json()["error"] == "queue_count_shrink"
    assert shrink.json()["detail"] == {"topic": "wide", "current": 8, "requested": 4}
    grown = c.patch("/v1/topics/wide", json={"queues": 12, "cold_retention_hours": "default"})
    assert grown.status_code == 200, grown.text
    assert grown.json()["queues"] == 12
    assert grown.json()["cold_retention_own"] is False
    d = c.get("/v1/topics/wide").json()
    assert d["hot_messages"] == 16
    assert d["queues"] == 12
    assert c.get("/v1/topics/nope").status_code == 404


def _cold_paths(root: Path, topic: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and f"/{topic}/" in str(p)]


def _tier_with_group(c: httpx.Client, topic: str) -> None:
    produce(c, topic, 8, keys=["k-1"])
    assert c.post("/v1/admin/tier").status_code == 200
    r = c.put(f"/v1/groups/billing/topics/{topic}/queues/0/offset", json={"offset": 1})
    assert r.status_code == 200, r.text


def _wait_gone(c: httpx.Client, topic: str, timeout: float = 60) -> None:
    """An interrupted delete finishes in the background once the cold tier has loaded."""
    deadline = time.monotonic() + timeout
    while c.get(f"/v1/topics/{topic}").status_code != 404:
        assert time.monotonic() < deadline, f"topic {topic} still there after {timeout} s"
        time.sleep(0.1)


def _check_gone(c: httpx.Client, topic: str) -> None:
    assert c.get(f"/v1/topics/{topic}").status_code == 404
    assert topic not in [t["name"] for t in c.get("/v1/topics").json()["topics"]]
    assert c.get(f"/v1/topics/{topic}/keys/k-1").json()["messages"] == []
    assert c.get(f"/v1/topics/{topic}/queues/0/messages", params={"offset": 0}).json()["messages"] == []
    groups = c.get("/v1/groups/billing/offsets")
    assert groups.status_code != 200 or all(o["topic"] != topic for o in groups.json()["offsets"])


def test_delete_refused_while_needed_then_forced(
    posix_daemon: tuple[TierdProcess, httpx.Client], tmp_path: Path
) -> None:
    _, c = posix_daemon
    _tier_with_group(c, "doomed")
    produce(c, "kept", 2)
    assert _cold_paths(tmp_path / "cold", "doomed")
    refused = c.delete("/v1/topics/doomed")
    assert refused.status_code == 409
    assert refused.json()["error"] == "topic_in_use"
    assert "billing" in refused.json()["message"]
    assert c.delete("/v1/topics/doomed", params={"force": "true"}).status_code == 200
    _check_gone(c, "doomed")
    assert _cold_paths(tmp_path / "cold", "doomed") == []
    assert c.get("/v1/topics/kept").json()["hot_messages"] == 2
    # Made again, it starts empty: the old messages never come back.
    assert c.post("/v1/topics", json={"name": "doomed", "queues": 1}).status_code == 201
    r = c.get("/v1/topics/doomed/queues/0/messages", params={"offset": 0})
    assert r.json()["messages"] == []


def test_delete_in_s3_removes_objects_and_manifests(tmp_path: Path, moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    backend = {"name": "s3", "url": f"s3://{bucket}/tierd", "storage_options": moto_server.storage_options}
    proc = TierdProcess(write_config(tmp_path, service_config(tmp_path, backend)))
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            _tier_with_group(c, "doomed")
            s3 = moto_server.boto3_client()

            def keys() -> list[str]:
                listing = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
                return [o["Key"] for o in listing if "/doomed/" in o["Key"]]

            assert any(k.endswith("manifest.json") for k in keys()) or keys()
            assert c.delete("/v1/topics/doomed", params={"force": "true"}).status_code == 200
            assert keys() == []
            _check_gone(c, "doomed")
        assert proc.terminate() == 0
    finally:
        proc.kill()


def test_kill_during_delete_is_finished_at_the_next_start(tmp_path: Path) -> None:
    config = write_config(tmp_path, service_config(tmp_path))
    _killed_halfway_through_a_delete(tmp_path, config)
    table = json.loads((tmp_path / "hot" / "config" / "topics.json").read_text())
    assert "doomed" in table["deleting"]  # the intent survived the kill
    assert _cold_paths(tmp_path / "cold", "doomed")  # the cold part was not done yet
    proc = TierdProcess(config)
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            _wait_gone(c, "doomed")
            _check_gone(c, "doomed")
        assert _cold_paths(tmp_path / "cold", "doomed") == []
        table = json.loads((tmp_path / "hot" / "config" / "topics.json").read_text())
        assert table["deleting"] == {}
        assert proc.terminate() == 0
    finally:
        proc.kill()


def _killed_halfway_through_a_delete(tmp_path: Path, config: Path) -> None:
    proc = TierdProcess(config, env={CRASH_ENV: "after-hot"})
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            _tier_with_group(c, "doomed")
            with pytest.raises(httpx.TransportError):
                c.delete("/v1/topics/doomed", params={"force": "true"})
        assert proc.proc.wait(60) == -9
    finally:
        proc.kill()


def test_writes_refused_while_a_delete_is_pending(tmp_path: Path) -> None:
    """The cold part of an interrupted delete cannot run while the bucket is unreachable: the
    topic stays refused for writes (else a producer would make it anew halfway through the
    delete) until the delete has finished; then it starts anew at offset 0."""
    # A stop waits shutdown_grace for a cold tier still starting: not worth 30 s here.
    config = write_config(tmp_path, service_config(tmp_path, server={"shutdown_grace": 1}))
    _killed_halfway_through_a_delete(tmp_path, config)
    cold, aside = tmp_path / "cold", tmp_path / "cold-aside"
    cold.rename(aside)
    cold.write_text("not a directory: the cold tier cannot load")
    proc = TierdProcess(config)
    try:
        proc.wait_for(r"ready: \d+ topic", 60)  # the hot store serves; the cold tier cannot load
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            r = c.post("/v1/topics/doomed/messages", json={"body": b64(b"late")})
            assert r.status_code == 409, r.text
            assert r.json()["error"] == "topic_deleting"
            assert r.json()["detail"] == {"topic": "doomed"}
            batch = c.post("/v1/topics/doomed/messages:batch", json={"messages": [{"body": b64(b"b")}]})
            assert batch.status_code == 409
            assert batch.json()["error"] == "topic_deleting"
            assert produce(c, "other", 1)[0]["queue_offset"] == 0  # other topics are written
        assert proc.terminate() == 0
    finally:
        proc.kill()
    cold.unlink()
    aside.rename(cold)
    proc = TierdProcess(config)
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            _wait_gone(c, "doomed")
            _check_gone(c, "doomed")
            again = produce(c, "doomed", 1)[0]
            assert again["queue_offset"] == 0
        assert proc.terminate() == 0
    finally:
        proc.kill()


def test_config_declared_topics_exist_at_start(tmp_path: Path) -> None:
    data = service_config(tmp_path)
    data["topics"] = {"declared": {"queues": 6, "cold_retention_hours": 48}}
    proc = TierdProcess(write_config(tmp_path, data))
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            d = c.get("/v1/topics/declared")
            assert d.status_code == 200, d.text
            assert d.json()["queues"] == 6
            assert d.json()["origin"] == "config"
            assert d.json()["cold_retention_hours"] == 48
            assert {r["queue_id"] for r in produce(c, "declared", 12)} == set(range(6))
        assert proc.terminate() == 0
    finally:
        proc.kill()


def test_erase_mark_goes_once_retention_freed_the_records(tmp_path: Path) -> None:
    """A deleted topic's records stay in the shared commitlog until hot retention frees their
    files; the mark hiding them goes with the last of those files, not never."""
    data = service_config(tmp_path)
    data["store"] |= {"commitlog_file_size": 1024 * 1024, "max_message_size": 64 * 1024}
    data["store"]["file_reserved_time"] = 0.0001  # 0.36 s: files expire as soon as they are cold
    data["tiered"]["commitlog_segment_size"] = 4 * 1024 * 1024
    proc = TierdProcess(write_config(tmp_path, data))
    marks = tmp_path / "hot" / "config" / "erased-topics.json"
    big = b64(b"x" * 60_000)
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            for topic in ("doomed", "other"):
                for _ in range(2):  # 2 x 12 x 60 KB: each topic fills more than a 1 MiB file
                    batch = {"messages": [{"body": big}] * 12}
                    r = c.post(f"/v1/topics/{topic}/messages:batch", json=batch)
                    assert r.status_code == 200, r.text
                if topic == "doomed":
                    assert c.post("/v1/admin/tier").status_code == 200
                    assert c.delete("/v1/topics/doomed", params={"force": "true"}).status_code == 200
                    assert "doomed" in json.loads(marks.read_text())
            assert c.post("/v1/admin/tier").status_code == 200
            deadline = time.monotonic() + 60
            while "doomed" in json.loads(marks.read_text()):
                assert time.monotonic() < deadline, "the erase mark outlived the files it hid"
                assert c.post("/v1/admin/gc").status_code == 200
                time.sleep(0.2)
            other = c.get("/v1/topics/other").json()
            assert other["cold_messages"] == 24  # the other topic keeps every message
            assert c.get("/v1/topics/doomed").status_code == 404
        assert proc.terminate() == 0
    finally:
        proc.kill()
