"""kill -9 of a real ``tierd serve`` process at each step of a transaction: no committed
message lost or written twice, no rolled-back one delivered, pending ones resumed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import httpx

from ..service.conftest import TierdProcess, toml
from ..service.test_daemon import wait_ready
from .conftest import bodies, half, tx_config

if TYPE_CHECKING:
    from pathlib import Path


def _serve(path: Path) -> tuple[TierdProcess, httpx.Client]:
    proc = TierdProcess(path)
    wait_ready(proc.url)
    return proc, httpx.Client(base_url=proc.url, timeout=30)


def _config(tmp_path: Path, **transactions: Any) -> Path:
    path = tmp_path / "tierd.toml"
    path.write_text(toml(tx_config(tmp_path, **transactions)))
    return path


def test_kill_9_between_half_and_commit_resumes_the_transaction(tmp_path: Path) -> None:
    """After the restart, one half is committed by id, one found by the check-back poll and
    committed, one rolled back: exactly the two committed bodies are in the topic."""
    path = _config(tmp_path, transaction_timeout=0.2)
    proc, c = _serve(path)
    try:
        by_id, by_poll, dropped = half(c, b"by id"), half(c, b"by poll", group="poller"), half(c, b"no")
        proc.proc.kill()  # SIGKILL: no clean close, no progress record
        proc.proc.wait(30)
    finally:
        c.close()
        proc.kill()

    proc, c = _serve(path)
    try:
        pending = c.get("/v1/transactions").json()["transactions"]
        assert sorted(p["transaction_id"] for p in pending) == sorted([by_id, by_poll, dropped])
        assert bodies(c) == []
        assert c.post(f"/v1/transactions/{by_id}/commit", json={}).status_code == 200
        polled = c.get("/v1/transactions", params={"producer_group": "poller", "due": "true"}).json()
        assert [p["transaction_id"] for p in polled["transactions"]] == [by_poll]
        assert c.post(f"/v1/transactions/{by_poll}/commit", json={}).status_code == 200
        assert c.post(f"/v1/transactions/{dropped}/rollback", json={}).status_code == 200
        assert sorted(bodies(c)) == [b"by id", b"by poll"]
        proc.proc.kill()  # and once more: the resolutions were durable before they were answered
        proc.proc.wait(30)
    finally:
        c.close()
        proc.kill()

    proc, c = _serve(path)
    try:
        assert c.get("/v1/transactions").json()["transactions"] == []
        assert sorted(bodies(c)) == [b"by id", b"by poll"]
        assert proc.terminate() == 0
    finally:
        c.close()
        proc.kill()


CRASH_MID_COMMIT = """
import os, signal
from tierd import BlockingMessageStore, TierdConfig
from tierd.message import Message
store = BlockingMessageStore.open(TierdConfig.load({path!r}, env={{}}))
tx = store.transactions
r = store.put_half(Message(topic="orders", body=b"once"), producer_group="pg")
print(r.transaction_id, flush=True)

async def write_the_message_only():
    h = tx._pending[r.transaction_id]
    await tx._put(tx._real_message(h, await tx._half_message(h)))

store._transactions_loop().run(write_the_message_only())
os.kill(os.getpid(), signal.SIGKILL)  # between the message and its COMMIT record
"""


def test_kill_9_during_commit_writes_the_message_exactly_once(tmp_path: Path) -> None:
    """A process dies after the committed message is durable and before the COMMIT record: the
    restart finds the message by its UNIQ_KEY and records the commit; a retried commit is told
    it committed, and nothing is written a second time."""
    path = _config(tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CRASH_MID_COMMIT.format(path=str(path)))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    tid = child.stdout.strip()

    proc, c = _serve(path)
    try:
        assert c.get("/v1/transactions").json()["transactions"] == []
        retried = c.post(f"/v1/transactions/{tid}/commit", json={})
        assert retried.status_code == 409, retried.text
        assert retried.json()["detail"]["resolution"] == "COMMIT"
        assert bodies(c) == [b"once"]
        assert proc.terminate() == 0
    finally:
        c.close()
        proc.kill()
