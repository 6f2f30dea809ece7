"""Service fixtures: the daemon on a free port, in a thread (``running``) or as a real ``tierd
serve`` subprocess (``TierdProcess``). Files are small: tests never allocate 1 GiB commitlogs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import httpx

from tierd.service.daemon import Daemon

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tierd import TierdConfig

TIERD = [sys.executable, "-c", "from tierd.cli import main; main()"]
SMALL_STORE: dict[str, Any] = {
    "commitlog_file_size": 8 * 1024 * 1024,
    "max_message_size": 1024 * 1024,
    "consumequeue_file_units": 10_000,
    "index_slots": 64,
    "index_items": 4000,
}


def service_config(
    root: Path,
    backend: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    **tiered: Any,
) -> dict[str, Any]:
    """A config dict (TierdConfig.from_dict or TOML): small hot files, posix cold tier by
    default, dispatch only when asked (``tier_now``), any free port."""
    return {
        "store": {"dir": str(root / "hot"), **SMALL_STORE},
        "backend": backend or {"name": "posix", "url": str(root / "cold")},
        "tiered": {"dispatch_interval": 3600, **tiered},
        "server": {"host": "127.0.0.1", "port": 0, "shutdown_grace": 30, **(server or {})},
        # gRPC is on by default at 8081: tests running side by side must not contend for it.
        "grpc": {"port": 0},
    }


class Running:
    """A daemon serving in a background thread (its own event loop, as in production)."""

    def __init__(self, daemon: Daemon, thread: threading.Thread) -> None:
        self.daemon = daemon
        self.thread = thread
        assert daemon.url is not None
        self.url = daemon.url
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def wait_ready(self, timeout: float = 60) -> None:
        """Poll ``/readyz`` until 200: the cold tier loads in the background after the store
        opens, and tiering requests before that are refused (503 ``not_ready``)."""
        deadline = time.monotonic() + timeout
        while self.client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "/readyz never became 200"
            time.sleep(0.05)  # polling interval; the deadline bounds the wait

    def call(self, fn: Any, *args: Any) -> Any:
        """Run a coroutine function on the daemon's loop (where the store lives)."""
        assert self.daemon.loop is not None
        return asyncio.run_coroutine_threadsafe(fn(*args), self.daemon.loop).result(60)


@contextmanager
def running(cfg: TierdConfig, *, cold_ready: bool = True) -> Iterator[Running]:
    """The daemon in a thread, serving. With ``cold_ready`` (default) the cold tier has loaded
    too: the daemon serves as soon as its hot store is open (``/readyz``), and claiming the
    bucket prefix and loading the flat files continue in the background — tests that list or
    read both tiers at once wait for that; tests of the in-between state pass False."""
    daemon = Daemon(cfg)
    ready = threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(daemon.run(lambda _: ready.set()))
        except BaseException as e:
            failure.append(e)
            ready.set()

    thread = threading.Thread(target=main, name="tierd-daemon", daemon=True)
    thread.start()
    assert ready.wait(60), "daemon did not become ready"
    if failure:
        raise failure[0]
    tiering = daemon.store.tiering if daemon.store is not None else None
    if cold_ready and tiering is not None:
        deadline = time.monotonic() + 60
        while not tiering.ready.is_set():
            assert time.monotonic() < deadline, f"the cold tier did not load: {tiering.start_error}"
            time.sleep(0.01)  # polling interval; the deadline bounds the wait
    r = Running(daemon, thread)
    try:
        yield r
    finally:
        r.client.close()
        daemon.request_stop()
        thread.join(90)
        assert not thread.is_alive(), "daemon did not stop"
    if failure:
        raise failure[0]


def toml(data: dict[str, Any], prefix: str = "") -> str:
    """Enough TOML for our configs: scalars, lists of scalars and nested tables."""
    lines, tables = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((f"{prefix}{key}", value))
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    out = "\n".join(lines) + "\n"
    for name, table in tables:
        out += f"[{name}]\n" + toml(table, f"{name}.")
    return out


def collect_lines(stream: IO[str], lines: list[str], cond: threading.Condition) -> None:
    """Append each line of ``stream`` to ``lines`` (notifying ``cond``) until end of file.

    Select-then-readline would be wrong: lines written together land in the file object's
    buffer on the first read, and select, which sees only the pipe, then waits for more output
    while they sit there (tests/service/test_process_lines.py)."""
    for line in stream:
        with cond:
            lines.append(line)
            cond.notify_all()


class TierdProcess:
    """``tierd --config FILE serve`` as an operator runs it; stderr is collected by a thread so a
    chatty server never blocks on a full pipe."""

    def __init__(
        self, config_path: Path, env: dict[str, str] | None = None, nofile: int | None = None
    ) -> None:
        """``nofile``: the server's open-files limit (``ulimit -n``)."""

        def limit() -> None:
            if nofile is not None:
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

        self.proc = subprocess.Popen(
            [*TIERD, "--config", str(config_path), "serve"],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=limit if nofile is not None else None,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self.wait_for(r"listening on (http://[^\s\"]+)", 60).group(1)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        collect_lines(self.proc.stderr, self.lines, self._cond)

    @property
    def output(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if m := rx.search(line):
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{pattern!r} not seen; output so far:\n{''.join(self.lines)}")
                self._cond.wait(min(left, 0.5))

    def terminate(self, timeout: float = 90) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        """Clean-up for ``finally``: kill if still running, then release the pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
