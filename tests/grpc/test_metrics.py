"""gRPC metrics on the ops listener's /metrics of a real daemon after real gRPC traffic."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.grpc.conftest import GrpcTierd, consumer, producer, receive_until
from tests.grpc.test_client import _message

if TYPE_CHECKING:
    from pathlib import Path


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_grpc_metrics_on_the_ops_listener(tmp_path: Path) -> None:
    server = GrpcTierd(tmp_path, server={"ops_host": "127.0.0.1", "ops_port": 0}, max_delivery_attempts=2)
    try:
        ops = re.search(r"ops listener \S+ \S+ \S+ on (http://\S+)", server.proc.output)
        assert ops is not None, server.proc.output
        with producer(server, "metered") as p:
            for i in range(3):
                p.send(_message("metered", f"m{i}".encode()))
        with consumer(server, "meters", "metered") as c:
            got = receive_until(c, lambda got: len(got) >= 3, invisible=30)
            c.ack(got[0])  # one acked, two stay in flight
            in_flight = httpx.get(f"{ops.group(1)}/metrics", timeout=30).text
        channel, stub = server.stub()
        with channel:
            bad = pb.Message(topic=pb.Resource(name="bad topic!"), body=b"x")
            r = stub.SendMessage(svc.SendMessageRequest(messages=[bad]), timeout=30)
            assert r.status.code == pb.ILLEGAL_TOPIC
        # A lease that runs out twice: one redelivery, then the dead-letter topic.
        with producer(server, "doomed") as p:
            p.send(_message("doomed", b"poison"))
        with consumer(server, "doomers", "doomed") as c:
            receive_until(c, lambda got: len(got) >= 1, invisible=1)  # not acked
            (again,) = receive_until(c, lambda got: len(got) >= 1, invisible=1)
            assert again.delivery_attempt == 2
            assert c.receive(32, 1) == []  # the expired second lease moves it to %DLQ%doomers
        after = _samples(httpx.get(f"{ops.group(1)}/metrics", timeout=30).text)
    finally:
        server.proc.kill()

    before = _samples(in_flight)
    assert before[("tierd_grpc_messages_in_flight", frozenset({("group", "meters")}))] == 2
    ok_sends = ("tierd_grpc_requests_total", frozenset({("rpc", "SendMessage"), ("code", "OK")}))
    assert after[ok_sends] == 4
    bad_sends = ("tierd_grpc_requests_total", frozenset({("rpc", "SendMessage"), ("code", "ILLEGAL_TOPIC")}))
    assert after[bad_sends] == 1
    assert after[("tierd_grpc_requests_total", frozenset({("rpc", "AckMessage"), ("code", "OK")}))] == 1
    assert after[("tierd_grpc_request_duration_seconds_count", frozenset({("rpc", "SendMessage")}))] == 5
    assert after[("tierd_grpc_request_duration_seconds_count", frozenset({("rpc", "ReceiveMessage")}))] >= 4
    assert after[("tierd_grpc_redeliveries_total", frozenset())] == 1
    assert after[("tierd_grpc_dead_letters_total", frozenset())] == 1
    assert after[("tierd_grpc_messages_in_flight", frozenset({("group", "doomers")}))] == 0
