"""The RocketMQ gRPC API (docs/grpc.md) against in-process ``put_batch``, in the same run.

Prints one JSON object:

* ``send``: ``SendMessage`` through the raw stubs — ``--requests`` requests of ``--batch`` (32)
  messages of 1 KiB each, by ``--callers`` (8) concurrent callers on their own connections —
  against ``in_process``: ``MessageStore.put_batch`` of the very same messages (converted by the
  servicer's own ``to_message``), awaited one after another. ``ratio``: the median of the
  per-round ratios (gRPC msgs/s ÷ in-process msgs/s; target ≥ 0.3). Rounds interleave the two
  sides (odd rounds start with gRPC) so drift and the page cache hit both alike. With each:
  CPU time per request (the server process's, all threads, from ``/proc``; the in-process
  store's process time), which a busy machine moves far less than the rates. And each round,
  the same callers against a server that stores nothing (``noop_*``: the transport's ceiling).
* ``receive_ack``: the official ``SimpleConsumer`` draining a ``--backlog`` (100 k) message
  backlog: ``receive(32, 30)``, then ``ack`` of each message of the batch from 8 threads (the
  client acks one message per call) — messages/s (report).
* ``latency``: producer ``send`` → push consumer listener, one message at a time on an idle
  store, ``--samples`` (300) messages: p50 / p99 (target p99 ≤ 50 ms).
* ``client_send``: the official ``Producer.send``, one message per call, one thread (report:
  it is the client's own cost as much as the server's).

Messages have realistic shapes: a tag (``paid``/``refunded``), one key, two user properties and
the client's message id. The server is a real ``tierd serve`` **subprocess** (tiering off: the
comparison is the produce path); the load runs here. The 1-minute load average before and after
goes into the output: on a shared machine the other work slows every figure.

Named ``grpc_api.py``, not ``grpc.py``: a script's directory comes first on ``sys.path`` (and
mypy names a package-less file by its stem), so ``bench/grpc.py`` would shadow the ``grpc``
package this benchmark, the client and the server import.

Usage: ``python bench/grpc_api.py [--rounds 3] [--requests 1000] [--backlog 100000] [--quick]
[--send-only]`` (``--send-only``: the send comparison alone, about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tierd import MessageStore, TierdConfig
from tierd.grpc.convert import to_message
from tierd.testing.daemon import start_daemon

if TYPE_CHECKING:
    from collections.abc import Callable

BODY = 1024
TAGS = ("paid", "refunded")
#: Threads acking a received batch (the client acks one message per call; an application that
#: wants throughput acks concurrently).
ACKERS = 8
SEND = "/apache.rocketmq.v2.MessagingService/SendMessage"


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
        "grpc": {"enabled": True, "host": "127.0.0.1", "port": 0},
        "log": {"level": "WARNING"},
    }


def _protocol_message(topic: str, i: int, body: bytes) -> Any:
    return pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        user_properties={"region": "eu-west", "source": "bench"},
        system_properties=pb.SystemProperties(
            message_id=f"01BENCH{os.getpid():08X}{i:012X}",
            tag=TAGS[i % 2],
            keys=[f"order-{i}"],
            message_type=pb.NORMAL,
            body_encoding=pb.IDENTITY,
            born_timestamp={"seconds": int(time.time())},
        ),
    )


def _requests(topic: str, requests: int, batch: int) -> list[Any]:
    body = os.urandom(BODY)
    return [
        svc.SendMessageRequest(messages=[_protocol_message(topic, r * batch + j, body) for j in range(batch)])
        for r in range(requests)
    ]


def _start(root: Path) -> tuple[subprocess.Popen[str], str, Callable[[], None]]:
    """A ``tierd serve`` on ``root``: the process, its gRPC endpoint once the store is open, and
    how to stop it."""
    daemon = start_daemon(root, _store(root / "hot"), want_grpc=True)
    assert daemon.grpc is not None
    return daemon.proc, daemon.grpc, daemon.stop


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (all its threads), from /proc: on a
    shared machine the CPU a request costs moves far less than the wall time it takes."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentiles(lat: list[float]) -> dict[str, float]:
    lat = sorted(lat)
    return {
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


# ---------------------------------------------------------------------- send
async def _in_process(root: Path, requests: list[Any]) -> dict[str, float]:
    batches = [[to_message(m, None) for m in r.messages] for r in requests]  # before the clock
    async with MessageStore.open(TierdConfig.from_dict(_store(root))) as store:
        t0, cpu0 = time.perf_counter(), time.process_time()
        for b in batches:
            await store.put_batch(b)
        dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = sum(len(b) for b in batches)
    return {
        "messages": n,
        "seconds": dt,
        "msgs_per_s": n / dt,
        "cpu_us_per_request": cpu / len(batches) * 1e6,
    }


def _grpc_send(root: Path, requests: list[Any], callers: int, noop: bool = False) -> dict[str, float]:
    """Pre-serialized requests, raw bytes on the wire: the callers spend next to nothing.
    ``noop``: against :func:`_noop_server` instead of tierd (the transport's ceiling)."""
    proc, endpoint, stop = _start_noop() if noop else _start(root)
    try:
        payloads = [r.SerializeToString() for r in requests]
        shares = [payloads[i::callers] for i in range(callers)]
        lat: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(callers + 1)

        def caller(share: list[bytes]) -> None:
            # One connection each, as separate application instances would have.
            channel = grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])
            call = channel.unary_unary(SEND)
            call(svc.SendMessageRequest().SerializeToString(), timeout=30)  # connect before the clock
            mine = []
            start.wait()
            for p in share:
                t = time.perf_counter()
                raw = call(p, timeout=60)
                mine.append(time.perf_counter() - t)
                status = svc.SendMessageResponse.FromString(raw).status
                if status.code != pb.OK:
                    errors.append(status.message)
                    break
            channel.close()
            with lock:
                lat.extend(mine)

        threads = [threading.Thread(target=caller, args=(s,)) for s in shares]
        for t in threads:
            t.start()
        start.wait()
        t0, server0, client0 = time.perf_counter(), _cpu_seconds(proc.pid), time.process_time()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        server_cpu, client_cpu = _cpu_seconds(proc.pid) - server0, time.process_time() - client0
        if errors:
            raise RuntimeError(f"SendMessage errors: {errors[:3]}")
    finally:
        stop()
    n = sum(len(r.messages) for r in requests)
    return {
        "messages": n,
        "requests": len(requests),
        "seconds": dt,
        "msgs_per_s": n / dt,
        "server_cpu_us_per_request": server_cpu / len(requests) * 1e6,
        "client_cpu_us_per_request": client_cpu / len(requests) * 1e6,
        **_percentiles(lat),
    }


def _start_noop() -> tuple[subprocess.Popen[str], str, Callable[[], None]]:
    proc = subprocess.Popen([sys.executable, __file__, "--noop-server"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the port, once serving (EOF if it failed: the error is on stderr)
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError(f"the no-op gRPC server did not start: {line!r}")
    return proc, f"127.0.0.1:{line.strip()}", lambda: _stop(proc)


def _noop_server() -> None:
    """The transport's ceiling: a ``grpc.aio`` server, set up as tierd's, that parses each
    ``SendMessage`` and answers an OK entry per message (filled in place, as tierd does) but
    stores nothing. What tierd's gRPC send could reach with a store that cost nothing."""

    async def send(request: Any, context: Any) -> Any:
        response = svc.SendMessageResponse(status=pb.Status(code=pb.OK, message="OK"))
        add = response.entries.add
        for i, m in enumerate(request.messages):
            entry = add(message_id=m.system_properties.message_id, offset=i)
            entry.status.code, entry.status.message = pb.OK, "OK"
        return response

    async def serve() -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            send,
            request_deserializer=svc.SendMessageRequest.FromString,
            response_serializer=svc.SendMessageResponse.SerializeToString,
        )
        server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 100)])
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SEND.split("/")[1], {"SendMessage": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


# ---------------------------------------------------------------------- receive + ack
async def _fill(root: Path, topic: str, backlog: int) -> None:
    body = os.urandom(BODY)
    async with MessageStore.open(TierdConfig.from_dict(_store(root / "hot"))) as store:
        for start in range(0, backlog, 1000):
            await store.put_batch(
                [
                    to_message(_protocol_message(topic, i, body), None)
                    for i in range(start, min(backlog, start + 1000))
                ]
            )


def _config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=30)


def _receive_ack(root: Path, backlog: int) -> dict[str, float]:
    asyncio.run(_fill(root, "backlog", backlog))
    _, endpoint, stop = _start(root)
    try:
        c = SimpleConsumer(
            _config(endpoint), "drainers", {"backlog": FilterExpression("*")}, await_duration=5
        )
        c.startup()
        try:
            pool = ThreadPoolExecutor(ACKERS)
            done, empty = 0, 0
            t0 = time.perf_counter()
            while done < backlog and empty < 3:
                got = c.receive(32, 30)
                if not got:
                    empty += 1
                    continue
                list(pool.map(c.ack, got))  # raises if an ack failed
                done += len(got)
            dt = time.perf_counter() - t0
        finally:
            pool.shutdown()
            c.shutdown()
    finally:
        stop()
    if done < backlog:
        raise RuntimeError(f"drained {done} of {backlog} messages")
    return {"messages": done, "seconds": dt, "msgs_per_s": done / dt}


# ---------------------------------------------------------------------- latency, client send
class _Stamp(MessageListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.arrived: dict[bytes, float] = {}
        self.cond = threading.Condition()

    def consume(self, message: Message) -> ConsumeResult:
        with self.cond:
            self.arrived[message.body] = time.perf_counter()
            self.cond.notify_all()
        return ConsumeResult.SUCCESS


def _message(topic: str, i: int, body: bytes) -> Message:
    m = Message()
    m.topic, m.body, m.tag = topic, body, TAGS[i % 2]
    m.keys = f"order-{i}"
    m.add_property("region", "eu-west")
    m.add_property("source", "bench")
    return m


def _latency_and_client_send(root: Path, samples: int, sends: int) -> dict[str, Any]:
    _, endpoint, stop = _start(root)
    try:
        producer = Producer(_config(endpoint), ("latency", "client"))
        producer.startup()
        stamp = _Stamp()
        consumer = PushConsumer(_config(endpoint), "watchers", stamp, {"latency": FilterExpression("*")})
        consumer.startup()
        try:
            lat = []
            for i in range(-20, samples):  # 20 to warm up
                body = f"{i:08d}".encode() + b"x" * (BODY - 8)
                t0 = time.perf_counter()
                producer.send(_message("latency", i, body))
                with stamp.cond:
                    if not stamp.cond.wait_for(lambda b=body: b in stamp.arrived, 30):  # type: ignore[misc]
                        raise RuntimeError(f"message {i} not delivered to the push consumer in 30 s")
                if i >= 0:
                    lat.append(stamp.arrived[body] - t0)
            body = os.urandom(BODY)
            messages = [_message("client", i, body) for i in range(sends)]
            t0 = time.perf_counter()
            for m in messages:
                producer.send(m)
            dt = time.perf_counter() - t0
        finally:
            consumer.shutdown()
            producer.shutdown()
    finally:
        stop()
    return {
        "latency": {"samples": samples, **_percentiles(lat)},
        "client_send": {"messages": sends, "seconds": dt, "msgs_per_s": sends / dt},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved send rounds (noisy machine)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--callers", type=int, default=8)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--sends", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--send-only", action="store_true", help="the send comparison only (about a minute)")
    ap.add_argument("--noop-server", action="store_true", help=argparse.SUPPRESS)  # _start_noop's child
    args = ap.parse_args()
    if args.noop_server:
        _noop_server()
        return
    if args.quick:
        args.rounds, args.requests, args.backlog, args.samples, args.sends = 1, 100, 2000, 30, 200
    load_before = os.getloadavg()[0]
    requests = _requests("bench", args.requests, args.batch)
    in_runs: list[dict[str, float]] = []
    grpc_runs: list[dict[str, float]] = []
    ratios: list[float] = []
    noop: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        for i in range(args.rounds):
            for side in ("in", "grpc") if i % 2 == 0 else ("grpc", "in"):
                if side == "in":
                    in_runs.append(asyncio.run(_in_process(root / f"in{i}", requests)))
                else:
                    grpc_runs.append(_grpc_send(root / f"grpc{i}", requests, args.callers))
            for d in (root / f"in{i}", root / f"grpc{i}"):
                shutil.rmtree(d, ignore_errors=True)
            ratios.append(grpc_runs[-1]["msgs_per_s"] / in_runs[-1]["msgs_per_s"])
            noop.append(_grpc_send(root, requests, args.callers, noop=True))
        rest: dict[str, Any] = {}
        if not args.send_only:
            rest["receive_ack"] = _receive_ack(root / "drain", args.backlog)
            shutil.rmtree(root / "drain", ignore_errors=True)
            rest.update(_latency_and_client_send(root / "latency", args.samples, args.sends))
    out = {
        "batch": args.batch,
        "callers": args.callers,
        "body_bytes": BODY,
        "send": {
            "in_process_msgs_per_s": statistics.median(r["msgs_per_s"] for r in in_runs),
            "grpc_msgs_per_s": statistics.median(r["msgs_per_s"] for r in grpc_runs),
            "grpc_p50_ms": statistics.median(r["p50_ms"] for r in grpc_runs),
            "grpc_p99_ms": statistics.median(r["p99_ms"] for r in grpc_runs),
            "ratio": statistics.median(ratios),
            "ratios": ratios,
            "in_process_runs_msgs_per_s": [r["msgs_per_s"] for r in in_runs],
            "grpc_runs_msgs_per_s": [r["msgs_per_s"] for r in grpc_runs],
            # CPU per 32-message request: what a request costs, whatever else the machine runs.
            "in_process_cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in in_runs),
            "grpc_server_cpu_us_per_request": statistics.median(
                r["server_cpu_us_per_request"] for r in grpc_runs
            ),
            "grpc_client_cpu_us_per_request": statistics.median(
                r["client_cpu_us_per_request"] for r in grpc_runs
            ),
            # The same callers against a server that stores nothing (_noop_server), each round.
            "noop_server_msgs_per_s": statistics.median(r["msgs_per_s"] for r in noop),
            "noop_server_cpu_us_per_request": statistics.median(r["server_cpu_us_per_request"] for r in noop),
            "noop_ratio": statistics.median(r["msgs_per_s"] for r in noop)
            / statistics.median(r["msgs_per_s"] for r in in_runs),
        },
        **rest,
        "load_avg_1m": {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()},
        "targets": {"send.ratio": ">= 0.3", "latency.p99_ms": "<= 50"},
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
