"""What a ``tierd`` invocation imports before it does anything.

Every command used to import the facade — numpy, the hot store, the tiering engine — up front,
1.1–3.3 s before ``--help`` printed or a command that only asks the daemon sent its request. The
CLI now imports those only in the commands that open the store directory themselves. These
tests run the real console entry point in a subprocess and look at ``sys.modules`` when it
exits: a module list, not a stopwatch, so they cannot pass or fail by the machine's load
(docs/performance.md, "CLI start-up", has the measured times).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tierd.cli.consumers import RESET_TARGETS_HELP
from tierd.consumption.groups import RESET_TARGETS

from .test_remote import TOKEN, daemon

if TYPE_CHECKING:
    from pathlib import Path

    from ..service.conftest import TierdProcess

__all__ = ["daemon"]  # the fixture, shared with test_remote

#: Modules that make a start-up slow and that neither --help nor a command answered by the
#: daemon needs: numpy, the engine behind the facade, and the inventory with its manifest models
#: and segment drivers (~8 ms; ``queues`` and ``consume`` build :mod:`tierd.queue_info` rows).
HEAVY = (
    "numpy",
    "tierd.store",
    "tierd.local.store",
    "tierd.tiered.service",
    "tierd.router",
    "tierd.verify",
    "tierd.inventory",
)
#: Imported on first use only, by what needs them: rich for tables on a terminal and progress
#: bars (output to a pipe and JSON need none of it, ~25 ms of a start); asyncio and
#: concurrent.futures for the two commands that use them (~10 ms together).
LAZY = ("rich.console", "rich.table", "asyncio", "concurrent.futures")
#: ``groups ls`` turns the reply into :class:`tierd.consumption.groups.GroupInfo`, whose module imports the
#: offsets machinery and asyncio with it (left as it is: outside the CLI).
LAZY_EXCEPT = {"groups": ("asyncio", "concurrent.futures")}

#: Runs the console entry point, then writes to argv[1] the names of every imported module and
#: the config sections whose pydantic validators were built.
_PROBE = (
    "import atexit, json, sys\n"
    "out = sys.argv.pop(1)\n"
    "def report():\n"
    "    config = sys.modules.get('tierd.config')\n"
    "    models = {**config.SECTIONS, 'TierdConfig': config.TierdConfig, 'ClientConfig': config.ClientConfig}"
    " if config else {}\n"
    "    built = sorted(name for name, model in models.items() if model.__pydantic_complete__)\n"
    "    open(out, 'w').write(json.dumps({'modules': sorted(sys.modules), 'built': built}))\n"
    "atexit.register(report)\n"
    "from tierd.cli import main\n"
    "main()\n"
)


def _imported(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, set[str]]:
    text, modules, _ = _probe(tmp_path, *args, env=env)
    return text, modules


def _probe(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, set[str], list[str]]:
    """``tierd ARGS`` run for real; its stdout, its imported modules, its built config models."""
    out = tmp_path / "modules.json"
    out.unlink(missing_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(out.read_text())
    return proc.stdout, set(report["modules"]), report["built"]


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m in HEAVY or m.startswith("numpy."))


def test_help_imports_neither_numpy_nor_the_store(tmp_path: Path) -> None:
    text, modules = _imported(tmp_path, "--help")
    assert "consume" in text  # the probe really ran the CLI
    assert "tierd.cli.data" in modules
    assert _heavy(modules) == []


@pytest.mark.parametrize(
    "command",
    [
        ("topics", "ls"),
        ("queues", "ls", "orders"),
        ("consume", "orders", "-n", "4"),
        ("groups", "ls"),
        ("seek", "orders", "--time", "0"),
        ("query", "orders", "k-1"),
    ],
    ids=lambda c: "-".join(c[:2]),
)
def test_commands_the_daemon_answers_import_neither_numpy_nor_the_store(
    daemon: tuple[Path, TierdProcess], tmp_path: Path, command: tuple[str, ...]
) -> None:
    cfg, _ = daemon
    env = {"TIERD_CONFIG": str(cfg), "TIERD_SERVER__TOKEN": TOKEN}
    _imported(tmp_path, "produce", "orders", "hello", "-k", "k-1", env=env)
    for output in ("json", "text"):  # stdout is a pipe: text tables need no rich either
        text, modules, built = _probe(tmp_path, "-o", output, *command, env=env)
        if output == "json":
            assert json.loads(text) is not None  # answered (by the daemon: the store is locked)
        else:
            assert text.strip()
        assert "tierd.cli.remote" in modules
        assert _heavy(modules) == []
        exempt = LAZY_EXCEPT.get(command[0], ())
        assert [m for m in LAZY if m in modules and m not in exempt] == []
        # Only the sections a client needs were validated (``load_client``), not all of them.
        assert "ClientConfig" in built
        assert set(built) <= {"ClientConfig", "store", "server", "log"}


def test_the_help_texts_copy_of_the_reset_targets_is_the_stores() -> None:
    assert RESET_TARGETS_HELP == RESET_TARGETS


def test_a_command_that_opens_the_directory_still_works(tmp_path: Path) -> None:
    cfg = tmp_path / "tierd.toml"
    cfg.write_text(f'[store]\ndir = "{tmp_path / "hot"}"\n[tiered]\nenabled = false\n')
    env = {"TIERD_CONFIG": str(cfg)}
    text, modules = _imported(tmp_path, "-o", "json", "produce", "t", "x", env=env)
    assert json.loads(text)[0]["queue_offset"] == 0
    assert "tierd.store" in modules  # the lazy import happened where it is needed


def test_a_table_on_a_pipe_needs_no_rich(tmp_path: Path) -> None:
    """The command opens the store itself: the whole configuration is validated; the table is
    still a table, written without rich (a terminal gets rich's: tests/cli/test_text_output.py)."""
    cfg = tmp_path / "tierd.toml"
    cfg.write_text(f'[store]\ndir = "{tmp_path / "hot"}"\n[tiered]\nenabled = false\n')
    env = {"TIERD_CONFIG": str(cfg)}
    _imported(tmp_path, "produce", "t", "x", env=env)
    text, modules, built = _probe(tmp_path, "topics", "ls", env=env)
    assert text.splitlines()[:3] == [" topic ┃ queues ", "━━━━━━━╇━━━━━━━━", " t     │ 0      "]
    assert "rich.console" not in modules
    assert "TierdConfig" in built
