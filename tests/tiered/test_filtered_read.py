"""Tag-filtered reads (``get(..., tags=...)``) in both tiers and across their boundary.

offsets:  0 ........ 400 ........ 600
cold:     [==========)                      (committed cold)
hot:            [=====================)     (hot retention dropped its oldest files)

Tags cycle by ``offset % 10``: 0 → paid, 1 → Aa, 2 → BB (same Java hash as Aa), 3 → none,
else other. A filtered read matches units on their tags code, fetches only candidates and
keeps those whose decoded tag matches.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, GetStatus, Message
from tierd.errors import InvalidSubscriptionError

from .conftest import cold_config, hot_only_config, run

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tierd.message import GetResult
    from tierd.tiered.flatmessage import FlatMessageFile

BODY = 1000


def _tag(i: int) -> str | None:
    return {0: "paid", 1: "Aa", 2: "BB", 3: None}.get(i % 10, "other")


def _body(i: int) -> bytes:
    return b"%04d" % i * (BODY // 4)


def _store(tmp_path: Path, tag: Callable[[int], str | None] = _tag, **tiered: Any) -> BlockingMessageStore:
    """600 messages in t/0: 0..399 cold, 400..599 hot only, the hot tier starting after 0."""
    cfg = cold_config(tmp_path, max_message_size=64 * 1024, commitlog_segment_size=150_000, **tiered)
    cfg = cfg.with_overrides(store={"commitlog_file_size": 256 * 1024, "file_reserved_time": 1.0})
    store = BlockingMessageStore.open(cfg)
    store.hot.commitlog.clock = functools.partial(int, 1_000)
    store.put_batch([Message(topic="t", body=_body(i), queue_id=0, tags=tag(i)) for i in range(400)])
    store.tier_now()
    store.hot.commitlog.clock = functools.partial(int, 2_000)
    assert store.tiering is not None
    store.tiering.dispatcher.stop()
    store.put_batch([Message(topic="t", body=_body(i), queue_id=0, tags=tag(i)) for i in range(400, 600)])
    store.hot.wait_dispatched(10)
    assert store.hot.apply_retention(now_ms=10**12) >= 1
    assert 0 < store.hot.min_offset("t", 0) < 400
    return store


def _consume(store: BlockingMessageStore, tags: str, **kw: Any) -> tuple[list[int], list[GetResult]]:
    """A consumer following next_offset from 0 to the end; returns offsets received and results."""
    got: list[int] = []
    results: list[GetResult] = []
    offset = 0
    while True:
        r = store.get("t", 0, offset, 7, tags=tags, **kw)
        results.append(r)
        if r.status is GetStatus.OFFSET_OVERFLOW_ONE:
            return got, results
        assert r.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), r
        assert r.next_offset > offset  # a filtered consumer never spins on one range
        got += [m.queue_offset for m in r.messages]
        assert all(m.body == _body(m.queue_offset) for m in r.messages)
        offset = r.next_offset


@pytest.mark.parametrize("policy", ["NOT_IN_DISK", "FORCE"])
def test_a_filtered_consumer_gets_exactly_its_tags_across_the_boundary(tmp_path: Path, policy: str) -> None:
    with _store(tmp_path) as store:
        got, results = _consume(store, "paid || BB", policy=policy)
        assert got == [i for i in range(600) if i % 10 in (0, 2)]
        assert {r.source for r in results if r.messages} == {"cold", "hot"}
        assert results[-1].next_offset == 600


def test_hash_collisions_never_deliver_the_other_tag_in_either_tier(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        got, results = _consume(store, "Aa", policy="FORCE")
        assert got == [i for i in range(600) if i % 10 == 1]
        assert {m.tags for r in results for m in r.messages} == {"Aa"}
        # the 40 cold "BB" units passed the hash stage and were dropped on their tag
        assert store.router.fetcher.cache.stats.filter_collisions == 40
        hot_only = store.get("t", 0, 400, 100, policy="DISABLE", tags="BB")
        assert [m.queue_offset for m in hot_only.messages] == [i for i in range(400, 600) if i % 10 == 2]


def test_untagged_messages_match_only_star(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        got, _ = _consume(store, "*")
        assert got == list(range(600))
        got, _ = _consume(store, "other")
        assert got == [i for i in range(600) if i % 10 >= 4]


def test_nothing_matched_moves_next_offset_to_the_end_of_what_was_scanned(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        r = store.get("t", 0, 0, 32, tags="absent")  # cold: scans to the cold end
        assert (r.status, r.messages, r.next_offset, r.source) == (
            GetStatus.NO_MATCHED_MESSAGE,
            (),
            400,
            "cold",
        )
        r = store.get("t", 0, 400, 32, tags="absent")  # hot: scans to the end
        assert (r.status, r.next_offset, r.source) == (GetStatus.NO_MATCHED_MESSAGE, 600, "hot")
        assert store.get("t", 0, 600, 32, tags="absent").status is GetStatus.OFFSET_OVERFLOW_ONE


def test_each_read_examines_a_bounded_number_of_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tierd.local.store
    import tierd.tiered.fetcher

    monkeypatch.setattr(tierd.local.store, "MAX_SCAN_UNITS", 150)
    monkeypatch.setattr(tierd.tiered.fetcher, "MAX_SCAN_UNITS", 150)
    with _store(tmp_path) as store:
        steps = [
            store.get("t", 0, o, 32, policy="FORCE", tags="absent").next_offset
            for o in (0, 150, 300, 400, 550)
        ]
        assert steps == [150, 300, 400, 550, 600]
        r = store.get("t", 0, 0, 32, policy="FORCE", tags="paid")
        assert (r.status, [m.queue_offset for m in r.messages]) == (GetStatus.FOUND, list(range(0, 150, 10)))
        assert r.next_offset == 150  # examined 150 units, found 15 (< 32)


def test_a_bad_expression_is_refused_before_reading(tmp_path: Path) -> None:
    with _store(tmp_path) as store, pytest.raises(InvalidSubscriptionError, match="is empty"):
        store.get("t", 0, 0, 32, tags="paid ||")


def _counting(ff: FlatMessageFile) -> list[int]:
    """Lengths of the flat commitlog reads of ``ff`` from now on."""
    lengths: list[int] = []
    original = ff.read_commitlog_into

    async def read_commitlog_into(flat_offset: int, out: memoryview) -> int:
        lengths.append(out.nbytes)
        return await original(flat_offset, out)

    ff.read_commitlog_into = read_commitlog_into  # type: ignore[method-assign]
    return lengths


def _backend_bytes(store: BlockingMessageStore) -> list[int]:
    assert store.tiering is not None
    read: list[int] = []
    store.tiering.root.observer = lambda op, _s, n, ok: read.append(n) if op == "read" and ok else None
    return read


def _fresh_reads(store: BlockingMessageStore) -> None:
    store.router.fetcher.cache.invalidate(("t", 0))
    store.router.fetcher.units.invalidate(("t", 0))


def test_a_rare_tag_fetches_only_its_records(tmp_path: Path) -> None:
    rare = {37, 150, 151, 390}  # 150 and 151 are neighbours: one ranged read for both

    def tag(i: int) -> str:
        return "rare" if i in rare else "common"

    with _store(tmp_path, tag) as store:
        assert store.tiering is not None
        ff = store.tiering.flat.get("t", 0)
        assert ff is not None
        lengths = _counting(ff)
        backend = _backend_bytes(store)
        r = store.get("t", 0, 0, 32, policy="FORCE", tags="rare")
        assert [m.queue_offset for m in r.messages] == sorted(rare)
        assert r.next_offset == 400
        record = r.messages[0].size
        assert lengths == [record, 2 * record, record]  # nothing else from the commitlog
        filtered = sum(backend)
        assert filtered <= 3 * record + 400 * 20 + 4 * record  # the records, the consume queue

        _fresh_reads(store)
        backend.clear()
        offset = 0
        while offset < 400:
            offset = store.get("t", 0, offset, 400, policy="FORCE").next_offset
        assert filtered * 10 < sum(backend)  # the unfiltered replay read every record


def test_dense_matches_cost_no_more_reads_than_an_unfiltered_replay(tmp_path: Path) -> None:
    with _store(tmp_path, lambda i: "paid", read_ahead_size=20 * BODY, read_ahead_count=50) as store:
        assert store.tiering is not None
        ff = store.tiering.flat.get("t", 0)
        assert ff is not None
        lengths = _counting(ff)

        def replay(**kw: Any) -> list[int]:
            _fresh_reads(store)
            del lengths[:]
            offsets, offset = [], 0
            while offset < 400:
                r = store.get("t", 0, offset, 16, policy="FORCE", **kw)
                offsets += [m.queue_offset for m in r.messages]
                offset = r.next_offset
            assert offsets == list(range(400))
            return list(lengths)

        plain = replay()
        filtered = replay(tags="paid")
        assert len(filtered) <= len(plain)
        assert sum(filtered) == sum(plain)  # every byte once: the gaps are empty


def test_a_filtered_read_of_cached_batches_costs_no_backend_read(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.get("t", 0, 0, 100, policy="FORCE")  # loads (and caches) the batch
        fetcher = store.router.fetcher

        async def settled() -> None:  # background read-ahead the read started
            while fetcher._prefetching:
                await asyncio.gather(*fetcher._prefetching)

        run(store, settled())
        reads = fetcher.cache.stats.backend_reads
        r = store.get("t", 0, 0, 5, policy="FORCE", tags="paid")
        assert [m.queue_offset for m in r.messages] == [0, 10, 20, 30, 40]
        assert store.router.fetcher.cache.stats.backend_reads == reads


def test_a_corrupt_cold_candidate_is_never_returned(tmp_path: Path) -> None:
    from pathlib import Path as P

    with _store(tmp_path) as store:
        assert store.tiering is not None
        ff = store.tiering.flat.get("t", 0)
        assert ff is not None
        seg = ff.commitlog.segments[0]
        path = P(store.config.backend.url) / seg.path
        raw = bytearray(path.read_bytes())
        raw[BODY // 2] ^= 0xFF  # inside record 0 ("paid")
        path.chmod(0o644)
        path.write_bytes(bytes(raw))
        _fresh_reads(store)
        r = store.get("t", 0, 0, 5, tags="paid")  # cold only: the hot tier no longer has it
        assert (r.status, r.messages) == (GetStatus.OFFSET_FOUND_NULL, ())


def test_filtered_reads_without_a_cold_tier(tmp_path: Path) -> None:
    cfg = hot_only_config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="t", body=_body(i), queue_id=0, tags=_tag(i)) for i in range(100)])
        got, _ = _consume(store, "Aa || paid")
        assert got == [i for i in range(100) if i % 10 in (0, 1)]
