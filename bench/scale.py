"""Many queues: put, tier, reopen and read 10,000 queues under ``ulimit -n 1024``; prints JSON.

Workload (issue 15, "Resources that run out"): ``--queues`` (10,000) queues — topics of
``store.default_queues`` (4) queues each — receive ``--messages`` (10) messages of ``--body``
(100) bytes, interleaved across queues, through the public facade (``BlockingMessageStore``)
with default settings (posix cold tier next to the hot store). Phases, each timed:

1. ``open``: a new store; ``put``: ``put_batch`` in chunks of 1,000 messages;
2. ``tier_now``: everything to the cold tier (includes waiting for the hot store's dispatch);
3. ``close``, then ``reopen``: ``BlockingMessageStore.open`` (hot recovery of every consume
   queue; the hot store serves from here) and ``cold_ready``: ``wait_ready`` (cold metadata load
   and reconciliation of every queue's last segments with the backend);
4. ``read``: one message per queue with policy FORCE (every one from the cold tier), then close.

Each round runs in a fresh subprocess whose ``RLIMIT_NOFILE`` is set to ``--nofile`` (1024; 0
leaves it alone), so peak RSS and open files are the store's own. A sampler thread records the
peak resident set (``VmRSS``) and the peak number of open file descriptors per phase. Sizes:
the hot store's allocated bytes (``st_blocks``, what ``du`` counts) and apparent bytes, against
the bytes of the message bodies and of the records; the tiering metadata file; the cold tier.

Baseline, same run: the same number of messages into ``--baseline-queues`` (4) queues, so the
ratios say what the *number of queues* costs. ``--rounds`` (1) rounds, scale and baseline
interleaved; medians per phase and the ratios of medians are reported. A round that fails (for
example the fd limit exhausted) is reported with its error instead of figures.

Usage: ``python bench/scale.py [--queues 10000] [--messages 10] [--rounds 1] [--nofile 1024]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
PUT_CHUNK = 1000
QUEUES_PER_TOPIC = 4  # store.default_queues


class Sampler(threading.Thread):
    """Peak RSS and open file descriptors of this process, per phase (sampled every 20 ms and
    at each phase change)."""

    def __init__(self) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.phase = "start"
        self.rss: dict[str, int] = {}
        self.fds: dict[str, int] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> None:
        rss = _rss()
        try:
            fds = len(os.listdir("/proc/self/fd"))
        except OSError:  # the limit itself is exhausted: that is the peak
            fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        with self._lock:
            self.rss[self.phase] = max(self.rss.get(self.phase, 0), rss)
            self.fds[self.phase] = max(self.fds.get(self.phase, 0), fds)

    def enter(self, phase: str) -> None:
        self.sample()
        with self._lock:
            self.phase = phase
        self.sample()

    def run(self) -> None:
        while not self._halt.wait(0.02):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample()


def _rss() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # out of descriptors: the peak is taken at the next sample
        pass
    return 0


def _allocated(path: Path) -> tuple[int, int, int]:
    """(allocated bytes, apparent bytes, files) under ``path``."""
    blocks = apparent = files = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            blocks += st.st_blocks * 512
            apparent += st.st_size
            files += 1
    return blocks, apparent, files


def _du(path: Path) -> int:
    cmd = ["du", "-s", "--block-size=1", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def _tree_size(path: Path) -> int:
    return _allocated(path)[0] if path.exists() else 0


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One round in this process: every phase, timed and sampled."""
    if args.nofile:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
    from tierd import BlockingMessageStore, GetStatus, Message, ReadPolicy, TierdConfig

    root = Path(tempfile.mkdtemp(prefix="tierd-scale-", dir=args.dir))
    cfg = TierdConfig.from_dict({"store": {"dir": str(root / "hot")}, "backend": {"url": str(root / "cold")}})
    queues = [(f"scale-{i // QUEUES_PER_TOPIC}", i % QUEUES_PER_TOPIC) for i in range(args.queues)]
    per_queue = args.messages * args.total_queues // args.queues
    body = os.urandom(args.body)
    sampler = Sampler()
    sampler.start()
    seconds: dict[str, float] = {}
    out: dict[str, Any] = {"queues": args.queues, "messages_per_queue": per_queue, "seconds": seconds}

    def timed(phase: str) -> Timer:
        return Timer(phase, sampler, seconds)

    try:
        with timed("open"):
            store = BlockingMessageStore.open(cfg)
        with timed("put"):
            pending: list[Any] = []
            for _ in range(per_queue):
                for topic, qid in queues:
                    pending.append(Message(topic=topic, body=body, queue_id=qid))
                    if len(pending) == PUT_CHUNK:
                        store.put_batch(pending)
                        pending = []
            if pending:
                store.put_batch(pending)
        with timed("tier_now"):
            committed = store.tier_now().committed
        out["record_bytes"] = store.hot.commitlog.max_offset
        with timed("close"):
            store.close()
        hot_alloc, hot_apparent, hot_files = _allocated(root / "hot")
        cold_alloc, _, cold_files = _allocated(root / "cold")
        meta = root / "hot" / "config" / "tieredStoreMetadata.json"
        with timed("reopen"):
            store = BlockingMessageStore.open(cfg)  # hot recovery; the cold tier loads behind it
        with timed("cold_ready"):
            store.wait_ready(600)
        assert store.tiering is not None
        out["manifests_written_at_reopen"] = store.tiering.manifests.writes
        with timed("read"):
            cold = 0
            for topic, qid in queues:
                res = store.get(topic, qid, 0, 1, policy=ReadPolicy.FORCE)
                if res.status is not GetStatus.FOUND or len(res.messages) != 1:
                    raise RuntimeError(f"{topic}/{qid}: {res.status.name}, {len(res.messages)} message(s)")
                cold += res.source == "cold"
        with timed("close_again"):
            store.close()
        sampler.stop()
        total = per_queue * args.queues
        out.update(
            {
                "committed": committed,
                "read_from_cold": cold,
                "body_bytes": total * args.body,
                "hot_allocated_bytes": hot_alloc,
                "hot_du_bytes": _du(root / "hot"),
                "hot_apparent_bytes": hot_apparent,
                "hot_files": hot_files,
                "hot_allocated_per_record_byte": round(hot_alloc / max(1, out["record_bytes"]), 2),
                "metadata_bytes": meta.stat().st_size if meta.exists() else 0,
                "cold_allocated_bytes": cold_alloc,
                "cold_files": cold_files,
                "peak_rss_mib": round(max(sampler.rss.values()) / MiB, 1),
                "peak_rss_mib_by_phase": {k: round(v / MiB, 1) for k, v in sampler.rss.items()},
                "peak_open_files": max(sampler.fds.values()),
                "peak_open_files_by_phase": sampler.fds,
                "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    except Exception as e:  # reported, not raised: a failing "before" run is a figure too
        sampler.stop()
        out["error"] = f"{type(e).__name__}: {e}"[:2000]
        out["failed_in"] = sampler.phase
        out["peak_open_files"] = max(sampler.fds.values())
        out["seconds_so_far"] = dict(seconds)
        with contextlib.suppress(OSError):
            out["hot_allocated_bytes"] = _tree_size(root / "hot")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return out


class Timer:
    def __init__(self, phase: str, sampler: Sampler, seconds: dict[str, float]) -> None:
        self.phase, self.sampler, self.seconds = phase, sampler, seconds

    def __enter__(self) -> None:
        self.sampler.enter(self.phase)
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds[self.phase] = round(time.perf_counter() - self.start, 3)
        self.sampler.sample()


def run_child(args: argparse.Namespace, queues: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--queues",
        str(queues),
        "--total-queues",
        str(args.queues),
        "--messages",
        str(args.messages),
        "--body",
        str(args.body),
        "--nofile",
        str(args.nofile),
    ]
    if args.dir:
        cmd += ["--dir", args.dir]
    if args.keep:
        cmd.append("--keep")
    print(f"round: {queues} queues", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"queues": queues, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    result["log_lines"] = len(proc.stderr.splitlines())
    result["log_bytes"] = len(proc.stderr)
    return result


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r["seconds"][key] for r in rounds if "error" not in r and key in r.get("seconds", {})]
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--queues", type=int, default=10_000)
    p.add_argument("--messages", type=int, default=10, help="messages per queue (scale run)")
    p.add_argument("--body", type=int, default=100, help="body bytes per message")
    p.add_argument("--baseline-queues", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--nofile", type=int, default=1024, help="RLIMIT_NOFILE of each round (0: unchanged)")
    p.add_argument("--dir", default=None, help="parent directory of the stores (default: $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the stores (diagnostics)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--total-queues", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.total_queues = args.total_queues or args.queues
        print(json.dumps(child(args)), flush=True)
        return
    scale: list[dict[str, Any]] = []
    base: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        scale.append(run_child(args, args.queues))
        base.append(run_child(args, args.baseline_queues))
    phases = ["open", "put", "tier_now", "close", "reopen", "cold_ready", "read", "close_again"]
    medians = {
        "scale": {k: _median(scale, k) for k in phases},
        "baseline": {k: _median(base, k) for k in phases},
    }
    ratios = {
        k: round(s / b, 1) if s is not None and b else None
        for k, s, b in ((k, medians["scale"][k], medians["baseline"][k]) for k in phases)
    }
    print(
        json.dumps(
            {
                "workload": {
                    "queues": args.queues,
                    "messages_per_queue": args.messages,
                    "body_bytes": args.body,
                    "baseline_queues": args.baseline_queues,
                    "nofile": args.nofile,
                    "rounds": args.rounds,
                },
                "median_seconds": medians,
                "ratio_scale_to_baseline": ratios,
                "rounds": {"scale": scale, "baseline": base},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
