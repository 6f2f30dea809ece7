"""The gRPC API routes a created topic over its own queue count (docs/topics.md), and knows a
created topic before its first message — with topics not auto-created, too."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.grpc.conftest import GrpcTierd

if TYPE_CHECKING:
    from pathlib import Path


def test_query_route_answers_the_created_queue_count(tmp_path: Path) -> None:
    server = GrpcTierd(tmp_path, auto_create_topics=False)
    try:
        made = httpx.post(f"{server.url}/v1/topics", json={"name": "wide", "queues": 7}, timeout=60)
        assert made.status_code == 201, made.text
        channel, stub = server.stub()
        with channel:
            route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="wide")), timeout=30)
            assert route.status.code == pb.OK, route.status.message
            assert sorted(q.id for q in route.message_queues) == list(range(7))
            grown = httpx.patch(f"{server.url}/v1/topics/wide", json={"queues": 9}, timeout=60)
            assert grown.status_code == 200, grown.text
            route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="wide")), timeout=30)
            assert len(route.message_queues) == 9
    finally:
        server.proc.kill()
