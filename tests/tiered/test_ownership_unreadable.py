"""One flipped byte in an OWNER record: reads keep working, nothing is written while nobody can
tell who owns the prefix, verify names the record, restore refuses it with the way out, and
``tierd takeover --unreadable EPOCH`` (a real process) is that way out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, GetStatus, Message, ReadPolicy
from tierd.errors import PrefixOwnedError
from tierd.tiered.ownership import OWNER_DIR, OwnerRecord, store_id

from .conftest import cold_config

if TYPE_CHECKING:
    from pathlib import Path

TIERD = [sys.executable, "-c", "from tierd.cli import main; main()"]


def _record(bucket: Path, epoch: int) -> Path:
    (path,) = [p for p in bucket.rglob(f"{epoch:020d}.json") if p.parent.name == OWNER_DIR]
    return path


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"store-id"') + 2] ^= 0x01  # one byte of a key: the record no longer parses
    path.chmod(0o644)
    path.write_bytes(bytes(raw))


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "tierd.toml"
    path.write_text(
        f'[store]\ndir = "{tmp_path / "hot"}"\ncommitlog_file_size = 4194304\n'
        "max_message_size = 1048576\nconsumequeue_file_units = 10000\nindex_slots = 64\nindex_items = 4000\n"
        f'[tiered]\ndispatch_interval = 3600\n[backend]\nurl = "{tmp_path / "cold"}"\n'
    )
    return path


def _takeover(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIERD, "--config", str(cfg), "--output", "json", "takeover", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_unreadable_owner_record_blocks_writes_not_reads_and_takeover_ends_it(tmp_path: Path) -> None:
    cfg = cold_config(tmp_path)
    bodies = [b"m%03d" % i for i in range(30)]
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="t", body=b, queue_id=0) for b in bodies])
        assert store.tier_now().committed == 30
    _flip(_record(tmp_path / "cold", 1))

    with BlockingMessageStore.open(cfg) as store:
        r = store.get("t", 0, 0, 64, ReadPolicy.FORCE)  # the cold tier started: reads work
        assert (r.status, r.source, [m.body for m in r.messages]) == (GetStatus.FOUND, "cold", bodies)
        store.put(Message(topic="t", body=b"new", queue_id=0))  # still acknowledged
        with pytest.raises(PrefixOwnedError, match="tierd takeover --unreadable 1"):
            store.tier_now()  # nothing is written while the owner is unknown
        status = store.tiering_status()
        assert status is not None
        ownership = status["ownership"]
        assert isinstance(ownership, dict)
        assert ownership["owned_by_this_store"] is False
        assert ownership["error"]["detail"]["unreadable_epoch"] == 1

    report = BlockingMessageStore.verify_store(cfg)
    assert [(p.area, p.where.rsplit("/", 2)[-2:]) for p in report.problems] == [
        ("ownership", [OWNER_DIR, f"{1:020d}.json"])
    ]
    assert "tierd takeover --unreadable 1" in report.problems[0].message

    restored = cold_config(tmp_path / "new", backend={"name": "posix", "url": str(tmp_path / "cold")})
    with pytest.raises(PrefixOwnedError, match="unreadable"):
        BlockingMessageStore.restore(restored)  # refused, with the way out named

    cfg_file = _config_file(tmp_path)
    wrong = _takeover(cfg_file, "--unreadable", "2")  # must name the unreadable (highest) record
    assert wrong.returncode == 1, wrong
    assert "epoch 2 is not the highest" in wrong.stderr
    done = _takeover(cfg_file, "--unreadable", "1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["epoch"] == 2
    new = OwnerRecord.model_validate_json(_record(tmp_path / "cold", 2).read_bytes())
    assert (new.store_id, new.reason) == (store_id(tmp_path / "hot", create=False), "takeover")
    again = _takeover(cfg_file, "--unreadable", "1")  # once only: epoch 1 is no longer the highest
    assert again.returncode == 1

    with BlockingMessageStore.open(cfg) as store:  # this store owns the prefix again and tiers
        assert store.tier_now().committed == 1
        assert [m.body for m in store.get("t", 0, 0, 64, ReadPolicy.FORCE).messages] == [*bodies, b"new"]
