"""Sequential consume of a cold queue with policy FORCE, beside raw boto3 ranged GETs, same run.

Setup (not timed): ``--mib`` MiB of 1 KiB messages in one queue, tiered to a moto server
subprocess with 64 MiB commitlog segments (most of them sealed, as old data is).

* ``baseline_boto3``: ranged GETs (16 MiB) of every commitlog object of that queue, sequential.
* ``cold_consume``: ``MessageStore.get(..., policy=FORCE)`` from offset 0 to the end, each
  message decoded and CRC-checked; read-ahead batches of up to 16 MiB.
``--repeat`` (3) rounds, each the baseline then the consume (from a cold cache), interleaved so
both see the same machine. Reports MB/s of both per round, the ratio of the medians (target
≥ 0.5) and backend GETs per 16 MiB of commitlog (target ≤ 2: one consume-queue range, one
commitlog range). Usage: ``python bench/cold_read.py [--mib 1024] [--repeat 3]``.

Field note (this VM): moto answers a ranged GET by reading the whole object into fresh memory,
so each 16 MiB GET of a 64 MiB segment costs ~50 ms of server time before the first byte, and
the server — not the client — bounds both sides. Fresh memory is what is slow here: with
``MALLOC_MMAP_THRESHOLD_=4294967295 MALLOC_TRIM_THRESHOLD_=4294967295`` in the environment
(inherited by the moto subprocess) the baseline runs ~2.3x faster (630-680 MB/s) and the consume,
then CPU-bound on decoding, ~200 MB/s. Figures are quoted with the default environment.
The consume's own CPU is ~3.5 s per GiB here; ~0.8 s of it is Python's cyclic GC (full
collections over every object of the process, triggered by decoded messages the consumer
still holds) — it was ~1.3 s while cached batches kept a tuple of Python ints per record.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tierd import Message, MessageStore, ReadPolicy, TierdConfig
from tierd.testing.s3server import start_moto

MSG = 1024
BATCH_BYTES = 16 * 1024 * 1024


class Counter:
    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()

    def __call__(self, model: Any, **_: Any) -> None:
        self.ops[model.name] += 1


def _config(root: Path, endpoint: dict[str, Any], bucket: str) -> TierdConfig:
    return TierdConfig.from_dict(
        {
            "store": {"dir": str(root / "hot"), "index_slots": 1_000_000, "index_items": 4_000_000},
            "backend": {"name": "s3", "url": f"s3://{bucket}/bench", "storage_options": endpoint},
            "tiered": {
                "commitlog_segment_size": 64 << 20,
                "consumequeue_segment_size": 2_000_000,
                "read_ahead_count": 65536,
                "read_ahead_size": BATCH_BYTES,
                "dispatch_interval": 3600,
            },
        }
    )


async def _run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = start_moto(root / "moto")
    try:
        client = server.boto3_client()
        bucket = "cold-read"
        client.create_bucket(Bucket=bucket)
        cfg = _config(root, server.storage_options, bucket)
        n = args.mib * 1024 * 1024 // MSG
        body = os.urandom(MSG - 100)
        async with MessageStore.open(cfg) as store:
            t = time.perf_counter()
            for i in range(0, n, 4096):
                await store.put_batch([Message(topic="cold", body=body, queue_id=0)] * min(4096, n - i))
            produce_s = time.perf_counter() - t
            t = time.perf_counter()
            await store.tier_now()
            tier_s = time.perf_counter() - t
            assert store.tiering is not None
            ff = store.tiering.flat.get("cold", 0)
            assert ff is not None
            cl_bytes = ff.commitlog.commit_offset
            fs = await store.tiering.root.filesystem()  # type: ignore[attr-defined]
            counter = Counter()
            fs.s3.meta.events.register("before-call.s3", counter)
            # Baseline: the same commitlog bytes with raw ranged GETs.
            prefix = "bench/" + ff.commitlog.path_of(0).rsplit("/", 1)[0] + "/"
            keys = [
                (o["Key"], o["Size"])
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", [])
            ]
            rounds = []
            for _ in range(args.repeat):  # interleaved, so both sides see the same machine
                counter.ops.clear()
                t = time.perf_counter()
                raw = 0
                for key, size in keys:
                    for start in range(0, size, BATCH_BYTES):
                        end = min(size, start + BATCH_BYTES) - 1
                        raw += len(
                            client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")[
                                "Body"
                            ].read()
                        )
                base_s = time.perf_counter() - t
                base_gets = counter.ops.get("GetObject", 0)
                counter.ops.clear()
                fetcher = store.router.fetcher
                fetcher.cache.invalidate(("cold", 0))  # every round starts cold
                fetcher.units.invalidate(("cold", 0))
                fetcher._sequential.clear()
                # tierd: sequential consume through the facade, every message decoded and CRC-checked.
                t = time.perf_counter()
                offset, got, got_bytes = 0, 0, 0
                while offset < ff.max_offset:
                    res = await store.get("cold", 0, offset, 4096, policy=ReadPolicy.FORCE)
                    assert res.source == "cold", res.status
                    assert res.messages, res.status
                    got += len(res.messages)
                    got_bytes += sum(m.size for m in res.messages)
                    offset = res.next_offset
                cold_s = time.perf_counter() - t
                rounds.append(
                    {
                        "baseline_MB_per_s": raw / base_s / 1e6,
                        "cold_MB_per_s": got_bytes / cold_s / 1e6,
                        "ratio": (got_bytes / cold_s) / (raw / base_s),
                        "cold_gets": counter.ops.get("GetObject", 0) - base_gets,
                    }
                )
        client.close()
        batches = math.ceil(cl_bytes / BATCH_BYTES)
        cold_median = statistics.median(r["cold_MB_per_s"] for r in rounds)
        base_median = statistics.median(r["baseline_MB_per_s"] for r in rounds)
        return {
            "messages": got,
            "commitlog_bytes": cl_bytes,
            "load_average_after": os.getloadavg(),
            "setup": {
                "produce_seconds": produce_s,
                "tier_seconds": tier_s,
                "segments": len(ff.commitlog.segments),
            },
            "batches_16MiB": batches,
            "rounds": rounds,
            "baseline_boto3_MB_per_s_median": base_median,
            "cold_consume_MB_per_s_median": cold_median,
            "cold_msgs_per_s_median": cold_median * 1e6 * got / got_bytes,
            "ratio_median_of_medians": cold_median / base_median,
            "ratio_per_round": [round(r["ratio"], 3) for r in rounds],
            "gets_per_batch": statistics.median(r["cold_gets"] for r in rounds) / batches,
            "targets": {"ratio": ">= 0.5", "gets_per_batch": "<= 2"},
        }
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=1024, help="MiB of messages in the cold queue (default 1024)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved baseline/consume rounds (default 3)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        out = asyncio.run(_run(args, Path(tmp)))
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
