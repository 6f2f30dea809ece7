"""Transaction fixtures: a daemon with short check-back timings, polling with deadlines (never
sleeps as synchronisation: a check-back or a rollback is waited for by asking until it shows)."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

from ..service.conftest import service_config

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import httpx

#: Longest wait for something the checker does on its own: generous, the machine is shared.
DEADLINE = 60.0
TOPIC = "orders"
#: Queues a topic gets when first written (store.default_queues).
QUEUES = 4


def tx_config(root: Path, **transactions: Any) -> dict[str, Any]:
    """The service config (posix cold tier) with ``[transactions]`` settings; by default the
    checker never acts within a test (a check-back an hour away)."""
    cfg = service_config(root)
    cfg["transactions"] = {"transaction_timeout": 3600, "check_interval": 3600, **transactions}
    return cfg


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def half(client: httpx.Client, body: bytes, group: str = "pg", **extra: Any) -> str:
    r = client.post(
        f"/v1/topics/{TOPIC}/transactions", json={"body": b64(body), "producer_group": group, **extra}
    )
    assert r.status_code == 200, r.text
    tid: str = r.json()["transaction_id"]
    return tid


def bodies(client: httpx.Client, topic: str = TOPIC) -> list[bytes]:
    """Every message body of ``topic`` in each of its default queues (what a consumer would
    see; a queue read waits for the store to index what was acknowledged before it)."""
    out: list[bytes] = []
    for q in range(QUEUES):
        r = client.get(f"/v1/topics/{topic}/queues/{q}/messages", params={"offset": 0, "max_count": 256})
        assert r.status_code == 200, r.text
        out += [base64.b64decode(m["body"]) for m in r.json()["messages"]]
    return out


def wait_until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling interval; the deadline bounds the wait
