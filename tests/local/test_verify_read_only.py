"""``tierd verify`` without ``--repair`` changes nothing under the store directory or the posix
cold tier — not a byte, not an mtime — whatever damage it finds (issue 29, case 1). Each kind of
damage the hot store's recovery would repair on open (rebuild a unit, recreate a missing
commitlog file and quarantine its range, drop and rebuild a damaged key-index file, cut a torn
commitlog tail after a kill -9, fall back to the offsets backup) is reported by a real ``tierd
verify`` process with its location and exit 1; ``--repair`` then repairs it and a second
verify finds nothing left to do.

store dir + cold dir ──snapshot──▶ tierd verify (exit 1, damage named) ──snapshot── must be equal
                                   tierd verify --repair ──▶ tierd verify (exit 0)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.config import StoreConfig
from tierd.consumption.offsets import FILE_NAME as OFFSETS_FILE
from tierd.format.cq_unit import UNIT_SIZE
from tierd.local.index import HEADER_SIZE

from .conftest import SMALL_STORE

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

CLI = (sys.executable, "-c", "from tierd.cli import main; main()")
#: Bounds every CLI run and the crash child's start (a hang is a failure, not a stuck suite).
DEADLINE = 120


def _config(tmp_path: Path) -> tuple[TierdConfig, Path]:
    """Small hot files with a posix cold tier; the same settings as a TOML file for the CLI."""
    store = {**SMALL_STORE, "dir": str(tmp_path / "hot")}
    segment = StoreConfig(max_message_size=SMALL_STORE["max_message_size"]).max_record_size  # the smallest
    tiered = {"dispatch_interval": 3600, "commitlog_segment_size": segment, "consumequeue_segment_size": 100}
    backend = {"name": "posix", "url": str(tmp_path / "cold")}
    conf = tmp_path / "tierd.toml"
    conf.write_text(
        "[store]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in store.items())
        + "[tiered]\n"
        + "".join(f"{k} = {v}\n" for k, v in tiered.items())
        + "[backend]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in backend.items())
    )
    return TierdConfig.from_dict({"store": store, "tiered": tiered, "backend": backend}), conf


def _fill(cfg: TierdConfig) -> None:
    """~2.5 commitlog files in two queues (keys: three index files), some of it tiered, and
    committed consumer offsets (the offsets file and its backup)."""
    with BlockingMessageStore.open(cfg) as store:
        for i in range(0, 1200, 100):
            store.put_batch(
                [
                    Message(topic="t", body=b"%04d" % j * 120, keys=[f"k{j}"], queue_id=j % 2)
                    for j in range(i, i + 100)
                ]
            )
            if i == 200:
                assert store.tier_now().committed == 300
        store.commit_offset("billing", "t", 0, 7)
        store.commit_offset("billing", "t", 0, 9)


def _snapshot(*roots: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every file (bytes and mtime) and directory under the roots — the lock file included."""
    out: dict[str, tuple[bytes, int] | None] = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            out[str(p)] = (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
    return out


def _verify(conf: Path, *args: str) -> tuple[int, dict[str, Any]]:
    res = subprocess.run(
        [*CLI, "--config", str(conf), "--output", "json", "verify", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


# ------------------------------------------------------------------------------- damage kinds
def _flip_unit(hot: Path) -> str:
    """The size's sign bit of unit 150 of t/0: no longer looks written, written units after it."""
    f = hot / "consumequeue" / "t" / "0" / f"{128 * UNIT_SIZE:020d}"
    raw = bytearray(f.read_bytes())
    raw[(150 - 128) * UNIT_SIZE + 8] ^= 0x80
    f.write_bytes(bytes(raw))
    return "t/0@150"


def _remove_newest_commitlog(hot: Path) -> str:
    newest = sorted((hot / "commitlog").iterdir())[-1]
    newest.unlink()
    return newest.name


def _zero_index_header(hot: Path) -> str:
    damaged = sorted((hot / "index").iterdir())[0]
    with damaged.open("r+b") as fh:
        fh.write(bytes(HEADER_SIZE))
    return str(damaged)


def _flip_offsets(hot: Path) -> str:
    f = hot / "config" / OFFSETS_FILE
    raw = bytearray(f.read_bytes())
    raw[0] ^= 0x01
    f.write_bytes(bytes(raw))
    return str(f)


_CHILD = """
import os, sys
from tierd import BlockingMessageStore, Message, TierdConfig
cfg = TierdConfig.load(sys.argv[1])
store = BlockingMessageStore.open(cfg)
store.put_batch([Message(topic="t", body=b"late-%d" % i, queue_id=i % 2) for i in range(20)])
store.hot.commitlog.flush()
os.write(1, b"%d\\n" % store.hot.end_position)
sys.stdin.read()  # until killed
"""


def _torn_tail_after_kill(hot: Path, conf: Path) -> str:
    """A store SIGKILLed while open (its abort marker stays), with half a record written after
    its last one — as an append interrupted by the kill leaves it."""
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(conf)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        try:
            assert child.stdout is not None
            end = int(child.stdout.readline())  # readline is bounded by the child's own startup
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(DEADLINE)
    assert (hot / "abort").exists()
    files = sorted((hot / "commitlog").iterdir())
    last = next(f for f in files if int(f.name) <= end < int(f.name) + SMALL_STORE["commitlog_file_size"])
    with last.open("r+b") as fh:
        fh.seek(end - int(last.name))
        fh.write((300).to_bytes(4, "big") + b"\xab" * 100)  # a record of 300 bytes, cut short
    return str(end)


DAMAGE: dict[str, tuple[Callable[[Path], str], str]] = {
    "flipped consume-queue unit": (_flip_unit, "hot-consumequeue"),
    "missing newest commitlog file": (_remove_newest_commitlog, "hot-quarantine"),
    "zeroed key-index header": (_zero_index_header, "hot-index"),
    "flipped consumer-offsets byte": (_flip_offsets, "consumer-offsets"),
    "torn commitlog tail after kill -9": (lambda hot: "", "hot-commitlog"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_verify_reports_each_damage_and_writes_nothing_until_repair(tmp_path: Path, damage: str) -> None:
    cfg, conf = _config(tmp_path)
    hot, cold = tmp_path / "hot", tmp_path / "cold"
    _fill(cfg)
    make, area = DAMAGE[damage]
    named = _torn_tail_after_kill(hot, conf) if area == "hot-commitlog" else make(hot)
    before = _snapshot(hot, cold)

    code, report = _verify(conf)

    assert _snapshot(hot, cold) == before  # read-only: not a byte, an mtime or a file changed
    assert code == 1
    found = [p for p in report["problems"] if p["area"] == area]
    assert found, report["problems"]
    assert any(named in p["where"] or named in p["message"] for p in found), found
    assert all(not p["fixed"] for p in report["problems"])

    code, repaired = _verify(conf, "--repair")
    assert repaired["repairs"], repaired
    code, after = _verify(conf)
    left = [(p["area"], p["where"]) for p in after["problems"]]
    if area == "hot-quarantine":  # the messages are lost for good: the range stays listed
        assert code == 1
        assert [a for a, _ in left] == ["hot-quarantine"], after["problems"]
        assert "not yet recorded" not in after["problems"][0]["message"]
    else:
        assert (code, left) == (0, [])
    again = _snapshot(hot, cold)
    assert _verify(conf)[0] == code
    assert _snapshot(hot, cold) == again
