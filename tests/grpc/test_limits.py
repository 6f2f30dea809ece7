"""The gRPC listener is bounded like the HTTP one: ``grpc.max_connections`` connections at once;
one more is closed as it opens (the client sees UNAVAILABLE and retries), and a slot freed by a
closed connection serves the next client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from tests.grpc.conftest import GrpcTierd

if TYPE_CHECKING:
    from pathlib import Path


def _connect(endpoint: str) -> tuple[grpc.Channel, Any]:
    # Its own connection (channels to one address share one unless told not to).
    channel = grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, service_pb2_grpc.MessagingServiceStub(channel)


def test_connections_beyond_the_bound_are_refused(tmp_path: Path) -> None:
    server = GrpcTierd(tmp_path, max_connections=2)
    try:
        held = [_connect(server.endpoint) for _ in range(2)]
        for _, stub in held:
            assert stub.Heartbeat(svc.HeartbeatRequest(), timeout=30).status.code == pb.OK
        channel, stub = _connect(server.endpoint)
        with channel, pytest.raises(grpc.RpcError) as refused:
            stub.Heartbeat(svc.HeartbeatRequest(), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        held.pop()[0].close()
        channel, stub = _connect(server.endpoint)
        with channel:  # the freed slot serves the next client (it waits for a connection)
            r = stub.Heartbeat(svc.HeartbeatRequest(), timeout=30, wait_for_ready=True)
            assert r.status.code == pb.OK
        for c, _ in held:
            c.close()
    finally:
        server.proc.kill()
    assert "Traceback" not in server.proc.output
