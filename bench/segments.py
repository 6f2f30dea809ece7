"""Segment driver benchmark against a moto S3 server subprocess; prints one JSON object.

Measures, in one run:

1. ``put``: raw boto3 ``PutObject`` of ``--count`` × ``--chunk-mib`` objects (the baseline)
   versus the ``s3`` driver committing the same bytes through a FileSegment (one chunk PUT per
   commit). Target: driver throughput ≥ 0.8 × baseline (``put.ratio``).
2. ``seal``: a ``--size-mib`` segment made of ``--chunk-mib`` chunks, sealed by server-side
   composition (UploadPartCopy) versus download-and-reupload (``server_side_copy=False``). Both
   include the verification read of the composed object; ``verify_read_s`` is the time of one
   plain GET of a same-size object, for reference. S3 refuses copy parts under 5 MiB, so 4 MiB
   chunks cannot be copied on the server at all (both modes then do the same work); the same
   measurement is repeated with ``--big-chunk-mib`` chunks (default 8) where copying applies.

Request counts come from botocore/aiobotocore ``before-call`` event hooks (one per API call).
Usage: ``python bench/segments.py [--size-mib 1024] [--count 64] [--chunk-mib 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tierd.drivers.s3 import S3Root
from tierd.drivers.segment import FileSegment, FileType
from tierd.testing.s3server import S3Server, create_bucket, start_moto

MiB = 1024 * 1024


def _block(size: int) -> bytes:
    return os.urandom(size)


def _chunk(block: bytes, i: int) -> bytes:
    # Distinct content per chunk (so CRCs differ) without generating gigabytes of randomness.
    return i.to_bytes(8, "big") + block[8:]


class Counter:
    """Counts API calls by operation name."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()

    def __call__(self, model: Any, **_: Any) -> None:
        self.ops[model.name] += 1


def bench_boto3_put(server: S3Server, bucket: str, block: bytes, count: int) -> dict[str, Any]:
    client = server.boto3_client()
    counter = Counter()
    client.meta.events.register("before-call.s3", counter)
    try:
        client.put_object(Bucket=bucket, Key="warmup", Body=b"x")  # connection set up outside the timing
        counter.ops.clear()
        t = time.perf_counter()
        for i in range(count):
            client.put_object(Bucket=bucket, Key=f"raw/{i:08d}", Body=_chunk(block, i))
        elapsed = time.perf_counter() - t
        # moto slows down as it accumulates data: leave the server as we found it.
        keys = [{"Key": f"raw/{i:08d}"} for i in range(count)]
        for first in range(0, count, 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys[first : first + 1000]})
    finally:
        client.close()
    return {"seconds": elapsed, "mb_per_s": count * len(block) / elapsed / 1e6, "requests": dict(counter.ops)}


async def _open(server: S3Server, bucket: str, counter: Counter, **kwargs: Any) -> S3Root:
    root = S3Root(f"s3://{bucket}/bench", server.storage_options, **kwargs)
    fs = await root.filesystem()
    fs.s3.meta.events.register("before-call.s3", counter)
    return root


async def bench_driver_put(server: S3Server, bucket: str, block: bytes, count: int) -> dict[str, Any]:
    counter = Counter()
    root = await _open(server, bucket, counter)
    try:
        seg = FileSegment(root.driver("put/seg"), FileType.COMMIT_LOG, 0, max_size=1 << 62)
        t = time.perf_counter()
        for i in range(count):
            seg.append(_chunk(block, i), i)
            await seg.commit()
        elapsed = time.perf_counter() - t
        await seg.destroy()
    finally:
        await root.aclose()
    return {"seconds": elapsed, "mb_per_s": count * len(block) / elapsed / 1e6, "requests": dict(counter.ops)}


async def bench_seal(
    server: S3Server, bucket: str, block: bytes, chunks: int, server_side_copy: bool
) -> dict[str, Any]:
    counter = Counter()
    root = await _open(server, bucket, counter, server_side_copy=server_side_copy)
    path = f"seal/{'server' if server_side_copy else 'client'}"
    try:
        d = root.driver(path)
        t = time.perf_counter()
        for i in range(chunks):
            await d.write(i * len(block), _chunk(block, i))
        build = time.perf_counter() - t
        counter.ops.clear()
        t = time.perf_counter()
        await d.seal()
        elapsed = time.perf_counter() - t
        ops = dict(counter.ops)
        size = await d.size()
        await d.delete()
    finally:
        await root.aclose()
    return {
        "seconds": elapsed,
        "build_seconds": build,
        "mb_per_s": size / elapsed / 1e6,
        "requests": ops,
        "request_total": sum(ops.values()),
    }


def bench_plain_get(server: S3Server, bucket: str, block: bytes, chunks: int) -> float:
    """Time of one streaming GET of an object of the segment's size (the verify-read floor)."""
    client = server.boto3_client()
    try:
        mpu = client.create_multipart_upload(Bucket=bucket, Key="plain")
        parts = []
        per_part = max(1, (8 * MiB) // len(block))
        for n, first in enumerate(range(0, chunks, per_part), start=1):
            body = b"".join(_chunk(block, i) for i in range(first, min(first + per_part, chunks)))
            r = client.upload_part(
                Bucket=bucket, Key="plain", UploadId=mpu["UploadId"], PartNumber=n, Body=body
            )
            parts.append({"PartNumber": n, "ETag": r["ETag"]})
        client.complete_multipart_upload(
            Bucket=bucket, Key="plain", UploadId=mpu["UploadId"], MultipartUpload={"Parts": parts}
        )
        t = time.perf_counter()
        body = client.get_object(Bucket=bucket, Key="plain")["Body"]
        while body.read(8 * MiB):
            pass
        elapsed = time.perf_counter() - t
        client.delete_object(Bucket=bucket, Key="plain")
    finally:
        client.close()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=1024, help="segment size for the seal benchmark")
    parser.add_argument("--count", type=int, default=64, help="objects for the PUT benchmark")
    parser.add_argument("--chunk-mib", type=int, default=4, help="object / chunk size")
    parser.add_argument(
        "--big-chunk-mib", type=int, default=8, help="chunk size of the second seal run (0: skip)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the fastest is reported")
    args = parser.parse_args(argv)
    chunk = args.chunk_mib * MiB
    block = _block(chunk)
    seal: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="tierd-bench-") as tmp,
        start_moto(Path(tmp) / "moto") as server,
    ):
        bucket = create_bucket(server)
        raws, drivers = [], []
        for i in range(args.repeat):  # interleaved, so drift on a noisy machine hits both alike
            if i % 2:
                drivers.append(asyncio.run(bench_driver_put(server, bucket, block, args.count)))
            raws.append(bench_boto3_put(server, bucket, block, args.count))
            if not i % 2:
                drivers.append(asyncio.run(bench_driver_put(server, bucket, block, args.count)))
        raw = min(raws, key=lambda r: r["seconds"])
        driver = min(drivers, key=lambda r: r["seconds"])
        for mib in [args.chunk_mib] + ([args.big_chunk_mib] if args.big_chunk_mib else []):
            b = block if mib == args.chunk_mib else _block(mib * MiB)
            chunks = max(1, args.size_mib * MiB // len(b))
            servers: list[dict[str, Any]] = []
            clients: list[dict[str, Any]] = []
            for i in range(args.repeat):
                order = [True, False] if i % 2 == 0 else [False, True]
                for ssc in order:
                    out = asyncio.run(bench_seal(server, bucket, b, chunks, server_side_copy=ssc))
                    (servers if ssc else clients).append(out)
            server_side = min(servers, key=lambda r: r["seconds"])
            client_side = min(clients, key=lambda r: r["seconds"])
            seal[f"chunks_{mib}mib"] = {
                "segment_mib": chunks * len(b) // MiB,
                "chunks": chunks,
                "server_side_compose": server_side,
                "download_reupload": client_side,
                "speedup": client_side["seconds"] / server_side["seconds"],
                "verify_read_s": bench_plain_get(server, bucket, b, chunks),
            }
    result = {
        "server": "moto (subprocess, loopback)",
        "chunk_mib": args.chunk_mib,
        "repeat": args.repeat,
        "put": {
            "objects": args.count,
            "boto3_put": raw,
            "driver_commit": driver,
            "ratio": driver["mb_per_s"] / raw["mb_per_s"],
            "target_ratio": 0.8,
        },
        "seal": seal,
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
