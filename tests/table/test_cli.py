"""``tierd table sync`` and ``tierd table lag`` as a user runs them: a real process, a config file."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

from .conftest import Tier, sealed

if TYPE_CHECKING:
    from pathlib import Path


def _tierd(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierd.cli", "--config", str(config), "--output", "json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_table_sync_commits_once_and_reports_the_lag(tier: Tier, tmp_path: Path) -> None:
    config = tmp_path / "tierd.toml"
    config.write_text(
        f'[store]\ndir = "{tmp_path / "store"}"\n[backend]\nname = "posix"\nurl = "{tier.url}"\n'
        '[topics.orders]\ntable = "iceberg"\n'
    )
    expected = sealed(tier.url, "orders").num_rows
    before = _tierd(config, "table", "lag", "orders")
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout) == {"topic": "orders", "lag": expected}

    first = _tierd(config, "table", "sync", "orders", "--maintain")
    assert first.returncode == 0, first.stderr
    assert (json.loads(first.stdout)["rows"], json.loads(first.stdout)["lag"]) == (expected, 0)
    again = _tierd(config, "table", "sync", "orders")
    assert json.loads(again.stdout)["rows"] == 0

    unknown = _tierd(config, "table", "sync", "audit")  # not opted in: a clear error, no traceback
    assert unknown.returncode != 0
    assert "audit" in unknown.stderr
    assert "Traceback" not in unknown.stderr
