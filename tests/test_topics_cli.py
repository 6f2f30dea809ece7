"""``tierd topics create|describe|update|delete`` as an operator runs them: against a live
daemon (a real ``tierd serve`` process; the CLI asks it over HTTP because it holds the store)
and on the store directory once it has stopped — the same answers either way (docs/topics.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .cli.test_remote import _config, cli, ok
from .service.conftest import TierdProcess

if TYPE_CHECKING:
    from pathlib import Path


def test_topic_admin_through_the_daemon_then_on_the_directory(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    env = {"TIERD_CONFIG": str(cfg)}
    proc = TierdProcess(cfg)
    try:
        proc.wait_for("cold tier ready", 60)
        made = json.loads(
            ok(
                cli(
                    "-o",
                    "json",
                    "topics",
                    "create",
                    "orders",
                    "-n",
                    "6",
                    "--cold-retention-hours",
                    "48",
                    env=env,
                )
            )
        )
        assert made["queues"] == 6
        assert made["origin"] == "created"
        assert made["cold_retention_hours"] == 48
        again = cli("topics", "create", "orders", env=env)
        assert again.returncode == 1
        assert "already exists" in again.stderr

        # Producers without a queue id spread over the created count, through the daemon.
        sent = []
        for i in range(6):  # a `--lines` batch lands on one queue: one message per call
            sent += json.loads(ok(cli("-o", "json", "produce", "orders", f"m{i}", env=env)))
        assert {r["queue_id"] for r in sent} == set(range(6))

        shrink = cli("topics", "update", "orders", "-n", "3", env=env)
        assert shrink.returncode == 1
        assert shrink.stderr.startswith("tierd: error: topic 'orders' has 6 queues; the count only grows")
        hot = cli("topics", "update", "orders", "--hot-retention-hours", "1", env=env)
        assert hot.returncode == 1
        assert "hot retention is store-wide" in hot.stderr
        assert "Traceback" not in shrink.stderr + hot.stderr
        grown = json.loads(
            ok(
                cli(
                    "-o",
                    "json",
                    "topics",
                    "update",
                    "orders",
                    "-n",
                    "8",
                    "--cold-retention-hours",
                    "default",
                    env=env,
                )
            )
        )
        assert grown["queues"] == 8
        assert grown["cold_retention_own"] is False

        described = json.loads(ok(cli("-o", "json", "topics", "describe", "orders", env=env)))
        assert described["hot_messages"] == 6
        assert len(described["queue_ranges"]) == 8
        text = ok(cli("topics", "describe", "orders", env=env))
        assert "orders: 8 queue(s), created" in text
        assert "6 hot" in text

        ok(cli("groups", "commit", "billing", "orders", "--offset", "1", "-q", "0", env=env))
        refused = cli("topics", "delete", "orders", env=env)
        assert refused.returncode == 1
        assert "still needed: consumer group 'billing' has committed offsets" in refused.stderr
        assert ok(cli("topics", "delete", "orders", "--force", env=env)).startswith("deleted topic orders")
        gone = cli("topics", "describe", "orders", env=env)
        assert gone.returncode == 1
        assert gone.stderr.startswith("tierd: error: topic 'orders' does not exist")

        ok(cli("topics", "create", "kept", "-n", "2", env=env))
        remote = json.loads(ok(cli("-o", "json", "topics", "describe", "kept", env=env)))
        assert proc.terminate() == 0
    finally:
        proc.kill()
    # The daemon stopped: the same commands open the directory and answer the same.
    local = json.loads(ok(cli("-o", "json", "topics", "describe", "kept", env=env)))
    assert local == remote
    gone = cli("topics", "describe", "orders", env=env)
    assert gone.returncode == 1
    assert "does not exist" in gone.stderr
