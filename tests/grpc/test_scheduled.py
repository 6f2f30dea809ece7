"""Scheduled (delay / timer) messages over gRPC: the official client's ``delivery_timestamp``
and ``recall_message``, and the raw stubs' refusals — each with the protocol's code."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from rocketmq import Message
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.v5.exception import ClientException

from tests.grpc.conftest import GrpcTierd, consumer, producer, receive_until
from tests.scheduled.conftest import now_ms

if TYPE_CHECKING:
    from typing import Any


def _delayed(topic: str, body: bytes, deliver_at: int | None, message_id: str = "01DELAY") -> Any:
    sp = pb.SystemProperties(message_id=message_id, message_type=pb.DELAY)
    if deliver_at is not None:
        sp.delivery_timestamp.FromMilliseconds(deliver_at)
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp)


def test_client_delivery_timestamp_and_recall(tierd: GrpcTierd) -> None:
    """The official client: a message with a delivery timestamp arrives at (not before) that
    time; one recalled before it is due never arrives; a recall after delivery is refused."""
    with producer(tierd, "t") as p, consumer(tierd, "g", "t") as c:
        # The Python client's delivery_timestamp is in seconds (it fills Timestamp.seconds).
        due_s = now_ms() // 1000 + 4  # 3-4 s ahead: room for a loaded machine
        due = due_s * 1000
        later = Message()
        later.topic, later.body, later.delivery_timestamp = "t", b"later", due_s
        sent = p.send(later)
        assert sent.recall_handle
        gone = Message()
        gone.topic, gone.body, gone.delivery_timestamp = "t", b"recalled", due_s
        recalled = p.send(gone)
        p.recall_message("t", recalled.recall_handle)
        p.recall_message("t", recalled.recall_handle)  # again: OK (a lost answer can be retried)
        (m,) = receive_until(c, lambda got: len(got) >= 1)
        assert m.body == b"later"
        assert m.message_id == sent.message_id
        assert now_ms() >= due, "received before its delivery time"
        with pytest.raises(ClientException) as e:
            p.recall_message("t", sent.recall_handle)
        assert str(pb.BAD_REQUEST) in str(e.value) or "BAD_REQUEST" in str(e.value)
        # The recalled one, due with the other, never arrives: a plain message put after it
        # is the next (and only) thing received.
        marker = Message()
        marker.topic, marker.body = "t", b"marker"
        p.send(marker)
        rest = receive_until(c, lambda got: any(x.body == b"marker" for x in got))
        assert [x.body for x in rest] == [b"marker"]


def test_raw_stubs_refusals(tierd: GrpcTierd) -> None:
    channel, stub = tierd.stub()
    with channel:
        r = stub.SendMessage(svc.SendMessageRequest(messages=[_delayed("t", b"x", None)]), timeout=30)
        assert r.status.code == pb.ILLEGAL_DELIVERY_TIME
        assert "delivery_timestamp" in r.status.message
        past = stub.SendMessage(
            svc.SendMessageRequest(messages=[_delayed("t", b"x", now_ms() - 5000)]), timeout=30
        )
        assert past.status.code == pb.ILLEGAL_DELIVERY_TIME
        assert "not in the future" in past.status.message
        far = now_ms() + 365 * 86_400_000
        beyond = stub.SendMessage(svc.SendMessageRequest(messages=[_delayed("t", b"x", far)]), timeout=30)
        assert beyond.status.code == pb.ILLEGAL_DELIVERY_TIME
        two = [_delayed("t", b"a", now_ms() + 60_000, "01A"), _delayed("t", b"b", now_ms() + 60_000, "01B")]
        batch = stub.SendMessage(svc.SendMessageRequest(messages=two), timeout=30)
        assert batch.status.code == pb.BAD_REQUEST
        ok = stub.SendMessage(
            svc.SendMessageRequest(messages=[_delayed("t", b"x", now_ms() + 600_000)]), timeout=30
        )
        assert ok.status.code == pb.OK, ok.status.message
        handle = ok.entries[0].recall_handle
        assert handle
        first = stub.RecallMessage(
            svc.RecallMessageRequest(topic=pb.Resource(name="t"), recall_handle=handle)
        )
        assert first.status.code == pb.OK
        unknown = stub.RecallMessage(
            svc.RecallMessageRequest(topic=pb.Resource(name="t"), recall_handle="9-9")
        )
        assert unknown.status.code == pb.NOT_FOUND
        garbage = stub.RecallMessage(svc.RecallMessageRequest(topic=pb.Resource(name="t"), recall_handle="x"))
        assert garbage.status.code == pb.NOT_FOUND
        assert "handle" in garbage.status.message
    assert "Traceback" not in tierd.proc.output
