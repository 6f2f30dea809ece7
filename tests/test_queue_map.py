"""Each tier's per-topic highest queue id (tierd/queue_map.py), and the produce-path questions
it answers: a topic's queue count and whether it exists, without a pass over every queue of the
store (gRPC ``SendMessage`` asks per request; at 10,000 queues that pass cost milliseconds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.queue_map import QueueMap
from tierd.topics import TopicAdmin

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

TOPICS = st.sampled_from(["a", "b", "c"])
OPS = st.lists(
    st.tuples(st.sampled_from(["set", "del", "pop"]), TOPICS, st.integers(min_value=0, max_value=40)),
    max_size=60,
)


@given(OPS)
def test_the_highest_queue_follows_every_insert_and_removal(ops: list[tuple[str, str, int]]) -> None:
    m: QueueMap[int] = QueueMap()
    for op, topic, queue_id in ops:
        key = (topic, queue_id)
        if op == "set":
            m[key] = queue_id
        elif op == "del" and key in m:
            del m[key]
        elif op == "pop":
            had = key in m
            assert m.pop(key, None) == (queue_id if had else None)
            assert key not in m
        for t in ("a", "b", "c"):
            ids = [q for tt, q in m if tt == t]
            assert m.highest_queue(t) == (max(ids) if ids else None)


def test_pop_and_the_refused_writes() -> None:
    m: QueueMap[str] = QueueMap()
    m["t", 3] = "x"
    m["t", 9] = "y"
    assert m.pop(("t", 9)) == "y"
    assert m.highest_queue("t") == 3
    assert m.pop(("t", 9), "gone") == "gone"
    with pytest.raises(KeyError):
        m.pop(("t", 9))
    with pytest.raises(TypeError, match="keeps an index"):
        m.update({("t", 20): "z"})
    with pytest.raises(TypeError, match="keeps an index"):
        m.setdefault(("t", 20), "z")
    with pytest.raises(TypeError, match="keeps an index"):
        m.clear()
    with pytest.raises(TypeError, match="keeps an index"):
        m.popitem()
    assert dict(m) == {("t", 3): "x"}
    assert m.highest_queue("t") == 3


@pytest.fixture
def store(tmp_path: Path) -> Iterator[BlockingMessageStore]:
    cfg = TierdConfig.from_dict(
        {"store": {"dir": str(tmp_path / "hot")}, "backend": {"url": str(tmp_path / "cold")}}
    )
    with BlockingMessageStore.open(cfg) as s:
        yield s


def test_queue_count_and_existence_come_from_the_index_not_the_listing(
    store: BlockingMessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = store.config.store.default_queues
    store.put(Message(topic="wide", body=b"x", queue_id=default + 3))
    assert store.hot.wait_dispatched(10)
    store.tier_now()
    store.put(Message(topic="narrow", body=b"y"))
    assert store.hot.wait_dispatched(10)

    def no_listing(self: TopicAdmin) -> dict[str, list[int]]:
        raise AssertionError("a produce-path question built the full topic listing")

    store.put(Message(topic="wide", body=b"z", queue_id=1))  # a gap: queues 2 .. default + 2 empty
    assert store.hot.wait_dispatched(10)
    listed = store.topics(system=True)

    monkeypatch.setattr(TopicAdmin, "known", no_listing)
    for topic in ("wide", "narrow", "never"):  # what a receive reads, each topic's own entry
        assert store.queue_ids(topic) == listed.get(topic, [])
    assert store.queue_ids("wide") == [1, default + 3]
    assert store.describe_topic("wide").queues == default + 4
    assert store.queue_count("wide") == default + 4  # one past its highest queue id, both tiers
    assert store.queue_count("narrow") == default
    assert store.queue_count("never") == default
    assert store.has_topic("wide")
    assert store.has_topic("narrow")
    assert not store.has_topic("never")
    monkeypatch.undo()
    assert set(store.list_topics()) == {"wide", "narrow"}  # the listing agrees
    store.delete_topic("narrow", force=True)
    assert not store.has_topic("narrow")
    assert store.queue_count("narrow") == default
