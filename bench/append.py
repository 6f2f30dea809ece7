"""Hot-store append throughput, side by side with the raw disk in the same run.

Prints one JSON object:
* ``baseline_dd``: ``dd`` writing the same volume to the page cache (bs=1M, no sync);
* ``put``: single ``BlockingMessageStore.put`` of 1 KiB bodies with a key (async flush);
* ``put_batch``: the same messages through ``put_batch`` (numpy batch path);
* ``sync_group_commit``: ``sync`` flush, N concurrent asyncio producers — messages per fsync.
Ratios are figure / baseline. Usage: ``python bench/append.py [--messages N] [--producers P]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tierd import BlockingMessageStore, Message, MessageStore, TierdConfig

BODY = 1024


def _cfg(root: Path, flush: str = "async") -> TierdConfig:
    # The hot store alone: tiering would compete for the CPU (and needs its own cold location).
    return TierdConfig.from_dict(
        {
            "store": {
                "dir": str(root),
                "flush": flush,
                "flush_interval_ms": 200,
                "index_slots": 500_000,
                "index_items": 2_000_000,
            },
            "tiered": {"enabled": False},
        }
    )


def _messages(n: int, topic: str = "bench") -> list[Message]:
    body = os.urandom(BODY)
    return [Message(topic=topic, body=body, keys=(f"key-{i}",), queue_id=i % 8) for i in range(n)]


def bench_dd(volume: int, root: Path) -> dict[str, float]:
    target = root / "dd.out"
    count = max(1, volume // (1 << 20))
    t = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}"], check=True, capture_output=True
    )
    dt = time.perf_counter() - t
    target.unlink()
    return {"bytes": count << 20, "seconds": dt, "MB_per_s": (count << 20) / dt / 1e6}


def bench_put(n: int, root: Path) -> dict[str, float]:
    msgs = _messages(n)
    with BlockingMessageStore.open(_cfg(root)) as store:
        put = store.put
        t = time.perf_counter()
        for m in msgs:
            put(m)
        dt = time.perf_counter() - t
        store.hot.wait_dispatched(60)
    return {"messages": n, "seconds": dt, "msgs_per_s": n / dt, "MB_per_s": n * BODY / dt / 1e6}


def bench_put_batch(n: int, root: Path, batch: int = 1024) -> dict[str, float]:
    msgs = [Message(topic="bench", body=m.body, keys=m.keys) for m in _messages(n)]
    chunks = [msgs[i : i + batch] for i in range(0, n, batch)]
    with BlockingMessageStore.open(_cfg(root)) as store:
        t = time.perf_counter()
        for c in chunks:
            store.put_batch(c)
        dt = time.perf_counter() - t
        t2 = time.perf_counter()
        store.hot.wait_dispatched(120)
        dispatch_tail = time.perf_counter() - t2
        cl_bytes = store.hot.commitlog.max_offset
    return {
        "messages": n,
        "batch": batch,
        "seconds": dt,
        "msgs_per_s": n / dt,
        "MB_per_s": cl_bytes / dt / 1e6,
        "dispatch_tail_seconds": dispatch_tail,
    }


async def _sync_producers(root: Path, producers: int, per_producer: int) -> dict[str, float]:
    async with MessageStore.open(_cfg(root, "sync")) as store:
        body = os.urandom(BODY)

        async def producer(p: int) -> None:
            for i in range(per_producer):
                await store.put(Message(topic="sync", body=body, keys=(f"p{p}-{i}",), queue_id=p % 8))

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=400_000)
    ap.add_argument("--producers", type=int, default=64)
    args = ap.parse_args()
    n = args.messages
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        put_batch = bench_put_batch(n, root / "batch")
        volume = int(put_batch["MB_per_s"] * put_batch["seconds"] * 1e6)
        dd = bench_dd(volume, root)
        put = bench_put(min(n, 200_000), root / "single")
        sync = asyncio.run(_sync_producers(root / "sync", args.producers, max(50, n // 2000)))
    out = {
        "baseline_dd": dd,
        "put": put,
        "put_batch": put_batch,
        "sync_group_commit": sync,
        "ratios": {
            "put_batch_vs_dd_bandwidth": put_batch["MB_per_s"] / dd["MB_per_s"],
            "put_vs_dd_bandwidth": put["MB_per_s"] / dd["MB_per_s"],
        },
        "targets": {
            "put_batch_vs_dd_bandwidth": ">= 0.10",
            "put_msgs_per_s": ">= 100000",
            "sync_messages_per_fsync": ">= 10",
        },
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
