"""Settings that contradict the files on disk are refused before anything is written.

store made with 256 KiB commitlog files ──open with the 1 GiB default──▶ ConfigError naming
store.commitlog_file_size, 262144 and 1073741824; every file byte for byte as it was

The layout settings (commitlog file size, consume-queue units per file, index geometry) decide
where every byte lives; they are recorded in ``layout.json`` when a store is created.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, Message
from tierd.errors import ConfigError, CorruptionError

from .conftest import SMALL_STORE, small_config

if TYPE_CHECKING:
    from pathlib import Path


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Size and hash of every data file (the lock, abort marker and checkpoint aside)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("lock", "abort", "checkpoint")
    }


def _store(root: Path) -> dict[str, tuple[int, str]]:
    with BlockingMessageStore.open(small_config(root)) as store:
        store.put_batch(
            [Message(topic="l", body=b"%d" % i * 100, keys=[f"k{i}"], queue_id=0) for i in range(300)]
        )
    assert json.loads((root / "layout.json").read_text()) == {
        "format-version": 1,
        "commitlog-file-size": SMALL_STORE["commitlog_file_size"],
        "consumequeue-file-units": SMALL_STORE["consumequeue_file_units"],
        "index-slots": SMALL_STORE["index_slots"],
        "index-items": SMALL_STORE["index_items"],
    }
    return _snapshot(root)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("commitlog_file_size", 1024**3),  # the default: the case
        ("commitlog_file_size", 192 * 1024),
        ("consumequeue_file_units", 300_000),
        ("index_slots", 5_000_000),
        ("index_items", 50),
    ],
)
def test_open_with_a_different_layout_setting_is_refused_and_writes_nothing(
    tmp_path: Path, setting: str, value: int
) -> None:
    root = tmp_path / "s"
    before = _store(root)
    with pytest.raises(ConfigError) as err:
        BlockingMessageStore.open(small_config(root, **{setting: value}))
    message = str(err.value)
    assert (
        f"store.{setting} is configured as {value}, but the store was created with {SMALL_STORE[setting]}"
        in (message)
    )
    assert f"Set store.{setting} = {SMALL_STORE[setting]}" in message
    assert err.value.detail["settings"] == {setting: {"store": SMALL_STORE[setting], "configured": value}}
    assert _snapshot(root) == before  # nothing grown, shrunk or rewritten
    with BlockingMessageStore.open(small_config(root)) as store:  # the right settings still open it
        assert len(store.get("l", 0, 0, 500).messages) == 300


def test_tierd_verify_with_a_mismatched_setting_fails_in_one_line_and_touches_nothing(tmp_path: Path) -> None:
    root = tmp_path / "s"
    before = _store(root)
    cfg = tmp_path / "tierd.toml"
    small = {k: v for k, v in SMALL_STORE.items() if k != "commitlog_file_size"}  # the default 1 GiB
    cfg.write_text(
        f'[store]\ndir = "{root}"\n'
        + "".join(f"{k} = {v}\n" for k, v in small.items())
        + "[tiered]\nenabled = false\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", "from tierd.cli import main; main()", "--config", str(cfg), "verify"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1
    assert res.stderr.startswith("tierd: error: ")
    assert (
        "store.commitlog_file_size is configured as 1073741824, but the store was created with 262144"
        in res.stderr
    )
    assert _snapshot(root) == before


def test_a_store_without_a_layout_record_is_checked_against_its_files_then_recorded(tmp_path: Path) -> None:
    root = tmp_path / "s"
    before = _store(root)
    (root / "layout.json").unlink()  # as a store made before the record existed, or by RocketMQ
    del before["layout.json"]
    for setting, value, found in (
        ("commitlog_file_size", 1024**3, "its commitlog files hold 262144 bytes"),
        ("consumequeue_file_units", 100, "hold 1280 bytes"),
        ("index_items", 500, "make 10296-byte index files, but the store's index files hold 8296 bytes"),
    ):
        with pytest.raises(ConfigError, match=f"store\\.{setting}") as err:
            BlockingMessageStore.open(small_config(root, **{setting: value}))
        assert found in str(err.value)
        assert _snapshot(root) == before
        assert not (root / "layout.json").exists()
    with BlockingMessageStore.open(small_config(root)) as store:
        assert len(store.get("l", 0, 0, 500).messages) == 300
    assert json.loads((root / "layout.json").read_text())["commitlog-file-size"] == 262144


@pytest.mark.parametrize("content", ["not json", "[]", '{"format-version": 1}', '{"format-version": 7}'])
def test_a_damaged_layout_record_is_reported_not_guessed(tmp_path: Path, content: Any) -> None:
    root = tmp_path / "s"
    _store(root)
    (root / "layout.json").write_text(content)
    with pytest.raises(CorruptionError, match=r"layout record .*layout\.json"):
        BlockingMessageStore.open(small_config(root))
