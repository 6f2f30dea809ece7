"""Reads before the cold tier has loaded are never answered from the hot tier alone.

bucket ──restore──▶ empty store ──open──▶ read at once ──▶ every message (the read waits for the
                                                           cold tier, bounded), or NotReadyError

The cold tier loads in the background after open. A backend that answers slowly (here: a real
posix directory behind the fault injector's delay) widens that window to a second or more, so
a read that does not wait sees the hot tier only — for a restored store an empty queue that
starts at the restored end: ``OFFSET_TOO_SMALL``, and a consumer that trusts it skips history.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from typer.testing import CliRunner

import tierd.tiered.service as tiering_service
from tierd import BlockingMessageStore, GetStatus, Message, MessageStore, ReadPolicy
from tierd.cli import app
from tierd.errors import NotReadyError
from tierd.service.app import create_app
from tierd.testing.faults import FaultPlan, FaultyRoot
from tierd.tiered.roots import open_driver_factory

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.config import BackendConfig, TierdConfig
    from tierd.drivers.segment import DriverRoot

SMALL: dict[str, Any] = {
    "max_message_size": SMALL_BODY_LIMIT,
    "commitlog_segment_size": MIN_SEGMENT,
    "consumequeue_segment_size": 400,
}
QUEUES = 3
PER_QUEUE = 120


def _body(qid: int, i: int) -> bytes:
    return b"q%d-%05d;" % (qid, i) * 170  # ~2.8 commitlog segments a queue


def _restored(tmp_path: Path, **tiered: Any) -> TierdConfig:
    """A bucket written by store A (every message cold, several segments per queue), restored
    into the empty directory of store B; returns B's configuration."""
    bucket = {"name": "posix", "url": str(tmp_path / "bucket")}
    cfg_a = cold_config(tmp_path / "a", backend=bucket, **SMALL)
    with BlockingMessageStore.open(cfg_a) as store:
        for i in range(PER_QUEUE):
            store.put_batch(
                [Message(topic="r", body=_body(q, i), keys=[f"k{q}-{i}"], queue_id=q) for q in range(QUEUES)]
            )
        store.tier_now()
    cfg_b = cold_config(tmp_path / "b", backend=bucket, **SMALL, **tiered)
    BlockingMessageStore.restore(cfg_b)
    return cfg_b


@pytest.fixture
def slow_backend(monkeypatch: pytest.MonkeyPatch) -> FaultPlan:
    """Every cold root the stores open is the configured one behind a delay on each size
    request (what loading asks per open segment): loading takes a second or more."""
    plan = FaultPlan(delays={"size": 0.2})

    def slow(cfg: BackendConfig) -> DriverRoot:
        return FaultyRoot(open_driver_factory(cfg), plan)

    monkeypatch.setattr(tiering_service, "open_driver_factory", slow)
    return plan


def _read_queue(store: BlockingMessageStore, qid: int, policy: ReadPolicy) -> list[bytes]:
    """Every message of queue ``qid`` from offset 0, read the way a consumer does."""
    bodies: list[bytes] = []
    offset = 0
    while True:
        r = store.get("r", qid, offset, 50, policy)
        assert r.status in (GetStatus.FOUND, GetStatus.OFFSET_OVERFLOW_ONE), (qid, offset, r.status, r)
        if r.status is GetStatus.OFFSET_OVERFLOW_ONE:
            return bodies
        assert [m.queue_offset for m in r.messages] == list(range(offset, r.next_offset))
        bodies += [m.body for m in r.messages]
        offset = r.next_offset


@pytest.mark.parametrize("policy", list(ReadPolicy))
def test_restored_store_read_at_once_returns_every_message(
    tmp_path: Path, slow_backend: FaultPlan, policy: ReadPolicy
) -> None:
    cfg = _restored(tmp_path)
    expected = {q: [_body(q, i) for i in range(PER_QUEUE)] for q in range(QUEUES)}
    loads = slow_backend.count("size")
    with BlockingMessageStore.open(cfg) as store:
        assert store.tiering is not None
        assert not store.tiering.ready.is_set()
        for q in range(QUEUES):
            assert _read_queue(store, q, policy) == expected[q]
    assert slow_backend.count("size") > loads  # the loading really went through the slow root


def test_every_cold_dependent_answer_waits_for_the_cold_tier(tmp_path: Path, slow_backend: FaultPlan) -> None:
    cfg = _restored(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        assert store.tiering is not None
        assert not store.tiering.ready.is_set()
        assert (store.min_offset("r", 1), store.max_offset("r", 1)) == (0, PER_QUEUE)
    with BlockingMessageStore.open(cfg) as store:
        assert store.topics() == {"r": list(range(QUEUES))}
    with BlockingMessageStore.open(cfg) as store:
        assert [(q.min_offset, q.max_offset) for q in store.queues("r")] == [(0, PER_QUEUE)] * QUEUES
    with BlockingMessageStore.open(cfg) as store:
        assert store.earliest_time("r", 2) > 0
    with BlockingMessageStore.open(cfg) as store:
        assert store.offset_for_time("r", 0, 0) == 0
        assert store.offset_for_time("r", 0, 2**62) == PER_QUEUE


def test_asyncio_store_is_loaded_when_open_returns(tmp_path: Path, slow_backend: FaultPlan) -> None:
    cfg = _restored(tmp_path)

    async def main() -> None:
        async with MessageStore.open(cfg) as store:
            assert (store.min_offset("r", 0), store.max_offset("r", 0)) == (0, PER_QUEUE)
            r = await store.get("r", 0, 0, 5)
            assert [m.body for m in r.messages] == [_body(0, i) for i in range(5)]

    asyncio.run(main())


def test_a_cold_tier_that_does_not_load_in_time_is_a_retriable_error_not_a_partial_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _restored(tmp_path, ready_timeout=0.3)
    plan = FaultPlan(delays={"size": 30.0})  # a backend that never answers in time

    def stuck(backend: BackendConfig) -> DriverRoot:
        return FaultyRoot(open_driver_factory(backend), plan)

    monkeypatch.setattr(tiering_service, "open_driver_factory", stuck)
    with BlockingMessageStore.open(cfg) as store:
        started = time.monotonic()
        with pytest.raises(NotReadyError, match=r"cold tier has not loaded after 0\.3 s") as err:
            store.get("r", 0, 0, 5)
        assert err.value.retry_after >= 1
        assert isinstance(err.value, TimeoutError)
        for call in (
            lambda: store.min_offset("r", 0),
            lambda: store.topics(),
            lambda: store.query("r", "k0-1"),
            lambda: store.offset_for_time("r", 0, 0),
        ):
            with pytest.raises(NotReadyError):
                call()
        assert time.monotonic() - started < 25  # each waited about ready_timeout, not for ever
        # writes do not depend on the cold tier: the hot store takes them meanwhile
        assert store.put(Message(topic="r", body=b"new", queue_id=0)).queue_offset == PER_QUEUE
        store.close(grace=0)

    async def asyncio_facade() -> None:
        async with MessageStore.open(cfg) as store:  # open waits ready_timeout, then opens anyway
            with pytest.raises(NotReadyError):
                store.min_offset("r", 0)  # a synchronous call cannot wait: it refuses
            with pytest.raises(NotReadyError):
                await store.get("r", 0, 0, 1)
            await store.close(grace=0)

    asyncio.run(asyncio_facade())


def test_http_answers_503_not_ready_with_retry_after_until_the_cold_tier_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _restored(tmp_path, ready_timeout=0.2)
    plan = FaultPlan(delays={"size": 1.0})  # loading takes seconds; each request waits 0.2 s

    def slow(backend: BackendConfig) -> DriverRoot:
        return FaultyRoot(open_driver_factory(backend), plan)

    monkeypatch.setattr(tiering_service, "open_driver_factory", slow)

    async def main() -> None:
        store = await MessageStore.open(cfg, ready_timeout=0)  # as the daemon opens it
        transport = httpx.ASGITransport(app=create_app(cfg, store))
        async with httpx.AsyncClient(transport=transport, base_url="http://tierd") as c:
            for path in ("/v1/topics/r/queues/0/messages?offset=0", "/v1/topics", "/v1/topics/r/queues"):
                r = await c.get(path)
                assert r.status_code == 503, (path, r.text)
                assert r.json()["error"] == "not_ready"
                assert int(r.headers["retry-after"]) >= 1
            # writes are served while the cold tier loads
            r = await c.post("/v1/topics/r/messages", json={"body": "", "queue_id": 0})
            assert r.status_code == 200
            assert r.json()["queue_offset"] == PER_QUEUE
            await store.wait_ready(60)
            r = await c.get("/v1/topics/r/queues/0/messages?offset=0&max=3")
            assert r.status_code == 200, r.text
            assert [m["queue_offset"] for m in r.json()["messages"]] == [0, 1, 2]
        await store.close(grace=0)

    asyncio.run(main())


def test_cli_refuses_in_one_line_with_exit_1_while_the_cold_tier_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _restored(tmp_path)
    plan = FaultPlan(delays={"size": 30.0})

    def stuck(backend: BackendConfig) -> DriverRoot:
        return FaultyRoot(open_driver_factory(backend), plan)

    monkeypatch.setattr(tiering_service, "open_driver_factory", stuck)
    path = tmp_path / "tierd.toml"
    path.write_text(
        f'[store]\ndir = "{cfg.store.dir}"\n'
        + "".join(f"{k} = {getattr(cfg.store, k)}\n" for k in ("commitlog_file_size", "max_message_size"))
        + "".join(
            f"{k} = {getattr(cfg.store, k)}\n"
            for k in ("consumequeue_file_units", "index_slots", "index_items")
        )
        + "[tiered]\ndispatch_interval = 3600\nready_timeout = 0.2\n"
        + f'[backend]\nurl = "{cfg.backend.url}"\n'
    )
    res = CliRunner().invoke(app, ["--config", str(path), "consume", "r", "-q", "0"])
    assert res.exit_code == 1, res.output
    assert res.stderr.count("\n") == 1
    assert res.stderr.startswith("tierd: error: the cold tier has not loaded after 0.2 s")
    assert "retry shortly" in res.stderr
