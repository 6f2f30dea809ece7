"""Consumption that starts in the cold tier: a group reset back into tiered data (``tierd groups
reset``, the CLI against the running daemon) receives the cold messages over gRPC exactly as it
received them hot — same ids, bodies, tags, keys and properties, first delivery."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.grpc.conftest import GrpcTierd, consumer, producer, receive_until
from tests.grpc.test_client import _message
from tests.service.conftest import TIERD

if TYPE_CHECKING:
    from pathlib import Path

    from rocketmq import Message


def _cold_reads(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tierd_get_requests_total" and s.labels.get("source") == "cold"
    )


def _seen(messages: list[Message]) -> list[tuple[object, ...]]:
    return sorted(
        (
            m.message_id,
            m.body,
            m.tag,
            frozenset(m.keys),
            tuple(sorted(m.properties.items())),
            m.delivery_attempt,
        )
        for m in messages
    )


def test_group_reset_into_the_cold_tier_receives_cold_messages(tmp_path: Path) -> None:
    # FORCE: whatever the cold tier holds is read from there, although the hot copy still exists.
    server = GrpcTierd(tmp_path, tiered={"storage_level": "FORCE"})
    try:
        with producer(server, "history") as p:
            for i in range(6):
                p.send(_message("history", f"h{i}".encode(), "paid" if i % 2 else "new", f"o-{i}", n=str(i)))
        with consumer(server, "replay", "history") as c:
            hot = receive_until(c, lambda got: len(got) >= 6)
            for m in hot:
                c.ack(m)
        tiered = httpx.post(f"{server.url}/v1/admin/tier", json={}, timeout=60)
        assert tiered.status_code == 200, tiered.text
        cold_before = _cold_reads(server.url)

        reset = subprocess.run(
            [*TIERD, "--server", server.url, "groups", "reset", "replay", "history", "--to", "earliest"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert reset.returncode == 0, reset.stderr

        with consumer(server, "replay", "history") as c:
            cold = receive_until(c, lambda got: len(got) >= 6)
            for m in cold:
                c.ack(m)
            assert c.receive(32, 30) == []  # exactly those six, nothing twice
        assert _seen(cold) == _seen(hot)
        assert {m.delivery_attempt for m in cold} == {1}
        assert _cold_reads(server.url) > cold_before  # served by the cold tier
    finally:
        server.proc.kill()
    assert "Traceback" not in server.proc.output
