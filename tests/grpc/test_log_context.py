"""JSON log lines of gRPC calls carry the call's request id and the names its request carries
(issue 32 §5), on a real ``tierd serve`` driven through the raw stubs."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from tests.grpc.conftest import grpc_config
from tests.service.conftest import TierdProcess, toml
from tests.service.test_observability import json_lines

if TYPE_CHECKING:
    from pathlib import Path


def test_grpc_log_lines_carry_the_request_id_and_names(tmp_path: Path) -> None:
    """A refused send logs one line with the client's ``x-mq-request-id`` and the topic; a
    refused receive without the header gets a generated id, its group and topic; a malformed
    id is replaced; the authorization metadata never reaches the log."""
    cfg = grpc_config(tmp_path)
    cfg["log"] = {"format": "json"}
    path = tmp_path / "tierd.toml"
    path.write_text(toml(cfg))
    proc = TierdProcess(path)
    try:
        port = proc.wait_for(r"RocketMQ gRPC API listening on grpc://[^\s:]+:(\d+)", 60).group(1)
        proc.wait_for(r"ready: ", 60)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            m = pb.Message(
                topic=pb.Resource(name="bad topic!"),
                body=b"x",
                system_properties=pb.SystemProperties(message_id="01ABC", message_type=pb.NORMAL),
            )
            sent = stub.SendMessage(
                svc.SendMessageRequest(messages=[m]),
                metadata=[("x-mq-request-id", "req-grpc-7f3a"), ("authorization", "Signature=s3cr3t-sig")],
                timeout=30,
            )
            assert sent.status.code == pb.ILLEGAL_TOPIC
            req = svc.ReceiveMessageRequest(
                group=pb.Resource(name="billing"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name="orders"), id=-1),
                filter_expression=pb.FilterExpression(type=pb.SQL, expression="a > 1"),
                batch_size=1,
                invisible_duration={"seconds": 30},
                long_polling_timeout={"seconds": 1},
            )
            (received,) = stub.ReceiveMessage(req, timeout=30)
            assert received.status.code == pb.NOT_IMPLEMENTED
            route = stub.QueryRoute(
                svc.QueryRouteRequest(topic=pb.Resource(name="bad/topic")),
                metadata=[("x-mq-request-id", "a b")],
                timeout=30,
            )
            assert route.status.code == pb.ILLEGAL_TOPIC
        proc.wait_for(r"gRPC QueryRoute failed", 30)
        assert proc.terminate() == 0
    finally:
        proc.kill()
    lines = json_lines(proc.output)
    (send,) = [line for line in lines if line["message"].startswith("gRPC SendMessage failed")]
    assert send["request_id"] == "req-grpc-7f3a"
    assert send["topic"] == "bad topic!"
    assert "group" not in send
    (receive,) = [line for line in lines if line["message"].startswith("gRPC ReceiveMessage failed")]
    assert re.fullmatch(r"[0-9a-f]{32}", receive["request_id"])
    assert (receive["topic"], receive["group"]) == ("orders", "billing")
    assert "queue" not in receive  # -1: every queue of the topic
    (query,) = [line for line in lines if line["message"].startswith("gRPC QueryRoute failed")]
    assert re.fullmatch(r"[0-9a-f]{32}", query["request_id"])
    assert query["request_id"] != receive["request_id"]
    assert query["topic"] == "bad/topic"
    assert "s3cr3t-sig" not in proc.output
    # Lines logged outside any call carry none of the fields.
    listening = next(line for line in lines if "RocketMQ gRPC API listening" in line["message"])
    assert not {"request_id", "topic", "queue", "group"} & set(listening)
