"""P2: ``BlockingMessageStore.tier_now()`` to an S3 server vs raw boto3 4 MiB PUTs; prints JSON.

The user's path (docs/performance.md, figure P2): a store with the default configuration (only
``store.dir`` and the S3 ``[backend]`` set) holds ``--mib`` (256) MiB of 1 KiB bodies with one
key each, in ``--queues`` (16) queues; ``tier_now()`` moves all of it to the bucket — flat
commitlogs, consume queues, the key index hand-off, manifests, the ownership check, the
capability-probed conditional first writes, the backend-timeout guard, every request.

The baseline, same server, same run: a plain boto3 client PUTs the same number of bytes (the
flat commitlogs' size) as 4 MiB objects, one after another.

``--repeat`` (3) rounds per server, each: produce into a fresh store (not timed), time
``tier_now()``, close the store (not timed), then the baseline; each round's objects are deleted
afterwards (moto slows down as it accumulates data). Reported per server: MB/s of both per
round, their medians, the ratio of the medians (target >= 0.8) and each round's ratio, and the
S3 requests of the median tier_now by operation. ``--server`` moto, seaweedfs or both (default);
both servers run one after the other, never at once.

Usage: ``python bench/tiering.py [--mib 256] [--queues 16] [--repeat 3] [--server both]``.
"""

from __future__ import annotations

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
    TOPIC,
    bench_main,
    count_requests,
    delete_prefix,
    produce_keyed,
    spread,
    start_server,
    user_config,
)

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

MiB = 1024 * 1024
OBJECT = 4 * MiB
TARGET = 0.8


def tier_round(
    server: S3Server, bucket: str, workdir: Path, prefix: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One fresh store: produce (not timed), ``tier_now()`` (timed), close (not timed)."""
    messages = args.mib * MiB // BODY
    cfg = user_config(workdir / prefix, server, bucket, prefix)
    store = BlockingMessageStore.open(cfg)
    try:
        t = time.perf_counter()
        produce_keyed(store, messages, args.queues)
        produce_s = time.perf_counter() - t
        requests = count_requests(store)
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
        payload = sum(r.size for r in store.segments(TOPIC, type="COMMIT_LOG"))
    finally:
        store.close()
    return {
        "seconds": seconds,
        "payload_bytes": payload,
        "mb_per_s": payload / seconds / 1e6,
        "messages": report.committed,
        "produce_seconds": produce_s,
        "requests": calls,
    }


def baseline_put(server: S3Server, bucket: str, payload: int) -> dict[str, Any]:
    """boto3 PutObject of ``payload`` bytes as 4 MiB objects (the last one smaller), in order."""
    block = os.urandom(OBJECT)
    sizes = [OBJECT] * (payload // OBJECT) + ([payload % OBJECT] if payload % OBJECT else [])
    client = server.boto3_client()
    try:
        client.put_object(Bucket=bucket, Key="raw/warmup", Body=b"x")  # connection set up untimed
        t = time.perf_counter()
        for i, size in enumerate(sizes):
            # Distinct content per object (servers hash every body), no gigabytes of randomness.
            client.put_object(Bucket=bucket, Key=f"raw/{i:08d}", Body=i.to_bytes(8, "big") + block[8:size])
        seconds = time.perf_counter() - t
    finally:
        client.close()
    delete_prefix(server, bucket, "raw/")
    return {"seconds": seconds, "objects": len(sizes), "mb_per_s": payload / seconds / 1e6}


def run_server(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    tiered: list[dict[str, Any]] = []
    baselines: list[dict[str, Any]] = []
    with start_server(name, tmp / name) as server:
        bucket = create_bucket(server)
        for i in range(args.repeat):
            prefix = f"round{i}"
            tiered.append(tier_round(server, bucket, tmp / name, prefix, args))
            delete_prefix(server, bucket, prefix + "/")
            baselines.append(baseline_put(server, bucket, tiered[-1]["payload_bytes"]))
            print(
                f"{name} round {i + 1}/{args.repeat}: tier_now {tiered[-1]['mb_per_s']:.1f} MB/s, "
                f"boto3 PUT {baselines[-1]['mb_per_s']:.1f} MB/s",
                file=sys.stderr,
            )
    tier_mb = [r["mb_per_s"] for r in tiered]
    base_mb = [b["mb_per_s"] for b in baselines]
    median_run = sorted(tiered, key=lambda r: float(r["mb_per_s"]))[len(tiered) // 2]
    ratio = statistics.median(tier_mb) / statistics.median(base_mb)
    return {
        "server": name,
        "payload_bytes": tiered[0]["payload_bytes"],
        "tier_now_mb_per_s": spread(tier_mb),
        "baseline_boto3_put_mb_per_s": spread(base_mb),
        "ratio_of_medians": round(ratio, 3),
        "ratio_per_round": [round(t / b, 3) for t, b in zip(tier_mb, base_mb, strict=True)],
        "target": TARGET,
        "meets_target": ratio >= TARGET,
        "tier_now_seconds": spread([r["seconds"] for r in tiered]),
        "produce_seconds": spread([r["produce_seconds"] for r in tiered]),
        "requests_of_median_round": median_run["requests"],
        "baseline_objects": baselines[0]["objects"],
    }


def main(argv: list[str] | None = None) -> int:
    return bench_main(
        argv,
        doc=__doc__,
        figure="P2",
        what="BlockingMessageStore.tier_now() vs boto3 PutObject of 4 MiB objects, same bytes",
        run_server=run_server,
    )


if __name__ == "__main__":
    raise SystemExit(main())
