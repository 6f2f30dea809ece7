"""Consumers over HTTP (the daemon in a thread, real sockets): tag filters, seek by time,
consumer groups, long polling and what draining does to it; committed offsets across a kill -9
of a real ``tierd serve``.

consumers ──HTTP──▶ tierd ──▶ hot store ──tier_now──▶ posix cold tier
                      │  ▲
       long polls park│  │woken by the dispatch thread when their queue grows
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tierd import TierdConfig

from .conftest import Running, TierdProcess, running, service_config, toml
from .test_api import assert_error, b64

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

Q = "/v1/topics/orders/queues/0"


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Running]:
    with running(TierdConfig.from_dict(service_config(tmp_path, server={"long_poll_max_ms": 600_000}))) as r:
        yield r


def _produce(svc: Running, tags: list[str | None], at_ms: int | None = None) -> None:
    if at_ms is not None:
        store = svc.daemon.store
        assert store is not None
        store.hot.commitlog.clock = functools.partial(int, at_ms)
    messages: list[dict[str, Any]] = [{"body": b64(b"%d" % i), "queue_id": 0} for i in range(len(tags))]
    for m, tag in zip(messages, tags, strict=True):
        if tag is not None:
            m["tags"] = tag
    r = svc.client.post("/v1/topics/orders/messages:batch", json={"messages": messages})
    assert r.status_code == 200, r.text


def _read(svc: Running, **params: Any) -> dict[str, Any]:
    r = svc.client.get(f"{Q}/messages", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _follow(svc: Running, **params: Any) -> list[dict[str, Any]]:
    """Every message a consumer following ``next_offset`` from 0 gets."""
    got: list[dict[str, Any]] = []
    offset = 0
    while (r := _read(svc, offset=offset, max=16, **params))["status"] != "OFFSET_OVERFLOW_ONE":
        assert r["next_offset"] > offset
        got += r["messages"]
        offset = r["next_offset"]
    return got


def test_tag_filters_in_both_tiers_and_bad_expressions(svc: Running) -> None:
    _produce(svc, ["paid", "Aa", "BB", None, "refunded"] * 20)
    svc.client.post("/v1/admin/tier", json={})
    _produce(svc, ["paid", "Aa", "BB", None, "refunded"] * 20)
    for policy in ("FORCE", "DISABLE"):
        got = _follow(svc, tags="refunded || paid", policy=policy)
        assert [m["queue_offset"] for m in got] == [i for i in range(200) if i % 5 in (0, 4)]
        assert {m["tags"] for m in got} == {"paid", "refunded"}
        got = _follow(svc, tags="Aa", policy=policy)  # "BB" has the same hash
        assert [(m["queue_offset"], m["tags"]) for m in got] == [(i, "Aa") for i in range(1, 200, 5)]
    r = _read(svc, offset=0, max=5, tags="nobody", policy="FORCE")
    assert (r["status"], r["messages"], r["next_offset"], r["source"]) == (
        "NO_MATCHED_MESSAGE",
        [],
        100,
        "cold",
    )
    r = _read(svc, offset=0, max=5, tags="*")
    assert len(r["messages"]) == 5
    for bad, why in (("paid ||", "is empty"), ("paid | x", "single '|'"), ("* || paid", "'*'")):
        body = assert_error(
            svc.client.get(f"{Q}/messages", params={"tags": bad}), 400, "invalid_subscription"
        )
        assert why in body["message"]


def test_seek_by_time_across_tiers(svc: Running) -> None:
    _produce(svc, [None] * 10, at_ms=1_000)
    svc.client.post("/v1/admin/tier", json={})
    _produce(svc, [None] * 5, at_ms=2_000)
    _produce(svc, [None] * 5, at_ms=3_000)
    seek = svc.client.get(f"{Q}/offset", params={"timestamp": 1_500}).json()
    assert seek == {"topic": "orders", "queue_id": 0, "timestamp": 1_500, "boundary": "lower", "offset": 10}
    assert (
        svc.client.get(f"{Q}/offset", params={"timestamp": 2_000, "boundary": "upper"}).json()["offset"] == 14
    )
    assert svc.client.get(f"{Q}/offset", params={"timestamp": 0}).json()["offset"] == 0
    assert svc.client.get(f"{Q}/offset", params={"timestamp": 9_000}).json()["offset"] == 20
    assert svc.client.get(f"{Q}/earliest-time").json() == {
        "topic": "orders",
        "queue_id": 0,
        "earliest_time": 1_000,
    }
    assert svc.client.get("/v1/topics/orders/queues/3/earliest-time").json()["earliest_time"] == -1
    assert_error(svc.client.get(f"{Q}/offset"), 422, "invalid_request")  # timestamp is required
    assert_error(
        svc.client.get(f"{Q}/offset", params={"timestamp": 1, "boundary": "x"}), 422, "invalid_request"
    )


def test_consumer_groups_commit_list_reset_delete_and_lag_metric(svc: Running) -> None:
    c = svc.client
    _produce(svc, [None] * 10, at_ms=1_000)
    _produce(svc, [None] * 10, at_ms=2_000)
    G = "/v1/groups/billing"
    assert c.get(f"{G}/offsets").json() == {"group": "billing", "offsets": []}
    assert_error(c.get(G), 404, "not_found")
    r = c.put(f"{G}/topics/orders/queues/0/offset", json={"offset": 15})
    assert r.json() == {"topic": "orders", "queue_id": 0, "offset": 15}
    assert c.get(f"{G}/offsets").json()["offsets"] == [{"topic": "orders", "queue_id": 0, "offset": 15}]
    group = c.get(G).json()
    assert (group["lag"], group["queues"][0]["committed"], group["queues"][0]["max_offset"]) == (5, 15, 20)
    assert [g["group"] for g in c.get("/v1/groups").json()["groups"]] == ["billing"]
    metrics = c.get("/metrics").text
    assert 'tierd_consumer_lag_messages{group="billing",queue_id="0",topic="orders"} 5.0' in metrics
    assert 'tierd_consumer_group_lag_messages{group="billing"} 5.0' in metrics

    body = assert_error(
        c.put(f"{G}/topics/orders/queues/0/offset", json={"offset": 21}), 400, "offset_out_of_range"
    )
    assert body["detail"] == {"offset": 21, "min_offset": 0, "max_offset": 20}
    assert_error(c.put(f"{G}/topics/orders/queues/0/offset", json={"offset": "1"}), 422, "invalid_request")
    assert_error(c.put(f"{G}/topics/orders/queues/5/offset", json={"offset": 0}), 404, "not_found")

    reset = c.post(f"{G}/reset", json={"topic": "orders", "to": "timestamp", "timestamp": 1_500}).json()
    assert reset == {"group": "billing", "offsets": [{"topic": "orders", "queue_id": 0, "offset": 10}]}
    assert (
        c.post(f"{G}/reset", json={"topic": "orders", "to": "earliest"}).json()["offsets"][0]["offset"] == 0
    )
    assert c.post(f"{G}/reset", json={"topic": "orders", "to": "latest"}).json()["offsets"][0]["offset"] == 20
    bad = c.post(f"{G}/reset", json={"topic": "orders", "to": "offset", "offset": 99, "queue_id": 0})
    assert_error(bad, 400, "offset_out_of_range")
    assert_error(
        c.post(f"{G}/reset", json={"topic": "orders", "to": "offset", "offset": 1}), 400, "invalid_argument"
    )
    assert_error(c.post(f"{G}/reset", json={"topic": "nope", "to": "latest"}), 404, "not_found")
    assert_error(c.post(f"{G}/reset", json={"topic": "orders", "to": "later"}), 422, "invalid_request")
    assert c.get(f"{G}/offsets").json()["offsets"][0]["offset"] == 20  # refused resets changed nothing

    assert c.delete(G).json() == {"group": "billing", "queues": 1}
    assert c.get("/v1/groups").json() == {"groups": []}
    assert "tierd_consumer_lag_messages{" not in c.get("/metrics").text


async def _waiting(svc: Running, n: int, woken: int = 0, deadline: float = 30) -> None:
    """Until ``n`` reads wait, after ``woken`` wake-ups (a bounded poll of the store's counters)."""
    store = svc.daemon.store
    assert store is not None
    end = time.monotonic() + deadline
    while store.arrivals.wakeups < woken or store.arrivals.waiting < n:
        assert time.monotonic() < end, f"{store.arrivals.waiting} waiters, expected {n}"
        await asyncio.sleep(0.01)


def test_a_long_poll_returns_when_a_matching_message_arrives(svc: Running) -> None:
    _produce(svc, ["paid"])

    async def scenario() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=svc.url, timeout=120) as c:
            waiter = asyncio.ensure_future(
                c.get(f"{Q}/messages", params={"offset": 1, "tags": "paid", "wait_ms": 600_000})
            )
            await _waiting(svc, 1)
            await c.post(
                "/v1/topics/orders/messages", json={"body": b64(b"x"), "queue_id": 0, "tags": "other"}
            )
            await _waiting(svc, 1, woken=1)  # woken by a message it does not want: waits again
            await c.post(
                "/v1/topics/orders/messages", json={"body": b64(b"y"), "queue_id": 0, "tags": "paid"}
            )
            r = await waiter
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

    # Without the wake-up the read would sit out its 600 s (the client gives up after 120 s).
    body = asyncio.run(scenario())
    assert body["status"] == "FOUND"
    assert [(m["queue_offset"], m["tags"]) for m in body["messages"]] == [(2, "paid")]
    assert body["next_offset"] == 3


def test_a_long_poll_ends_empty_when_its_wait_does(svc: Running) -> None:
    _produce(svc, ["other"] * 3)
    r = _read(svc, offset=0, tags="paid", wait_ms=200)
    assert (r["status"], r["messages"], r["next_offset"]) == ("NO_MATCHED_MESSAGE", [], 3)
    r = _read(svc, offset=3, wait_ms=100)
    assert (r["status"], r["messages"]) == ("OFFSET_OVERFLOW_ONE", [])
    body = assert_error(svc.client.get(f"{Q}/messages", params={"wait_ms": 600_001}), 400, "invalid_argument")
    assert "server.long_poll_max_ms" in body["message"]


def test_many_waiters_share_one_loop_and_all_wake(svc: Running) -> None:
    _produce(svc, [None])
    n = 40

    async def scenario() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n + 8)
        async with httpx.AsyncClient(base_url=svc.url, timeout=120, limits=limits) as c:
            other = asyncio.ensure_future(
                c.get("/v1/topics/orders/queues/1/messages", params={"wait_ms": 1_000})
            )
            before = threading.active_count()
            waiters = [
                asyncio.ensure_future(c.get(f"{Q}/messages", params={"offset": 1, "wait_ms": 600_000}))
                for _ in range(n)
            ]
            await _waiting(svc, n + 1)
            assert threading.active_count() < before + 5  # no thread per waiting request
            await c.post("/v1/topics/orders/messages", json={"body": b64(b"new"), "queue_id": 0})
            done = await asyncio.gather(*waiters)
            assert (await other).json()["status"] == "NO_MATCHED_LOGIC_QUEUE"  # another queue: not woken
            return done

    for r in asyncio.run(scenario()):
        assert r.status_code == 200
        assert [m["queue_offset"] for m in r.json()["messages"]] == [1]


def test_draining_releases_long_polls_at_once(tmp_path: Path) -> None:
    cfg = TierdConfig.from_dict(service_config(tmp_path, server={"long_poll_max_ms": 600_000}))
    results: list[httpx.Response | BaseException] = []
    with running(cfg) as svc:
        _produce(svc, [None])

        def long_poll() -> None:
            try:
                results.append(
                    httpx.get(f"{svc.url}{Q}/messages", params={"offset": 1, "wait_ms": 600_000}, timeout=120)
                )
            except BaseException as e:  # reported below
                results.append(e)

        waiter = threading.Thread(target=long_poll)
        waiter.start()
        asyncio.run(_waiting(svc, 1))
        svc.daemon.request_stop()  # SIGTERM's path: drain, tier, stop HTTP, close
        waiter.join(120)
        assert not waiter.is_alive()
    [r] = results
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["messages"]) == ("OFFSET_OVERFLOW_ONE", [])


def test_committed_offsets_survive_kill_9_of_the_daemon(tmp_path: Path) -> None:
    path = tmp_path / "tierd.toml"
    path.write_text(toml(service_config(tmp_path)))
    proc = TierdProcess(path)
    try:
        proc.wait_for("ready", 60)
        c = httpx.Client(base_url=proc.url, timeout=30)
        c.post("/v1/topics/orders/messages:batch", json={"messages": [{"body": "", "queue_id": 0}] * 10})
        assert c.put("/v1/groups/g/topics/orders/queues/0/offset", json={"offset": 7}).status_code == 200
        c.close()
        proc.proc.kill()  # SIGKILL: no drain, no close
        proc.proc.wait(30)
    finally:
        proc.kill()
    again = TierdProcess(path)
    try:
        again.wait_for("ready", 60)
        got = httpx.get(f"{again.url}/v1/groups/g/offsets", timeout=30).json()
        assert got["offsets"] == [{"topic": "orders", "queue_id": 0, "offset": 7}]
        assert again.terminate() == 0
    finally:
        again.kill()
