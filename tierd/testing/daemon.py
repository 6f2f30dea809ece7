"""A real ``tierd serve`` subprocess for benchmarks: started from a settings dict, ready when its
log says so, stopped with SIGTERM.

The load generators in ``bench/`` measure the daemon from outside, the way an application sees
it, so the server and its load never share a GIL. Each needs the same three things — a config
file, the listening addresses, a bounded wait for readiness — and the same care with the log
pipe: ``select`` on a buffered text pipe misses lines the buffer already holds, and a pipe no one
drains eventually blocks the server. One reader thread takes every line for the life of the
process; the start-up wait reads from it with a deadline.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

#: Seconds ``tierd serve`` gets to open its store and listeners (recovery of an empty store
#: takes well under one; a loaded machine may need many).
START_TIMEOUT = 120.0
#: Seconds a stopping daemon gets to close its store before it is killed.
STOP_TIMEOUT = 60.0

_HTTP = re.compile(r"listening on http://([\d.]+):(\d+)")
_GRPC = re.compile(r"RocketMQ gRPC API listening on grpc://([\d.]+):(\d+)")


def write_config(path: Path, settings: dict[str, dict[str, object]]) -> None:
    """``settings`` as a TOML file of flat sections (JSON scalars and arrays are valid TOML)."""
    lines: list[str] = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


@dataclass
class Daemon:
    """A running ``tierd serve``; a context manager that stops it on exit."""

    proc: subprocess.Popen[str]
    #: ``host:port`` of the HTTP API, and of the gRPC API when it is enabled.
    http: str
    grpc: str | None
    #: The thread that drains the log pipe; it ends when the process has exited.
    reader: threading.Thread

    def stop(self) -> None:
        """SIGTERM (a clean close), then SIGKILL if the close overruns :data:`STOP_TIMEOUT`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _close_log(self.proc, self.reader)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_daemon(root: Path, settings: dict[str, dict[str, object]], *, want_grpc: bool = False) -> Daemon:
    """Write ``settings`` to ``root/tierd.toml`` and start ``tierd serve`` on it; return once its
    log says it is ready (and, with ``want_grpc``, that the gRPC listener is up). A daemon that
    exits or is not ready within :data:`START_TIMEOUT` is killed and reported with its last log
    lines."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "tierd.toml"
    write_config(cfg, settings)
    cli = [sys.executable, "-c", "from tierd.cli import main; main()"]
    proc = subprocess.Popen(
        [*cli, "--config", str(cfg), "--log-level", "INFO", "serve"],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def drain() -> None:
        for line in proc.stderr or ():
            lines.put(line)

    reader = threading.Thread(target=drain, name="tierd-serve-log", daemon=True)
    reader.start()
    deadline = time.monotonic() + START_TIMEOUT
    http = grpc = None
    seen: list[str] = []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        if m := _GRPC.search(line):
            grpc = f"{m.group(1)}:{m.group(2)}"
        elif m := _HTTP.search(line):
            http = f"{m.group(1)}:{m.group(2)}"
        if "ready:" in line and http is not None and (grpc is not None or not want_grpc):
            return Daemon(proc, http, grpc, reader)
    exited = proc.poll()
    proc.kill()
    proc.wait()
    _close_log(proc, reader)
    while not lines.empty():
        seen.append(lines.get_nowait())
    state = (
        f"exited with {exited} before it was ready"
        if exited is not None
        else f"not ready in {START_TIMEOUT:g} s"
    )
    raise RuntimeError(f"tierd serve {state}; log:\n" + "".join(seen[-20:]))


def _close_log(proc: subprocess.Popen[str], reader: threading.Thread) -> None:
    """After the process is gone: let the reader take the rest of the pipe, then close it."""
    reader.join(STOP_TIMEOUT)
    if proc.stderr is not None:
        proc.stderr.close()
