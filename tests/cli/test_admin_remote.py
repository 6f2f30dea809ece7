"""``tierd gc`` and ``tierd verify`` while a daemon holds the store: the daemon does the work
(``POST /v1/admin/gc``, ``POST /v1/admin/verify``) instead of the commands refusing to run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .test_remote import TOKEN, cli, daemon, ok

if TYPE_CHECKING:
    from pathlib import Path

    from ..service.conftest import TierdProcess

__all__ = ["daemon"]  # the fixture, shared with test_remote


def test_gc_and_verify_go_through_the_running_daemon(
    daemon: tuple[Path, TierdProcess], tmp_path: Path
) -> None:
    cfg, proc = daemon
    env = {"TIERD_CONFIG": str(cfg), "TIERD_SERVER__TOKEN": TOKEN}
    ok(cli("produce", "orders", "-q", "0", "--lines", stdin="".join(f"m{i}\n" for i in range(50)), env=env))
    assert json.loads(ok(cli("-o", "json", "tier", env=env)))["committed"] == 50

    assert json.loads(ok(cli("-o", "json", "gc", env=env))) == {"hot_files": 0, "cold_segments": 0}
    assert ok(cli("gc", env=env)) == "deleted 0 hot commitlog file(s) and 0 cold segment(s)\n"

    report = json.loads(ok(cli("-o", "json", "verify", env=env)))
    assert (report["ok"], report["problems"]) == (True, [])
    assert report["records"] == 100  # each message twice: its hot record and its cold copy
    assert ok(cli("verify", env=env)).startswith("OK: checked 100 records")

    # It really checks: a cold segment cut short on the backend is found, exit 1.
    segments = json.loads(ok(cli("-o", "json", "segments", "ls", "--type", "CL", env=env)))
    [seg] = [s for s in segments if s["topic"] == "orders"]
    path = tmp_path / "cold" / seg["path"]
    path.write_bytes(path.read_bytes()[: seg["size"] // 2])
    bad = cli("-o", "json", "verify", env=env)
    assert bad.returncode == 1, bad.stderr
    found = json.loads(bad.stdout)
    assert not found["ok"]
    assert "cold-segment" in found["counts"], found

    # Repairs change the directory: refused while the daemon holds it, saying what to do.
    repair = cli("verify", "--repair", env=env)
    assert repair.returncode == 1
    assert repair.stderr.startswith("tierd: error: `tierd verify --repair` changes the store directory")
    assert "stop the daemon" in repair.stderr
    assert repair.stderr.count("\n") == 1
    assert proc.proc.poll() is None  # the daemon still runs
