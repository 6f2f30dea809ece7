"""The rank column of the cold key index (``LocalFile.ranks``): what makes compaction of a file
written by this process one element-wise step.

The column must hold, for every item, how many older items share its slot; compaction with it
must give the very bytes of the two other orderings (the sort, which never looks at chains or
ranks, is the reference here; tests/tiered/test_index.py pins both to a per-item reference).
A reopened file, or one where a slot outgrew 16 bits, has no column and is compacted by its
chains instead — same bytes.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierd.drivers.memory import MemoryRoot
from tierd.testing.clock import ManualClock
from tierd.tiered.index import ColdIndexService, FileStatus, compact
from tierd.tiered.index import compaction as index_module
from tierd.tiered.index.format import compacted_size

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

T0 = 1_700_000_000_000


def put(svc: ColdIndexService, hashes: list[int]) -> None:
    idx = np.arange(len(hashes), dtype=np.int64)
    svc.put_items(np.array(hashes, dtype=np.uint32), 1, 0, idx * 100, 100, T0 + idx)


def by_sort(f: Any) -> bytes:
    return compact(f.mm, f.slots, f.items, use_chains=False).data.tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    slots=st.integers(1, 5),
    hashes=st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 9), min_size=1, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=4),
)
def test_ranks_count_older_slot_mates_and_compact_like_the_sort(
    tmp_path_factory: pytest.TempPathFactory, slots: int, hashes: list[int], cuts: list[int]
) -> None:
    store = tmp_path_factory.mktemp("ranks")

    async def main() -> None:
        unused = MemoryRoot("memory://unused")
        svc = ColdIndexService(store, unused, "C", "b", slots, len(hashes), clock=ManualClock(T0))
        await svc.load([])
        for a, b in itertools.pairwise(sorted({0, len(hashes), *(c for c in cuts if c < len(hashes))})):
            put(svc, hashes[a:b])  # several batches: ranks continue across them
        [f] = svc._local
        assert f.ranks is not None
        expected = [sum(1 for g in hashes[:i] if g % slots == h % slots) for i, h in enumerate(hashes)]
        assert f.ranks[1:].tolist() == expected
        assert compact(f.mm, slots, f.items, ranks=f.ranks).data.tobytes() == by_sort(f)
        await svc.close()

    asyncio.run(main())


def test_a_slot_outgrowing_16_bits_drops_the_column_and_chains_take_over(
    tmp_path: Path, mem: MemoryRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    chains: list[int] = []
    real = index_module._rows_by_chains

    def spy(*args: Any) -> Any:
        chains.append(args[2])
        return real(*args)

    monkeypatch.setattr(index_module, "_rows_by_chains", spy)
    limit = int(np.iinfo(np.uint16).max)

    async def main() -> None:
        svc = ColdIndexService(tmp_path, mem, "C", "b", 2, limit + 3, clock=ManualClock(T0))
        await svc.load([])
        put(svc, [7] * (limit + 1))  # slot 1: ranks 0 .. 65535 — still fits
        [f] = svc._local
        assert f.ranks is not None
        assert int(f.ranks.max()) == limit
        assert compact(f.mm, 2, f.items, ranks=f.ranks).data.tobytes() == by_sort(f)
        assert chains == []
        put(svc, [4, 9])  # slot 0 gets rank 0; slot 1 would get rank 65536
        assert f.ranks is None
        assert f.count == limit + 3
        expected = by_sort(f)
        await svc.maintain()  # full: sealed, compacted by its chains, uploaded
        assert chains == [limit + 3]
        assert svc.files()[0].status is FileStatus.UPLOADED
        assert await mem.driver(svc.segment_path(T0)).read_all() == expected
        await svc.close()

    asyncio.run(main())


def test_the_service_compacts_by_ranks_and_by_chains_after_a_restart(
    tmp_path: Path, mem: MemoryRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same items uploaded twice: by a service that wrote them (the rank column; neither the
    chains nor the sort run) and by one that reopened the file after a restart (chains)."""
    used: list[str] = []

    def spy(name: str) -> None:
        real = getattr(index_module, name)

        def call(*args: Any) -> Any:
            used.append(name)
            return real(*args)

        monkeypatch.setattr(index_module, name, call)

    spy("_rows_by_chains")
    spy("_order_by_sort")
    rng = np.random.default_rng(5)
    hashes = rng.integers(0, 2**32, 500, dtype=np.uint64).tolist()
    uploaded: list[bytes] = []

    async def fill_and_upload(store: Path, restart: bool) -> None:
        svc = ColdIndexService(store, mem, "C", store.name, 40, 500, clock=ManualClock(T0))
        await svc.load([])
        put(svc, hashes[:200])
        put(svc, hashes[200:])
        if restart:
            await svc.close()
            svc = ColdIndexService(store, mem, "C", store.name, 40, 500, clock=ManualClock(T0))
            await svc.load([])
            assert svc._local[0].ranks is None
        await svc.maintain()
        assert svc.files()[0].status is FileStatus.UPLOADED
        uploaded.append(await mem.driver(svc.segment_path(T0)).read_all())
        await svc.close()

    asyncio.run(fill_and_upload(tmp_path / "a", restart=False))
    assert used == []
    asyncio.run(fill_and_upload(tmp_path / "b", restart=True))
    assert used == ["_rows_by_chains"]
    assert uploaded[0] == uploaded[1]
    assert len(uploaded[0]) == compacted_size(40, 500)
