"""A cold queue whose objects cannot be loaded at all is fenced, and a read of its cold range
says so: ``OFFSET_FOUND_NULL`` at the offset asked for, with the lost range named
(``GetResult.lost``) — never ``OFFSET_TOO_SMALL``, which a consumer takes for retention and
follows past the whole damaged range as if nothing had been lost. The same over HTTP (``lost`` in
the read's answer) and gRPC (``PullMessage`` answers ``MESSAGE_CORRUPTED`` naming the range, and
``next_offset`` = the offset asked for).

The damage: c/0's first commitlog segment was rolled but its seal never completed (the backend
failed it, then the writer died: the manifest records it unsealed), and its object is gone.
Loading checks an unsealed rolled segment against the size recorded, so the queue cannot be
loaded at all.

bucket: c/0 [segment 0: object removed | 1 | 2]   d/0 [0..N-1]
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from tests.grpc.conftest import GrpcTierd
from tests.service.conftest import service_config
from tierd import BlockingMessageStore, GetStatus, Message, TierdConfig

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config

if TYPE_CHECKING:
    from pathlib import Path

N = 100  # 1.5 KiB bodies: three commitlog segments of MIN_SEGMENT
QUEUES = (("c", 0), ("d", 0))


def _body(topic: str, i: int) -> bytes:
    return b"%s-%03d-" % (topic.encode(), i) + b"x" * 1500


def _config(root: Path, bucket: Path) -> TierdConfig:
    backend = {"name": "posix", "url": str(bucket)}
    return cold_config(root, backend, max_message_size=SMALL_BODY_LIMIT, commitlog_segment_size=MIN_SEGMENT)


def _damaged_bucket(tmp_path: Path, bucket: Path) -> None:
    """Both queues tiered in full into ``bucket`` by a store of its own, then c/0's first
    commitlog segment recorded unsealed in its manifest and its object removed."""
    with BlockingMessageStore.open(_config(tmp_path / "writer", bucket)) as s:
        for topic, qid in QUEUES:
            s.put_batch([Message(topic=topic, body=_body(topic, i), queue_id=qid) for i in range(N)])
        assert s.tier_now().committed == N * len(QUEUES)
    (manifest,) = [p for p in bucket.rglob("MANIFEST.json") if p.parts[-3:-1] == ("c", "0")]
    data = json.loads(manifest.read_bytes())
    (first,) = [s for s in data["segments"] if s["type"] == "COMMIT_LOG" and s["base-offset"] == 0]
    assert first["sealed"], "segment 0 was expected to be sealed (rolled) by tier_now"
    first.update({"sealed": False, "crc32c": None})
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(data))
    (segment,) = [
        p
        for p in bucket.rglob("*")
        if p.is_file()
        and p.parts[-4:-2] == ("c", "0")
        and "COMMIT_LOG" in p.parts
        and p.name.endswith("0" * 20)
    ]
    segment.chmod(0o644)
    segment.unlink()


def test_a_read_of_an_unloadable_queue_names_the_lost_range(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    _damaged_bucket(tmp_path, bucket)
    cfg = _config(tmp_path / "restored", bucket)
    report = BlockingMessageStore.restore(cfg)
    assert [(d.topic, d.queue_id, d.first, d.end, d.meta is None) for d in report.damaged] == [
        ("c", 0, 0, N, False)
    ]
    with BlockingMessageStore.open(cfg) as store:
        d = store.get("d", 0, 0, N)  # the other queue reads in full
        assert [m.body for m in d.messages] == [_body("d", i) for i in range(N)]
        assert (store.min_offset("c", 0), store.max_offset("c", 0)) == (0, N)  # its history counts
        for offset in (0, N // 2, N - 1):
            r = store.get("c", 0, offset, 32)
            assert r.status is GetStatus.OFFSET_FOUND_NULL, r
            assert (r.messages, r.next_offset, r.lost) == ((), offset, (0, N))  # never past it
            assert (r.min_offset, r.max_offset) == (0, N)
        # new messages continue after the damaged range and read as usual; the range stays named
        store.put(Message(topic="c", body=b"new", queue_id=0))
        r = store.get("c", 0, N, 32)
        assert (r.status, [m.body for m in r.messages], r.lost) == (GetStatus.FOUND, [b"new"], None)
        assert store.get("c", 0, 3, 32).lost == (0, N)
        status = store.tiering_status()
        assert status is not None
        damaged: Any = status["damaged"]
        assert [(x["topic"], x["queue_id"], x["first"], x["end"], x["loaded"]) for x in damaged] == [
            ("c", 0, 0, N, False)
        ]


def _pull(stub: Any, topic: str, queue_id: int, offset: int) -> tuple[Any, list[Any], int | None]:
    """(status, messages, next offset) of one PullMessage stream."""
    req = svc.PullMessageRequest(
        group=pb.Resource(name="pullers"),
        message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic),
            id=queue_id,
            permission=pb.READ_WRITE,
            broker=pb.Broker(name="tierd"),
        ),
        offset=offset,
        batch_size=32,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        long_polling_timeout={"seconds": 1},
    )
    status, messages, next_offset = None, [], None
    for r in stub.PullMessage(req, timeout=30):
        kind = r.WhichOneof("content")
        if kind == "status":
            status = r.status
        elif kind == "message":
            messages.append(r.message)
        else:
            next_offset = r.next_offset
    assert status is not None
    return status, messages, next_offset


@pytest.mark.parametrize("offset", [0, N - 1])
def test_http_and_grpc_readers_are_told_the_lost_range(tmp_path: Path, offset: int) -> None:
    root = tmp_path / "server"
    _damaged_bucket(tmp_path, root / "cold")  # where the server's configuration keeps its bucket
    cfg = TierdConfig.from_dict(service_config(root))
    BlockingMessageStore.restore(cfg)
    server = GrpcTierd(root)
    try:
        r = httpx.get(f"{server.url}/v1/topics/c/queues/0/messages", params={"offset": offset}, timeout=30)
        assert r.status_code == 200, r.text
        got = r.json()
        assert (got["status"], got["messages"], got["next_offset"]) == ("OFFSET_FOUND_NULL", [], offset)
        assert got["lost"] == {"first": 0, "end": N}
        assert (got["min_offset"], got["max_offset"]) == (0, N)
        channel = grpc.insecure_channel(server.endpoint)
        try:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            status, messages, next_offset = _pull(stub, "c", 0, offset)
            assert (status.code, messages, next_offset) == (pb.MESSAGE_CORRUPTED, [], offset), status
            assert f"0..{N - 1}" in status.message, status.message
            status, messages, next_offset = _pull(stub, "d", 0, 0)  # the other queue as usual
            assert (status.code, [m.body for m in messages], next_offset) == (
                pb.OK,
                [_body("d", i) for i in range(32)],
                32,
            )
        finally:
            channel.close()
    finally:
        server.proc.kill()
