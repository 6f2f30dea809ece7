"""The official RocketMQ Python client, unmodified, against a real ``tierd serve``."""

from __future__ import annotations

from rocketmq import Message

from tests.grpc.conftest import GrpcTierd, consumer, producer, receive_until


def _message(topic: str, body: bytes, tag: str | None = None, *keys: str, **props: str) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for key in keys:
        m.keys = key  # the client's setter adds one key per assignment
    for k, v in props.items():
        m.add_property(k, v)
    return m


def test_send_receive_ack(tierd: GrpcTierd) -> None:
    with producer(tierd, "orders") as p:
        receipt = p.send(_message("orders", b"hello", "paid", "o-1", region="eu"))
    assert receipt.message_id
    assert receipt.offset == 0
    with consumer(tierd, "billing", "orders") as c:
        (m,) = receive_until(c, lambda got: len(got) >= 1)
        assert (m.body, m.tag, m.keys, m.properties) == (b"hello", "paid", {"o-1"}, {"region": "eu"})
        assert m.message_id == receipt.message_id
        assert m.delivery_attempt == 1
        c.ack(m)
        assert c.receive(32, 30) == []  # long polls, then nothing: acked is consumed
