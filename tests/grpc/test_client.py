"""The official RocketMQ Python client, unmodified, against a real ``tierd serve``."""

from __future__ import annotations

import base64
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rocketmq import Message

from tests.grpc.conftest import GrpcTierd, consumer, producer, receive_until

if TYPE_CHECKING:
    from pathlib import Path


def _message(topic: str, body: bytes, tag: str | None = None, *keys: str, **props: str) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for key in keys:
        m.keys = key  # the client's setter adds one key per assignment
    for k, v in props.items():
        m.add_property(k, v)
    return m


def test_send_receive_ack(tierd: GrpcTierd) -> None:
    with producer(tierd, "orders") as p:
        receipt = p.send(_message("orders", b"hello", "paid", "o-1", region="eu"))
    assert receipt.message_id
    assert receipt.offset == 0
    with consumer(tierd, "billing", "orders") as c:
        (m,) = receive_until(c, lambda got: len(got) >= 1)
        assert (m.body, m.tag, m.keys, m.properties) == (b"hello", "paid", {"o-1"}, {"region": "eu"})
        assert m.message_id == receipt.message_id
        assert m.delivery_attempt == 1
        c.ack(m)
        assert c.receive(32, 30) == []  # long polls, then nothing: acked is consumed


def test_fifo_group_lands_in_one_queue_in_order(tierd: GrpcTierd) -> None:
    with producer(tierd, "fifo") as p:
        receipts = []
        for i in range(8):
            m = _message("fifo", f"m{i}".encode())
            m.message_group = "customer-7"
            receipts.append(p.send(m))
    # One queue: its offsets run 0..7 in send order.
    assert [r.offset for r in receipts] == list(range(8))
    with consumer(tierd, "fifo-readers", "fifo") as c:
        got: list[Message] = []
        while len(got) < 8:  # one at a time: the group's next waits for the ack of this one
            (m,) = receive_until(c, lambda new: len(new) >= 1)
            got.append(m)
            c.ack(m)
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(8)]
    assert {m.message_group for m in got} == {"customer-7"}


def test_unacked_message_comes_back_with_attempt_plus_one(tierd: GrpcTierd) -> None:
    with producer(tierd, "retry") as p:
        p.send(_message("retry", b"once"))
    with consumer(tierd, "retriers", "retry") as c:
        (first,) = receive_until(c, lambda got: len(got) >= 1, invisible=1)
        assert first.delivery_attempt == 1
        (again,) = receive_until(c, lambda got: len(got) >= 1, invisible=30)
        assert (again.message_id, again.delivery_attempt) == (first.message_id, 2)
        with pytest.raises(Exception, match="stale"):
            c.ack(first)  # its handle was superseded by the redelivery
        c.ack(again)
        assert c.receive(32, 30) == []


def test_change_invisible_duration_gives_a_new_handle(tierd: GrpcTierd) -> None:
    with producer(tierd, "slow") as p:
        p.send(_message("slow", b"work"))
    with consumer(tierd, "workers", "slow") as c:
        (m,) = receive_until(c, lambda got: len(got) >= 1, invisible=30)
        old = m.receipt_handle
        c.change_invisible_duration(m, 60)
        assert m.receipt_handle != old
        c.ack(m)  # the new handle acks
        assert c.receive(32, 30) == []


def test_tag_filter(tierd: GrpcTierd) -> None:
    with producer(tierd, "tagged") as p:
        for tag in ("a", "b", "c", "a"):
            p.send(_message("tagged", tag.encode(), tag))
    with consumer(tierd, "ab-only", "tagged", tags="a||b") as c:
        got = receive_until(c, lambda got: len(got) >= 3)
        for m in got:
            c.ack(m)
        assert sorted(m.tag for m in got) == ["a", "a", "b"]
        assert c.receive(32, 30) == []


def _long_poll(url: str) -> dict[str, float]:
    """The daemon's long-poll metrics: reads waiting now, and reads woken by an arrival."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in ("tierd_long_poll_waiters", "tierd_long_poll_wakeups_total")
    }


def test_long_poll_is_woken_by_a_new_message(tierd: GrpcTierd) -> None:
    """A waiting receive is woken by the arrival, also in a queue that held nothing when it
    began to wait: the producer's round-robin put "first" in one queue and "second" in the next.
    (It used to wait for arrivals only in queues that already held data, and so ended at its
    timeout; a last read then found "second", so only the wake-up count tells.)"""
    with producer(tierd, "wake") as p, consumer(tierd, "sleepers", "wake", await_duration=30) as c:
        p.send(_message("wake", b"first"))  # the topic and its queues now exist
        receive_until(c, lambda got: len(got) >= 1)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(c.receive, 32, 30)
            deadline = time.monotonic() + 30
            while _long_poll(tierd.url)["tierd_long_poll_waiters"] < 1:
                assert time.monotonic() < deadline, "the receive never started waiting"
                time.sleep(0.02)
            woken = _long_poll(tierd.url)["tierd_long_poll_wakeups_total"]
            p.send(_message("wake", b"second"))
            assert [m.body for m in waiting.result(60)] == [b"second"]
            assert _long_poll(tierd.url)["tierd_long_poll_wakeups_total"] == woken + 1


def test_acked_is_never_redelivered_after_kill_9(tmp_path: Path) -> None:
    server = GrpcTierd(tmp_path)
    try:
        with producer(server, "durable") as p:
            for body in (b"acked", b"pending"):
                p.send(_message("durable", body))
        with consumer(server, "keepers", "durable") as c:
            got = receive_until(c, lambda got: len(got) >= 2)
            (acked,) = [m for m in got if m.body == b"acked"]
            c.ack(acked)
        server.proc.proc.send_signal(signal.SIGKILL)
        server.proc.kill()
        server.start()
        with consumer(server, "keepers", "durable") as c:
            # The un-acked one comes back at once (leases do not survive a restart); the acked never.
            got = receive_until(c, lambda got: any(m.body == b"pending" for m in got))
            assert [m.body for m in got] == [b"pending"]
            c.ack(got[0])
            assert c.receive(32, 30) == []
        groups = httpx.get(f"{server.url}/v1/groups", timeout=30).json()
        assert "keepers" in str(groups)  # the shared committed-offset store shows the gRPC group
    finally:
        server.proc.kill()


def test_grpc_and_http_see_the_same_messages(tierd: GrpcTierd) -> None:
    with producer(tierd, "both") as p:
        receipt = p.send(_message("both", b"from-grpc", "paid", "k-1", region="eu"))
    found = httpx.get(f"{tierd.url}/v1/topics/both/keys/k-1", timeout=30).json()["messages"]
    (m,) = found
    assert base64.b64decode(m["body"]) == b"from-grpc"
    assert (m["keys"], m["tags"]) == (["k-1"], "paid")
    assert m["properties"]["UNIQ_KEY"] == receipt.message_id
    assert m["properties"]["region"] == "eu"
    body: dict[str, Any] = {"body": base64.b64encode(b"from-http").decode(), "keys": ["h-1"], "tags": "x"}
    body["properties"] = {"source": "http"}
    assert httpx.post(f"{tierd.url}/v1/topics/both/messages", json=body, timeout=30).status_code == 200
    with consumer(tierd, "mixed", "both") as c:
        got = receive_until(c, lambda got: len(got) >= 2)
    by_body = {m.body: m for m in got}
    assert by_body[b"from-grpc"].message_id == receipt.message_id
    h = by_body[b"from-http"]
    assert (h.tag, h.keys, h.properties) == ("x", {"h-1"}, {"source": "http"})
