"""The reader beside the store that owns the bucket: it writes nothing (not an owner record, not
a byte), and the owner goes on tiering; a dataset kept open sees what was tiered since."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow.compute as pc

import tierd.arrow
from tierd import BlockingMessageStore
from tierd.tiered.ownership import owner_dir

from .conftest import config, fill, history

if TYPE_CHECKING:
    from pathlib import Path


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_scans_leave_the_bucket_and_its_owner_alone(tmp_path: Path) -> None:
    cold = tmp_path / "cold"
    with BlockingMessageStore.open(config(tmp_path, {"name": "posix", "url": str(cold)})) as store:
        n = fill(store, (60, 60), index_after=1)
        before = _snapshot(cold)
        owners = [k for k in before if k.startswith(owner_dir("DefaultCluster", "broker-a"))]
        assert owners  # the running store's claim

        ds = tierd.arrow.dataset(str(cold))
        assert ds.count_rows() == n
        assert tierd.arrow.dataset(str(cold), keys="k7").count_rows() == 1
        assert tierd.arrow.dataset(str(cold), tags="rare").count_rows() == sum(
            1 for i in range(n) if i % 40 == 1
        )
        assert ds.count_rows(filter=pc.field("uniq_key") == "u9") == 1
        assert _snapshot(cold) == before

        # The owner is undisturbed: it tiers more, and the same dataset sees it at its next scan.
        store.put_batch(history(n, 30))
        assert store.tier_now().committed == 30
        assert ds.count_rows() == n + 30
        after = _snapshot(cold)
        assert {k: after[k] for k in owners} == {k: before[k] for k in owners}
        assert not [
            k for k in after if k.startswith(owner_dir("DefaultCluster", "broker-a")) and k not in owners
        ]
