"""Batch produce over HTTP vs in-process ``put_batch`` of the same batches, in the same run.

Prints one JSON object:
* ``in_process``: ``MessageStore.put_batch`` of B-message batches (1 KiB bodies), awaited one
  after another in one asyncio loop — the floor the HTTP path adds its costs to;
* ``http``: the same batches POSTed to ``/v1/topics/{topic}/messages:batch`` by C concurrent
  clients over keep-alive connections, with p50/p99 request latency;
* ``ratio``: HTTP messages/s divided by in-process messages/s (target ≥ 0.3).

The server is a real ``tierd serve`` **subprocess** and the clients run here: on a 2-core
machine, a server sharing the GIL with its own load generator would measure the client as much
as the server. Clients use the standard library's ``http.client`` on threads (one keep-alive
connection each) because a heavyweight client would again bench itself. Tiering is off, as in
``bench/append.py``: the comparison is the produce path, not the dispatcher competing for CPU.

Usage: ``python bench/http_produce.py [--batches N] [--batch B] [--clients C]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tierd import Message, MessageStore, TierdConfig

BODY = 1024


def _store(root: Path) -> dict[str, dict[str, object]]:
    return {
        "store": {
            "dir": str(root),
            "commitlog_file_size": 256 * 1024 * 1024,
            "flush_interval_ms": 200,
            "index_slots": 500_000,
            "index_items": 2_000_000,
        },
        "tiered": {"enabled": False},
        "server": {"host": "127.0.0.1", "port": 0},
        "log": {"level": "WARNING"},
    }


def _payloads(batches: int, batch: int) -> tuple[list[list[Message]], list[bytes]]:
    body = os.urandom(BODY)
    b64 = base64.b64encode(body).decode()
    msgs, payloads = [], []
    for i in range(batches):
        keys = [f"k-{i}-{j}" for j in range(batch)]
        msgs.append([Message(topic="bench", body=body, keys=(k,)) for k in keys])
        payloads.append(json.dumps({"messages": [{"body": b64, "keys": [k]} for k in keys]}).encode())
    return msgs, payloads


async def _in_process(root: Path, batches: list[list[Message]]) -> dict[str, float]:
    async with MessageStore.open(TierdConfig.from_dict(_store(root))) as store:
        lat = []
        t0 = time.perf_counter()
        for b in batches:
            t = time.perf_counter()
            await store.put_batch(b)
            lat.append(time.perf_counter() - t)
        dt = time.perf_counter() - t0
    n = sum(len(b) for b in batches)
    return {"messages": n, "seconds": dt, "msgs_per_s": n / dt, **_percentiles(lat)}


def _percentiles(lat: list[float]) -> dict[str, float]:
    lat = sorted(lat)
    return {
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


def _start_server(root: Path) -> tuple[subprocess.Popen[str], str, int]:
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "tierd.toml"
    s = _store(root / "hot")
    lines = []
    for section, values in s.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    cfg.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from tierd.cli import main; main()",
            "--config",
            str(cfg),
            "--log-level",
            "INFO",
            "serve",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    host = port = None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 1)
        if not ready:
            continue
        line = proc.stderr.readline()
        if m := re.search(r"listening on http://([\d.]+):(\d+)", line):
            host, port = m.group(1), int(m.group(2))
        if "ready:" in line and host is not None and port is not None:
            # Drain stderr from now on so the server never blocks on a full pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, host, port
    proc.kill()
    raise RuntimeError("tierd serve did not become ready")


def _http(root: Path, payloads: list[bytes], clients: int, batch: int) -> dict[str, float]:
    proc, host, port = _start_server(root)
    try:
        lat: list[float] = []
        lock = threading.Lock()
        shares = [payloads[i::clients] for i in range(clients)]
        errors: list[str] = []
        start = threading.Barrier(clients + 1)

        def client(share: list[bytes]) -> None:
            conn = http.client.HTTPConnection(host, port)
            headers = {"Content-Type": "application/json"}
            mine = []
            start.wait()
            for p in share:
                t = time.perf_counter()
                conn.request("POST", "/v1/topics/bench/messages:batch", p, headers)
                r = conn.getresponse()
                data = r.read()
                mine.append(time.perf_counter() - t)
                if r.status != 200:
                    errors.append(data.decode()[:200])
                    break
            conn.close()
            with lock:
                lat.extend(mine)

        threads = [threading.Thread(target=client, args=(s,)) for s in shares]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"HTTP errors: {errors[:3]}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    n = len(payloads) * batch
    return {
        "messages": n,
        "requests": len(payloads),
        "clients": clients,
        "seconds": dt,
        "msgs_per_s": n / dt,
        **_percentiles(lat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    batches, payloads = _payloads(args.batches, args.batch)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        in_proc = asyncio.run(_in_process(root / "inproc", batches))
        over_http = _http(root / "http", payloads, args.clients, args.batch)
    out = {
        "batch": args.batch,
        "body_bytes": BODY,
        "in_process": in_proc,
        "http": over_http,
        "ratio": over_http["msgs_per_s"] / in_proc["msgs_per_s"],
        "targets": {"ratio": ">= 0.3"},
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
