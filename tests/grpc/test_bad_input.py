"""Bad input through the raw stubs: each answers the protocol's Code in the response status,
one log line, no traceback to the client, and the server keeps serving."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.grpc.conftest import GrpcTierd

if TYPE_CHECKING:
    from pathlib import Path


def _send(stub: Any, topic: str, body: bytes) -> Any:
    m = pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        system_properties=pb.SystemProperties(message_id="01ABC", message_type=pb.NORMAL),
    )
    return stub.SendMessage(svc.SendMessageRequest(messages=[m]), timeout=30)


def _receive(stub: Any, topic: str, expr: pb.FilterExpression) -> list[Any]:
    req = svc.ReceiveMessageRequest(
        group=pb.Resource(name="g"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0),
        filter_expression=expr,
        batch_size=1,
        invisible_duration={"seconds": 30},
        long_polling_timeout={"seconds": 1},
    )
    return list(stub.ReceiveMessage(req, timeout=30))


def test_bad_input_gets_the_protocol_codes(tierd: GrpcTierd) -> None:
    channel, stub = tierd.stub()
    with channel:
        assert _send(stub, "bad topic!", b"x").status.code == pb.ILLEGAL_TOPIC
        too_big = _send(stub, "t", b"x" * (1024 * 1024 + 1))  # store.max_message_size: 1 MiB here
        assert too_big.status.code == pb.MESSAGE_BODY_TOO_LARGE
        (sql,) = _receive(stub, "t", pb.FilterExpression(type=pb.SQL, expression="a > 1"))
        assert sql.status.code == pb.NOT_IMPLEMENTED
        assert "SQL92" in sql.status.message
        (bad,) = _receive(stub, "t", pb.FilterExpression(type=pb.TAG, expression="a ||"))
        assert bad.status.code == pb.ILLEGAL_FILTER_EXPRESSION
        ack = stub.AckMessage(
            svc.AckMessageRequest(
                group=pb.Resource(name="g"),
                topic=pb.Resource(name="t"),
                entries=[svc.AckMessageEntry(message_id="x", receipt_handle="not-a-handle")],
            ),
            timeout=30,
        )
        assert ack.status.code == pb.INVALID_RECEIPT_HANDLE
        delayed = pb.Message(
            topic=pb.Resource(name="t"),
            body=b"later",
            system_properties=pb.SystemProperties(message_id="01D", message_type=pb.DELAY),
        )
        r = stub.SendMessage(svc.SendMessageRequest(messages=[delayed]), timeout=30)
        assert r.status.code == pb.ILLEGAL_DELIVERY_TIME  # DELAY without a delivery_timestamp
        assert "delivery_timestamp" in r.status.message
        # Still serving, and nothing of the refused sends was stored.
        ok = _send(stub, "t", b"fine")
        assert ok.status.code == pb.OK
        assert ok.entries[0].offset == 0
    assert "Traceback" not in tierd.proc.output


def test_unknown_topic_when_topics_are_not_created(tmp_path: Path) -> None:
    server = GrpcTierd(tmp_path, auto_create_topics=False)
    try:
        channel, stub = server.stub()
        with channel:
            route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="nope")), timeout=30)
            assert route.status.code == pb.TOPIC_NOT_FOUND
            assert _send(stub, "nope", b"x").status.code == pb.TOPIC_NOT_FOUND
    finally:
        server.proc.kill()
