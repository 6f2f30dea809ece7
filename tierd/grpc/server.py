"""The gRPC listener's life in the daemon: bind (before the store opens, so a port in use is a
clean one-line error at once), start serving once the store is open, stop within a bound."""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING, Any

from tierd.errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from tierd.config import TierdConfig
    from tierd.store import MessageStore

log = logging.getLogger("tierd.grpc")

#: Largest request a client may send: the largest message body plus room for its properties.
REQUEST_OVERHEAD = 1024 * 1024
#: Calls in flight per allowed connection: a client holds its Telemetry stream and a long poll,
#: and sends or acks alongside.
RPCS_PER_CONNECTION = 8
#: HTTP/2 streams one connection may have open at once (gRPC's usual server default).
STREAMS_PER_CONNECTION = 100


def check_ports(cfg: TierdConfig) -> None:
    """``grpc.port`` (8081, the proxy's gRPC port) and ``server.ops_port`` (8082) are both set
    by operators: when they collide, say which settings instead of failing to bind."""
    g, s = cfg.grpc, cfg.server
    if s.ops_host is not None and g.port != 0 and g.port == s.ops_port:
        raise ConfigError(
            f"grpc.port and server.ops_port are both {g.port}: move one, or set grpc.enabled = false",
            port=g.port,
        )


def check_exposure(cfg: TierdConfig, authenticated: bool) -> None:
    """Without credentials (``grpc.credentials``/``credentials_file``) the gRPC API authenticates
    nobody: like the HTTP API without a token, it may then only listen on loopback unless
    ``server.allow_unauthenticated`` says something in front authenticates."""
    try:
        loopback = ipaddress.ip_address(cfg.grpc.host.split("%", 1)[0]).is_loopback
    except ValueError:
        loopback = cfg.grpc.host == "localhost"
    if not loopback and not authenticated and not cfg.server.allow_unauthenticated:
        raise ConfigError(
            f"grpc.host = {cfg.grpc.host!r} is reachable from other machines and no credentials are "
            "configured: set grpc.credentials_file (or grpc.credentials), bind 127.0.0.1, or set "
            "server.allow_unauthenticated = true if something in front authenticates",
            host=cfg.grpc.host,
        )


class GrpcListener:
    """A bound ``grpc.aio`` server; :meth:`start` serves the store, :meth:`stop` ends it."""

    def __init__(
        self, cfg: TierdConfig, registry: CollectorRegistry | None = None, max_connections: int | None = None
    ) -> None:
        """``registry``: where the gRPC metrics go (the daemon's; none: not measured).
        ``max_connections``: the connection bound (default ``grpc.max_connections``; the daemon
        passes it capped by the open-files limit)."""
        check_ports(cfg)
        try:
            import grpc

            from tierd.grpc.auth import load_credentials
            from tierd.grpc.metrics import GrpcMetrics
        except ImportError as e:
            raise ConfigError(
                "grpc.enabled needs the gRPC extra: pip install 'tierd[grpc]' (or set grpc.enabled = false)"
            ) from e
        keys = load_credentials(cfg.grpc)
        check_exposure(cfg, bool(keys))
        self.cfg = cfg
        self.keys = keys
        limit = cfg.store.max_message_size + REQUEST_OVERHEAD
        self.metrics = GrpcMetrics(registry) if registry is not None else None
        # Bounded like the HTTP listener (server.max_connections): a connection past the bound is
        # closed as it opens, a call past the in-flight bound gets RESOURCE_EXHAUSTED, and one
        # connection opens at most STREAMS_PER_CONNECTION streams (more wait in the client).
        connections = max_connections if max_connections is not None else cfg.grpc.max_connections
        self.server: Any = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.max_allowed_incoming_connections", connections),
                ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
            ],
            maximum_concurrent_rpcs=connections * RPCS_PER_CONNECTION,
        )
        address = (
            f"[{cfg.grpc.host}]:{cfg.grpc.port}"
            if ":" in cfg.grpc.host
            else f"{cfg.grpc.host}:{cfg.grpc.port}"
        )
        try:
            if cfg.grpc.tls_cert_file is not None and cfg.grpc.tls_key_file is not None:
                creds = grpc.ssl_server_credentials(
                    [(cfg.grpc.tls_key_file.read_bytes(), cfg.grpc.tls_cert_file.read_bytes())]
                )
                self.port = self.server.add_secure_port(address, creds)
            else:
                self.port = self.server.add_insecure_port(address)
        except OSError as e:
            raise ConfigError(f"grpc TLS files: {e.strerror or e}", path=str(e.filename)) from e
        except RuntimeError as e:  # grpc's "Failed to bind"
            raise ConfigError(
                f"cannot listen on {address} (grpc.host, grpc.port): {e}",
                host=cfg.grpc.host,
                port=cfg.grpc.port,
            ) from e
        if not self.port:
            raise ConfigError(
                f"cannot listen on {address} (grpc.host, grpc.port)", host=cfg.grpc.host, port=cfg.grpc.port
            )
        scheme = "grpcs" if cfg.grpc.tls_cert_file is not None else "grpc"
        self.url = f"{scheme}://{cfg.grpc.host}:{self.port}"
        self.servicer: Any = None

    async def start(self, store: MessageStore) -> None:
        from tierd.grpc.boundary import add_service
        from tierd.grpc.servicer import Servicer

        self.servicer = Servicer(self.cfg, store, (self.cfg.grpc.host, self.port))
        if self.metrics is not None:
            self.metrics.watch(self.servicer.inflight)
        # Request ids, credentials and metrics wrap each RPC once (tierd.grpc.boundary).
        add_service(self.server, self.servicer, self.metrics, self.keys)
        await self.server.start()
        log.info("RocketMQ gRPC API listening on %s", self.url)

    async def stop(self, grace: float) -> None:
        """Finish RPCs in flight for up to ``grace`` seconds, then cancel the rest (long polls)."""
        await self.server.stop(grace)
        if self.servicer is not None:
            await self.servicer.inflight.close()
