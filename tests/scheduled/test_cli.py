"""``tierd produce --deliver-at/--delay-level`` and ``tierd recall``: on the store directory and
through a running daemon; bad input is one line on stderr, never a traceback."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..cli.test_remote import TOKEN, cli, daemon, ok  # noqa: F401  (daemon: a fixture)
from ..service.conftest import service_config, toml
from .conftest import now_ms

if TYPE_CHECKING:
    from pathlib import Path

    from ..service.conftest import TierdProcess


def one_line_error(proc: object, says: str) -> None:
    assert proc.returncode != 0  # type: ignore[attr-defined]
    err = proc.stderr.strip()  # type: ignore[attr-defined]
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert says in err, err


def test_produce_scheduled_and_recall_on_the_directory(tmp_path: Path) -> None:
    cfg = tmp_path / "tierd.toml"
    cfg.write_text(toml(service_config(tmp_path)))
    out = json.loads(ok(cli("--config", str(cfg), "-o", "json", "produce", "t", "hi", "--delay-level", "18")))
    assert out["topic"] == "t"
    assert out["deliver_at"] > now_ms() + 3_600_000
    assert ok(cli("--config", str(cfg), "recall", out["handle"])).strip() == f"recalled {out['handle']}"
    again = ok(cli("--config", str(cfg), "recall", out["handle"]))
    assert "already recalled" in again
    one_line_error(cli("--config", str(cfg), "recall", "1-2"), "no scheduled message has handle")
    one_line_error(
        cli("--config", str(cfg), "produce", "t", "x", "--deliver-at", str(now_ms() - 5000)),
        "not in the future",
    )
    one_line_error(cli("--config", str(cfg), "produce", "t", "x", "--delay-level", "99"), "delay level")


def test_produce_scheduled_and_recall_through_the_daemon(daemon: tuple[Path, TierdProcess]) -> None:  # noqa: F811
    cfg, _ = daemon
    env = {"TIERD_SERVER__TOKEN": TOKEN}
    out = json.loads(
        ok(
            cli(
                "--config",
                str(cfg),
                "-o",
                "json",
                "produce",
                "t",
                "hi",
                "--deliver-at",
                str(now_ms() + 600_000),
                env=env,
            )
        )
    )
    assert out["topic"] == "t"
    doc = json.loads(ok(cli("--config", str(cfg), "-o", "json", "recall", out["handle"], env=env)))
    assert doc == {"handle": out["handle"], "recalled": True}
    one_line_error(cli("--config", str(cfg), "recall", "5-6", env=env), "no scheduled message has handle")
