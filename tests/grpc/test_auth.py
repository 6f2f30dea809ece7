"""RocketMQ access-key signatures: with credentials configured, the official client given the
right ones works; a wrong secret, an unknown key or no credentials get ``UNAUTHORIZED`` and
nothing is served; the secret never reaches the log."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from rocketmq import Message, Producer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.grpc.conftest import GrpcTierd, run_async, signed_config
from tests.service.conftest import service_config, toml
from tierd.config import TierdConfig
from tierd.errors import ConfigError
from tierd.grpc.server import GrpcListener

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SECRET = "s3cret-Key-9f2"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[GrpcTierd]:
    creds = tmp_path / "rocketmq-credentials"
    creds.write_text(f"# app keys\napp:{SECRET}\n")
    server = GrpcTierd(tmp_path, credentials_file=str(creds))
    yield server
    server.proc.kill()


def _send(server: GrpcTierd, ak: str, sk: str) -> str:
    p = Producer(signed_config(server, ak, sk), ("secure",))
    p.startup()
    try:
        m = Message()
        m.topic = "secure"
        m.body = b"signed"
        return str(p.send(m).message_id)
    finally:
        p.shutdown()


def test_the_right_credentials_are_served(secured: GrpcTierd) -> None:
    assert _send(secured, "app", SECRET)


@pytest.mark.parametrize(
    ("ak", "sk", "why"),
    [("app", "wrong", "wrong signature for access key 'app'"), ("stranger", SECRET, "unknown access key")],
)
def test_wrong_credentials_are_unauthorized(secured: GrpcTierd, ak: str, sk: str, why: str) -> None:
    # The client's start-up fetches the route first: refused, it cannot start.
    with pytest.raises(Exception, match="route"):
        _send(secured, ak, sk)
    secured.proc.wait_for(why, 30)  # one log line says why (never the secret)
    assert not any(SECRET in line for line in secured.proc.lines)


def test_no_credentials_are_unauthorized_on_every_kind_of_rpc(secured: GrpcTierd) -> None:
    channel, stub = secured.stub()
    with channel:
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="secure")), timeout=10)
        assert route.status.code == pb.UNAUTHORIZED
        assert not route.message_queues
        (received,) = list(
            stub.ReceiveMessage(
                svc.ReceiveMessageRequest(group=pb.Resource(name="g"), batch_size=1), timeout=10
            )
        )
        assert received.status.code == pb.UNAUTHORIZED
        (settings,) = list(stub.Telemetry(iter([svc.TelemetryCommand(settings=pb.Settings())]), timeout=10))
        assert settings.status.code == pb.UNAUTHORIZED
    assert not any(SECRET in line for line in secured.proc.lines)
    assert not any("Traceback" in line for line in secured.proc.lines)


def test_a_non_loopback_listener_needs_credentials(tmp_path: Path) -> None:
    cfg = service_config(tmp_path)
    cfg["grpc"] = {"host": "0.0.0.0", "port": 0}

    async def bind() -> int:
        # On a running loop, as the daemon builds the listener (grpc.aio needs one).
        listener = GrpcListener(TierdConfig.from_dict(cfg))
        port: int = listener.port
        await listener.stop(0)
        return port

    with pytest.raises(ConfigError, match="credentials"):
        run_async(bind())
    cfg["grpc"]["credentials"] = {"app": SECRET}
    assert run_async(bind())  # binds; serves nobody unsigned
    assert SECRET not in repr(TierdConfig.from_dict(cfg))


def test_a_malformed_credentials_file_names_the_line_not_the_secret(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.write_text(f"app:{SECRET}\n{SECRET}\n")
    cfg = service_config(tmp_path)
    cfg["grpc"] = {"port": 0, "credentials_file": str(creds)}
    with pytest.raises(ConfigError, match="line 2") as e:
        GrpcListener(TierdConfig.from_dict(cfg))
    assert SECRET not in str(e.value)
    (tmp_path / "unused.toml").write_text(toml(cfg))
