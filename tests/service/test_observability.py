"""Observability as an operator sees it: per-topic traffic and process metrics on a real
daemon's /metrics, JSON log lines with request ids and the topic they concern, over real
sockets and a real ``tierd serve`` process."""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import socket
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.grpc.conftest import GrpcTierd, consumer, receive_until
from tierd import TierdConfig
from tierd.logs import JsonFormatter, log_context
from tierd.traffic import OTHER

from .conftest import TierdProcess, running, service_config, toml

if TYPE_CHECKING:
    from pathlib import Path

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def traffic(s: Samples, name: str, topic: str) -> float | None:
    return s.get((f"tierd_{name}_total", frozenset({("topic", topic)})))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def read_all(c: httpx.Client, topic: str, queues: int) -> list[bytes]:
    """Every message of ``topic``, queue by queue, through the HTTP read."""
    out: list[bytes] = []
    for q in range(queues):
        offset = 0
        while True:
            r = c.get(f"/v1/topics/{topic}/queues/{q}/messages", params={"offset": offset, "max": 256})
            assert r.status_code == 200, r.text
            body = r.json()
            if not body["messages"]:
                break
            out += [base64.b64decode(m["body"]) for m in body["messages"]]
            offset = body["next_offset"]
    return out


def test_a_batch_counts_each_of_its_messages_and_bytes_per_topic(tmp_path: Path) -> None:
    """A 1,024-message batch is one HTTP request but 1,024 messages: the per-topic counters say
    1,024 produced, and 1,024 consumed once they are read back, with their body bytes."""
    bodies = [f"order-{i}".encode() for i in range(1024)]
    with running(TierdConfig.from_dict(service_config(tmp_path))) as d:
        c = d.client
        r = c.post("/v1/topics/orders/messages:batch", json={"messages": [{"body": b64(b)} for b in bodies]})
        assert r.status_code == 200, r.text
        r = c.post("/v1/topics/refunds/messages", json={"body": b64(b"refund!")})
        assert r.status_code == 200, r.text
        produced = samples(c.get("/metrics").text)
        got = read_all(c, "orders", d.daemon.cfg.store.default_queues)
        assert sorted(got) == sorted(bodies)
        after = samples(c.get("/metrics").text)

    size = sum(map(len, bodies))
    assert traffic(produced, "produced_messages", "orders") == 1024
    assert traffic(produced, "produced_bytes", "orders") == size
    assert traffic(produced, "produced_messages", "refunds") == 1
    assert traffic(produced, "produced_bytes", "refunds") == len(b"refund!")
    assert traffic(produced, "consumed_messages", "orders") in (None, 0)
    assert traffic(after, "consumed_messages", "orders") == 1024
    assert traffic(after, "consumed_bytes", "orders") == size
    assert traffic(after, "consumed_messages", "refunds") in (None, 0)


def test_topics_beyond_the_bound_share_one_other_series(tmp_path: Path) -> None:
    """Topics are user-made: past ``server.metrics_max_topics`` their traffic is summed under
    ``topic="(other)"`` instead of growing the series (and the memory) without bound."""
    cfg = service_config(tmp_path, server={"metrics_max_topics": 2})
    with running(TierdConfig.from_dict(cfg)) as d:
        for n, topic in enumerate(("t1", "t2", "t3", "t4"), 1):
            batch = [{"body": b64(b"xy")}] * n
            r = d.client.post(f"/v1/topics/{topic}/messages:batch", json={"messages": batch})
            assert r.status_code == 200, r.text
        s = samples(d.client.get("/metrics").text)
    produced = "tierd_produced_messages_total"
    per_topic = {dict(labels)["topic"]: value for (name, labels), value in s.items() if name == produced}
    assert per_topic == {"t1": 1, "t2": 2, OTHER: 3 + 4}
    assert traffic(s, "produced_bytes", OTHER) == 2 * 7


def test_the_standard_process_metrics_are_exported(tmp_path: Path) -> None:
    with running(TierdConfig.from_dict(service_config(tmp_path))) as d:
        s = samples(d.client.get("/metrics").text)
    names = {name for name, _ in s}
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert s[(name, frozenset())] > 0, name
    assert "process_max_fds" in names
    assert "python_info" in names
    assert "python_gc_collections_total" in names


def test_grpc_batches_and_receives_count_per_message(tmp_path: Path) -> None:
    """The same counters over gRPC: one SendMessage of five messages is five, and a consumer's
    receives count what they handed out."""
    server = GrpcTierd(tmp_path)
    try:
        channel, stub = server.stub()
        with channel:
            msgs = [
                pb.Message(
                    topic=pb.Resource(name="grpcd"),
                    body=f"g{i}".encode(),
                    system_properties=pb.SystemProperties(message_id=f"id-{i}"),
                )
                for i in range(5)
            ]
            r = stub.SendMessage(svc.SendMessageRequest(messages=msgs), timeout=30)
            assert r.status.code == pb.OK, r
        with consumer(server, "readers", "grpcd") as c:
            got = receive_until(c, lambda got: len(got) >= 5)
            for m in got:
                c.ack(m)
        s = samples(httpx.get(f"{server.url}/metrics", timeout=30).text)
    finally:
        server.proc.kill()
    assert traffic(s, "produced_messages", "grpcd") == 5
    assert traffic(s, "produced_bytes", "grpcd") == 10
    assert traffic(s, "consumed_messages", "grpcd") == len(got) == 5
    assert traffic(s, "consumed_bytes", "grpcd") == 10


def json_lines(output: str) -> list[dict[str, Any]]:
    """Every line of the server's stderr, each of which must be one JSON object."""
    lines = []
    for line in output.splitlines():
        if line.strip():
            lines.append(json.loads(line))
    return lines


def test_json_logs_carry_the_request_id_and_topic(tmp_path: Path) -> None:
    """``log.format = "json"`` on a real ``tierd serve``: a request whose client hangs up mid-body
    logs one line carrying the client's X-Request-Id and the topic; every response echoes the
    id (or a generated one when the client sent none, or a malformed one)."""
    cfg = service_config(tmp_path)
    cfg["log"] = {"format": "json"}
    path = tmp_path / "tierd.toml"
    path.write_text(toml(cfg))
    proc = TierdProcess(path)
    try:
        proc.wait_for(r"ready: ", 60)
        with httpx.Client(base_url=proc.url, timeout=30) as c:
            echoed = c.get("/healthz", headers={"X-Request-Id": "trace-42"}).headers["x-request-id"]
            assert echoed == "trace-42"
            generated = c.get("/healthz").headers["x-request-id"]
            assert re.fullmatch(r"[0-9a-f]{32}", generated)
            forged = c.get("/healthz", headers={"X-Request-Id": "a b\tc"}).headers["x-request-id"]
            assert re.fullmatch(r"[0-9a-f]{32}", forged)
        host, port = re.match(r"http://([^:]+):(\d+)", proc.url).groups()  # type: ignore[union-attr]
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/topics/orders/messages HTTP/1.1\r\n"
                + f"Host: {host}:{port}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 100\r\n"
                b"X-Request-Id: req-7f3a\r\n\r\n"
                b'{"body": '
            )
            # The server has the headers and part of the body: hang up.
        proc.wait_for(r"closed the connection before its request body", 30)
        assert proc.terminate() == 0
    finally:
        proc.kill()
    lines = json_lines(proc.output)
    (hung_up,) = [line for line in lines if "closed the connection" in line["message"]]
    assert hung_up["request_id"] == "req-7f3a"
    assert hung_up["topic"] == "orders"
    assert hung_up["level"] == "INFO"
    assert "queue" not in hung_up
    assert "group" not in hung_up
    # Records logged outside any request carry none of the fields.
    listening = next(line for line in lines if line["message"].startswith("listening on"))
    assert not {"request_id", "topic", "queue", "group"} & set(listening)


def test_the_json_formatter_adds_only_the_fields_bound() -> None:
    """The fields bound for a piece of work (topic, queue, group, request id) are on every line
    logged inside it, a record's own ``extra`` wins, and they are gone after."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tierd.test.observability")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        with log_context(request_id="r1", topic="orders", queue=3, group="billing"):
            logger.info("inside")
            logger.info("own topic", extra={"topic": "refunds"})
        logger.info("after")
    finally:
        logger.removeHandler(handler)
    inside, own, after = (json.loads(line) for line in out.getvalue().splitlines())
    assert {k: inside[k] for k in ("request_id", "topic", "queue", "group")} == {
        "request_id": "r1",
        "topic": "orders",
        "queue": 3,
        "group": "billing",
    }
    assert own["topic"] == "refunds"
    assert own["group"] == "billing"
    assert not {"request_id", "topic", "queue", "group"} & set(after)
