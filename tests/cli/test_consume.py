"""``tierd consume`` as an operator tails a topic, against a live daemon (a real ``tierd
serve`` process; the CLI a real subprocess, its stdout a pipe or a pseudo-terminal)."""

from __future__ import annotations

import base64
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from .test_remote import TOKEN, cli, daemon, ok

if TYPE_CHECKING:
    from pathlib import Path

    from ..service.conftest import TierdProcess

__all__ = ["daemon"]  # the fixture, shared with test_remote

WAIT = 60.0  # seconds: the bound of every wait below


def _env(cfg: Path) -> dict[str, str]:
    return {"TIERD_CONFIG": str(cfg), "TIERD_SERVER__TOKEN": TOKEN}


def _produce(
    env: dict[str, str], topic: str, *bodies: str, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """One message per call (the topic's round robin spreads them over its queues)."""
    return [json.loads(ok(cli("-o", "json", "produce", topic, b, *extra, env=env)))[0] for b in bodies]


def _bodies(doc: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(m["body"]) for m in doc["messages"]]


def test_consume_reads_every_queue_of_the_topic(daemon: tuple[Path, TierdProcess]) -> None:
    cfg, _ = daemon
    env = _env(cfg)
    sent = [f"m{i}" for i in range(8)]
    placed = _produce(env, "orders", *sent)
    assert {r["queue_id"] for r in placed} == {0, 1, 2, 3}  # round robin over 4 queues

    doc = json.loads(ok(cli("-o", "json", "consume", "orders", "-n", "100", env=env)))
    assert sorted(_bodies(doc)) == sorted(b.encode() for b in sent)  # not queue 0's quarter
    assert [q["queue_id"] for q in doc["queues"]] == [0, 1, 2, 3]
    assert all(q["next_offset"] == 2 for q in doc["queues"])
    # --max counts across queues, oldest first by store time.
    two = json.loads(ok(cli("-o", "json", "consume", "orders", "-n", "2", env=env)))
    assert len(two["messages"]) == 2
    text = ok(cli("consume", "orders", "-n", "100", env=env))
    assert "8 message(s) from 4 queue(s)" in text
    # -q still narrows to one queue, with that queue's fields at the top of the document.
    one = json.loads(ok(cli("-o", "json", "consume", "orders", "-q", "1", env=env)))
    assert (one["status"], one["next_offset"]) == ("FOUND", 2)
    assert _bodies(one) == [r.encode() for r, p in zip(sent, placed, strict=True) if p["queue_id"] == 1]


def test_formats_ndjson_body_and_format_string(daemon: tuple[Path, TierdProcess]) -> None:
    cfg, _ = daemon
    env = _env(cfg)
    [r] = _produce(env, "fmt", "hello world", extra=("-k", "k-1", "-t", "paid", "-q", "2"))
    line = ok(cli("consume", "fmt", "--format", r"%t|%p|%o|%k|%g|%i|%S|%s\n", env=env))
    assert line == f"fmt|2|0|k-1|paid|{r['msg_id']}|11|hello world\n"
    assert ok(cli("consume", "fmt", "--format", "body", env=env)) == "hello world\n"
    [doc] = [json.loads(x) for x in ok(cli("consume", "fmt", "--format", "json", env=env)).splitlines()]
    assert (doc["topic"], doc["queue_id"], base64.b64decode(doc["body"])) == ("fmt", 2, b"hello world")
    bad = cli("consume", "fmt", "--format", "%Q", env=env)
    assert bad.returncode == 2
    assert "unknown format code '%Q'" in bad.stderr


def test_from_time_starts_at_the_first_message_stored_then(daemon: tuple[Path, TierdProcess]) -> None:
    cfg, _ = daemon
    env = _env(cfg)
    early = _produce(env, "timed", "e0", "e1", "e2")
    first = json.loads(ok(cli("-o", "json", "consume", "timed", "-n", "10", env=env)))
    last_early = max(m["store_timestamp"] for m in first["messages"])
    deadline = time.monotonic() + WAIT  # the next message must be stored in a later millisecond
    while time.time() * 1000 <= last_early + 1:
        assert time.monotonic() < deadline
    late = _produce(env, "timed", "l0", "l1")
    assert (len(early), len(late)) == (3, 2)
    got = json.loads(
        ok(cli("-o", "json", "consume", "timed", "--from-time", str(last_early + 1), "-n", "10", env=env))
    )
    assert sorted(_bodies(got)) == [b"l0", b"l1"]


def _read_until(fd: int, needle: bytes, seen: bytearray) -> None:
    deadline = time.monotonic() + WAIT
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} not printed; so far {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"output ended before {needle!r}; so far {bytes(seen)!r}"
            seen += chunk


def test_follow_prints_new_messages_until_ctrl_c(daemon: tuple[Path, TierdProcess]) -> None:
    cfg, _ = daemon
    env = _env(cfg)
    _produce(env, "tail", "before")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    with subprocess.Popen(
        [sys.executable, "-m", "tierd.cli", "consume", "tail", "--follow", "--from-beginning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**clean, **env},
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stderr is not None
            seen = bytearray()
            _read_until(proc.stdout.fileno(), b"before\n", seen)  # it runs, and has caught up
            # Produced after it started, on every queue (round robin): each one is printed.
            _produce(env, "tail", "after-0", "after-1", "after-2", "after-3")
            for i in range(4):
                _read_until(proc.stdout.fileno(), f"after-{i}\n".encode(), seen)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(WAIT) == 0
            assert proc.stderr.read().decode() == "tierd: stopped after 5 message(s)\n"
        finally:
            if proc.poll() is None:
                proc.kill()


def test_binary_bodies_are_escaped_on_a_terminal_and_raw_in_a_pipe(daemon: tuple[Path, TierdProcess]) -> None:
    cfg, _ = daemon
    env = _env(cfg)
    body = b"bin\x1b[31mred\xff\x00end\n"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    put = subprocess.run(
        [sys.executable, "-m", "tierd.cli", "produce", "bin", "--file", "-", "-q", "0"],
        input=body,
        capture_output=True,
        env={**clean, **env},
        timeout=120,
        check=False,
    )
    assert put.returncode == 0, put.stderr
    for fmt in ("body", "%s\\n", "table"):
        main, secondary = pty.openpty()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tierd.cli", "consume", "bin", "--format", fmt],
                stdout=secondary,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                env={**clean, **env, "COLUMNS": "200"},
            )
            os.close(secondary)
            seen = bytearray()
            _read_until(main, b"end", seen)
            assert proc.wait(WAIT) == 0
        finally:
            os.close(main)
        assert not [raw for raw in (b"\x1b[31m", b"\xff", b"\x00") if raw in seen], (fmt, seen)
        assert b"bin\\x1b[31mred\\xff\\x00end" in seen, (fmt, seen)
    # To a pipe the body-only format writes the bytes as stored.
    raw = subprocess.run(
        [sys.executable, "-m", "tierd.cli", "consume", "bin", "--format", "body"],
        capture_output=True,
        env={**clean, **env},
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert raw.stdout == body + b"\n"
