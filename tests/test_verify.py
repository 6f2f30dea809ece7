"""``tierd verify`` (issue 15 part 3): read-only by default, every problem with its location,
manifests checked as they are (not rewritten first), ``--repair`` says what it changed.

store dir (hot + metadata + .bak) ──verify──▶ report ◀── bucket (segments, manifests, owner)
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.cli import app
from tierd.consumption.offsets import bucket_path as offsets_path
from tierd.tiered.manifest import broker_manifest_path, index_manifest_path, queue_manifest_path
from tierd.tiered.ownership import owner_path

from .tiered.conftest import MIN_SEGMENT, SMALL_BODY_LIMIT

if TYPE_CHECKING:
    from pathlib import Path

CLUSTER, BROKER = "DefaultCluster", "broker-a"
runner = CliRunner()


def _config(tmp_path: Path) -> TierdConfig:
    return TierdConfig.from_dict(
        {
            "store": {
                "dir": str(tmp_path / "hot"),
                "commitlog_file_size": 4 * 1024 * 1024,
                "max_message_size": SMALL_BODY_LIMIT,
                "consumequeue_file_units": 10_000,
                "index_slots": 64,
                "index_items": 4000,
            },
            "backend": {"name": "posix", "url": str(tmp_path / "cold")},
            "tiered": {
                "dispatch_interval": 3600,
                "commitlog_segment_size": MIN_SEGMENT,
                "consumequeue_segment_size": 100,
            },
        }
    )


@pytest.fixture
def cfg(tmp_path: Path) -> TierdConfig:
    """A stopped store with 60 messages in two queues, all tiered (many small segments: bodies
    of 2,880 bytes fill a little over one commitlog segment per queue)."""
    cfg = _config(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch(
            [
                Message(topic="t", body=b"body-%03d" % i * 360, keys=[f"k{i}"], queue_id=i % 2)
                for i in range(60)
            ]
        )
        store.commit_offset("billing", "t", 0, 10)  # its copy in the bucket is a known object
        assert store.tier_now().committed == 60
        assert store.tiering is not None
        store.tiering.index.max_file_age_ms = 0  # upload the cold key index (and its manifest) now
        asyncio.run_coroutine_threadsafe(store.tiering.index.maintain(), store._loop.loop).result(60)  # type: ignore[union-attr]
    return cfg


def _tree(*roots: Path) -> dict[str, bytes]:
    """Every file under the roots with its bytes (lock/abort files excluded: opening a store
    takes its lock, which is not a change of its data)."""
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file() and p.name not in ("lock", "abort"):
                out[str(p)] = p.read_bytes()
    return out


def _manifest(tmp_path: Path, queue: int = 0) -> Path:
    return tmp_path / "cold" / queue_manifest_path(CLUSTER, BROKER, "t", queue)


def _problems(cfg: TierdConfig, **kwargs: Any) -> list[tuple[str, str, str]]:
    report = BlockingMessageStore.verify_store(cfg, **kwargs)
    return [(p.area, p.where, p.message) for p in report.problems]


def test_a_healthy_store_verifies_ok_and_nothing_is_written(cfg: TierdConfig, tmp_path: Path) -> None:
    before = _tree(tmp_path / "hot" / "config", tmp_path / "cold")
    assert (tmp_path / "cold" / offsets_path(CLUSTER, BROKER)).is_file()
    assert (tmp_path / "cold" / index_manifest_path(CLUSTER, BROKER)).is_file()
    assert any((tmp_path / "cold").rglob("INDEX/*"))
    report = BlockingMessageStore.verify_store(cfg)
    assert report.ok, report.problems
    assert report.records == 120  # every record checked once hot and once cold
    assert report.segments > 10
    assert _tree(tmp_path / "hot" / "config", tmp_path / "cold") == before


def test_a_garbage_manifest_is_reported_not_silently_rewritten(cfg: TierdConfig, tmp_path: Path) -> None:
    _manifest(tmp_path).write_bytes(b"garbage")
    before = _tree(tmp_path / "hot" / "config", tmp_path / "cold")
    problems = _problems(cfg)
    assert problems == [
        (
            "manifest",
            queue_manifest_path(CLUSTER, BROKER, "t", 0),
            f"manifest {queue_manifest_path(CLUSTER, BROKER, 't', 0)} is not valid: Invalid JSON: "
            "expected value at line 1 column 1",
        )
    ]
    assert _tree(tmp_path / "hot" / "config", tmp_path / "cold") == before  # read-only
    repaired = BlockingMessageStore.verify_store(cfg, repair=True)
    assert repaired.ok
    assert repaired.repairs == ["rewrote 3 bucket manifest(s) from the metadata"]
    assert all(p.fixed for p in repaired.problems)
    assert json.loads(_manifest(tmp_path).read_bytes())["max-offset"] == 30
    assert BlockingMessageStore.verify_store(cfg).problems == []


def test_a_lying_manifest_is_reported_with_each_lie(cfg: TierdConfig, tmp_path: Path) -> None:
    m = json.loads(_manifest(tmp_path, 1).read_bytes())
    m["max-offset"] = 500  # claims messages that do not exist
    sealed = next(s for s in m["segments"] if s["type"] == "COMMIT_LOG" and s["sealed"])
    sealed["size"] += 7
    sealed["message-count"] += 1
    last = m["segments"][-1]
    m["segments"].append({**last, "base-offset": last["base-offset"] + 10_000})  # a segment nobody has
    dropped = next(s for s in m["segments"] if s["type"] == "CONSUME_QUEUE")
    m["segments"].remove(dropped)
    _manifest(tmp_path, 1).write_text(json.dumps(m))
    messages = [msg for area, where, msg in _problems(cfg) if area == "manifest"]
    assert "claims readable offsets up to 500, the cold tier holds up to 30" in messages
    assert f"does not list CONSUME_QUEUE segment {dropped['base-offset']}" in messages
    assert (
        f"lists {last['type']} segment {last['base-offset'] + 10_000}, which the store does not have"
        in messages
    )
    name = f"COMMIT_LOG segment {sealed['base-offset']}"
    assert f"{name}: lists {sealed['size']} bytes, the backend holds {sealed['size'] - 7}" in messages
    assert any(msg.startswith(f"{name}: lists {sealed['message-count']} messages") for msg in messages)
    assert len(messages) == 5


def test_the_broker_manifest_is_checked_against_metadata(cfg: TierdConfig, tmp_path: Path) -> None:
    path = tmp_path / "cold" / broker_manifest_path(CLUSTER, BROKER)
    m = json.loads(path.read_bytes())
    m["topics"][0]["queues"] = [0]
    path.write_text(json.dumps(m))
    assert _problems(cfg) == [
        (
            "manifest",
            broker_manifest_path(CLUSTER, BROKER),
            "topic 't': lists id 0, queues [0]; metadata has id 0, queues [0, 1]",
        )
    ]


def test_a_bucket_without_local_metadata_is_reported_and_nothing_is_created(
    cfg: TierdConfig, tmp_path: Path
) -> None:
    config = tmp_path / "hot" / "config"
    for name in ("tieredStoreMetadata.json", "tieredStoreMetadata.json.bak"):
        (config / name).unlink()
    before = _tree(config, tmp_path / "cold")
    report = BlockingMessageStore.verify_store(cfg)
    assert not report.ok
    [problem] = report.problems
    assert problem.area == "metadata"
    assert "no usable tiering metadata, but the bucket prefix" in problem.message
    assert "segment(s)" in problem.message
    assert "tierd restore" in problem.message
    assert not (config / "tieredStoreMetadata.json").exists()  # verify used to create an empty one
    assert _tree(config, tmp_path / "cold") == before


def test_a_corrupt_main_metadata_file_is_reported_even_with_a_good_backup(
    cfg: TierdConfig, tmp_path: Path
) -> None:
    main = tmp_path / "hot" / "config" / "tieredStoreMetadata.json"
    main.write_text("{")
    [problem] = BlockingMessageStore.verify_store(cfg).problems
    assert (problem.area, problem.where) == ("metadata", str(main))
    assert "unreadable (Invalid JSON: EOF while parsing" in problem.message
    assert "falls back to the backup" in problem.message
    repaired = BlockingMessageStore.verify_store(cfg, repair=True)
    assert repaired.repairs == [f"restored {main} from tieredStoreMetadata.json.bak"]
    assert BlockingMessageStore.verify_store(cfg).ok


def test_verify_goes_on_past_bad_hot_records_and_reports_each(cfg: TierdConfig, tmp_path: Path) -> None:
    log = next((tmp_path / "hot" / "commitlog").iterdir())
    with BlockingMessageStore.open(cfg) as store:
        q = store.hot.queue("t", 0)
        assert q is not None
        units = q.read_units(0, 30)
    offsets = [int(o) for o in units["offset"]]
    raw = bytearray(log.read_bytes())
    raw[offsets[3] + 90] ^= 0xFF  # body of record 3 of queue 0: its CRC no longer matches
    raw[offsets[10] + 4 : offsets[10] + 8] = b"\x00\x00\x00\x00"  # record 10: magic destroyed
    raw[offsets[20] + 90] ^= 0xFF  # body of record 20
    log.write_bytes(bytes(raw))
    report = BlockingMessageStore.verify_store(cfg)
    hot = [p for p in report.problems if p.area == "hot-commitlog"]
    assert [p.where for p in hot] == [f"{log}@{offsets[i]}" for i in (3, 10, 20)]
    assert "body CRC does not match" in hot[0].message
    assert "bad framing" in hot[1].message
    assert "scan resumed at" in hot[1].message
    assert report.records == 120 - 3  # every other record, hot and cold, was checked
    assert report.counts()["hot-commitlog"] == 3


def test_objects_nobody_knows_and_another_owner_are_reported(cfg: TierdConfig, tmp_path: Path) -> None:
    cl = next(p for p in (tmp_path / "cold").rglob("COMMIT_LOG") if p.parent.name == "1")
    stray = cl / "cfcd2084stray000000000000"
    stray.write_bytes(b"another writer")
    record = tmp_path / "cold" / owner_path(CLUSTER, BROKER, 1)
    other = json.loads(record.read_text())
    other.update({"epoch": 2, "store-id": "someone-else", "reason": "takeover"})
    (tmp_path / "cold" / owner_path(CLUSTER, BROKER, 2)).write_text(json.dumps(other))
    problems = _problems(cfg)
    relative = str(stray.relative_to(tmp_path / "cold"))
    unknown = "1 object(s) that the metadata does not know (another writer's, or leftovers), e.g. "
    assert ("bucket", relative.rsplit("/", 1)[0], unknown + relative) in problems
    owned = [p for p in problems if p[0] == "ownership"]
    assert len(owned) == 1
    assert "owned by store someone-else" in owned[0][2]


def test_cli_verify_exits_1_lists_every_problem_and_repair_says_what_it_changed(
    cfg: TierdConfig, tmp_path: Path
) -> None:
    conf = tmp_path / "tierd.toml"
    store, cold = cfg.store, cfg.backend.url
    conf.write_text(
        f'[store]\ndir = "{store.dir}"\ncommitlog_file_size = {store.commitlog_file_size}\n'
        f"max_message_size = {store.max_message_size}\nconsumequeue_file_units = 10000\n"
        "index_slots = 64\nindex_items = 4000\n"
        f"[tiered]\ncommitlog_segment_size = {cfg.tiered.commitlog_segment_size}\n"
        "consumequeue_segment_size = 100\n"
        f'[backend]\nurl = "{cold}"\n'
    )
    _manifest(tmp_path).write_bytes(b"garbage")
    (tmp_path / "hot" / "config" / "tieredStoreMetadata.json").write_text("{")
    res = runner.invoke(app, ["--config", str(conf), "--output", "json", "verify"])
    assert res.exit_code == 1, res.output
    body = json.loads(res.stdout)
    assert body["ok"] is False
    assert body["counts"] == {"manifest": 1, "metadata": 1}
    assert all(p["fix"] and not p["fixed"] for p in body["problems"])
    text = runner.invoke(app, ["--config", str(conf), "verify"])
    assert text.exit_code == 1
    assert "PROBLEMS FOUND (1 manifest, 1 metadata)" in text.stdout
    fixed = runner.invoke(app, ["--config", str(conf), "verify", "--repair"])
    assert fixed.exit_code == 0, fixed.output
    assert "repaired: restored " in fixed.stdout
    assert "repaired: rewrote 3 bucket manifest(s) from the metadata" in fixed.stdout
    assert runner.invoke(app, ["--config", str(conf), "verify"]).exit_code == 0
