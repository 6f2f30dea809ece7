"""System topics (the scheduler's, the transactions') never look like user data: a store that
never scheduled has none, and listings and "all topics" scans leave them out — while a read that
names one still gets it (operators inspect them that way)."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING

import tierd.arrow
from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.scheduled.timing import SCHEDULE_TOPIC
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.plan import load_queues
from tierd.spark.storage import ColdStorage
from tierd.systopics import SYSTEM_TOPICS, is_system_topic

from .scheduled.conftest import DEADLINE, now_ms, tiered_config, wait_for_count
from .service.conftest import running, service_config

if TYPE_CHECKING:
    from pathlib import Path


def _system_dirs(root: Path) -> list[Path]:
    """Every file or directory under ``root`` (hot and cold) named after a system topic."""
    return sorted(p for p in root.rglob("*") if is_system_topic(p.name))


def test_dlq_topics_are_user_topics() -> None:
    assert is_system_topic(SCHEDULE_TOPIC)
    assert is_system_topic("RMQ_SYS_TRANS_HALF_TOPIC")
    assert not is_system_topic("%DLQ%billing")
    assert not is_system_topic("orders")


def test_a_store_that_never_schedules_has_no_system_topic(tmp_path: Path) -> None:
    with BlockingMessageStore.open(tiered_config(tmp_path)) as store:
        store.put_batch([Message(topic="orders", body=b"m%d" % i, queue_id=0) for i in range(5)])
        assert store.tier_now().committed == 5
    # Opened again (a restart reads the progress topics) and closed: still nothing written.
    with BlockingMessageStore.open(tiered_config(tmp_path)) as store:
        assert store.tier_now().committed == 0
        assert store.list_topics() == ["orders"]
    assert _system_dirs(tmp_path) == []


def test_scans_and_listings_leave_system_topics_out(tmp_path: Path) -> None:
    with BlockingMessageStore.open(tiered_config(tmp_path)) as store:
        store.put(Message(topic="orders", body=b"now", queue_id=0))
        store.schedule(Message(topic="orders", body=b"later", queue_id=0), deliver_at=now_ms() + 1000)
        wait_for_count(store, "orders", 2)
        store.tier_now()
        assert set(store.topics(system=True)) >= {"orders", SCHEDULE_TOPIC}
        assert store.topics() == {"orders": [0]}
        assert store.list_topics() == ["orders"]
    assert any(p.name == SCHEDULE_TOPIC for p in (tmp_path / "cold").rglob("*")), "nothing to hide"
    url = f"file://{tmp_path / 'cold'}"

    rows = tierd.arrow.dataset(url).to_table().to_pylist()
    assert sorted((r["topic"], r["body"]) for r in rows) == [("orders", b"later"), ("orders", b"now")]
    named = tierd.arrow.dataset(url, topic=SCHEDULE_TOPIC).to_table().to_pylist()
    assert [(r["topic"], r["body"]) for r in named] == [(SCHEDULE_TOPIC, b"later")]

    # The Spark source plans from the same enumeration: all topics, then one named.
    opts = ReadOptions.parse({"path": url})
    storage = ColdStorage(opts.url, opts.storage_options)
    assert {q.topic for q in load_queues(storage, opts, Constraints.from_options(opts))} == {"orders"}
    opts = ReadOptions.parse({"path": url, "topic": SCHEDULE_TOPIC})
    assert {q.topic for q in load_queues(storage, opts, Constraints.from_options(opts))} == {SCHEDULE_TOPIC}


def test_http_topics_leave_system_topics_out(tmp_path: Path) -> None:
    with running(TierdConfig.from_dict(service_config(tmp_path))) as r:
        c = r.client
        due = now_ms() + 2000  # in the future however slow the request
        body = {"body": base64.b64encode(b"later").decode(), "queue_id": 0, "deliver_at": due}
        assert c.post("/v1/topics/orders/messages", json=body).status_code < 300
        store = r.daemon.store
        assert store is not None
        deadline = time.monotonic() + DEADLINE
        while SCHEDULE_TOPIC not in store.topics(system=True):  # listed once dispatched
            assert time.monotonic() < deadline, "the scheduled message's topic never appeared"
            time.sleep(0.02)  # polling interval; the deadline bounds the wait
        while True:  # until the delivery created "orders"
            listed = c.get("/v1/topics")
            assert listed.status_code == 200
            names = [t["name"] for t in listed.json()["topics"]]
            if names:
                break
            assert time.monotonic() < deadline, "the scheduled message was never delivered"
            time.sleep(0.02)  # polling interval; the deadline bounds the wait
        assert names == ["orders"]
        assert not SYSTEM_TOPICS & set(names)
        # Named explicitly, a system topic is still readable.
        got = c.get(f"/v1/topics/{SCHEDULE_TOPIC}/queues/0/messages", params={"offset": 0})
        assert got.status_code == 200
        assert [base64.b64decode(m["body"]) for m in got.json()["messages"]] == [b"later"]
