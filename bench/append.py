"""Write throughput through the public blocking facade, against raw page-cache writes, in one run.

The user's path (docs/performance.md, figures P1 and P1b): ``BlockingMessageStore`` opened with
the default settings — only ``store.dir`` and ``backend.url`` point into a temporary directory, so
tiering is on with the posix driver, as in ``conf/local.toml`` — and messages of 1 KiB bodies with
one key each and no queue id (the store picks queues round-robin)::

    Message(topic="bench", body=body, keys=(f"key-{i}",))

* **P1** ``put_batch``: ``--messages`` messages in batches of ``--batch`` (1,000). Baseline
  ``raw_write``: the same number of bytes as the commitlog received, written with ``os.write`` in
  1 MiB blocks to a new file in the same directory, no sync (what ``dd bs=1M`` does, without a
  process start). Ratio: store bytes/s ÷ raw bytes/s (target >= 0.10).
* **P1b** ``put``: ``--single`` messages, one ``put`` each (target >= 100,000 msgs/s). Baseline
  ``raw_append``: the same records, pre-encoded, each appended to a file with one ``os.write``
  (a log file written a message at a time, no sync).

A store figure runs from the first put until the last one has returned *and* every message is
dispatched (in its consume queue and the key index: readable and queryable) — nothing is left
in a backlog outside the timed window. Messages are built before the clock starts. Each round
opens a fresh store, measures, closes it (the close, which tiers what is pending, is not timed)
and removes it, then runs the baselines; odd rounds run the baselines first, so drift and the
state of the page cache hit both sides alike. Medians over ``--rounds`` (5); ratios are the
median of the per-round ratios (each pair ran back to back).

Informational (not in the table): ``sync_group_commit`` — ``store.flush = "sync"``, ``--producers``
concurrent asyncio producers on ``MessageStore``: messages per ``fdatasync``.

``--startup [N]`` (issue 31, target <= 0.5 s): N fresh interpreters each ``import tierd``, open a
default store and ``put`` one message; the process wall time as the parent sees it and its CPU
time, medians, the floor ``python -c pass``, and the ``-X importtime`` entries with the largest
cumulative time. Under load, the CPU time is the steadier figure: wall time is CPU time plus the
wait for a core.

Prints one JSON object (with the 1-minute load average before and after: the machine's other
work slows the figures). Usage: ``python bench/append.py [--messages 200000] [--single 100000]
[--batch 1000] [--rounds 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tierd import BlockingMessageStore, Message, MessageStore, TierdConfig

BODY = 1024
BLOCK = 1 << 20


def _cfg(root: Path, **store: Any) -> TierdConfig:
    """Defaults, except where the files go (and what a figure says it changes)."""
    return TierdConfig.from_dict(
        {"store": {"dir": str(root / "hot"), **store}, "backend": {"url": str(root / "cold")}}
    )


def _messages(n: int, body: bytes) -> list[Message]:
    return [Message(topic="bench", body=body, keys=(f"key-{i}",)) for i in range(n)]


def warm_page_cache(root: Path, volume: int) -> None:
    """Write and delete ``volume`` bytes, untimed, right before a timed section.

    On this VM (and any whose hypervisor takes idle guest memory back) the first use of memory
    freed a second or more ago costs a host fault per page: a page-cache write then runs at
    0.3-0.6 GB/s instead of 3-5 GB/s, depending only on how long the machine idled before.
    Warming before *each* timed section, store and baseline alike, compares the software on
    the same (fast) memory — the strict reading of the baseline."""
    block = bytes(BLOCK)
    path = root / "warm"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(-(-volume // BLOCK)):
            os.write(fd, block)
    finally:
        os.close(fd)
        path.unlink()


def _timed_store(root: Path, run: Any, warm: int) -> tuple[float, int, list[bytes], float]:
    """Open a fresh store, time ``run(store)`` until everything is dispatched; return seconds,
    commitlog bytes, a sample of the records as stored (for the per-message baseline) and the
    process's CPU seconds in the same window (every thread: the figure a loaded machine moves
    least, as wall time adds the wait for a core)."""
    store = BlockingMessageStore.open(_cfg(root))
    try:
        warm_page_cache(root, warm)
        t, cpu = time.perf_counter(), time.process_time()
        run(store)
        if not store.hot.wait_dispatched(120):
            raise RuntimeError("dispatch did not finish within 120 s")
        dt, cpu = time.perf_counter() - t, time.process_time() - cpu
        volume = store.hot.commitlog.max_offset
        first = store.hot.commitlog.files.files[0]
        size = int.from_bytes(first.mm[0:4], "big")
        record = bytes(first.mm[0:size])
    finally:
        store.close(grace=0)
    shutil.rmtree(root)
    return dt, volume, [record], cpu


def _estimate(msgs: list[Message]) -> int:
    """Bytes the commitlog will hold (to warm as much memory before the store runs)."""
    return len(msgs) * (len(msgs[0].body) + 192)


def store_put_batch(root: Path, msgs: list[Message], batch: int) -> dict[str, float]:
    chunks = [msgs[i : i + batch] for i in range(0, len(msgs), batch)]

    def run(store: BlockingMessageStore) -> None:
        put_batch = store.put_batch
        for c in chunks:
            put_batch(c)

    dt, volume, _, cpu = _timed_store(root, run, _estimate(msgs))
    return {
        "seconds": dt,
        "msgs_per_s": len(msgs) / dt,
        "MB_per_s": volume / dt / 1e6,
        "bytes": volume,
        "cpu_us_per_msg": cpu / len(msgs) * 1e6,
    }


def store_put(root: Path, msgs: list[Message]) -> tuple[dict[str, float], bytes]:
    def run(store: BlockingMessageStore) -> None:
        put = store.put
        for m in msgs:
            put(m)

    dt, volume, records, cpu = _timed_store(root, run, _estimate(msgs))
    out = {
        "seconds": dt,
        "msgs_per_s": len(msgs) / dt,
        "MB_per_s": volume / dt / 1e6,
        "bytes": volume,
        "cpu_us_per_msg": cpu / len(msgs) * 1e6,
    }
    return out, records[0]


def raw_write(root: Path, volume: int) -> dict[str, float]:
    """``volume`` bytes in 1 MiB ``os.write`` calls to a new file (page cache, no sync)."""
    block = os.urandom(BLOCK)
    path = root / "raw-write"
    warm_page_cache(root, volume)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        t = time.perf_counter()
        left = volume
        while left >= BLOCK:
            left -= os.write(fd, block)
        if left:
            os.write(fd, block[:left])
        dt = time.perf_counter() - t
    finally:
        os.close(fd)
        path.unlink()
    return {"seconds": dt, "MB_per_s": volume / dt / 1e6, "bytes": volume}


def raw_append(root: Path, record: bytes, n: int) -> dict[str, float]:
    """``n`` records appended one ``os.write`` each (a log written a message at a time)."""
    path = root / "raw-append"
    warm_page_cache(root, n * len(record))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    write = os.write
    try:
        t = time.perf_counter()
        for _ in range(n):
            write(fd, record)
        dt = time.perf_counter() - t
    finally:
        os.close(fd)
        path.unlink()
    return {"seconds": dt, "msgs_per_s": n / dt, "MB_per_s": n * len(record) / dt / 1e6}


async def _sync_producers(root: Path, producers: int, per_producer: int, body: bytes) -> dict[str, float]:
    async with MessageStore.open(_cfg(root, flush="sync")) as store:

        async def producer(p: int) -> None:
            for i in range(per_producer):
                await store.put(Message(topic="sync", body=body, keys=(f"p{p}-{i}",)))

        t = time.perf_counter()
        await asyncio.gather(*(producer(p) for p in range(producers)))
        dt = time.perf_counter() - t
        fl = store.hot.flusher
        total = producers * per_producer
        return {
            "producers": producers,
            "messages": total,
            "seconds": dt,
            "msgs_per_s": total / dt,
            "fsyncs": fl.fsyncs,
            "messages_per_fsync": fl.requests_served / max(1, fl.fsyncs),
        }


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    keys = [k for k in ("msgs_per_s", "MB_per_s", "seconds") if k in runs[0]]
    out: dict[str, Any] = {f"{k}_median": statistics.median(r[k] for r in runs) for k in keys}
    out["runs"] = [{k: round(r[k], 4 if k == "seconds" else 1) for k in keys} for r in runs]
    return out


#: The shape matrix (issue 31): what users send, not only the benchmark's shape.
SHAPES: dict[str, Any] = {
    "keys_only": lambda i, body: Message(topic="bench", body=body, keys=(f"key-{i}",)),
    "queue_ids": lambda i, body: Message(topic="bench", body=body, keys=(f"key-{i}",), queue_id=i % 8),
    "tag": lambda i, body: Message(topic="bench", body=body, keys=(f"key-{i}",), tags="TagA"),
    "tag_2props_queue_id": lambda i, body: Message(
        topic="bench",
        body=body,
        keys=(f"key-{i}",),
        tags="TagA",
        properties={"region": "eu-west", "trace": f"t-{i}"},
        queue_id=i % 8,
    ),
    "three_topics": lambda i, body: Message(topic=f"bench{i % 3}", body=body, keys=(f"key-{i}",)),
}


def shape_matrix(args: argparse.Namespace) -> dict[str, Any]:
    """``put_batch`` (batches of ``--batch``) and single ``put`` of every shape, for each body
    size, against ``raw_write`` of the same volume, rounds interleaved (shapes in a rotating
    order; the baseline in the same round). Medians; ratios to the fastest shape and to the
    baseline."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        for size in args.body_sizes:
            body = os.urandom(size)
            batches = {name: [make(i, body) for i in range(args.messages)] for name, make in SHAPES.items()}
            singles = {name: [make(i, body) for i in range(args.single)] for name, make in SHAPES.items()}
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in SHAPES}
            puts: dict[str, list[dict[str, float]]] = {name: [] for name in SHAPES}
            raw: list[dict[str, float]] = []
            names = list(SHAPES)
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    runs[name].append(
                        store_put_batch(root / f"b{size}-{name}-{r}", batches[name], args.batch)
                    )
                    puts[name].append(store_put(root / f"s{size}-{name}-{r}", singles[name])[0])
                raw.append(raw_write(root, int(runs[names[0]][-1]["bytes"])))
            med = {name: statistics.median(x["msgs_per_s"] for x in runs[name]) for name in names}
            fastest = max(med.values())
            raw_mb = statistics.median(x["MB_per_s"] for x in raw)
            out[f"body_{size}"] = {
                "raw_write_MB_per_s": raw_mb,
                "put_batch": {
                    name: {
                        "msgs_per_s": med[name],
                        "MB_per_s": statistics.median(x["MB_per_s"] for x in runs[name]),
                        "vs_fastest_shape": med[name] / fastest,
                        "vs_raw_write": statistics.median(x["MB_per_s"] for x in runs[name]) / raw_mb,
                        "cpu_us_per_msg": statistics.median(x["cpu_us_per_msg"] for x in runs[name]),
                        "per_round_msgs_per_s": [round(x["msgs_per_s"]) for x in runs[name]],
                    }
                    for name in names
                },
                "put": {name: statistics.median(x["msgs_per_s"] for x in puts[name]) for name in names},
                "put_per_round_msgs_per_s": {
                    name: [round(x["msgs_per_s"]) for x in puts[name]] for name in names
                },
                "put_cpu_us_per_msg": {
                    name: statistics.median(x["cpu_us_per_msg"] for x in puts[name]) for name in names
                },
            }
    return out


#: The start-up figure's child: ``import tierd``, open a default store, one ``put`` (issue 31:
#: <= 0.5 s), each step timed inside the child too, printed as JSON.
_STARTUP_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from tierd import BlockingMessageStore, Message, TierdConfig
t1 = time.perf_counter()
root = sys.argv[1]
store = BlockingMessageStore.open(
    TierdConfig.from_dict({"store": {"dir": root + "/hot"}, "backend": {"url": root + "/cold"}})
)
t2 = time.perf_counter()
store.put(Message(topic="startup", body=b"x", keys=("k",)))
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "open": t2 - t1, "first_put": t3 - t2}), flush=True)
store.close(grace=0)
"""


def _importtime_top(root: Path, top: int, env: dict[str, str]) -> list[dict[str, Any]]:
    """The ``-X importtime`` entries of the start-up child's imports with the largest cumulative
    time (one run: what an import-time change would have to move)."""
    child = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "from tierd import BlockingMessageStore, Message, TierdConfig",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env=env,
    )
    rows = []
    for line in child.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), int(parts[0].split(":")[1]), parts[2].rstrip()))
    rows.sort(reverse=True)
    return [{"module": m.strip(), "cumulative_ms": c / 1000, "self_ms": s / 1000} for c, s, m in rows[:top]]


def startup(runs: int) -> dict[str, Any]:
    """``runs`` fresh interpreters, each importing tierd, opening a default store in a new
    directory and putting one message; the wall time of each process as the parent sees it
    (interpreter start and exit, the store's close included) and its CPU time (user + system),
    medians. The floor ``python -c pass`` is measured in the same rounds.

    Byte code is cached, as for an installed package (pip compiles it at install): the children
    run without ``PYTHONDONTWRITEBYTECODE`` and with a cache directory of their own, filled by one
    warm-up process that is not counted. Without it every process would compile tierd's ~85
    modules from source (~150 ms here) — a cost no installed tierd pays."""
    walls: list[float] = []
    cpus: list[float] = []
    floors: list[float] = []
    steps: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        warm_up = [sys.executable, "-c", _STARTUP_CHILD, str(root / "warm-up")]
        subprocess.run(warm_up, check=True, cwd=root, env=env, capture_output=True)
        for r in range(runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True, cwd=root, env=env)
            floors.append(time.perf_counter() - t)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            child = subprocess.run(
                [sys.executable, "-c", _STARTUP_CHILD, str(root / f"s{r}")],
                capture_output=True,
                text=True,
                check=True,
                cwd=root,
                env=env,
            )
            walls.append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            steps.append(json.loads(child.stdout))
        top = _importtime_top(root, 12, env)
    med = statistics.median
    return {
        "runs": runs,
        "process_wall_s_median": med(walls),
        "process_wall_s": [round(x, 3) for x in walls],
        "process_cpu_s_median": med(cpus),
        "python_pass_wall_s_median": med(floors),
        "in_process_s_median": {k: med(s[k] for s in steps) for k in steps[0]},
        "import_then_open_then_put_s_median": med(sum(s.values()) for s in steps),
        "importtime_top": top,
        "bytecode": "cached, as an installed package runs",
        "target": "process wall <= 0.5 s",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000, help="messages per put_batch round")
    ap.add_argument("--single", type=int, default=100_000, help="messages per single-put round")
    ap.add_argument("--batch", type=int, default=1000, help="messages per put_batch call")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians count")
    ap.add_argument("--producers", type=int, default=64, help="sync group commit producers")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 small rounds (not the figures)")
    ap.add_argument("--shapes", action="store_true", help="the shape matrix instead (docs/performance.md)")
    ap.add_argument("--body-sizes", type=int, nargs="+", default=[1024, 100, 16384], help="with --shapes")
    ap.add_argument(
        "--startup", type=int, nargs="?", const=9, metavar="N", help="start-up instead: N fresh processes (9)"
    )
    args = ap.parse_args()
    if args.startup:
        load = os.getloadavg()[0]
        out = startup(args.startup)
        json.dump({"load_average_1m": [load, os.getloadavg()[0]], **out}, sys.stdout, indent=2)
        print()
        return
    if args.shapes:
        load = os.getloadavg()[0]
        matrix = shape_matrix(args)
        json.dump(
            {"load_average_1m": [load, os.getloadavg()[0]], "rounds": args.rounds, **matrix},
            sys.stdout,
            indent=2,
        )
        print()
        return
    if args.quick:
        args.messages, args.single, args.rounds = 20_000, 10_000, 3
    load_before = os.getloadavg()
    body = os.urandom(BODY)
    batch_msgs = _messages(args.messages, body)
    single_msgs = _messages(args.single, body)
    batch_runs: list[dict[str, float]] = []
    write_runs: list[dict[str, float]] = []
    put_runs: list[dict[str, float]] = []
    append_runs: list[dict[str, float]] = []
    record = b""  # a stored record, learnt from the first single-put round
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            baselines_first = r % 2 == 1
            # The baselines need the volume and a record: the first round learns them first.
            volume = batch_runs[-1]["bytes"] if batch_runs else 0
            if baselines_first and volume:
                write_runs.append(raw_write(root, int(volume)))
            batch_runs.append(store_put_batch(root / f"batch{r}", batch_msgs, args.batch))
            if not (baselines_first and volume):
                write_runs.append(raw_write(root, int(batch_runs[-1]["bytes"])))
            if baselines_first and r:
                append_runs.append(raw_append(root, record, args.single))
            put, record = store_put(root / f"single{r}", single_msgs)
            put_runs.append(put)
            if not (baselines_first and r):
                append_runs.append(raw_append(root, record, args.single))
        sync = asyncio.run(
            _sync_producers(root / "sync", args.producers, max(20, args.messages // 4000), body)
        )
    p1 = [b["MB_per_s"] / w["MB_per_s"] for b, w in zip(batch_runs, write_runs, strict=True)]
    p1b = [p["msgs_per_s"] / a["msgs_per_s"] for p, a in zip(put_runs, append_runs, strict=True)]
    out = {
        "settings": "defaults (store.dir, backend.url in a temporary directory; tiering on, posix)",
        "message": {"body_bytes": BODY, "keys": 1, "queue_id": "round-robin"},
        "rounds": args.rounds,
        "quick": args.quick,
        # Other work on the machine slows both sides, not always alike: say how busy it was.
        "load_average_1m": {"before": load_before[0], "after": os.getloadavg()[0], "cpus": os.cpu_count()},
        "P1_put_batch": {"messages": args.messages, "batch": args.batch, **_summary(batch_runs)},
        "P1_baseline_raw_write": {"block_bytes": BLOCK, **_summary(write_runs)},
        "P1b_put": {"messages": args.single, **_summary(put_runs)},
        "P1b_baseline_raw_append": {"messages": args.single, **_summary(append_runs)},
        "ratios": {
            "P1_put_batch_vs_raw_write": statistics.median(p1),
            "P1_per_round": [round(x, 4) for x in p1],
            "P1b_put_vs_raw_append": statistics.median(p1b),
            "P1b_per_round": [round(x, 4) for x in p1b],
        },
        "sync_group_commit": sync,
        "targets": {
            "P1_put_batch_vs_raw_write": ">= 0.10",
            "P1b_put_msgs_per_s": ">= 100000",
            "sync_messages_per_fsync": ">= 10 (informational)",
        },
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
