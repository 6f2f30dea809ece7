"""Defaults: a sidecar serves RocketMQ's gRPC port out of the box, and its probes do not take it."""

from __future__ import annotations

from tierd.config import TierdConfig
from tierd.grpc.server import check_ports


def test_grpc_is_on_at_the_proxy_port_and_the_ops_listener_is_elsewhere() -> None:
    cfg = TierdConfig.from_dict({"server": {"ops_host": "0.0.0.0"}})
    assert cfg.grpc.enabled
    assert (cfg.grpc.host, cfg.grpc.port) == ("127.0.0.1", 8081)
    assert cfg.server.ops_port != cfg.grpc.port
    check_ports(cfg)  # no collision in the defaults
