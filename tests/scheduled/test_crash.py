"""kill -9 of a real ``tierd serve`` process while scheduled messages are delivered: after a
restart every one is in its topic exactly once (nothing lost, nothing twice)."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING

import httpx

from tierd import BlockingMessageStore, TierdConfig
from tierd.message import Message

from ..service.conftest import TierdProcess, service_config, toml
from ..service.test_daemon import wait_ready
from .conftest import DEADLINE, now_ms

if TYPE_CHECKING:
    from pathlib import Path

JSON = {"Content-Type": "application/json"}
N = 3000


def topic_messages(c: httpx.Client, topic: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    offset = 0
    while True:
        r = c.get(f"/v1/topics/{topic}/queues/0/messages", params={"offset": offset, "max_count": 1000})
        if r.status_code == 404:
            return out
        assert r.status_code == 200, r.text
        doc = r.json()
        out.extend(doc["messages"])
        if not doc["messages"]:
            return out
        offset = doc["next_offset"]


def test_kill_9_during_delivery_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    """The progress record is written once an hour here: every delivery before the kill is one
    the restarted scheduler must find in the key index, or it would write it a second time."""
    data = service_config(tmp_path)
    data["scheduled"] = {"batch": 8, "checkpoint_interval": 3600}
    path = tmp_path / "tierd.toml"
    path.write_text(toml(data))
    due = now_ms() + 3000
    with BlockingMessageStore.open(TierdConfig.load(path, env={})) as store:
        expected = {
            store.schedule(Message(topic="t", body=b"m%d" % i, queue_id=0), deliver_at=due).handle
            for i in range(N)
        }
    assert now_ms() < due, "scheduling took longer than the delay"

    proc = TierdProcess(path)
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=30) as c:
            deadline = time.monotonic() + DEADLINE
            while True:
                r = c.get("/v1/topics/t/queues/0/messages", params={"offset": 0, "max_count": 1})
                if r.status_code == 200 and r.json()["max_offset"] > 0:
                    break
                assert time.monotonic() < deadline, "nothing was delivered"
                time.sleep(0.005)  # polling interval; the deadline bounds the wait
        proc.proc.kill()  # SIGKILL mid-delivery: no progress record, no clean close
        proc.proc.wait(30)
    finally:
        proc.kill()

    proc = TierdProcess(path)
    try:
        wait_ready(proc.url)
        with httpx.Client(base_url=proc.url, timeout=30, headers=JSON) as c:
            last = c.post(
                "/v1/topics/t/messages",
                json={
                    "body": base64.b64encode(b"last").decode(),
                    "queue_id": 0,
                    "deliver_at": now_ms() + 2_000,  # room for a loaded machine
                },
            )
            assert last.status_code == 200, last.text
            # The last one is due after all the others: once it is there, they all are.
            deadline = time.monotonic() + DEADLINE
            while True:
                msgs = topic_messages(c, "t")
                if any(base64.b64decode(str(m["body"])) == b"last" for m in msgs):
                    break
                assert time.monotonic() < deadline, f"{len(msgs)} delivered, not the last one"
                time.sleep(0.02)  # polling interval; the deadline bounds the wait
        assert proc.terminate() == 0
    finally:
        proc.kill()
    # Which side a surplus is on: the same queue offset read twice is the reader's paging; two
    # offsets holding one handle is a delivery written twice.
    offsets = [int(m["queue_offset"]) for m in msgs]  # type: ignore[call-overload]
    assert len(set(offsets)) == len(offsets), "a page of the topic was read twice"
    handles = [str(m["properties"]["TIMER_HANDLE"]) for m in msgs]  # type: ignore[index]
    assert len(handles) == N + 1, (
        f"{len(handles) - N - 1:+d} messages at offsets {min(offsets)}..{max(offsets)}: "
        f"{len(handles) - len(set(handles))} handles delivered twice"
    )
    assert set(handles) - {last.json()["handle"]} == expected
