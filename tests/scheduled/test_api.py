"""Scheduled messages through the Python API: visible at (not before) their time, delay levels,
recall, bad input, restart, beyond hot retention via the cold tier, restore on a new machine."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore
from tierd.errors import (
    AlreadyDeliveredError,
    DeliveryTimeError,
    InvalidQueueError,
    InvalidTopicError,
    UnknownHandleError,
)
from tierd.message import Message
from tierd.scheduled.timing import PROPERTY_TIMER_HANDLE, SCHEDULE_TOPIC

from .conftest import hot_config, now_ms, read_all, tiered_config, wait_for_count

if TYPE_CHECKING:
    from pathlib import Path


def test_visible_at_not_before_its_time(tmp_path: Path) -> None:
    with BlockingMessageStore.open(hot_config(tmp_path)) as store:
        due = now_ms() + 1500
        r = store.schedule(Message(topic="orders", body=b"later", queue_id=0, keys=["k1"]), deliver_at=due)
        assert r.deliver_at == due
        assert r.topic == "orders"
        seen_early = []
        deadline = time.monotonic() + 60
        while not (msgs := read_all(store, "orders")):
            seen_early.append(now_ms())
            assert time.monotonic() < deadline, "never delivered"
            time.sleep(0.02)  # polling interval; the deadline bounds the wait
        (m,) = msgs
        assert m.body == b"later"
        assert m.store_timestamp >= due, "visible before its delivery time"
        assert m.keys == ("k1",)
        assert m.uniq_key == r.msg_id
        assert m.properties[PROPERTY_TIMER_HANDLE] == r.handle
        assert "REAL_TOPIC" not in m.properties
        assert seen_early, "the message was visible at once"
        assert [x.body for x in store.query("orders", "k1")] == [b"later"]  # indexed by its keys


def test_delay_level_maps_as_rocketmq_levels(tmp_path: Path) -> None:
    with BlockingMessageStore.open(hot_config(tmp_path, delay_levels="1s 2s 1h")) as store:
        before = now_ms()
        r = store.schedule(Message(topic="t", body=b"x", queue_id=0), delay_level=2)
        after = now_ms()
        assert before + 2000 <= r.deliver_at <= after + 2000
        r3 = store.schedule(Message(topic="t", body=b"y", queue_id=0), delay_level=3)
        assert r3.deliver_at >= before + 3_600_000
        (m,) = wait_for_count(store, "t", 1)
        assert m.body == b"x"
        assert m.properties["DELAY"] == "2"
        assert m.store_timestamp >= r.deliver_at


def test_recall_before_due_is_never_delivered(tmp_path: Path) -> None:
    with BlockingMessageStore.open(hot_config(tmp_path)) as store:
        due = now_ms() + 1000
        gone = store.schedule(Message(topic="t", body=b"recalled", queue_id=0), deliver_at=due)
        kept = store.schedule(Message(topic="t", body=b"kept", queue_id=0), deliver_at=due + 300)
        assert store.recall(gone.handle) is True
        assert store.recall(gone.handle) is False  # already recalled: said so, no error
        # The later one is delivered after the recalled one would have been (delivery order).
        msgs = wait_for_count(store, "t", 1)
        assert [m.body for m in msgs] == [b"kept"]
        with pytest.raises(AlreadyDeliveredError) as e:
            store.recall(kept.handle)
        assert e.value.detail["handle"] == kept.handle
        assert store.scheduler.stats.recalls == 1


def test_bad_input_is_refused_with_a_typed_error(tmp_path: Path) -> None:
    with BlockingMessageStore.open(hot_config(tmp_path, max_delay=60)) as store:
        msg = Message(topic="t", body=b"x")
        with pytest.raises(DeliveryTimeError, match="not in the future") as e:
            store.schedule(msg, deliver_at=now_ms() - 1000)
        assert e.value.code == "invalid_delivery_time"
        with pytest.raises(DeliveryTimeError, match=r"scheduled\.max_delay") as e:
            store.schedule(msg, deliver_at=now_ms() + 120_000)
        assert e.value.detail["max_delay_ms"] == 60_000
        with pytest.raises(DeliveryTimeError, match=r"\[1, 18\]"):
            store.schedule(msg, delay_level=19)
        with pytest.raises(DeliveryTimeError):
            store.schedule(msg, delay_level=0)
        with pytest.raises(ValueError, match="one of the two"):
            store.schedule(msg, deliver_at=now_ms() + 1000, delay_level=1)
        with pytest.raises(InvalidTopicError):
            store.schedule(Message(topic=SCHEDULE_TOPIC, body=b"x"), delay_level=1)
        for handle in ("nope", "12-34", "0-1"):
            with pytest.raises(UnknownHandleError) as u:
                store.recall(handle)
            assert u.value.code == "unknown_handle"
        # A real offset with the wrong delivery time is not that message: unknown, not recalled.
        r = store.schedule(msg, deliver_at=now_ms() + 30_000)
        offset = r.handle.split("-")[0]
        with pytest.raises(UnknownHandleError):
            store.recall(f"{offset}-{r.deliver_at + 1}")
        assert store.recall(r.handle) is True


def test_a_topic_scheduled_into_before_still_refuses_bad_input(tmp_path: Path) -> None:
    """After a first accepted put into a topic, later puts into it take an inline check of the
    same rules (docs/performance.md, "Scheduled messages"): each one still refuses what the
    first put would have, with the same typed error, and stores nothing for it."""
    with BlockingMessageStore.open(hot_config(tmp_path, max_delay=60)) as store:
        first = store.schedule(Message(topic="t", body=b"ok", queue_id=0), deliver_at=now_ms() + 30_000)
        end = store.router.max_offset(SCHEDULE_TOPIC, 0)
        max_queues = store.config.store.max_queues
        later: dict[str, object] = {"deliver_at": now_ms() + 9000}
        bad: list[tuple[type[Exception], Message, dict[str, object]]] = [
            (DeliveryTimeError, Message(topic="t", body=b"x"), {"deliver_at": now_ms() - 1000}),
            (DeliveryTimeError, Message(topic="t", body=b"x"), {"deliver_at": now_ms() + 120_000}),
            (DeliveryTimeError, Message(topic="t", body=b"x"), {"deliver_at": True}),
            (DeliveryTimeError, Message(topic="t", body=b"x"), {"deliver_at": float(now_ms() + 9000)}),
            (ValueError, Message(topic="t", body=b"x"), {"deliver_at": now_ms() + 9000, "delay_level": 1}),
            (InvalidQueueError, Message(topic="t", body=b"x", queue_id=-1), later),
            (InvalidQueueError, Message(topic="t", body=b"x", queue_id=max_queues), later),
            (InvalidQueueError, Message(topic="t", body=b"x", queue_id=True), later),
        ]
        for error, msg, when in bad:
            with pytest.raises(error):
                store.schedule(msg, **when)  # type: ignore[arg-type]
        assert store.router.max_offset(SCHEDULE_TOPIC, 0) == end, "a refused put was stored"
        # Properties of its own are kept beside the schedule's (its UNIQ_KEY too).
        r = store.schedule(
            Message(topic="t", body=b"p", queue_id=1, properties={"UNIQ_KEY": "K1", "a": "b"}),
            deliver_at=now_ms() + 30_000,
        )
        assert r.msg_id == "K1"
        got = store.get(SCHEDULE_TOPIC, 0, end, 1).messages[0].properties
        assert (got["a"], got["REAL_TOPIC"], got["REAL_QID"]) == ("b", "t", "1")
        assert got["TIMER_DELIVER_MS"] == str(r.deliver_at)
        assert store.recall(first.handle) is True


def test_pending_messages_survive_a_restart(tmp_path: Path) -> None:
    cfg = hot_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        due = now_ms() + 1500
        handles = [
            store.schedule(Message(topic="t", body=b"m%d" % i, queue_id=0), deliver_at=due + i).handle
            for i in range(20)
        ]
        recalled = handles.pop(5)
        assert store.recall(recalled)
    with BlockingMessageStore.open(cfg) as store:
        msgs = wait_for_count(store, "t", 19)
        assert sorted(m.properties[PROPERTY_TIMER_HANDLE] for m in msgs) == sorted(handles)
        # ... and exactly once: a message due after all of them comes after all of them.
        store.schedule(Message(topic="t", body=b"last", queue_id=0), deliver_at=now_ms() + 1_000)
        msgs = wait_for_count(store, "t", 20)
        assert len(msgs) == 20
        assert msgs[-1].body == b"last"


def test_a_delay_beyond_hot_retention_is_delivered_from_the_cold_tier(tmp_path: Path) -> None:
    """RocketMQ #9006: a delay longer than local retention. The scheduled message is tiered,
    its hot copy freed by retention, and the scheduler reads it back from the cold tier."""
    cfg = tiered_config(tmp_path, store={"file_reserved_time": 0.0001})
    with BlockingMessageStore.open(cfg) as store:
        due = now_ms() + 5000
        r = store.schedule(Message(topic="t", body=b"far", queue_id=0), deliver_at=due)
        for _ in range(80):  # roll the commitlog past the scheduled message's file
            store.put(Message(topic="filler", body=b"f" * 4000, queue_id=0))
        store.tier_now()
        deadline = time.monotonic() + 30
        while True:
            store.gc()
            (q,) = store.queues(SCHEDULE_TOPIC)
            if q.hot_min_offset is None or q.hot_min_offset > 0:
                break
            assert time.monotonic() < deadline, f"hot retention never freed the scheduled message: {q}"
            time.sleep(0.05)  # polling interval; the deadline bounds the wait
        assert now_ms() < due, "the machine was too slow to free the hot copy before the delivery time"
        cold_reads = store.stats.reads.reads.get("cold", 0)
        (m,) = wait_for_count(store, "t", 1)
        assert m.body == b"far"
        assert m.properties[PROPERTY_TIMER_HANDLE] == r.handle
        assert m.store_timestamp >= due
        assert store.stats.reads.reads.get("cold", 0) > cold_reads


def test_restore_on_a_new_machine_delivers_pending_messages(tmp_path: Path) -> None:
    first = tiered_config(tmp_path)
    with BlockingMessageStore.open(first) as store:
        due = now_ms() + 4000
        handles = {
            store.schedule(Message(topic="t", body=b"r%d" % i, queue_id=0), deliver_at=due).handle
            for i in range(10)
        }
        recalled = sorted(handles)[3]
        assert store.recall(recalled)
        handles.discard(recalled)
        store.tier_now()
    # The machine is lost: a new store directory, the same bucket.
    second = tiered_config(tmp_path, hot_dir="restored")
    BlockingMessageStore.restore(second)
    with BlockingMessageStore.open(second) as store:
        msgs = wait_for_count(store, "t", 9)
        assert {m.properties[PROPERTY_TIMER_HANDLE] for m in msgs} == handles
        assert all(m.store_timestamp >= due for m in msgs)
        store.schedule(Message(topic="t", body=b"last", queue_id=0), deliver_at=now_ms() + 1_000)
        msgs = wait_for_count(store, "t", 10)
        assert len(msgs) == 10
        assert msgs[-1].body == b"last"
