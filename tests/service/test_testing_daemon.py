"""``tierd.testing.daemon``: the ``tierd serve`` subprocess the load generators in ``bench/`` use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from tierd.testing.daemon import start_daemon

if TYPE_CHECKING:
    from pathlib import Path


def _settings(root: Path) -> dict[str, dict[str, object]]:
    return {
        "store": {"dir": str(root / "hot")},
        "tiered": {"enabled": False},
        "server": {"host": "127.0.0.1", "port": 0, "ops_port": 0},
        "grpc": {"enabled": True, "port": 0},
    }


def test_a_started_daemon_serves_http_and_stops_cleanly(tmp_path: Path) -> None:
    with start_daemon(tmp_path, _settings(tmp_path), want_grpc=True) as daemon:
        assert daemon.grpc is not None
        assert daemon.grpc.startswith("127.0.0.1:")
        base = f"http://{daemon.http}/v1/topics/t"
        put = httpx.post(f"{base}/messages", json={"body": "aGk=", "queue_id": 0}, timeout=30)
        assert put.status_code == 200, put.text
        got = httpx.get(f"{base}/queues/0/messages", params={"offset": 0}, timeout=30)
        assert [m["body"] for m in got.json()["messages"]] == ["aGk="]
    assert daemon.proc.returncode == 0  # SIGTERM: a clean close, not a kill


def test_a_daemon_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings["store"]["commitlog_file_size"] = -1  # refused by the config's validation
    with pytest.raises(RuntimeError, match="exited with 1 before it was ready") as info:
        start_daemon(tmp_path, settings)
    assert "commitlog_file_size" in str(info.value)
