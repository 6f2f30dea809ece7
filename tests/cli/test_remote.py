"""The CLI against a live daemon (a real ``tierd serve`` process, a real socket), as an operator
runs it in a pod with ``kubectl exec … -- tierd …``: the daemon holds the store, so the commands
ask it over HTTP — and print exactly what they print when they open the directory themselves."""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..service.conftest import SMALL_STORE, TierdProcess, toml

if TYPE_CHECKING:
    from collections.abc import Iterator

TOKEN = "123456"  # digits only: a token from the environment that looks like a number stays text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _config(tmp_path: Path, **server: Any) -> Path:
    path = tmp_path / "tierd.toml"
    data = {
        "store": {"dir": str(tmp_path / "hot"), **SMALL_STORE},
        "backend": {"name": "posix", "url": str(tmp_path / "cold")},
        "tiered": {"dispatch_interval": 3600},
        "server": {"host": "127.0.0.1", "port": _free_port(), **server},
    }
    path.write_text(toml(data))
    return path


def cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``tierd`` as a shell runs it (a real process; stdin a pipe when given)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    return subprocess.run(
        [sys.executable, "-m", "tierd.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
        stdin=None if stdin is not None else subprocess.DEVNULL,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Path, TierdProcess]]:
    cfg = _config(tmp_path)
    proc = TierdProcess(cfg, env={"TIERD_SERVER__TOKEN": TOKEN})
    try:
        proc.wait_for("cold tier ready", 60)  # tiering requests before that get 503 not_ready
        yield cfg, proc
    finally:
        proc.kill()


#: Read commands compared between the two modes (JSON output).
READS = [
    ("topics", "ls"),
    ("queues", "ls", "orders"),
    ("consume", "orders", "-q", "0", "-n", "100"),
    ("consume", "orders", "-q", "0", "--offset", "1", "-n", "2", "--policy", "FORCE"),
    ("query", "orders", "k-1"),
    ("segments", "ls"),
    ("segments", "ls", "--topic", "orders", "--type", "CQ"),
    ("consume", "orders", "-q", "0", "--tags", "*", "-n", "3"),
    ("groups", "ls"),
    ("groups", "show", "g1"),
    ("groups", "show", "g2"),
    ("seek", "orders", "--time", "0"),
    ("earliest-time", "orders"),
]


def test_commands_ask_the_running_daemon_and_print_what_they_print_locally(
    daemon: tuple[Path, TierdProcess], tmp_path: Path
) -> None:
    cfg, proc = daemon
    env = {"TIERD_CONFIG": str(cfg), "TIERD_SERVER__TOKEN": TOKEN}  # as the image and pod set them
    # Without a token the daemon refuses: the CLI really goes through the API.
    denied = cli("topics", "ls", env={"TIERD_CONFIG": str(cfg)})
    assert denied.returncode == 1
    assert denied.stderr.startswith("tierd: error: missing Authorization header")
    assert denied.stderr.count("\n") == 1

    one = json.loads(ok(cli("-o", "json", "produce", "orders", "first", "-k", "k-1", "-q", "0", env=env)))
    assert one[0]["queue_offset"] == 0
    # `echo … | tierd produce t`: stdin lines are messages (one batch); options after the command.
    piped = ok(cli("produce", "orders", "-q", "0", "-o", "json", stdin="a\n\nb\nc\n", env=env))
    assert [r["queue_offset"] for r in json.loads(piped)] == [1, 2, 3]
    tiered = json.loads(ok(cli("tier", "--output=json", env=env)))
    assert tiered == {
        "committed": 4,
        "pending": 0,
        "queues": [{"topic": "orders", "queue_id": 0, "committed": 4, "pending": 0}],
    }
    assert ok(cli("produce", "orders", "on queue 1", "-q", "1", env=env)).startswith("stored orders/1@0 ")
    shown = ok(cli("tier", env=env))  # the same per-queue table as locally, then the total
    assert shown.endswith("committed 1 message(s) to the cold tier; 0 pending\n")
    assert [c.strip() for c in shown.splitlines()[2].split("│")] == ["orders", "1", "1", "0"]

    # Consumer groups through the daemon: a group read commits over HTTP (PUT), then a reset.
    grouped = json.loads(
        ok(cli("consume", "orders", "-q", "0", "--group", "g1", "-n", "2", "-o", "json", env=env))
    )
    assert [m["queue_offset"] for m in grouped["messages"]] == [0, 1]
    ok(cli("groups", "commit", "g2", "orders", "--offset", "3", "-q", "0", env=env))
    ok(cli("groups", "commit", "g3", "orders", "--offset", "1", "-q", "1", env=env))
    ok(cli("groups", "reset", "g2", "orders", "--to", "earliest", env=env))
    ok(cli("groups", "delete", "g3", env=env))
    remote = {args: ok(cli(*args, "-o", "json", env=env)) for args in READS}
    remote_text = ok(cli("queues", "ls", "orders", env=env))
    verify = cli("verify", env=env)  # the daemon checks its own store (test_admin_remote.py)
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.startswith("OK: checked ")

    assert proc.terminate() == 0  # now the directory is free: the same commands open it
    local = {args: ok(cli(*args, "-o", "json", env=env)) for args in READS}
    for args in READS:
        assert json.loads(remote[args]) == json.loads(local[args]), args
    assert remote_text == ok(cli("queues", "ls", "orders", env=env))
    consumed = json.loads(local[READS[2]])
    assert [m["body"] for m in consumed["messages"]] == ["Zmlyc3Q=", "YQ==", "Yg==", "Yw=="]
    groups = {g["group"]: g for g in json.loads(local[("groups", "ls")])}
    assert set(groups) == {"g1", "g2"}  # g3 was deleted through the daemon


def test_server_url_and_token_from_the_environment(daemon: tuple[Path, TierdProcess], tmp_path: Path) -> None:
    _, proc = daemon
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"TIERD_SERVER_URL": proc.url, "TIERD_SERVER__TOKEN": TOKEN}
    # No config at all: --server/TIERD_SERVER_URL alone reaches the daemon, from any directory.
    out = subprocess.run(
        [sys.executable, "-m", "tierd.cli", "produce", "t", "hello"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}, **env},
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("stored t/")
    assert not (elsewhere / "data").exists()  # no store was created here
    wrong = cli("--server", proc.url, "topics", "ls", env={"TIERD_SERVER__TOKEN": "nope"})
    assert wrong.returncode == 1
    assert wrong.stderr.startswith("tierd: error: wrong bearer token")
    assert "nope" not in wrong.stderr
    gone = cli("--server", "http://127.0.0.1:1", "topics", "ls")
    assert gone.returncode == 1
    assert gone.stderr.startswith("tierd: error: no answer from a tierd daemon at http://127.0.0.1:1")


def test_read_commands_never_create_a_store(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    for args in (("topics", "ls"), ("segments", "ls"), ("consume", "t"), ("verify",), ("tier",)):
        res = cli("--config", str(cfg), *args)
        assert res.returncode == 1, args
        assert res.stderr.startswith(f"tierd: error: no tierd store at {tmp_path / 'hot'}"), res.stderr
        assert f"config {cfg}" in res.stderr
        assert res.stderr.count("\n") == 1
    assert not (tmp_path / "hot").exists()
    # The built-in defaults are named as the source when there is no config at all.
    bare = subprocess.run(
        [sys.executable, "-m", "tierd.cli", "topics", "ls"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("TIERD_")},
        check=False,
    )
    assert bare.returncode == 1
    assert "built-in defaults (no --config/TIERD_CONFIG)" in bare.stderr
    assert not (tmp_path / "data").exists()
    ok(cli("--config", str(cfg), "produce", "t", "first"))  # writing creates it
    assert "1 topic(s)" in ok(cli("topics", "ls", env={"TIERD_CONFIG": str(cfg)}))


def test_produce_on_a_terminal_without_a_body_asks_for_one(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    main, secondary = pty.openpty()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "tierd.cli", "--config", str(cfg), "produce", "t"],
            stdin=secondary,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(main)
        os.close(secondary)
    assert res.returncode == 2
    assert "give the message body as an argument, --file PATH (- for stdin), or pipe lines" in res.stderr


def test_shell_completion_completes_commands_and_options() -> None:
    def complete(words: str, index: int) -> list[str]:
        """What bash's completion function gets from the installed ``tierd`` script."""
        env = {
            **os.environ,
            "_TIERD_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(index),
        }
        script = str(Path(sys.executable).parent / "tierd")
        proc = subprocess.run([script], capture_output=True, text=True, timeout=60, env=env, check=False)
        return ok(proc).split()

    assert complete("tierd seg", 1) == ["segments"]
    assert "--type" in complete("tierd segments ls --ty", 3)
    assert "--install-completion" in ok(cli("--help"))


def test_global_options_after_the_command_are_the_same_options() -> None:
    from tierd.cli.app import GLOBAL_VALUE_OPTIONS, app, hoist_global_options

    assert hoist_global_options(["topics", "ls", "-o", "json", "--config=x.toml"]) == [
        "-o",
        "json",
        "--config=x.toml",
        "topics",
        "ls",
    ]
    assert hoist_global_options(["-c", "a.toml", "produce", "t", "--", "-o"]) == [
        "-c",
        "a.toml",
        "produce",
        "t",
        "--",
        "-o",
    ]
    # No command may define an option with a global option's name (it would be taken away).
    import typer.main

    group = typer.main.get_command(app)
    seen: list[str] = []

    def walk(cmd: Any) -> None:
        for param in getattr(cmd, "params", []):
            seen.extend(getattr(param, "opts", []))
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    for sub in group.commands.values():  # type: ignore[attr-defined]
        walk(sub)
    assert not set(seen) & GLOBAL_VALUE_OPTIONS


def test_query_through_the_daemon_follows_the_byte_bounded_pages(tmp_path: Path) -> None:
    """The daemon bounds each key-query answer by server.max_read_bytes; the CLI follows
    `next` and prints every match, as a local query would."""
    cfg = _config(tmp_path, max_read_bytes=1024)
    proc = TierdProcess(cfg)
    try:
        proc.wait_for("cold tier ready", 60)
        lines = "".join(f"{i:04d}" + "x" * 600 + "\n" for i in range(5))
        ok(cli("--config", str(cfg), "produce", "orders", "--file", "-", "--lines", "-k", "k", stdin=lines))
        got = json.loads(ok(cli("--config", str(cfg), "-o", "json", "query", "orders", "k")))
    finally:
        proc.kill()
    assert len(got) == 5
    assert len({m["queue_offset"] for m in got}) == 5  # each once
