"""Replay of a cold queue with a tag that matches 1 % of its messages, beside the same replay
without a filter, same run: backend bytes fetched, backend reads and wall time.

Setup (not timed): ``--mib`` MiB of 1 KiB messages in one queue, every message tagged
``common`` except a random 1 % (``--share``) tagged ``rare``, tiered to the backend
(``--backend``: a SeaweedFS or moto S3 server subprocess, or a posix directory), default
tiered settings.

Each round, from a cold cache (read-ahead cache and unit cache emptied):

* ``unfiltered``: ``MessageStore.get(..., max_count, policy=FORCE)`` from offset 0 to the end —
  every message fetched, decoded and CRC-checked (what a consumer filtering client-side pays);
* ``filtered``: the same with ``tags="rare"`` — units skipped on their tags code, only the
  ranges of matching records fetched (``tiered.filter_read_gap`` coalesces neighbours).

Rounds alternate which side goes first. Bytes are counted by the store's backend observer
(every successful driver read: consume-queue and commitlog). Reports medians and the ratios
(target: filtered bytes ≤ 5 % of unfiltered). JSON on stdout.
Usage: ``python bench/filtered_read.py [--mib 256] [--repeat 3] [--backend seaweedfs]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tierd import Message, MessageStore, ReadPolicy, TierdConfig
from tierd.testing.s3server import S3Server, create_bucket, start_moto, start_seaweedfs

MSG = 1024
TOPIC = "replay"


def _config(root: Path, backend: dict[str, Any], gap: int | None) -> TierdConfig:
    tiered: dict[str, Any] = {"dispatch_interval": 3600}
    if gap is not None:
        tiered["filter_read_gap"] = gap
    return TierdConfig.from_dict(
        {
            # Small key index files: this bench stores no keys, and the default preallocates 420 MB.
            "store": {"dir": str(root / "hot"), "index_slots": 100_000, "index_items": 400_000},
            "backend": backend,
            "tiered": tiered,
        }
    )


class Meter:
    """The backend observer: bytes and count of successful reads."""

    def __init__(self) -> None:
        self.bytes = 0
        self.reads = 0

    def __call__(self, operation: str, seconds: float, nbytes: int, ok: bool) -> None:
        if operation == "read" and ok:
            self.bytes += nbytes
            self.reads += 1


async def _replay(store: MessageStore, end: int, max_count: int, tags: str | None) -> tuple[int, int]:
    """Consume the cold queue from 0 to ``end`` as a consumer following next_offset does."""
    fetcher = store.router.fetcher
    fetcher.cache.invalidate((TOPIC, 0))  # every replay starts cold
    fetcher.units.invalidate((TOPIC, 0))
    fetcher._sequential.clear()
    offset = got = nbytes = 0
    while offset < end:
        r = await store.get(TOPIC, 0, offset, max_count, policy=ReadPolicy.FORCE, tags=tags)
        assert r.source == "cold", r
        assert r.next_offset > offset, r
        got += len(r.messages)
        nbytes += sum(len(m.body) for m in r.messages)
        offset = r.next_offset
    return got, nbytes


async def _run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    server: S3Server | None = None
    if args.backend == "posix":
        backend: dict[str, Any] = {"name": "posix", "url": str(root / "cold")}
    else:
        server = (start_seaweedfs if args.backend == "seaweedfs" else start_moto)(root / args.backend)
        bucket = create_bucket(server)
        backend = {"name": "s3", "url": f"s3://{bucket}/bench", "storage_options": server.storage_options}
    try:
        n = args.mib * 1024 * 1024 // MSG
        rng = random.Random(19)
        rare = [rng.random() < args.share for _ in range(n)]
        body = os.urandom(MSG - 100)
        cfg = _config(root, backend, args.filter_read_gap)
        async with MessageStore.open(cfg) as store:
            t = time.perf_counter()
            for i in range(0, n, 4096):
                await store.put_batch(
                    [
                        Message(topic=TOPIC, body=body, queue_id=0, tags="rare" if rare[j] else "common")
                        for j in range(i, min(n, i + 4096))
                    ]
                )
            await store.tier_now()
            setup_s = time.perf_counter() - t
            assert store.tiering is not None
            ff = store.tiering.flat.get(TOPIC, 0)
            assert ff is not None
            assert ff.max_offset == n
            meter = Meter()
            store.tiering.root.observer = meter
            rounds = []
            for k in range(args.repeat):
                row: dict[str, Any] = {}
                sides = [("unfiltered", None), ("filtered", "rare")]
                for name, tags in sides if k % 2 == 0 else sides[::-1]:
                    meter.bytes = meter.reads = 0
                    t = time.perf_counter()
                    got, _ = await _replay(store, n, args.max_count, tags)
                    row[name] = {
                        "seconds": time.perf_counter() - t,
                        "messages": got,
                        "backend_bytes": meter.bytes,
                        "backend_reads": meter.reads,
                    }
                assert row["unfiltered"]["messages"] == n
                assert row["filtered"]["messages"] == sum(rare)
                row["bytes_ratio"] = row["filtered"]["backend_bytes"] / row["unfiltered"]["backend_bytes"]
                row["time_ratio"] = row["filtered"]["seconds"] / row["unfiltered"]["seconds"]
                rounds.append(row)
            cl_bytes = ff.commitlog.commit_offset
            stats = store.router.fetcher.cache.stats
        med = {
            side: {
                key: statistics.median(r[side][key] for r in rounds)
                for key in ("seconds", "backend_bytes", "backend_reads")
            }
            for side in ("unfiltered", "filtered")
        }
        return {
            "backend": args.backend,
            "messages": n,
            "matching_messages": sum(rare),
            "commitlog_bytes": cl_bytes,
            "max_count": args.max_count,
            "filter_read_gap": cfg.tiered.filter_read_gap,
            "setup_seconds": setup_s,
            "load_average_after": os.getloadavg(),
            "rounds": rounds,
            "median": med,
            "bytes_ratio_median": statistics.median(r["bytes_ratio"] for r in rounds),
            "time_ratio_median": statistics.median(r["time_ratio"] for r in rounds),
            "filter_skipped_messages": stats.filter_skipped,
            "targets": {"bytes_ratio": "<= 0.05"},
        }
    finally:
        if server is not None:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=256, help="MiB of messages in the cold queue (default 256)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds, each both replays (default 3)")
    ap.add_argument("--share", type=float, default=0.01, help="share of messages with the rare tag")
    ap.add_argument("--max-count", type=int, default=1024, help="max_count of each get (default 1024)")
    ap.add_argument("--backend", choices=["seaweedfs", "moto", "posix"], default="seaweedfs")
    ap.add_argument(
        "--filter-read-gap", type=int, default=None, help="tiered.filter_read_gap (default: the setting's)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        out = asyncio.run(_run(args, Path(tmp)))
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
