"""P2: ``BlockingMessageStore.tier_now()`` to an S3 server vs raw boto3 PUTs; prints JSON.

The user's path (docs/performance.md, figure P2): a store with the default configuration (only
``store.dir``, the S3 ``[backend]`` and a long ``tiered.dispatch_interval`` set) holds ``--mib``
(256) MiB of 1 KiB bodies with one key and one tag each and explicit queue ids, in ``--queues``
(16) queues, **none of them dispatched to the cold tier before the call** (``--dispatch-interval``,
default 3600 s, keeps the periodic round away; the keys are hashed and the queues' flat files
made by ``tier_now()`` itself). ``tier_now()`` moves all of it to the bucket — flat commitlogs,
consume queues, the key index hand-off, manifests, the ownership check, the capability-probed
conditional first writes, the backend-timeout guard, every request.

Two modes, each with its baseline in the same run, same server:

* bytes (default): a plain boto3 client PUTs the same number of bytes (the flat commitlogs'
  size) as 4 MiB objects, one after another. Figure: the ratio of the median MB/s (target
  >= 0.8).
* many queues (``--per-queue N``, e.g. ``--queues 10000 --per-queue 10``): ``N`` messages per
  queue, ``--mib`` ignored, topics of ``--queues-per-topic`` (8) queues (a topic holds at most
  ``store.max_queues``). The PUTs ``tier_now()`` made are recorded (body sizes) and replayed
  by boto3 with ``tier_now()``'s own upload concurrency (``tiered.max_concurrent_queues``), one
  client, a pool of as many connections. Figure: median ``tier_now()`` seconds over median
  replay seconds (target <= 3).

``--repeat`` (3) rounds per server, each: produce into a fresh store (not timed), time
``tier_now()``, close the store (not timed), then the baseline; each round's objects are deleted
afterwards (moto slows down as it accumulates data). Reported per server: both sides per round,
their medians, the figure and each round's value, and the S3 requests of the median tier_now by
operation. ``--server`` moto, seaweedfs or both (default); both servers run one after the other,
never at once. ``--no-tags`` drops the tags; ``--dispatch-interval 20`` is the shipped default.

Usage: ``python bench/tiering.py [--mib 256] [--queues 16] [--per-queue N] [--repeat 3]
[--server both] [--no-tags] [--dispatch-interval 3600]``.
"""

from __future__ import annotations

import concurrent.futures
import gc
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from tierd import BlockingMessageStore
from tierd.testing.s3server import S3Server, create_bucket
from tierd.testing.workload import (
    BODY,
    bench_main,
    count_requests,
    delete_prefix,
    produce_keyed,
    record_puts,
    spread,
    start_server,
    topics,
    user_config,
)

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

MiB = 1024 * 1024
OBJECT = 4 * MiB
#: Bytes mode: tier_now MB/s over boto3's, at least.
TARGET = 0.8
#: Many-queues mode: tier_now seconds over the replay's, at most.
SLOWDOWN_TARGET = 3.0
#: Seconds the untimed wait for the hot store's dispatch may take.
HOT_DISPATCH_TIMEOUT = 600


def messages_of(args: argparse.Namespace) -> int:
    """Messages a round produces: ``--queues`` × ``--per-queue``, or ``--mib`` of 1 KiB bodies."""
    per_queue: int = args.per_queue
    return int(args.queues) * per_queue if per_queue else int(args.mib) * MiB // BODY


def tier_round(
    server: S3Server, bucket: str, workdir: Path, prefix: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One fresh store: produce (not timed), ``tier_now()`` (timed), close (not timed)."""
    messages = messages_of(args)
    cfg = user_config(
        workdir / prefix, server, bucket, prefix, tiered={"dispatch_interval": args.dispatch_interval}
    )
    store = BlockingMessageStore.open(cfg)
    try:
        t = time.perf_counter()
        per_topic = args.queues_per_topic if args.per_queue else None
        produce_keyed(store, messages, args.queues, tags=args.tags, queues_per_topic=per_topic)
        produce_s = time.perf_counter() - t
        requests = count_requests(store)
        puts = record_puts(store)
        # The hot store's own dispatch (consume queues, key index) is the put path's work, not
        # tiering's: tier_now waits at most 30 s for it, which 10,000 new queues on a loaded
        # machine exceed. Waited for here, untimed.
        if not store.hot.wait_dispatched(HOT_DISPATCH_TIMEOUT):
            raise RuntimeError(
                f"the hot store did not dispatch {messages} messages in {HOT_DISPATCH_TIMEOUT} s"
            )
        gc.collect()  # the untimed produce's garbage is not tier_now's to collect
        t = time.perf_counter()
        report = store.tier_now()
        seconds = time.perf_counter() - t
        calls = dict(sorted(requests.items()))
        if report.committed != messages or report.pending:
            raise RuntimeError(
                f"tier_now committed {report.committed} of {messages} messages ({report.pending} "
                "pending): a periodic dispatch round ran first, or tiering failed"
            )
        payload = sum(
            r.size for t in topics(args.queues, per_topic) for r in store.segments(t, type="COMMIT_LOG")
        )
    finally:
        store.close()
    return {
        "seconds": seconds,
        "payload_bytes": payload,
        "mb_per_s": payload / seconds / 1e6,
        "messages": report.committed,
        "produce_seconds": produce_s,
        "requests": calls,
        "put_sizes": puts,
        "concurrency": cfg.tiered.max_concurrent_queues,
    }


def baseline_put(server: S3Server, bucket: str, payload: int) -> dict[str, Any]:
    """boto3 PutObject of ``payload`` bytes as 4 MiB objects (the last one smaller), in order."""
    sizes = [OBJECT] * (payload // OBJECT) + ([payload % OBJECT] if payload % OBJECT else [])
    return replay_puts(server, bucket, sizes, 1)


def replay_puts(server: S3Server, bucket: str, sizes: list[int], concurrency: int) -> dict[str, Any]:
    """boto3 PutObject of objects of ``sizes`` bytes, ``concurrency`` at a time: a client (and
    its connection) per thread, each thread putting every ``concurrency``-th object."""
    block = os.urandom(max(sizes, default=0) + 8)
    clients = [server.boto3_client() for _ in range(concurrency)]  # made here: not thread-safe

    def put(worker: int) -> None:
        for i in range(worker, len(sizes), concurrency):
            # Distinct content per object (servers hash every body), no gigabytes of randomness.
            body = i.to_bytes(8, "big")[: sizes[i]] + block[8 : sizes[i]]
            clients[worker].put_object(Bucket=bucket, Key=f"raw/{i:08d}", Body=body)

    def warm_up(worker: int) -> None:
        clients[worker].put_object(Bucket=bucket, Key=f"raw/warmup{worker}", Body=b"x")

    try:
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            # Connections set up untimed, as tier_now's are by the store's earlier requests.
            list(pool.map(warm_up, range(concurrency)))
            t = time.perf_counter()
            list(pool.map(put, range(concurrency)))
            seconds = time.perf_counter() - t
    finally:
        for client in clients:
            client.close()
    delete_prefix(server, bucket, "raw/")
    payload = sum(sizes)
    return {
        "seconds": seconds,
        "objects": len(sizes),
        "bytes": payload,
        "concurrency": concurrency,
        "mb_per_s": payload / seconds / 1e6,
    }


def run_server(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    tiered: list[dict[str, Any]] = []
    baselines: list[dict[str, Any]] = []
    with start_server(name, tmp / name) as server:
        bucket = create_bucket(server)
        for i in range(args.repeat):
            prefix = f"round{i}"
            tiered.append(tier_round(server, bucket, tmp / name, prefix, args))
            delete_prefix(server, bucket, prefix + "/")
            if args.per_queue:
                baselines.append(
                    replay_puts(server, bucket, tiered[-1]["put_sizes"], tiered[-1]["concurrency"])
                )
            else:
                baselines.append(baseline_put(server, bucket, tiered[-1]["payload_bytes"]))
            print(
                f"{name} round {i + 1}/{args.repeat}: tier_now {tiered[-1]['seconds']:.2f} s "
                f"({tiered[-1]['mb_per_s']:.1f} MB/s), boto3 PUTs {baselines[-1]['seconds']:.2f} s "
                f"({baselines[-1]['mb_per_s']:.1f} MB/s)",
                file=sys.stderr,
            )
    tier_mb = [r["mb_per_s"] for r in tiered]
    base_mb = [b["mb_per_s"] for b in baselines]
    tier_s = [r["seconds"] for r in tiered]
    base_s = [b["seconds"] for b in baselines]
    median_run = sorted(tiered, key=lambda r: float(r["seconds"]))[len(tiered) // 2]
    out: dict[str, Any] = {
        "server": name,
        "payload_bytes": tiered[0]["payload_bytes"],
        "tier_now_seconds": spread(tier_s),
        "baseline_seconds": spread(base_s),
        "tier_now_mb_per_s": spread(tier_mb),
        "baseline_boto3_put_mb_per_s": spread(base_mb),
    }
    if args.per_queue:
        slowdown = statistics.median(tier_s) / statistics.median(base_s)
        out |= {
            "slowdown_of_medians": round(slowdown, 3),
            "slowdown_per_round": [round(t / b, 3) for t, b in zip(tier_s, base_s, strict=True)],
            "target_slowdown": SLOWDOWN_TARGET,
            "meets_target": slowdown <= SLOWDOWN_TARGET,
            "baseline_concurrency": baselines[0]["concurrency"],
        }
    else:
        ratio = statistics.median(tier_mb) / statistics.median(base_mb)
        out |= {
            "ratio_of_medians": round(ratio, 3),
            "ratio_per_round": [round(t / b, 3) for t, b in zip(tier_mb, base_mb, strict=True)],
            "target": TARGET,
            "meets_target": ratio >= TARGET,
        }
    puts = median_run["put_sizes"]
    return out | {
        "produce_seconds": spread([r["produce_seconds"] for r in tiered]),
        "requests_of_median_round": median_run["requests"],
        "puts_of_median_round": {"count": len(puts), "bytes": sum(puts), "largest": max(puts, default=0)},
        "baseline_objects": baselines[0]["objects"],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--per-queue",
        type=int,
        default=0,
        help="messages per queue (the many-queues mode; --mib is then ignored)",
    )
    parser.add_argument(
        "--queues-per-topic",
        type=int,
        default=8,
        help="many-queues mode: queues of each topic (default 8; the bytes mode uses one topic)",
    )
    parser.add_argument(
        "--no-tags", dest="tags", action="store_false", help="no tag on the messages (default: one each)"
    )
    parser.add_argument(
        "--dispatch-interval",
        type=float,
        default=3600.0,
        help="tiered.dispatch_interval in s (default 3600: nothing tiered before tier_now)",
    )


def main(argv: list[str] | None = None) -> int:
    return bench_main(
        argv,
        doc=__doc__,
        figure="P2",
        what="BlockingMessageStore.tier_now() vs boto3 PutObject: 4 MiB objects of the same bytes, "
        "or (--per-queue) tier_now's own PUTs replayed at its concurrency",
        run_server=run_server,
        add_arguments=add_arguments,
    )


if __name__ == "__main__":
    raise SystemExit(main())
