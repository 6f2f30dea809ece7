"""Tiering throughput to a moto S3 server subprocess vs raw boto3 PUTs; prints one JSON object.

Issue target: ``--mib`` (1024) MiB of 1 KiB messages over ``--queues`` (64) queues, tiered with
the default group commit (4 MiB), reach ≥ 0.8 × the throughput of raw boto3 ``PutObject`` of the
same bytes as 4 MiB objects (sequential, same server, same run), with at most
``bytes / 4 MiB + 2 × queues`` PUTs (+ bucket manifests).

Steps (one moto server for all of them):

1. Produce the messages into the hot store with ``put_batch`` (explicit queue ids, round robin)
   and wait until they are dispatched into the consume queues. Not part of any timing.
2. ``--repeat`` (1) times, interleaved: the baseline — boto3 ``PutObject`` of ``payload`` bytes
   as 4 MiB objects, sequentially, objects deleted afterwards — then a tiering run:
   ``TieringService.tier_now()`` of the whole backlog into a fresh prefix (its objects and local
   metadata are removed afterwards, since moto slows down as it accumulates data). One more
   baseline closes the sequence. The fastest baseline and the fastest tiering run are compared.
3. Requests of the tiering run are counted by operation with an aiobotocore
   ``provide-client-params`` hook on the s3 root's own client (``before-send`` counts HTTP
   attempts, retries included), and PutObject calls are classified by key (commitlog chunk,
   consume-queue chunk, manifest, other).

``payload`` = bytes of the flat commitlogs = the produced records (body + header, ≈ 1.1 KiB
each); both throughputs are payload / seconds (consume-queue and manifest bytes are tiering
overhead). ``--profile FILE`` writes cProfile stats of the first tiering run (the event-loop
thread: hot reads, record patching, s3fs/aiobotocore; moto runs in its own process), prints the
top entries to stderr and adds ``tiering.profile_seconds_by_category`` to the JSON (profiling
inflates call-heavy Python code, so read it as proportions). ``--defer-manifests`` is a
diagnostic: no manifest writes on each segment change inside the commit path (``tier_now``
still writes them once at its end). ``--max-concurrent-queues`` overrides the tiered setting.

Usage: ``python bench/tiering.py [--mib 1024] [--queues 64] [--repeat 1] [--profile out.prof]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from backends.s3 import S3Root
from tierd import Message, TierdConfig
from tierd.local.store import HotStore
from tierd.testing.s3server import S3Server, create_bucket, start_moto
from tierd.tiered.metadata import MetadataStore
from tierd.tiered.service import TieringService

KiB = 1024
MiB = 1024 * KiB
OBJECT = 4 * MiB
BODY = KiB


class Counter:
    """Counts S3 API calls by operation; PutObject also by what the key is."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.puts: collections.Counter[str] = collections.Counter()
        self.put_bytes: collections.Counter[str] = collections.Counter()
        #: HTTP requests sent (retries included), from ``before-send``.
        self.http = 0

    def on_send(self, **_: Any) -> None:
        self.http += 1

    def __call__(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.ops[model.name] += 1
        if model.name == "PutObject":
            key = str(params.get("Key", ""))
            kind = (
                "commitlog"
                if "/COMMIT_LOG/" in key
                else "consumequeue"
                if "/CONSUME_QUEUE/" in key
                else "manifest"
                if key.endswith("MANIFEST.json")
                else "other"
            )
            self.puts[kind] += 1
            body = params.get("Body")
            self.put_bytes[kind] += len(body) if isinstance(body, (bytes, bytearray)) else 0

    def clear(self) -> None:
        self.http = 0
        self.ops.clear()
        self.puts.clear()
        self.put_bytes.clear()

    def snapshot(self) -> dict[str, Any]:
        return {
            "by_operation": dict(sorted(self.ops.items())),
            "total": sum(self.ops.values()),
            "http_requests": self.http,
            "put_object": dict(sorted(self.puts.items())),
            "put_object_bytes": dict(sorted(self.put_bytes.items())),
        }


def _config(root: Path, server: S3Server, bucket: str, prefix: str, tiered: dict[str, Any]) -> TierdConfig:
    return TierdConfig.from_dict(
        {
            "store": {"dir": str(root / "hot"), "index_slots": 500_000, "index_items": 4_000_000},
            # Defaults for everything that shapes uploads: group_commit_size 4 MiB,
            # group_commit_count 4096, commitlog_segment_size 1 GiB, consumequeue_segment_size
            # 100 MiB, max_concurrent_queues 16. Timers far away: only tier_now() moves data.
            "tiered": {"dispatch_interval": 3600, "manifest_interval": 3600, **tiered},
            "backend": {
                "name": "s3",
                "url": f"s3://{bucket}/{prefix}",
                "storage_options": server.storage_options,
            },
        }
    )


def produce(hot: HotStore, messages: int, queues: int, batch: int = 4096) -> dict[str, Any]:
    block = os.urandom(64 * KiB)
    t = time.perf_counter()
    for first in range(0, messages, batch):
        msgs = [
            Message(
                topic="bench",
                body=block[(i * 61) % (len(block) - BODY) :][:BODY],
                queue_id=i % queues,
            )
            for i in range(first, min(first + batch, messages))
        ]
        hot.put_batch(msgs)
    appended = time.perf_counter() - t
    if not hot.wait_dispatched(600):
        raise RuntimeError("the hot store did not dispatch the produced messages in 600 s")
    return {
        "messages": messages,
        "seconds": time.perf_counter() - t,
        "append_seconds": appended,
        "body_mb_per_s": messages * BODY / appended / 1e6,
    }


# Where the tiering run's time goes: cProfile "tottime" (time inside each function itself) summed
# by category. The first matching rule wins; built-ins are matched by name.
_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("waiting for moto (epoll)", ("select.epoll",)),
    ("socket send/recv/connect", ("_socket.socket", "socket.close")),
    ("hashing: SigV4 SHA256, MD5, CRC32 (botocore)", ("_hashlib", "binascii")),
    ("CRC32C of chunks (driver)", ("google_crc32c",)),
    ("hot store reads (tierd/local)", ("tierd/local/", "_thread.RLock", "mmap")),
    ("record patching + buffers (numpy, bytes.join)", ("numpy", "of 'bytes' objects", "BytesIO")),
    ("tiering logic (tierd/tiered)", ("tierd/tiered/",)),
    ("S3 driver (backends)", ("backends/",)),
    ("metadata/manifests (pydantic, json)", ("pydantic", "json/")),
    (
        "s3fs/aiobotocore/botocore/aiohttp",
        ("s3fs", "aiobotocore", "botocore", "aiohttp", "yarl", "multidict"),
    ),
    ("asyncio event loop", ("asyncio/",)),
)


def profile_breakdown(stats: pstats.Stats) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, name), row in table.items():
        where = f"{filename}:{name}"
        category = next((c for c, marks in _CATEGORIES if any(m in where for m in marks)), "other")
        out[category] += float(row[2])
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def _record_bytes(hot: HotStore) -> int:
    """Sum of the produced records' sizes (the commitlog also holds end-of-file padding)."""
    total = 0
    for cq in hot.cqs.values():
        total += int(
            cq.read_units(cq.min_offset, cq.max_offset - cq.min_offset)["size"].astype("int64").sum()
        )
    return total


async def tier(cfg: TierdConfig, hot: HotStore, profile: str | None, defer_manifests: bool) -> dict[str, Any]:
    root = S3Root(cfg.backend.url, cfg.backend.storage_options)
    tiering = TieringService(cfg, hot, root=root)
    counter = Counter()
    await tiering.start()
    await asyncio.wait_for(tiering.ready.wait(), 60)
    if defer_manifests:
        # Diagnostic: no manifest writes on every segment change inside the commit path;
        # tier_now() still brings every manifest up to date once, at its end.
        tiering.flat.after_change = None
    fs = await root.filesystem()
    fs.s3.meta.events.register("provide-client-params.s3", counter)
    fs.s3.meta.events.register("before-send.s3", counter.on_send)
    # One request outside the timing sets up the connection pool, as the baseline does.
    await root.call("list_objects_v2", Prefix=root.prefix + "/", MaxKeys=1)
    counter.clear()
    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    if prof is not None:
        prof.enable()
    committed = (await tiering.tier_now()).committed
    if prof is not None:
        prof.disable()
    elapsed = time.perf_counter() - t
    requests = counter.snapshot()
    stats = tiering.dispatcher.stats
    payload = cq_bytes = 0
    lagging = []
    for (topic, qid), ff in tiering.flat.files.items():
        payload += ff.commitlog.commit_offset - ff.commitlog.min_offset
        cq_bytes += ff.consumequeue.commit_offset - ff.consumequeue.min_offset
        hot_cq = hot.queue(topic, qid)
        if hot_cq is None or ff.max_offset != hot_cq.max_offset:
            lagging.append(f"{topic}/{qid}")
    counter.clear()
    await tiering.close()
    breakdown = None
    if prof is not None and profile:
        prof.dump_stats(profile)
        stats_ = pstats.Stats(prof, stream=sys.stderr)
        stats_.sort_stats("tottime").print_stats(30)
        breakdown = profile_breakdown(stats_)
    return {
        "seconds": elapsed,
        "messages": committed,
        "queues_tiered": len(tiering.flat.files),
        "queues_behind": lagging,
        "payload_bytes": payload,
        "consumequeue_bytes": cq_bytes,
        "mb_per_s": payload / elapsed / 1e6,
        "commits": stats.commits,
        "commit_failures": stats.commit_failures,
        "requests": requests,
        "requests_at_close": counter.snapshot()["by_operation"],
        **({"profile_seconds_by_category": breakdown} if breakdown is not None else {}),
    }


def baseline_put(server: S3Server, bucket: str, payload: int) -> dict[str, Any]:
    """boto3 PutObject of ``payload`` bytes as 4 MiB objects (last one smaller), sequentially."""
    block = os.urandom(OBJECT)
    sizes = [OBJECT] * (payload // OBJECT) + ([payload % OBJECT] if payload % OBJECT else [])
    bodies_seen = 0
    client = server.boto3_client()
    counter = collections.Counter[str]()

    def count(model: Any, **_: Any) -> None:
        counter[model.name] += 1

    client.meta.events.register("before-call.s3", count)
    try:
        client.put_object(Bucket=bucket, Key="raw/warmup", Body=b"x")  # connection set up untimed
        counter.clear()
        t = time.perf_counter()
        for i, size in enumerate(sizes):
            # Distinct content per object (moto hashes every body) without gigabytes of randomness.
            body = i.to_bytes(8, "big") + block[8:size] if size > 8 else block[:size]
            client.put_object(Bucket=bucket, Key=f"raw/{i:08d}", Body=body)
            bodies_seen += len(body)
        elapsed = time.perf_counter() - t
        requests = dict(counter)
        keys = [{"Key": f"raw/{i:08d}"} for i in range(len(sizes))] + [{"Key": "raw/warmup"}]
        for first in range(0, len(keys), 1000):  # leave the server as we found it
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys[first : first + 1000]})
    finally:
        client.close()
    assert bodies_seen == payload
    return {
        "objects": len(sizes),
        "object_bytes": OBJECT,
        "seconds": elapsed,
        "mb_per_s": payload / elapsed / 1e6,
        "requests": requests,
    }


def _forget_run(server: S3Server, bucket: str, cfg: TierdConfig, prefix: str) -> None:
    """Delete a tiering run's objects and local metadata, so the next run starts from scratch
    (moto slows down as it accumulates data)."""
    client = server.boto3_client()
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    finally:
        client.close()
    meta = MetadataStore(Path(cfg.store.dir))
    meta.path.unlink(missing_ok=True)
    meta.backup.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=1024, help="MiB of message bodies to produce and tier")
    parser.add_argument("--queues", type=int, default=64, help="queues the messages are spread over")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="baseline/tiering pairs, interleaved; the fastest of each counts",
    )
    parser.add_argument("--profile", default=None, help="write cProfile stats of the first tiering run here")
    parser.add_argument(
        "--max-concurrent-queues", type=int, default=None, help="tiered.max_concurrent_queues (default 16)"
    )
    parser.add_argument(
        "--defer-manifests",
        action="store_true",
        help="diagnostic: skip per-change manifest writes (tier_now still writes them once at its end)",
    )
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.max_concurrent_queues is not None:
        overrides["max_concurrent_queues"] = args.max_concurrent_queues
    messages = args.mib * MiB // BODY
    baselines: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="tierd-bench-") as tmp,
        start_moto(Path(tmp) / "moto") as server,
    ):
        bucket = create_bucket(server)
        cfg = _config(Path(tmp), server, bucket, "tier", overrides)
        hot = HotStore.open(cfg.store)
        try:
            produced = produce(hot, messages, args.queues)
            payload = _record_bytes(hot)
            for i in range(args.repeat):
                baselines.append(baseline_put(server, bucket, payload))
                run_cfg = _config(Path(tmp), server, bucket, f"tier{i}", overrides)
                profile = args.profile if i == 0 else None
                runs.append(asyncio.run(tier(run_cfg, hot, profile, args.defer_manifests)))
                if runs[-1]["payload_bytes"] != payload:
                    raise RuntimeError(
                        f"tiered {runs[-1]['payload_bytes']} bytes, the hot store holds {payload}"
                    )
                if runs[-1]["queues_behind"]:
                    raise RuntimeError(f"tier_now left queues behind: {runs[-1]['queues_behind']}")
                _forget_run(server, bucket, run_cfg, f"tier{i}")
            baselines.append(baseline_put(server, bucket, payload))
        finally:
            hot.close()
    baseline = max(baselines, key=lambda r: float(r["mb_per_s"]))
    tiered = max(runs, key=lambda r: float(r["mb_per_s"]))
    puts = tiered["requests"]["put_object"]
    data_puts = puts.get("commitlog", 0) + puts.get("consumequeue", 0)
    manifests = puts.get("manifest", 0)
    bound = -(-payload // OBJECT) + 2 * args.queues
    result = {
        "server": "moto (subprocess, loopback)",
        "mib": args.mib,
        "queues": args.queues,
        "repeat": args.repeat,
        "defer_manifests": args.defer_manifests,
        "message_body_bytes": BODY,
        "messages": messages,
        "payload_bytes": payload,
        "config": {
            "group_commit_size": cfg.tiered.group_commit_size,
            "group_commit_count": cfg.tiered.group_commit_count,
            "commitlog_segment_size": cfg.tiered.commitlog_segment_size,
            "consumequeue_segment_size": cfg.tiered.consumequeue_segment_size,
            "max_concurrent_queues": cfg.tiered.max_concurrent_queues,
        },
        "produce": produced,
        "tiering": tiered,
        "tiering_runs_mb_per_s": [r["mb_per_s"] for r in runs],
        "baseline_boto3_put": baseline,
        "baseline_runs_mb_per_s": [b["mb_per_s"] for b in baselines],
        "throughput": {
            "tiering_mb_per_s": tiered["mb_per_s"],
            "baseline_mb_per_s": baseline["mb_per_s"],
            "ratio": tiered["mb_per_s"] / baseline["mb_per_s"],
            "target_ratio": 0.8,
            "meets_target": tiered["mb_per_s"] >= 0.8 * baseline["mb_per_s"],
        },
        "puts": {
            "count": data_puts + manifests + puts.get("other", 0),
            "by_kind": puts,
            "bound": bound,
            "bound_formula": "ceil(payload / 4 MiB) + 2 × queues (+ manifest PUTs)",
            "within_bound": data_puts + puts.get("other", 0) <= bound,
            "baseline_objects": baseline["objects"],
        },
        "requests_total": tiered["requests"]["total"],
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
