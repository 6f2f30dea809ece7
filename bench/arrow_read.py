"""Arrow reader (``tierd.arrow``) over a cold tier on a moto S3 server vs raw boto3 GETs.

Setup (not timed): ``--messages`` messages tiered by tierd to a moto server subprocess, shaped
as a topic's usually are — two topics over 8 queues, 100 tags, a unique key and a shared one per
message, a UNIQ_KEY and two more properties, bodies of ~300 bytes with one in ten of ~8 KiB —
in 16 MiB commitlog segments (mostly sealed, as months of history are); then the cold key index
is uploaded (its file sealed at once instead of after ``max_file_age``).

* ``baseline``: boto3 ``get_object`` of every commitlog object of the bucket (sealed segments and
  open segments' chunk objects), whole, one after another — the bytes the reader decodes, moved
  and nothing else.
* ``tierd``: ``tierd.arrow.dataset(url).to_batches()`` over everything, all 16 columns decoded,
  every record validated and CRC-checked; one process, the next parts read and decoded ahead
  in threads while one is handed out (``tierd.spark.parts.read_parts``, bounded).
* ``tierd_one_by_one`` (the A/B): the same with ``fragment_readahead=0`` — parts read one after
  another, each with only its own next piece read ahead (the reader before read-ahead).
* ``tierd_body_only`` (informational): the full scan with ``columns=["body"]``.

``--warmup`` (1) untimed round of each, then ``--repeat`` (5) interleaved rounds (baseline,
tierd, tierd_one_by_one, tierd_body_only), so every source sees the same machine. MB/s is
commitlog bytes per second (the same bytes for every source); the JSON has every run, the
medians, the ratio to the baseline of the medians (target >= 0.5 for ``tierd``) and per round.

**Pushdown**: bytes each read fetched from S3 (manifests and index included, as counted by the
reader): the full scan, a single-key lookup (``keys=``: the index manifest, two small reads per
index file, the one record) and a 1 % tag filter (``tags=``: consume-queue tag codes, then only
those records); the single key's bytes as a fraction of the full scan's (target < 0.1 %).
Usage: ``python bench/arrow_read.py [--messages 120000] [--warmup 1] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import tierd.arrow
from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.testing.s3server import start_moto

BUCKET = "arrow-read"
QUEUES = 8


def _messages(start: int, n: int) -> list[Message]:
    small, large = os.urandom(300), os.urandom(8000)
    return [
        Message(
            topic="orders" if i % 4 else "audit",
            body=large if i % 10 == 0 else small,
            keys=[f"k{i}", f"customer-{i % 5000}"],
            tags=f"t{i % 100}",
            queue_id=i % QUEUES,
            properties={"UNIQ_KEY": f"u{i}", "region": "eu-west-1", "seq": str(i)},
        )
        for i in range(start, start + n)
    ]


def _produce(root: Path, so: dict[str, Any], n: int) -> dict[str, float]:
    cfg = TierdConfig.from_dict(
        {
            "store": {
                "dir": str(root / "hot"),
                "index_slots": 1_000_000,
                "index_items": 4_000_000,
                "default_queues": QUEUES,
            },
            "backend": {"name": "s3", "url": f"s3://{BUCKET}/bench", "storage_options": so},
            "tiered": {
                "commitlog_segment_size": 16 << 20,
                "consumequeue_segment_size": 2_000_000,
                "dispatch_interval": 3600,
            },
        }
    )
    t = time.perf_counter()
    with BlockingMessageStore.open(cfg) as store:
        for i in range(0, n, 4096):
            store.put_batch(_messages(i, min(4096, n - i)))
        produce_s = time.perf_counter() - t
        t = time.perf_counter()
        store.tier_now()
        tier_s = time.perf_counter() - t
        assert store.tiering is not None
        assert store._loop is not None
        index = store.tiering.index
        index.max_file_age_ms = 0  # the daemon waits max_file_age (1 h) before uploading
        asyncio.run_coroutine_threadsafe(index.maintain(), store._loop.loop).result(600)
    return {"produce_seconds": produce_s, "tier_seconds": tier_s}


def _summary(runs: list[tuple[float, int, int]]) -> dict[str, Any]:
    times = [r[0] for r in runs]
    median = statistics.median(times)
    return {
        "seconds": [round(s, 3) for s in times],
        "seconds_median": median,
        "rows": runs[0][1],
        "MB": runs[0][2] / 1e6,
        "MB_per_s": runs[0][2] / median / 1e6,
        "MB_per_s_best": runs[0][2] / min(times) / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=120_000, help="messages to produce (default 120000)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds; the medians count (default 5)")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        server = start_moto(root / "moto")
        try:
            so = server.storage_options
            client = server.boto3_client()
            client.create_bucket(Bucket=BUCKET)
            setup = _produce(root, so, args.messages)
            objects = [
                (o["Key"], int(o["Size"]))
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="bench/")
                for o in page.get("Contents", [])
                if "/COMMIT_LOG/" in o["Key"] and o["Size"] > 0
            ]
            total = sum(size for _, size in objects)
            url = f"s3://{BUCKET}/bench"

            def baseline() -> tuple[float, int, int]:
                t = time.perf_counter()
                got = sum(len(client.get_object(Bucket=BUCKET, Key=key)["Body"].read()) for key, _ in objects)
                assert got == total
                return time.perf_counter() - t, 0, got

            # One dataset for every round, as the baseline keeps its client: each scan still
            # plans from the manifests, on a connected client.
            ds = tierd.arrow.dataset(url, storage_options=so)

            def scan(columns: list[str] | None = None, **tuning: Any) -> tuple[float, int, int]:
                t = time.perf_counter()
                rows = sum(b.num_rows for b in ds.to_batches(columns=columns, **tuning))
                seconds = time.perf_counter() - t
                assert rows == args.messages, rows
                return seconds, rows, total

            def one_by_one() -> tuple[float, int, int]:
                return scan(fragment_readahead=0)

            def body_only() -> tuple[float, int, int]:
                return scan(["body"])

            sources = {
                "baseline": baseline,
                "tierd": scan,
                "tierd_one_by_one": one_by_one,
                "tierd_body_only": body_only,
            }
            for _ in range(args.warmup):
                for run in sources.values():
                    run()
            runs: dict[str, list[tuple[float, int, int]]] = {name: [] for name in sources}
            for _ in range(args.repeat):
                for name, run in sources.items():
                    runs[name].append(run())

            def bytes_of(**kw: Any) -> dict[str, int]:
                ds = tierd.arrow.dataset(url, storage_options=so, **kw)
                rows = ds.count_rows()
                return {"rows": rows, "bytes": ds.bytes_read, "requests": ds.requests}

            key = f"k{args.messages // 2 + 1}"
            pushdown = {
                "full_scan": bytes_of(),
                "single_key": bytes_of(keys=key),
                "tags_1pct": bytes_of(tags="t7"),
            }
            assert pushdown["single_key"]["rows"] == 1
            client.close()
        finally:
            server.stop()
    summaries = {name: _summary(r) for name, r in runs.items()}
    base, ours = summaries["baseline"], summaries["tierd"]
    print(
        json.dumps(
            {
                "benchmark": "arrow_read",
                "messages": args.messages,
                "commitlog_MB": total / 1e6,
                "commitlog_objects": len(objects),
                "setup": setup,
                **summaries,
                "ratio_tierd_vs_baseline": ours["MB_per_s"] / base["MB_per_s"],
                "ratio_tierd_one_by_one_vs_baseline": summaries["tierd_one_by_one"]["MB_per_s"]
                / base["MB_per_s"],
                "ratio_per_round": {
                    name: [round(b[0] / o[0], 3) for b, o in zip(runs["baseline"], runs[name], strict=True)]
                    for name in ("tierd", "tierd_one_by_one")
                },
                "pushdown": {
                    **pushdown,
                    "single_key_fraction_of_full_scan": pushdown["single_key"]["bytes"]
                    / pushdown["full_scan"]["bytes"],
                    "tags_1pct_fraction_of_full_scan": pushdown["tags_1pct"]["bytes"]
                    / pushdown["full_scan"]["bytes"],
                },
                "targets": {
                    "ratio_tierd_vs_baseline": ">= 0.5",
                    "single_key_fraction_of_full_scan": "< 0.001",
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
