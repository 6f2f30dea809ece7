"""Dead letters and FIFO groups with the official client: after the group's maximum delivery
attempts a message moves to ``%DLQ%<group>`` (readable over HTTP like any topic), and a message
group's next message waits until the previous one is acked or moved there."""

from __future__ import annotations

import base64
import signal
import time
from typing import TYPE_CHECKING, Any

import httpx
from rocketmq import Message
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.grpc.conftest import GrpcTierd, consumer, producer, receive_until

if TYPE_CHECKING:
    from pathlib import Path


def _message(topic: str, body: bytes, group: str | None = None) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    m.keys = f"k-{body.decode()}"
    m.tag = "t"
    m.add_property("origin", "test")
    if group:
        m.message_group = group
    return m


def dlq(server: GrpcTierd, group: str, timeout: float = 30) -> list[dict[str, Any]]:
    """Every message of ``%DLQ%<group>`` over HTTP, polled until there is one (bounded)."""
    deadline = time.monotonic() + timeout
    topic = f"%DLQ%{group}"
    while True:
        url = f"{server.url}/v1/topics/{topic.replace('%', '%25')}/queues/0/messages"
        r = httpx.get(url, params={"offset": 0}, timeout=30)
        if r.status_code == 200 and r.json()["messages"]:
            return list(r.json()["messages"])
        assert time.monotonic() < deadline, f"nothing in {topic} after {timeout} s: {r.status_code} {r.text}"
        time.sleep(0.05)  # polling interval; the deadline bounds the wait


def test_after_the_maximum_attempts_a_message_moves_to_the_dlq(tmp_path: Path) -> None:
    server = GrpcTierd(tmp_path, max_delivery_attempts=2)
    try:
        with producer(server, "jobs") as p:
            receipt = p.send(_message("jobs", b"poison"))
        with consumer(server, "workers", "jobs") as c:
            seen = []
            for attempt in (1, 2):
                (m,) = receive_until(c, lambda got: len(got) >= 1, invisible=1)
                assert (m.message_id, m.delivery_attempt) == (receipt.message_id, attempt)
                seen.append(m)
            # The second lease expires: no third delivery (the group's next receive moves it).
            assert c.receive(32, 3) == []
        (dead,) = dlq(server, "workers")
        assert base64.b64decode(dead["body"]) == b"poison"
        props = dead["properties"]
        assert props["UNIQ_KEY"] == receipt.message_id
        assert props["DLQ_ORIGIN_TOPIC"] == "jobs"
        assert props["DLQ_ORIGIN_MESSAGE_ID"] == receipt.message_id
        assert props["RECONSUME_TIME"] == "1"
        assert (dead["keys"], dead["tags"], props["origin"]) == (["k-poison"], "t", "test")
        # Acked in the original topic: the group's committed offset moved past it.
        groups = httpx.get(f"{server.url}/v1/groups", timeout=30).json()
        assert "workers" in str(groups)
        # A restart neither redelivers it nor copies it again.
        server.proc.proc.send_signal(signal.SIGKILL)
        server.proc.kill()
        server.start()
        with consumer(server, "workers", "jobs") as c:
            assert c.receive(32, 2) == []
        assert len(dlq(server, "workers")) == 1
    finally:
        server.proc.kill()


def test_a_message_groups_next_message_waits_for_the_ack(tierd: GrpcTierd) -> None:
    with producer(tierd, "orders") as p:
        for body in (b"a1", b"a2"):
            p.send(_message("orders", body, group="A"))
        p.send(_message("orders", b"free"))  # no group: never waits
    with consumer(tierd, "fifo", "orders") as c:
        got = receive_until(c, lambda got: {m.body for m in got} >= {b"a1", b"free"}, invisible=30)
        assert sorted(m.body for m in got) == [b"a1", b"free"]  # a2 waits for a1
        assert c.receive(32, 2) == []
        for m in got:
            c.ack(m)
        (a2,) = receive_until(c, lambda got: len(got) >= 1)
        assert a2.body == b"a2"
        c.ack(a2)


def test_a_dead_letter_releases_its_message_group(tmp_path: Path) -> None:
    server = GrpcTierd(tmp_path, max_delivery_attempts=1)
    try:
        with producer(server, "orders") as p:
            for body in (b"b1", b"b2"):
                p.send(_message("orders", body, group="B"))
        with consumer(server, "fifo", "orders") as c:
            (b1,) = receive_until(c, lambda got: len(got) >= 1, invisible=1)
            assert b1.body == b"b1"
            # b1's one attempt expires: it goes to the DLQ and b2 is next.
            (b2,) = receive_until(c, lambda got: len(got) >= 1, invisible=30)
            assert b2.body == b"b2"
            c.ack(b2)
        assert [base64.b64decode(m["body"]) for m in dlq(server, "fifo")] == [b"b1"]
    finally:
        server.proc.kill()


def test_forward_to_dead_letter_queue(tierd: GrpcTierd) -> None:
    """What a FIFO push consumer calls when its own retries are spent (raw stubs: the request
    is the client's)."""
    with producer(tierd, "fwd") as p:
        receipt = p.send(_message("fwd", b"give-up"))
    with consumer(tierd, "pushers", "fwd") as c:
        (m,) = receive_until(c, lambda got: len(got) >= 1, invisible=30)
        channel, stub = tierd.stub()
        with channel:
            request = svc.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name="pushers"),
                topic=pb.Resource(name="fwd"),
                receipt_handle=m.receipt_handle,
                message_id=m.message_id,
                delivery_attempt=1,
                max_delivery_attempts=1,
            )
            assert stub.ForwardMessageToDeadLetterQueue(request, timeout=30).status.code == pb.OK
            stale = svc.ForwardMessageToDeadLetterQueueRequest()
            stale.CopyFrom(request)
            stale.receipt_handle = "bm90LWEtaGFuZGxl"
            bad = stub.ForwardMessageToDeadLetterQueue(stale, timeout=30)
            assert bad.status.code == pb.INVALID_RECEIPT_HANDLE
        assert c.receive(32, 2) == []
    (dead,) = dlq(tierd, "pushers")
    assert dead["properties"]["DLQ_ORIGIN_MESSAGE_ID"] == receipt.message_id
