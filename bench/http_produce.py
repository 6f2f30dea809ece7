"""Batch produce over HTTP vs in-process ``put_batch`` of the same batches, in the same run.

Prints one JSON object:
* ``in_process``: ``MessageStore.put_batch`` of B-message batches (1 KiB bodies), awaited one
  after another in one asyncio loop — the floor the HTTP path adds its costs to;
* ``http``: the same batches POSTed to ``/v1/topics/{topic}/messages:batch`` by C concurrent
  clients over keep-alive connections, with p50/p99 request latency;
* ``ratio``: HTTP messages/s divided by in-process messages/s (target ≥ 0.3).

The server is a real ``tierd serve`` **subprocess** and the clients run here: on a 2-core
machine, a server sharing the GIL with its own load generator would measure the client as much
as the server. Clients are threads with one keep-alive socket each that send pre-built HTTP/1.1
requests and read just the status line, headers and ``Content-Length`` bytes of each response
(what ``wrk`` does): on 2 cores, every microsecond the load generator spends is taken from the
server, and ``http.client`` spends ~0.3 ms per request parsing headers with ``email``. Tiering is off: the
comparison is the produce path, not the dispatcher competing for CPU.

Usage: ``python bench/http_produce.py [--batches N] [--batch B] [--clients C]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from tierd import Message, MessageStore, TierdConfig
from tierd.testing.daemon import start_daemon

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


def _read_response(sock: socket.socket, buf: bytes) -> tuple[int, bytes, bytes]:
    """One HTTP/1.1 response: (status, body, bytes already received of the next one)."""
    while b"\r\n\r\n" not in buf:
        more = sock.recv(65536)
        if not more:
            raise RuntimeError("server closed the connection")
        buf += more
    head, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        more = sock.recv(65536)
        if not more:
            raise RuntimeError("server closed the connection")
        rest += more
    return status, rest[:length], rest[length:]


def _http(root: Path, payloads: list[bytes], clients: int, batch: int) -> dict[str, float]:
    with start_daemon(root, _store(root / "hot")) as daemon:
        host, _, port_text = daemon.http.rpartition(":")
        port = int(port_text)
        lat: list[float] = []
        lock = threading.Lock()
        shares = [payloads[i::clients] for i in range(clients)]
        errors: list[str] = []
        start = threading.Barrier(clients + 1)

        def client(share: list[bytes]) -> None:
            sock = socket.create_connection((host, port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = (
                f"POST /v1/topics/bench/messages:batch HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Content-Type: application/json\r\nContent-Length: "
            ).encode()
            requests = [head + str(len(p)).encode() + b"\r\n\r\n" + p for p in share]
            mine = []
            buf = b""
            start.wait()
            for req in requests:
                t = time.perf_counter()
                sock.sendall(req)
                status, body, buf = _read_response(sock, buf)
                mine.append(time.perf_counter() - t)
                if status != 200:
                    errors.append(body.decode()[:200])
                    break
            sock.close()
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
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of each side (noisy machine)")
    args = ap.parse_args()
    batches, payloads = _payloads(args.batches, args.batch)
    in_runs: list[dict[str, float]] = []
    http_runs: list[dict[str, float]] = []
    ratios: list[float] = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        for i in range(args.repeat):
            # Odd rounds start with HTTP: drift and the page cache hit both sides alike.
            for side in ("in", "http") if i % 2 == 0 else ("http", "in"):
                if side == "in":
                    in_runs.append(asyncio.run(_in_process(root / f"inproc{i}", batches)))
                else:
                    http_runs.append(_http(root / f"http{i}", payloads, args.clients, args.batch))
            ratios.append(http_runs[-1]["msgs_per_s"] / in_runs[-1]["msgs_per_s"])
    in_median = statistics.median(r["msgs_per_s"] for r in in_runs)
    http_median = statistics.median(r["msgs_per_s"] for r in http_runs)
    best_in = max(in_runs, key=lambda r: r["msgs_per_s"])
    best_http = max(http_runs, key=lambda r: r["msgs_per_s"])
    out = {
        "batch": args.batch,
        "body_bytes": BODY,
        "in_process": best_in,
        "http": best_http,
        "in_process_runs_msgs_per_s": [r["msgs_per_s"] for r in in_runs],
        "http_runs_msgs_per_s": [r["msgs_per_s"] for r in http_runs],
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "ratio_of_medians": http_median / in_median,
        "load_avg_1m": {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()},
        "ratio_best_vs_best": best_http["msgs_per_s"] / best_in["msgs_per_s"],
        "targets": {"ratio": ">= 0.3 (median of the per-round HTTP / in-process ratios)"},
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
