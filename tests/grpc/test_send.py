"""``SendMessage`` through the raw stubs, as the benchmark and any hand-built client sends: what
each entry of the answer says, and that the stored messages read back as they were sent."""

from __future__ import annotations

import gzip
import time
from typing import TYPE_CHECKING, Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

if TYPE_CHECKING:
    from tests.grpc.conftest import GrpcTierd


def _message(topic: str, body: bytes, **system: Any) -> Any:
    return pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        user_properties={"region": "eu-west"},
        system_properties=pb.SystemProperties(message_type=pb.NORMAL, **system),
    )


def test_each_entry_names_its_message_and_offset(tierd: GrpcTierd) -> None:
    """A batch: one entry per message, OK, at consecutive offsets, with the client's id or —
    for a message sent without one — the offset message id consumers then see. A single
    message (the store's single put) answers the same way. Tag, keys, properties, message
    group and a GZIP body are stored as sent."""
    batch = [
        _message("t", b"first", message_id="01CLIENT0001", tag="paid", keys=["order-1", "k2"]),
        _message("t", b"second"),  # no client id
        _message(
            "t",
            gzip.compress(b"third"),
            message_id="01CLIENT0003",
            body_encoding=pb.GZIP,
            message_group="g1",
        ),
    ]
    channel, stub = tierd.stub()
    with channel:
        sent = stub.SendMessage(svc.SendMessageRequest(messages=batch), timeout=30)
        single = stub.SendMessage(svc.SendMessageRequest(messages=[_message("t", b"alone")]), timeout=30)
        stored = _receive_all(stub, "t", 4)
    assert sent.status.code == pb.OK, sent.status.message
    assert [e.status.code for e in sent.entries] == [pb.OK] * 3
    ids = [e.message_id for e in sent.entries]
    assert ids[0] == "01CLIENT0001"
    assert ids[2] == "01CLIENT0003"
    assert ids[1]
    assert ids[1] not in ("01CLIENT0001", "01CLIENT0003")
    assert single.status.code == pb.OK
    (alone,) = single.entries
    assert alone.status.code == pb.OK
    assert alone.message_id

    assert sorted(m.body for m in stored.values()) == [b"alone", b"first", b"second", b"third"]
    for entry in [*sent.entries, alone]:  # each entry names its message and where it is
        assert stored[entry.message_id].system_properties.queue_offset == entry.offset
    first, second, third = (stored[i] for i in ids)
    assert (first.body, second.body, third.body) == (b"first", b"second", b"third")
    assert first.system_properties.tag == "paid"
    assert set(first.system_properties.keys) == {"order-1", "k2"}
    assert dict(first.user_properties) == dict(second.user_properties) == {"region": "eu-west"}
    assert third.system_properties.message_group == "g1"


def _receive_all(stub: Any, topic: str, count: int) -> dict[str, Any]:
    """Receive (raw stub, every queue of ``topic``) until ``count`` messages came: by id."""
    got: dict[str, Any] = {}
    deadline = time.monotonic() + 60
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count} messages in 60 s"
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name="readers"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            batch_size=32,
            invisible_duration={"seconds": 60},
            long_polling_timeout={"seconds": 5},
        )
        for response in stub.ReceiveMessage(request, timeout=30):
            if response.HasField("message"):
                got[response.message.system_properties.message_id] = response.message
    return got


def test_a_reserved_property_refuses_the_whole_batch(tierd: GrpcTierd) -> None:
    """A user property the store reserves (``KEYS``) is refused with the property named, and no
    message of that request is stored."""
    good = _message("t", b"fine", message_id="01GOOD")
    bad = _message("t", b"sneaky", message_id="01BAD")
    bad.user_properties["KEYS"] = "forged"
    channel, stub = tierd.stub()
    with channel:
        refused = stub.SendMessage(svc.SendMessageRequest(messages=[good, bad]), timeout=30)
        after = stub.SendMessage(svc.SendMessageRequest(messages=[_message("t", b"after")]), timeout=30)
        stored = _receive_all(stub, "t", 1)
    assert refused.status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert "'KEYS'" in refused.status.message
    assert [e.status.code for e in refused.entries] == [pb.ILLEGAL_MESSAGE_PROPERTY_KEY] * 2
    assert [e.message_id for e in refused.entries] == ["01GOOD", "01BAD"]
    assert after.status.code == pb.OK
    assert [m.body for m in stored.values()] == [b"after"]
