"""Pull-style RPCs (QueryOffset, GetOffset, UpdateOffset, PullMessage) through the raw stubs —
the official Python client has no pull consumer — over the committed-offset store that HTTP
consumer groups and receive / ack groups share."""

from __future__ import annotations

import threading
from typing import Any

import httpx
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.grpc.conftest import GrpcTierd, consumer, receive_until
from tierd.topics import queue_for_group

GROUP = "pullers"


def _send(stub: Any, topic: str, body: bytes, tag: str, message_group: str) -> Any:
    m = pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        system_properties=pb.SystemProperties(
            message_id=f"id-{body.decode()}", message_type=pb.FIFO, tag=tag, message_group=message_group
        ),
    )
    r = stub.SendMessage(svc.SendMessageRequest(messages=[m]), timeout=30)
    assert r.status.code == pb.OK, r.status
    return r.entries[0]


def _queue(topic: str, queue_id: int) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id)


def _pull(
    stub: Any, topic: str, queue_id: int, offset: int, batch: int = 32, tags: str = "*", poll: int = 1
) -> tuple[int, list[Any], int | None]:
    """(status code, messages, next offset) of one PullMessage stream."""
    req = svc.PullMessageRequest(
        group=pb.Resource(name=GROUP),
        message_queue=_queue(topic, queue_id),
        offset=offset,
        batch_size=batch,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression=tags),
        long_polling_timeout={"seconds": poll},
    )
    code, messages, next_offset = None, [], None
    for r in stub.PullMessage(req, timeout=30):
        kind = r.WhichOneof("content")
        if kind == "status":
            code = r.status.code
        elif kind == "message":
            messages.append(r.message)
        else:
            next_offset = r.next_offset
    assert code is not None
    return code, messages, next_offset


def _query(stub: Any, topic: str, queue_id: int, policy: int, **kw: Any) -> Any:
    req = svc.QueryOffsetRequest(message_queue=_queue(topic, queue_id), query_offset_policy=policy, **kw)
    return stub.QueryOffset(req, timeout=30)


def _get(stub: Any, topic: str, queue_id: int, group: str = GROUP) -> Any:
    return stub.GetOffset(
        svc.GetOffsetRequest(group=pb.Resource(name=group), message_queue=_queue(topic, queue_id)), timeout=30
    )


def _update(stub: Any, topic: str, queue_id: int, offset: int, group: str = GROUP) -> Any:
    req = svc.UpdateOffsetRequest(
        group=pb.Resource(name=group), message_queue=_queue(topic, queue_id), offset=offset
    )
    return stub.UpdateOffset(req, timeout=30)


def test_pull_consumer_offsets(tierd: GrpcTierd) -> None:
    channel, stub = tierd.stub()
    with channel:
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="pulled")), timeout=30)
        q = queue_for_group("one", len(route.message_queues))
        for i in range(5):
            entry = _send(stub, "pulled", f"m{i}".encode(), "odd" if i % 2 else "even", "one")
            assert entry.offset == i

        assert _query(stub, "pulled", q, pb.BEGINNING).offset == 0
        assert _query(stub, "pulled", q, pb.END).offset == 5
        assert _query(stub, "pulled", q, pb.TIMESTAMP, timestamp={"seconds": 0}).offset == 0
        assert _query(stub, "pulled", q, pb.TIMESTAMP).status.code == pb.BAD_REQUEST

        # A group that never committed: the client must choose a start itself.
        assert _get(stub, "pulled", q).status.code == pb.OFFSET_NOT_FOUND

        code, got, nxt = _pull(stub, "pulled", q, 0, batch=3)
        assert code == pb.OK
        assert [(m.body, m.system_properties.queue_offset, m.system_properties.tag) for m in got] == [
            (b"m0", 0, "even"),
            (b"m1", 1, "odd"),
            (b"m2", 2, "even"),
        ]
        assert got[0].system_properties.message_id == "id-m0"
        assert nxt == 3
        code, got, nxt = _pull(stub, "pulled", q, 3, tags="even")
        assert (code, [m.body for m in got], nxt) == (pb.OK, [b"m4"], 5)
        # Caught up: an empty answer after the long poll, still saying where to continue.
        assert _pull(stub, "pulled", q, 5) == (pb.MESSAGE_NOT_FOUND, [], 5)
        # Past the end: the protocol's illegal-offset code, and where to continue.
        assert _pull(stub, "pulled", q, 50) == (pb.ILLEGAL_OFFSET, [], 5)

        assert _update(stub, "pulled", q, 3).status.code == pb.OK
        assert (_get(stub, "pulled", q).status.code, _get(stub, "pulled", q).offset) == (pb.OK, 3)
        assert _update(stub, "pulled", q, 99).status.code == pb.ILLEGAL_OFFSET
        assert _get(stub, "pulled", q).offset == 3

        # One committed-offset store: HTTP (and `tierd groups`) sees the gRPC commit.
        offsets = httpx.get(f"{tierd.url}/v1/groups/{GROUP}/offsets", timeout=30).json()
        assert {"topic": "pulled", "queue_id": q, "offset": 3}.items() <= offsets["offsets"][0].items()

        bad_queue = _query(stub, "pulled", len(route.message_queues), pb.END)
        assert bad_queue.status.code == pb.BAD_REQUEST
        assert _get(stub, "pulled", q, group="bad group!").status.code == pb.ILLEGAL_CONSUMER_GROUP
    assert "Traceback" not in tierd.proc.output


def test_pull_long_poll_is_woken_by_a_send(tierd: GrpcTierd) -> None:
    channel, stub = tierd.stub()
    with channel:
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="woken")), timeout=30)
        q = queue_for_group("g", len(route.message_queues))
        result: list[tuple[int, list[Any], int | None]] = []
        puller = threading.Thread(target=lambda: result.append(_pull(stub, "woken", q, 0, poll=25)))
        puller.start()
        _send(stub, "woken", b"late", "t", "g")
        puller.join(30)
        assert not puller.is_alive()
    ((code, got, nxt),) = result
    assert (code, [m.body for m in got], nxt) == (pb.OK, [b"late"], 1)


def test_update_offset_moves_a_receive_group(tierd: GrpcTierd) -> None:
    """A receive / ack group and UpdateOffset share the committed offset: moving it back
    delivers the acked messages again."""
    channel, stub = tierd.stub()
    with channel:
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="shared")), timeout=30)
        q = queue_for_group("k", len(route.message_queues))
        for i in range(3):
            _send(stub, "shared", f"s{i}".encode(), "t", "k")
        with consumer(tierd, GROUP, "shared") as c:
            for _ in range(3):
                (m,) = receive_until(c, lambda got: len(got) >= 1)
                c.ack(m)
            assert _get(stub, "shared", q).offset == 3
            assert _update(stub, "shared", q, 1).status.code == pb.OK
            (again,) = receive_until(c, lambda got: len(got) >= 1)
            assert again.body == b"s1"
