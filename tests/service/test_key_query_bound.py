"""A key query over HTTP reads no more than its page needs: with ``max=1024`` over 4 MiB
messages and a 1 MiB ``server.max_read_bytes``, each tier reads back the page's message, the one
after it (which says that more follow) and the message a continued page leaves out — never every
candidate (up to 1,024, each 4 MiB) before trimming (counted: ``HotStore.query_reads``,
``TierRouter.query_cold_reads``). Paging with ``next`` returns every message exactly once,
newest first.
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

from tierd import Message, TierdConfig
from tierd.config import MiB

from .conftest import running, service_config

if TYPE_CHECKING:
    from pathlib import Path

    from .conftest import Running

BIG = 4 * MiB
N = 8
TIERED = 5  # the oldest ones are in the cold tier (and its key index) too


def _config(root: Path) -> TierdConfig:
    data = service_config(root, server={"max_read_bytes": MiB})
    data["store"].update(max_message_size=BIG + MiB, commitlog_file_size=12 * BIG)
    return TierdConfig.from_dict(data)


def _put(r: Running, i: int) -> None:
    """Message ``i``, stored in a millisecond of its own (the store clock is this clock)."""
    store = r.daemon.store
    assert store is not None
    body = b"%02d" % i + bytes(BIG - 2)
    r.call(store.put, Message(topic="big", body=body, queue_id=i % 2, keys=["k"]))
    stored = time.time_ns() // 1_000_000
    deadline = time.monotonic() + 5
    while time.time_ns() // 1_000_000 <= stored:  # poll the clock past the put's millisecond
        assert time.monotonic() < deadline, "the clock did not advance"


def _reads(r: Running) -> tuple[int, int]:
    store = r.daemon.store
    assert store is not None
    return store.hot.query_reads, store.router.query_cold_reads


def test_a_key_query_reads_one_page_and_pages_through_every_message(tmp_path: Path) -> None:
    with running(_config(tmp_path)) as r:
        store = r.daemon.store
        assert store is not None
        for i in range(TIERED):
            _put(r, i)
        assert r.call(store.tier_now).committed == TIERED
        for i in range(TIERED, N):
            _put(r, i)
        got: list[str] = []
        params: dict[str, Any] = {"max": 1024}
        for _ in range(N + 1):  # a bound: one message per page, then the last page says so
            before = _reads(r)
            resp = r.client.get("/v1/topics/big/keys/k", params=params)
            assert resp.status_code == 200, resp.text
            page = resp.json()
            hot, cold = (after - b for after, b in zip(_reads(r), before, strict=True))
            # hot: the one the previous page returned, the page's message and the next one (the
            # one after that is seen in its header only); cold: those and that one
            assert hot <= 3, f"the hot tier read {hot} messages for one page"
            # plus, cold, the newer messages of `end`'s second: its index keeps whole seconds,
            # so they are read to learn their time (and not kept)
            newer = sum(1 for b64 in got if b64[:4] in COLD)
            assert cold <= 4 + newer, f"the cold tier read {cold} messages for one page"
            assert len(page["messages"]) == 1
            got += [m["body"] for m in page["messages"]]
            if page["next"] is None:
                break
            params = {"max": 1024, **page["next"]}
        assert [b64[:4] for b64 in got] == [_b64_prefix(i) for i in reversed(range(N))]


def _b64_prefix(i: int) -> str:
    """The first 4 base64 characters of a body starting with ``b"%02d" % i`` and a zero byte."""
    return base64.b64encode(b"%02d\x00" % i).decode()[:4]


COLD = {_b64_prefix(i) for i in range(TIERED)}
