"""A full hot disk, for real: the store on a size-limited tmpfs (issue 29, cases 3 and 4).

Case 4: writes must be refused at ``store.disk_max_used_ratio``, not only once the disk is out
of space (retention, which enforced the ratio, runs once a minute; a burst filled the disk
between two runs). Case 3: even with the ratio at 100 % the store keeps headroom for its own
metadata, so that when the cold tier recovers, tiering records its progress, retention frees
space and producers are accepted again — with nobody deleting anything by hand.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, Message
from tierd.errors import BackendError, StoreFullError
from tierd.local.store import METADATA_HEADROOM_MIN

from ..tiered.conftest import cold_config, run

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tierd.config import TierdConfig

pytestmark = pytest.mark.timeout(180)

MiB = 1024 * 1024
BODY = 16 * 1024
#: Messages per put: 800 KiB, a fifth of a commitlog file.
BATCH = 50


@contextlib.contextmanager
def tmpfs(where: Path, size_mb: int) -> Iterator[Path]:
    """A real filesystem of ``size_mb`` MiB mounted at ``where`` (tests run as root)."""
    where.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def used_share(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total


def fill_until_refused(store: BlockingMessageStore, limit_mb: int) -> StoreFullError:
    """Produce until the store refuses; fail if ``limit_mb`` MiB go in without a refusal."""
    for _ in range(limit_mb * MiB // (BODY * BATCH)):
        try:
            store.put_batch([Message(topic="t", body=b"f" * BODY, queue_id=0) for _ in range(BATCH)])
        except StoreFullError as e:
            return e
    raise AssertionError(f"{limit_mb} MiB were accepted without a refusal")


def config(hot: Path, cold: Path, **store: object) -> TierdConfig:
    cfg = cold_config(hot.parent, group_commit_count=10**6, group_commit_timeout=10**6)
    return cfg.with_overrides(
        store={"dir": str(hot / "store"), "max_message_size": 64 * 1024, **store},
        backend={"name": "posix", "url": str(cold)},
    )


def test_writes_are_refused_at_the_ratio_not_at_enospc(tmp_path: Path) -> None:
    mount = tmp_path / f"hot-{uuid.uuid4().hex[:8]}"
    with tmpfs(mount, 96) as hot:
        cfg = config(hot, tmp_path / "cold", disk_max_used_ratio=0.5)
        with BlockingMessageStore.open(cfg) as store:
            store.wait_ready()  # tiering idle (its thresholds are never met): nothing may be deleted
            refused = fill_until_refused(store, 200)
            assert "disk_max_used_ratio" in str(refused), refused
            # Over the ratio by less than a commitlog file and a batch, nowhere near full.
            assert used_share(hot) < 0.5 + (cfg.store.commitlog_file_size + BODY * BATCH) / (96 * MiB)
            with pytest.raises(StoreFullError, match="disk_max_used_ratio"):
                store.put(Message(topic="t", body=b"one more", queue_id=0))


def test_a_full_disk_with_the_cold_tier_down_recovers_on_its_own(tmp_path: Path) -> None:
    """Ratio 100 %, cold tier on a full filesystem: producers are refused before the hot disk
    is full, the tiering metadata can still be written, and once the cold filesystem has room
    again tiering, retention and producers resume without anyone deleting a file."""
    hot_mount = tmp_path / f"hot-{uuid.uuid4().hex[:8]}"
    cold_mount = tmp_path / f"cold-{uuid.uuid4().hex[:8]}"
    with tmpfs(hot_mount, 96) as hot, tmpfs(cold_mount, 160) as cold:
        cfg = config(hot, cold / "bucket", disk_max_used_ratio=1.0, retention_interval=0.5)
        with BlockingMessageStore.open(cfg) as store:
            store.wait_ready()
            ballast = cold / "ballast"
            with ballast.open("wb") as fh, contextlib.suppress(OSError):  # the cold filesystem fills
                while True:
                    fh.write(b"\0" * MiB)
            refused = fill_until_refused(store, 200)
            assert "no disk space" not in str(refused), "refused at ENOSPC, not before"
            assert shutil.disk_usage(hot).free >= METADATA_HEADROOM_MIN // 2
            with pytest.raises(BackendError):
                store.tier_now()  # the cold tier is full: nothing moves
            assert store.tiering is not None
            run(store, store.tiering.flat.save())  # the tiering metadata can still be written
            ballast.unlink()  # the cold tier gets space again
            report = store.tier_now()
            assert report.pending == 0
            deadline = time.monotonic() + 60
            while True:  # retention frees the tiered files; producers are accepted again
                try:
                    store.put(Message(topic="t", body=b"accepted again", queue_id=0))
                    break
                except StoreFullError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)  # polling for retention's next run, bounded by the deadline
            assert store.hot.commitlog.min_offset > 0  # retention deleted tiered files
