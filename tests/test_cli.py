"""The ``tierd`` command as an operator runs it: real subprocesses, real signals."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from typing import TYPE_CHECKING

from tests.service.conftest import TierdProcess
from tierd import BlockingMessageStore, Message, TierdConfig

if TYPE_CHECKING:
    from pathlib import Path

TIERD = [sys.executable, "-c", "from tierd.cli import main; main()"]


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "tierd.toml"
    path.write_text(
        f'[store]\ndir = "{tmp_path / "hot"}"\nflush = "sync"\ncommitlog_file_size = 4194304\n'
        f"max_message_size = 1048576\nconsumequeue_file_units = 10000\n"
        f'[backend]\nurl = "{tmp_path / "cold"}"\n'
    )
    return path


def test_serve_recovers_runs_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    cfg_path = _config(tmp_path)
    with BlockingMessageStore.open(TierdConfig.load(cfg_path, env={})) as store:
        store.put(Message(topic="orders", body=b"before"))
    proc = TierdProcess(cfg_path)
    try:
        proc.wait_for(r"ready: 1 topic\(s\)", 60)
        assert (tmp_path / "hot" / "abort").exists()
        assert proc.terminate(timeout=60) == 0
        out = proc.output
    finally:
        proc.kill()
    assert "stopped cleanly" in out
    assert not (tmp_path / "hot" / "abort").exists()
    with BlockingMessageStore.open(TierdConfig.load(cfg_path, env={})) as store:
        assert store.hot.last_exit_ok


def test_tierd_errors_are_one_line_and_exit_1(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*TIERD, "--config", str(tmp_path / "missing.toml"), "serve"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"tierd: error: config file not found: {tmp_path / 'missing.toml'}"


def test_store_in_use_is_reported_without_a_traceback(tmp_path: Path) -> None:
    cfg_path = _config(tmp_path)
    with BlockingMessageStore.open(TierdConfig.load(cfg_path, env={})):
        proc = subprocess.run(
            [*TIERD, "--config", str(cfg_path), "serve"], capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 1
    assert "in use by another process" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_start_up_error_is_printed_once(tmp_path: Path) -> None:
    """The cold tier refuses to start (metadata gone, the bucket holds this broker's data): the
    store logs it and the command fails with it — the operator reads it once."""
    cfg_path = _config(tmp_path)
    with BlockingMessageStore.open(TierdConfig.load(cfg_path, env={})) as store:
        store.put(Message(topic="orders", body=b"tiered"))
        store.tier_now()
    for f in (tmp_path / "hot" / "config").glob("tieredStoreMetadata.json*"):
        f.unlink()
    proc = subprocess.run(
        [*TIERD, "--config", str(cfg_path), "tier"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tierd: error: the cold tier cannot start: no tiering metadata")


def test_held_error_lines_reach_every_handler_once(tmp_path: Path) -> None:
    """An embedding process with two log handlers of its own: a held ERROR line that the
    command's error does not restate is written once to each of them when the command ends."""
    from tierd.cli.app import _held_errors, setup_logging

    root = logging.getLogger()
    streams = [io.StringIO(), io.StringIO()]
    handlers = [logging.StreamHandler(s) for s in streams]
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers[:] = handlers
    try:
        setup_logging(TierdConfig.load(_config(tmp_path), env={}), None, quiet=True)
        logging.getLogger("tierd.test").error("the disk under the hot store is failing")
        assert [s.getvalue() for s in streams] == ["", ""]  # held while the command runs
        _held_errors.release(None)
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for h in handlers:
            h.removeFilter(_held_errors)
    assert [s.getvalue() for s in streams] == ["the disk under the hot store is failing\n"] * 2


def test_usage_errors_exit_2_and_help_teaches() -> None:
    assert subprocess.run([*TIERD, "bogus"], capture_output=True, timeout=60).returncode == 2
    helptext = subprocess.run([*TIERD, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "serve" in helptext
    assert "--config" in helptext
