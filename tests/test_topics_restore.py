"""Created topics come back with a restore from the bucket (docs/topics.md): the topic table
is copied to the bucket beside the consumer offsets, and ``tierd restore`` brings it back."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import httpx

from tierd.config import TierdConfig
from tierd.drivers.paths import cluster_dir
from tierd.topics import FILE_NAME

from .cli.test_remote import cli, ok
from .service.conftest import TierdProcess, service_config, toml
from .service.test_daemon import wait_ready

if TYPE_CHECKING:
    from pathlib import Path

JSON = {"Content-Type": "application/json"}


def test_restore_brings_created_topics_back(tmp_path: Path) -> None:
    first = tmp_path / "first.toml"
    first.write_text(toml(service_config(tmp_path)))
    proc = TierdProcess(first)
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            made = c.post("/v1/topics", json={"name": "wide", "queues": 8, "cold_retention_hours": 48})
            assert made.status_code == 201, made.text
            for i in range(2):  # data on two queues only: the count must come from the table
                r = c.post("/v1/topics/wide/messages", json={"body": base64.b64encode(b"m%d" % i).decode()})
                assert r.status_code == 200, r.text
            assert c.post("/v1/admin/tier").status_code == 200
        assert proc.terminate() == 0
    finally:
        proc.kill()
    cfg = TierdConfig.load(first)
    copy = tmp_path / "cold" / cluster_dir(cfg.tiered.cluster) / cfg.tiered.broker / FILE_NAME
    assert copy.is_file()

    # The machine is lost: a new store directory, the same bucket.
    data = service_config(tmp_path)
    data["store"]["dir"] = str(tmp_path / "restored")
    second = tmp_path / "second.toml"
    second.write_text(toml(data))
    ok(cli("--config", str(second), "restore", "--from", str(tmp_path / "cold"), "--take-over"))
    proc = TierdProcess(second)
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=60, headers=JSON) as c:
            d = c.get("/v1/topics/wide")
            assert d.status_code == 200, d.text
            assert d.json()["queues"] == 8
            assert d.json()["origin"] == "created"
            assert d.json()["cold_retention_hours"] == 48
            assert d.json()["cold_messages"] == 2
        assert proc.terminate() == 0
    finally:
        proc.kill()
