"""Transactional messages over gRPC with the official RocketMQ Python client, unmodified: a
half message is invisible, a commit shows it once, a rollback never, and a producer's checker
answers a check-back (RecoverOrphanedTransactionCommand on the telemetry stream) for a half
message another producer abandoned."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx
from rocketmq import Message, Producer, TransactionChecker, TransactionResolution
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from ..service.conftest import toml
from ..transactions.conftest import bodies, wait_until
from .conftest import GrpcTierd, consumer, grpc_config, receive_until

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

TOPIC = "orders"


class TxTierd(GrpcTierd):
    """``tierd serve`` with gRPC on and these ``[transactions]`` settings."""

    def __init__(self, root: Path, **transactions: Any) -> None:
        self.root = root
        self.path = root / "tierd.toml"
        cfg = grpc_config(root)
        cfg["transactions"] = {"transaction_timeout": 3600, "check_interval": 3600, **transactions}
        self.path.write_text(toml(cfg))
        self.start()


class Checker(TransactionChecker):  # type: ignore[misc]
    """Answers check-backs from the body (``commit-*`` commits, anything else rolls back),
    remembering what it was asked."""

    def __init__(self) -> None:
        self.asked: list[Message] = []
        self.lock = threading.Lock()

    def check(self, message: Message) -> Any:
        with self.lock:
            self.asked.append(message)
        if message.body.startswith(b"commit-"):
            return TransactionResolution.COMMIT
        return TransactionResolution.ROLLBACK


@contextmanager
class Undecided(Checker):
    """A checker that does not know yet (RocketMQ's UNKNOWN): the half stays pending."""

    def check(self, message: Message) -> Any:
        super().check(message)
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED


@contextmanager
def _producer(server: GrpcTierd, checker: TransactionChecker) -> Iterator[Producer]:
    p = Producer(server.config(), (TOPIC,), checker)
    p.startup()
    try:
        yield p
    finally:
        p.shutdown()


@contextmanager
def _killed(server: GrpcTierd) -> Iterator[GrpcTierd]:
    try:
        yield server
    finally:
        server.proc.kill()


def _message(body: bytes, key: str) -> Message:
    m = Message()
    m.topic = TOPIC
    m.body = body
    m.keys = key
    return m


def test_commit_is_seen_once_rollback_never(tmp_path: Path) -> None:
    server = TxTierd(tmp_path)
    with _killed(server), httpx.Client(base_url=server.url, timeout=30) as http:
        with _producer(server, Checker()) as p:
            kept = p.begin_transaction()
            receipt = p.send(_message(b"kept", "order-1"), kept)
            assert receipt.transaction_id
            dropped = p.begin_transaction()
            p.send(_message(b"dropped", "order-2"), dropped)
            assert bodies(http, TOPIC) == []  # half messages are invisible
            kept.commit()
            dropped.rollback()
        assert bodies(http, TOPIC) == [b"kept"]
        with consumer(server, "g", TOPIC) as c:
            got = receive_until(c, lambda ms: any(m.body == b"kept" for m in ms))
            assert [m.body for m in got] == [b"kept"]
        assert http.get("/v1/transactions").json()["transactions"] == []

        # A second commit of the same id is told it is resolved, never written twice.
        channel, stub = server.stub()
        with channel:
            again = stub.EndTransaction(
                svc.EndTransactionRequest(
                    topic=pb.Resource(name=TOPIC),
                    message_id=receipt.message_id,
                    transaction_id=receipt.transaction_id,
                    resolution=pb.COMMIT,
                ),
                timeout=30,
            )
            assert again.status.code == pb.BAD_REQUEST, again.status
            assert "already committed" in again.status.message
            unknown = stub.EndTransaction(
                svc.EndTransactionRequest(transaction_id="12-NOPE", resolution=pb.ROLLBACK), timeout=30
            )
            assert unknown.status.code == pb.INVALID_TRANSACTION_ID, unknown.status
            assert "12-NOPE" in unknown.status.message
            half = pb.Message(
                topic=pb.Resource(name=TOPIC),
                body=b"batched",
                system_properties=pb.SystemProperties(message_id="01B", message_type=pb.TRANSACTION),
            )
            batch = stub.SendMessage(svc.SendMessageRequest(messages=[half, half]), timeout=30)
            assert batch.status.code == pb.BAD_REQUEST, batch.status
            assert "sent alone" in batch.status.message
        assert bodies(http, TOPIC) == [b"kept"]


def test_check_back_answered_by_another_producers_checker(tmp_path: Path) -> None:
    server = TxTierd(tmp_path, transaction_timeout=1, check_interval=1, check_max=1000)
    with _killed(server), httpx.Client(base_url=server.url, timeout=30) as http:
        with _producer(server, Undecided()) as gone:
            for body in (b"commit-a", b"rollback-b"):
                gone.send(_message(body, body.decode()), gone.begin_transaction())
        # The producer that sent them (it may be asked, does not know) is gone; a new producer
        # of the topic is asked, its checker decides.
        checker = Checker()
        with _producer(server, checker):
            wait_until(
                "the check-backs to resolve both",
                lambda: http.get("/v1/transactions").json()["transactions"] == [],
            )
        with checker.lock:
            asked = {m.body: m for m in checker.asked}
        assert set(asked) == {b"commit-a", b"rollback-b"}
        assert asked[b"commit-a"].topic == TOPIC
        assert bodies(http, TOPIC) == [b"commit-a"]
