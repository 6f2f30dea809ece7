"""P3: sequential cold consume with ``BlockingMessageStore.get(..., FORCE)`` vs raw boto3 GETs.

The user's path (docs/performance.md, figure P3): a store with the default configuration (only
``store.dir`` and the S3 ``[backend]`` set) tiered ``--mib`` (256) MiB of 1 KiB bodies with one
key each, in ``--queues`` (16) queues, with ``tier_now()`` (setup, not timed). A consumer then
reads the queues one after the other, from offset 0 to the end, with
``store.get(topic, queue, offset, max_count=4096, policy=FORCE)`` — every message decoded into a
``MessageExt``, CRC-checked and checked against its consume-queue unit, read-ahead cache and all.

The baseline, same server, same run: a plain boto3 client GETs every commitlog object of those
queues (as stored: the chunk objects of open segments, sealed objects), one after another, and
reads each body whole — the same bytes, with no decoding.

``--repeat`` (3) rounds per server, each the baseline then the consume; the consume runs on a
store opened for the round (opening, not timed, leaves it with an empty read cache, as after a
restart), so no round profits from the one before. Reported per server: MB/s of commitlog bytes
for both per round, medians, the ratio of the medians (target >= 0.5), each round's ratio, and
the S3 requests of the median consume by operation (``lean_gets_of_median_round``: how many of
its GETs went out as tierd's lean GET, and how many of those were repeated through botocore),
and this process's CPU time per message (the consume's threads, not the S3 server's; steadier
than wall time on a shared machine) with the part spent in the garbage collector, and the
consume's system CPU seconds and minor page faults (memory mapped afresh for received bytes).
``--server`` moto, seaweedfs or both (default; one after the other).

Usage: ``python bench/cold_read.py [--mib 256] [--queues 16] [--repeat 3] [--server both]``.
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from tierd import BlockingMessageStore, ReadPolicy
from tierd.testing.s3server import S3Server, create_bucket
from tierd.testing.workload import (
    BODY,
    TOPIC,
    bench_main,
    count_requests,
    lean_gets,
    list_objects,
    produce_keyed,
    spread,
    start_server,
    user_config,
)

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from tierd.config import TierdConfig

MiB = 1024 * 1024
MAX_COUNT = 4096
TARGET = 0.5
PREFIX = "cold"


def setup(cfg: TierdConfig, messages: int, queues: int) -> dict[str, Any]:
    """Produce and tier the queues (not timed); return what is where."""
    with BlockingMessageStore.open(cfg) as store:
        t = time.perf_counter()
        produce_keyed(store, messages, queues)
        produce_s = time.perf_counter() - t
        t = time.perf_counter()
        report = store.tier_now()
        tier_s = time.perf_counter() - t
        if report.committed != messages or report.pending:
            raise RuntimeError(f"tier_now committed {report.committed} of {messages} messages")
        rows = store.segments(TOPIC, type="COMMIT_LOG")
    return {
        "produce_seconds": produce_s,
        "tier_now_seconds": tier_s,
        "commitlog_bytes": sum(r.size for r in rows),
        "commitlog_segments": len(rows),
        "paths": sorted({r.path for r in rows}),
    }


class _GcClock:
    """Seconds the cyclic garbage collector runs while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


def consume(cfg: TierdConfig, queues: int) -> dict[str, Any]:
    """Open the store (not timed), then read every queue from 0 to its end from the cold tier."""
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready()
        requests = count_requests(store)
        lean_before = lean_gets(store)
        # Opening leaves tens of thousands of objects in reference cycles (the S3 client's
        # models): collected here, not by a full collection inside the timed consume.
        gc.collect()
        got = got_bytes = 0
        gc_clock = _GcClock()
        gc.callbacks.append(gc_clock)
        t, cpu, usage = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
        for queue in range(queues):
            offset, end = 0, store.max_offset(TOPIC, queue)
            while offset < end:
                res = store.get(TOPIC, queue, offset, MAX_COUNT, policy=ReadPolicy.FORCE)
                if res.source != "cold" or not res.messages:
                    raise RuntimeError(f"queue {queue} offset {offset}: {res.status} from {res.source}")
                got += len(res.messages)
                got_bytes += sum(m.size for m in res.messages)
                offset = res.next_offset
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        after = resource.getrusage(resource.RUSAGE_SELF)
        gc.callbacks.remove(gc_clock)
        calls = dict(sorted(requests.items()))
        lean_after = lean_gets(store)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "system_seconds": after.ru_stime - usage.ru_stime,
        "minor_faults": after.ru_minflt - usage.ru_minflt,
        "gc_seconds": gc_clock.seconds,
        "messages": got,
        "bytes": got_bytes,
        "requests": calls,
        "lean_gets": {k: lean_after[k] - lean_before[k] for k in lean_after},
    }


def baseline_get(server: S3Server, bucket: str, keys: list[tuple[str, int]]) -> dict[str, Any]:
    """boto3 GetObject of every key, whole, in order."""
    client = server.boto3_client()
    try:
        client.list_buckets()  # connection set up untimed
        total = 0
        t = time.perf_counter()
        for key, _ in keys:
            total += len(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        seconds = time.perf_counter() - t
    finally:
        client.close()
    return {"seconds": seconds, "bytes": total, "objects": len(keys)}


def run_server(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    messages = args.mib * MiB // BODY
    with start_server(name, tmp / name) as server:
        bucket = create_bucket(server)
        cfg = user_config(tmp / name / "store", server, bucket, PREFIX)
        made = setup(cfg, messages, args.queues)
        # The commitlog objects of the queues: each segment's sealed object or its chunks.
        keys = [
            (k, size)
            for k, size in list_objects(server, bucket, PREFIX + "/")
            if any(k == f"{PREFIX}/{p}" or k.startswith(f"{PREFIX}/{p}.chunks/") for p in made["paths"])
        ]
        base_runs: list[dict[str, Any]] = []
        cold_runs: list[dict[str, Any]] = []
        for i in range(args.repeat):
            base_runs.append(baseline_get(server, bucket, keys))
            cold_runs.append(consume(cfg, args.queues))
            if cold_runs[-1]["messages"] != messages or base_runs[-1]["bytes"] != made["commitlog_bytes"]:
                raise RuntimeError(
                    f"consumed {cold_runs[-1]['messages']} of {messages} messages; baseline read "
                    f"{base_runs[-1]['bytes']} of {made['commitlog_bytes']} bytes"
                )
            print(
                f"{name} round {i + 1}/{args.repeat}: consume "
                f"{cold_runs[-1]['bytes'] / cold_runs[-1]['seconds'] / 1e6:.1f} MB/s, boto3 GET "
                f"{base_runs[-1]['bytes'] / base_runs[-1]['seconds'] / 1e6:.1f} MB/s",
                file=sys.stderr,
            )
    cold_mb = [r["bytes"] / r["seconds"] / 1e6 for r in cold_runs]
    base_mb = [r["bytes"] / r["seconds"] / 1e6 for r in base_runs]
    ratio = statistics.median(cold_mb) / statistics.median(base_mb)
    median_run = sorted(cold_runs, key=lambda r: float(r["seconds"]))[len(cold_runs) // 2]
    return {
        "server": name,
        "commitlog_bytes": made["commitlog_bytes"],
        "messages": messages,
        "consume_mb_per_s": spread(cold_mb),
        "consume_msgs_per_s_median": statistics.median(r["messages"] / r["seconds"] for r in cold_runs),
        "baseline_boto3_get_mb_per_s": spread(base_mb),
        "ratio_of_medians": round(ratio, 3),
        "ratio_per_round": [round(c / b, 3) for c, b in zip(cold_mb, base_mb, strict=True)],
        "consume_cpu_us_per_message": spread([r["cpu_seconds"] / r["messages"] * 1e6 for r in cold_runs]),
        "consume_gc_us_per_message": spread([r["gc_seconds"] / r["messages"] * 1e6 for r in cold_runs]),
        "consume_system_cpu_seconds": spread([r["system_seconds"] for r in cold_runs]),
        "consume_minor_page_faults": spread([r["minor_faults"] for r in cold_runs]),
        "target": TARGET,
        "meets_target": ratio >= TARGET,
        "requests_of_median_round": median_run["requests"],
        "lean_gets_of_median_round": median_run["lean_gets"],
        "baseline_objects": len(keys),
        "setup": {k: v for k, v in made.items() if k != "paths"},
    }


def main(argv: list[str] | None = None) -> int:
    return bench_main(
        argv,
        doc=__doc__,
        figure="P3",
        what="BlockingMessageStore.get(max_count=4096, FORCE), queue after queue, vs boto3 "
        "GetObject of the same commitlog objects",
        run_server=run_server,
    )


if __name__ == "__main__":
    raise SystemExit(main())
