"""Wall time of ``tierd`` commands that a running daemon answers (issue 32: ≤ 0.3 s).

Starts a real ``tierd serve`` (tiering off, a free port, its own temporary directory), produces
one message, then runs each command N times, interleaved (one round = every command once, in
order), each a fresh interpreter as a shell starts it. Prints, per command, the median, min and
max in milliseconds of the wall time and of the CPU time (user + sys), plus the interpreter
floor (``python -c pass``) and the 1-minute load average before and after.

``--baseline DIR``: also run every command from another checkout of the tree (e.g. made with
``git worktree add /tmp/base <commit>``), interleaved with this one — an A/B in one run, so
both see the same machine; the table then gives both and their ratio.

``--instructions``: instead of timing, count the instructions of one run of each (valgrind's
callgrind; about 20 s a run) — the figure a loaded machine does not change.

Stdout of each command is a pipe (captured and checked, as a script runs the CLI).

Usage: ``python bench/cli_startup.py [--rounds 15] [--baseline DIR] [--instructions]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tierd.testing.daemon import start_daemon

TOKEN = "bench-token"
COMMANDS: list[tuple[str, ...]] = [
    ("--help",),
    ("topics", "ls"),
    ("-o", "json", "topics", "ls"),
    ("consume", "orders", "-n", "1"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tierd(tree: Path | None) -> list[str]:
    """The console entry point, from ``tree`` when given (first on ``sys.path``)."""
    prefix = f"import sys; sys.path.insert(0, {str(tree)!r}); " if tree is not None else ""
    return [sys.executable, "-c", prefix + "from tierd.cli import main; main()"]


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + sys) of one run: CPU time is the steadier figure on a
    loaded machine (another process's turn on the core is not counted)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu


def _instructions(argv: list[str], env: dict[str, str]) -> int:
    """Instructions one run executes (valgrind's callgrind): a count that the machine's load
    does not change, for an A/B on a shared machine (about 20 s a run)."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        text=True,
        env={**env, "PYTHONHASHSEED": "0"},
        timeout=600,
        check=False,
    )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"{argv} under valgrind failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare against")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions (valgrind), one run each, no times"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tierd-cli-bench-") as tmp:
        root = Path(tmp)
        settings: dict[str, dict[str, object]] = {
            "store": {"dir": str(root / "hot"), "commitlog_file_size": 8 * 1024 * 1024},
            "tiered": {"enabled": False},
            "server": {"host": "127.0.0.1", "port": _free_port(), "token": TOKEN},
            "log": {"level": "WARNING"},  # the commands; the daemon logs at INFO (its readiness)
        }
        cfg = root / "tierd.toml"  # start_daemon writes it there; the commands read it too
        clean = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TIERD_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        # Byte code cached (in the temporary directory, not the tree), as an installed package
        # runs: compiling tierd's sources on every start would be measured otherwise.
        env = {
            **clean,
            "TIERD_CONFIG": str(cfg),
            "PYTHONPYCACHEPREFIX": str(root / "pyc"),
        }
        server = start_daemon(root, settings)
        try:
            _run([*_tierd(None), "produce", "orders", "hello", "-k", "k-1"], env)
            trees: dict[str, Path | None] = {"this": None}
            if args.baseline is not None:
                trees["baseline"] = args.baseline.resolve()
            runs: dict[str, list[tuple[str, list[str]]]] = {
                "python -c pass": [("floor", [sys.executable, "-c", "pass"])]
            }
            for command in COMMANDS:
                name = "tierd " + " ".join(command)
                runs[name] = [(tree, [*_tierd(path), *command]) for tree, path in trees.items()]
            for variants in runs.values():  # warm-up, not counted: writes the byte code cache
                for _, argv in variants:
                    _run(argv, env)
            if args.instructions:
                counts = {
                    f"{name} [{tree}]": round(_instructions(argv, env) / 1e6, 1)
                    for name, variants in runs.items()
                    for tree, argv in variants
                }
                print(json.dumps({"million_instructions": counts}, indent=2))
                return
            load_before = os.getloadavg()[0]
            times: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for _ in range(args.rounds):
                for name, variants in runs.items():
                    for tree, argv in variants:
                        times.setdefault((name, tree), []).append(_run(argv, env))
            load_after = os.getloadavg()[0]
        finally:
            server.stop()

    result: dict[str, object] = {"rounds": args.rounds, "load_1min": [load_before, load_after]}
    for (name, tree), ts in times.items():
        wall = sorted(t * 1000 for t, _ in ts)
        cpu = sorted(c * 1000 for _, c in ts)
        result[f"{name} [{tree}]"] = {
            "wall_ms": [round(statistics.median(wall), 1), round(wall[0], 1), round(wall[-1], 1)],
            "cpu_ms": [round(statistics.median(cpu), 1), round(cpu[0], 1), round(cpu[-1], 1)],
        }
    if args.baseline is not None:
        for name in runs:
            if (name, "baseline") in times:
                this, base = times[(name, "this")], times[(name, "baseline")]
                result[f"{name} [this/baseline]"] = {
                    "wall": round(
                        statistics.median(t for t, _ in this) / statistics.median(t for t, _ in base), 3
                    ),
                    "cpu": round(
                        statistics.median(c for _, c in this) / statistics.median(c for _, c in base), 3
                    ),
                }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
