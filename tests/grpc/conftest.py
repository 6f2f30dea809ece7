"""gRPC fixtures: a real ``tierd serve`` process with its RocketMQ gRPC listener on a free
loopback port, driven by the official RocketMQ Python client (unmodified) or its raw stubs."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import service_pb2_grpc

from tests.service.conftest import TierdProcess, service_config, toml

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator
    from pathlib import Path

    from rocketmq import Message


T = TypeVar("T")


def grpc_config(
    root: Path, server: dict[str, Any] | None = None, tiered: dict[str, Any] | None = None, **grpc_keys: Any
) -> dict[str, Any]:
    cfg = service_config(root, server=server, **(tiered or {}))
    cfg["grpc"] = {"enabled": True, "host": "127.0.0.1", "port": 0, **grpc_keys}
    return cfg


class GrpcTierd:
    """``tierd serve`` with gRPC on; ``endpoint`` is what a RocketMQ client is given."""

    def __init__(
        self,
        root: Path,
        server: dict[str, Any] | None = None,
        tiered: dict[str, Any] | None = None,
        **grpc_keys: Any,
    ) -> None:
        self.root = root
        self.path = root / "tierd.toml"
        self.path.write_text(toml(grpc_config(root, server, tiered, **grpc_keys)))
        self.start()

    def start(self) -> None:
        self.proc = TierdProcess(self.path)
        port = self.proc.wait_for(r"RocketMQ gRPC API listening on grpcs?://[^\s:]+:(\d+)", 60).group(1)
        self.endpoint = f"127.0.0.1:{port}"
        self.url = self.proc.url
        self.proc.wait_for(r"ready: ", 60)

    def config(self) -> ClientConfiguration:
        return ClientConfiguration(self.endpoint, Credentials(), request_timeout=10)

    def stub(self) -> tuple[grpc.Channel, Any]:
        channel = grpc.insecure_channel(self.endpoint)
        return channel, service_pb2_grpc.MessagingServiceStub(channel)


@pytest.fixture
def tierd(tmp_path: Path) -> Iterator[GrpcTierd]:
    server = GrpcTierd(tmp_path)
    try:
        yield server
    finally:
        server.proc.kill()


@contextmanager
def producer(server: GrpcTierd, *topics: str) -> Iterator[Producer]:
    p = Producer(server.config(), topics)
    p.startup()
    try:
        yield p
    finally:
        p.shutdown()


@contextmanager
def consumer(
    server: GrpcTierd, group: str, topic: str, tags: str = "*", await_duration: int = 5
) -> Iterator[SimpleConsumer]:
    c = SimpleConsumer(server.config(), group, {topic: FilterExpression(tags)}, await_duration=await_duration)
    c.startup()
    try:
        yield c
    finally:
        c.shutdown()


def receive_until(
    c: SimpleConsumer, want: Callable[[list[Message]], bool], invisible: int = 30, timeout: float = 60
) -> list[Message]:
    """Receive (acking nothing) until ``want`` holds for everything received so far; each
    receive long-polls, the deadline bounds the loop."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while not want(got):
        assert time.monotonic() < deadline, f"not received in {timeout} s; got {[m.body for m in got]}"
        got += c.receive(32, invisible)
    return got


def run_async(coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
    """``asyncio.run(coro)`` in a thread of its own. Run in the main thread, it leaves that
    thread's event loop unset, and the official client, started later in the same pytest process,
    then fails now and then to open its telemetry stream ("There is no current event loop in
    thread 'MainThread'", then "failed to fetch topic route")."""
    with ThreadPoolExecutor(1, thread_name_prefix="test-asyncio") as pool:
        return pool.submit(asyncio.run, coro).result(timeout)


def signed_config(server: GrpcTierd, access_key: str, secret_key: str) -> ClientConfiguration:
    """A client configuration that signs every call with these credentials."""
    return ClientConfiguration(server.endpoint, Credentials(access_key, secret_key), request_timeout=10)
