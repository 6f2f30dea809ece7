"""The admin CLI through Typer's runner (in-process) and as a real subprocess: every command,
its JSON output, its exit codes, and what bad input gets."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from tierd import BlockingMessageStore, TierdConfig
from tierd.cli import app

if TYPE_CHECKING:
    from pathlib import Path

    from typer.testing import Result

    from tierd.testing.s3server import S3Server

runner = CliRunner()


def _config(tmp_path: Path, backend: str | None = None) -> Path:
    path = tmp_path / "tierd.toml"
    path.write_text(
        f'[store]\ndir = "{tmp_path / "hot"}"\ncommitlog_file_size = 4194304\n'
        "max_message_size = 1048576\nconsumequeue_file_units = 10000\nindex_slots = 64\nindex_items = 4000\n"
        "[tiered]\ndispatch_interval = 3600\n"
        + (backend if backend is not None else f'[backend]\nurl = "{tmp_path / "cold"}"\n')
    )
    return path


def tierd(cfg: Path, *args: str, input: str | None = None, code: int = 0) -> Result:
    res = runner.invoke(app, ["--config", str(cfg), *args], input=input)
    assert res.exit_code == code, f"exit {res.exit_code}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res


def tierd_json(cfg: Path, *args: str, input: str | None = None) -> Any:
    return json.loads(tierd(cfg, "--output", "json", *args, input=input).stdout)


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    return _config(tmp_path)


def _produce_lines(cfg: Path, topic: str, n: int, key: str) -> list[dict[str, Any]]:
    lines = "".join(f"message {i}\n" for i in range(n))
    out: list[dict[str, Any]] = tierd_json(
        cfg, "produce", topic, "--file", "-", "--lines", "-k", key, input=lines
    )
    return out


def test_produce_consume_query_round_trip(cfg: Path) -> None:
    one = tierd_json(
        cfg, "produce", "orders", "héllo", "-k", "o-1", "-t", "paid", "-p", "region=eu", "-q", "2"
    )
    assert [(r["queue_id"], r["queue_offset"]) for r in one] == [(2, 0)]

    got = tierd_json(cfg, "consume", "orders", "-q", "2")
    assert got["status"] == "FOUND"
    [m] = got["messages"]
    assert base64.b64decode(m["body"]) == "héllo".encode()
    assert (m["keys"], m["tags"], m["properties"]["region"]) == (["o-1"], "paid", "eu")
    assert m["msg_id"] == one[0]["msg_id"]

    hits = tierd_json(cfg, "query", "orders", "o-1")
    assert [h["msg_id"] for h in hits] == [one[0]["msg_id"]]
    assert tierd_json(cfg, "query", "orders", "o-2") == []


def test_produce_lines_is_one_batch_and_text_output_is_readable(cfg: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a\n\nb\nc\n")
    res = tierd(cfg, "produce", "t", "--file", str(src), "--lines", "-q", "1")
    assert "stored 3 messages in t" in res.stdout
    text = tierd(cfg, "consume", "t", "-q", "1").stdout
    assert "3 message(s) from 1 queue(s), hot tier" in text
    bodies = [base64.b64decode(m["body"]) for m in tierd_json(cfg, "consume", "t", "-q", "1")["messages"]]
    assert bodies == [b"a", b"b", b"c"]


def test_tier_moves_everything_and_force_reads_cold(cfg: Path) -> None:
    produced = _produce_lines(cfg, "orders", 200, "bulk")
    queues = {r["queue_id"] for r in produced}
    before = tierd_json(cfg, "queues", "ls", "orders")
    assert sum(q["pending_messages"] for q in before) == 200

    report = tierd_json(cfg, "tier")
    assert (report["committed"], report["pending"]) == (200, 0)
    assert {(q["topic"], q["queue_id"]): q["committed"] for q in report["queues"]} == {
        ("orders", q): sum(1 for r in produced if r["queue_id"] == q) for q in queues
    }
    after = {q["queue_id"]: q for q in tierd_json(cfg, "queues", "ls", "orders")}
    assert set(after) == queues
    assert all(
        q["pending_messages"] == 0 and q["cold_max_offset"] == q["hot_max_offset"] for q in after.values()
    )

    qid = produced[0]["queue_id"]
    got = tierd_json(
        cfg, "consume", "orders", "-q", str(qid), "--offset", "0", "-n", "500", "--policy", "FORCE"
    )
    assert got["source"] == "cold"
    expected = [f"message {i}".encode() for i, r in enumerate(produced) if r["queue_id"] == qid]
    assert [base64.b64decode(m["body"]) for m in got["messages"]] == expected
    assert tierd_json(cfg, "topics", "ls") == [{"topic": "orders", "queues": sorted(queues)}]


def _segment_keys(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    return {
        (r["topic"], r["queue_id"], r["type"], r["base_offset"], r["size"], r["message_count"]) for r in rows
    }


def test_segments_ls_live_and_from_the_bucket_agree(cfg: Path, tmp_path: Path) -> None:
    _produce_lines(cfg, "orders", 120, "k")
    tierd(cfg, "tier")
    live = tierd_json(cfg, "segments", "ls")
    bucket = tierd_json(cfg, "segments", "ls", "--backend-url", str(tmp_path / "cold"))
    assert _segment_keys(live) == _segment_keys(bucket)
    assert sum(r["message_count"] for r in live if r["type"] == "COMMIT_LOG") == 120
    assert {r["type"] for r in live} >= {"COMMIT_LOG", "CONSUME_QUEUE"}

    cq = tierd_json(cfg, "segments", "ls", "--type", "cq", "--queue", "0")
    assert cq
    assert all(r["type"] == "CONSUME_QUEUE" and r["queue_id"] == 0 for r in cq)
    assert "segment(s)" in tierd(cfg, "segments", "ls", "--backend-url", f"file://{tmp_path / 'cold'}").stdout


def test_segments_ls_reads_an_s3_bucket_alone(tmp_path: Path, moto_server: S3Server) -> None:
    from tierd.testing.s3server import create_bucket

    bucket = create_bucket(moto_server)
    backend = (
        f'[backend]\nname = "s3"\nurl = "s3://{bucket}/cold"\n'
        f'storage_options = {{ endpoint_url = "{moto_server.endpoint_url}", region_name = "us-east-1", '
        f'key = "{moto_server.access_key}", secret = "{moto_server.secret_key}" }}\n'
    )
    cfg = _config(tmp_path, backend)
    _produce_lines(cfg, "orders", 50, "k")
    tierd(cfg, "tier")
    live = tierd_json(cfg, "segments", "ls")
    bucket_rows = tierd_json(cfg, "segments", "ls", "--backend-url", f"s3://{bucket}/cold")
    assert _segment_keys(live) == _segment_keys(bucket_rows)
    assert sum(r["message_count"] for r in bucket_rows if r["type"] == "COMMIT_LOG") == 50


def test_verify_passes_then_lists_a_corrupt_cold_segment(cfg: Path, tmp_path: Path) -> None:
    _produce_lines(cfg, "orders", 60, "k")
    tierd(cfg, "tier")
    report = tierd_json(cfg, "verify")
    assert report["ok"] is True
    assert report["records"] == 120  # every record checked once hot and once cold
    assert "OK: checked" in tierd(cfg, "verify").stdout

    seg = next(p for p in (tmp_path / "cold").rglob("*") if p.is_file() and "COMMIT_LOG" in p.parts)
    raw = bytearray(seg.read_bytes())
    raw[len(raw) - 3] ^= 0xFF  # inside the last record's body: its CRC no longer matches
    seg.write_bytes(bytes(raw))
    res = tierd(cfg, "--output", "json", "verify", code=1)
    problems = json.loads(res.stdout)["problems"]
    assert problems
    assert all(p["area"] == "cold-consumequeue" for p in problems)
    assert "CRC" in problems[0]["message"]
    assert "PROBLEMS FOUND" in tierd(cfg, "verify", code=1).stdout


def test_verify_finds_a_corrupt_hot_record(cfg: Path, tmp_path: Path) -> None:
    tierd(cfg, "produce", "t", "x" * 500, "-q", "0")
    tierd(cfg, "produce", "t", "y" * 500, "-q", "0")
    log = next((tmp_path / "hot" / "commitlog").iterdir())
    with log.open("r+b") as f:
        f.seek(300)
        f.write(b"\x00\x01\x02")
    problems = json.loads(tierd(cfg, "--output", "json", "verify", code=1).stdout)["problems"]
    assert [p["area"] for p in problems][:1] == ["hot-commitlog"]


def test_gc_reports_what_it_deleted(cfg: Path) -> None:
    _produce_lines(cfg, "orders", 10, "k")
    assert tierd_json(cfg, "gc") == {"hot_files": 0, "cold_segments": 0}
    # Nothing was old enough: every message is still readable.
    total = sum(q["max_offset"] - q["min_offset"] for q in tierd_json(cfg, "queues", "ls", "orders"))
    assert total == 10


def test_restore_rebuilds_an_empty_store_from_the_bucket(cfg: Path, tmp_path: Path) -> None:
    produced = _produce_lines(cfg, "orders", 80, "k")
    tierd(cfg, "tier")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    fresh_cfg = _config(fresh, f'[backend]\nurl = "{tmp_path / "cold"}"\n')
    # The bucket's owner (the first store) is fenced: only with --take-over.
    report = tierd_json(fresh_cfg, "restore", "--from", str(tmp_path / "cold"), "--take-over")
    assert report["messages"] == 80
    assert report["topics"] == 1
    assert (report["owner"]["epoch"], report["owner"]["reason"]) == (2, "takeover")
    qid = produced[-1]["queue_id"]
    got = tierd_json(fresh_cfg, "consume", "orders", "-q", str(qid), "--offset", "0", "-n", "100")
    assert got["source"] == "cold"
    assert len(got["messages"]) == sum(1 for r in produced if r["queue_id"] == qid)

    # Restoring into a store that already holds data is refused, with one clear line.
    res = tierd(fresh_cfg, "restore", "--from", str(tmp_path / "cold"), code=1)
    assert res.stderr.startswith("tierd: error: restore needs an empty store directory")
    assert "Traceback" not in res.stderr


def test_tier_exits_1_naming_the_owner_when_another_store_owns_the_prefix(cfg: Path, tmp_path: Path) -> None:
    _produce_lines(cfg, "orders", 3, "a")
    tierd(cfg, "tier")
    other = tmp_path / "other"
    other.mkdir()
    other_cfg = _config(other, f'[backend]\nurl = "{tmp_path / "cold"}"\n')  # the same prefix
    with BlockingMessageStore.open(TierdConfig.load(other_cfg)):  # a store (tier never makes one)
        pass
    res = tierd(other_cfg, "tier", code=1)
    assert res.stderr.startswith("tierd: error: cold-tier prefix ")
    assert " is owned by store " in res.stderr
    assert "tierd restore" in res.stderr
    assert "Traceback" not in res.stderr
    assert tierd_json(cfg, "tier")["committed"] == 0  # the owner goes on as before


def test_tier_exits_1_naming_the_queue_when_pending_messages_cannot_be_committed(
    cfg: Path, tmp_path: Path
) -> None:
    tierd(cfg, "produce", "orders", "first", "-q", "0")
    tierd(cfg, "tier")
    tierd(cfg, "produce", "orders", "second", "-q", "0")
    broken = next((tmp_path / "cold").rglob("orders/0"))
    for p in sorted(broken.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    broken.rmdir()
    broken.write_bytes(b"")  # the queue's directory is now a file: nothing can be written there
    res = tierd(cfg, "tier", code=1)
    assert res.stderr.startswith("tierd: error: tiering failed for 1 queue(s), ")
    assert "message(s) still pending (committed 0): orders/0: posix write of " in res.stderr
    assert res.stdout == ""  # no "committed 0 message(s)" success line


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["queues", "ls", "nope"], 1, "topic 'nope' does not exist"),
        (["segments", "ls", "--type", "wal"], 1, "segment type must be one of"),
        (["consume", "orders", "--policy", "sometimes"], 2, "--policy"),
        (["consume", "orders", "-n", "0"], 2, "--max"),
        (["produce", "orders"], 2, "no message: the input holds no non-empty line"),
        (["produce", "orders", "x", "-p", "novalue"], 2, "KEY=VALUE"),
        (["produce", "rmq_sys_x", "x"], 1, "rmq_sys_"),
        (
            ["query", "orders", "k", "--begin", "5", "--end", "1"],
            1,
            "--begin (5) must not be after --end (1)",
        ),
        (["segments", "ls", "--backend-url", "/nonexistent/bucket"], 1, "no tierd manifest"),
        (["--log-level", "LOUD", "topics", "ls"], 2, "--log-level"),
    ],
)
def test_bad_input_gets_one_clear_line_and_the_right_exit_code(
    cfg: Path, args: list[str], code: int, message: str
) -> None:
    tierd(cfg, "produce", "seed", "x")  # a store exists: the errors are about the input
    res = tierd(cfg, *args, code=code)
    assert message in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    if code == 1:
        assert res.stderr.startswith("tierd: error:")
        assert res.stderr.count("\n") == 1


def test_missing_config_file_is_one_line(tmp_path: Path) -> None:
    res = runner.invoke(app, ["--config", str(tmp_path / "missing.toml"), "topics", "ls"])
    assert res.exit_code == 1
    assert res.stderr.startswith("tierd: error:")
    assert "missing.toml" in res.stderr


def test_version() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0
    assert res.stdout.startswith("tierd 0.")


def test_help_teaches_every_command() -> None:
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for command in (
        "serve",
        "produce",
        "consume",
        "query",
        "topics",
        "queues",
        "segments",
        "tier",
        "verify",
        "gc",
        "restore",
    ):
        assert command in res.stdout
    sub = runner.invoke(app, ["segments", "ls", "--help"])
    assert "--backend-url" in sub.stdout
    assert "--type" in sub.stdout


def test_a_real_subprocess_round_trip(cfg: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tierd.cli", "--config", str(cfg), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    put = run("--output", "json", "produce", "t", "from a shell", "-q", "0")
    assert put.returncode == 0, put.stderr
    got = run("--output", "json", "consume", "t", "-q", "0")
    assert base64.b64decode(json.loads(got.stdout)["messages"][0]["body"]) == b"from a shell"
    bad = run("queues", "ls", "nope")
    assert (bad.returncode, bad.stderr.strip()) == (1, "tierd: error: topic 'nope' does not exist")


def test_a_store_held_by_another_process_without_a_daemon_is_one_clear_line(cfg: Path) -> None:
    """The directory is locked (a daemon holds it, or here a script), so the CLI asks the daemon
    at the config's address; nothing answers there: one line naming both facts."""
    from tierd import BlockingMessageStore, TierdConfig

    port = _free_port()
    cfg.write_text(cfg.read_text() + f"[server]\nport = {port}\n")
    with BlockingMessageStore.open(TierdConfig.load(cfg)):  # holds the lock, serves nothing
        res = tierd(cfg, "topics", "ls", code=1)
    assert f"no answer from a tierd daemon at http://127.0.0.1:{port}" in res.stderr
    assert "is in use by another process" in res.stderr
    assert "--server" in res.stderr
    assert res.stderr.count("\n") == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_verify_lists_a_sealed_segment_whose_checksum_no_longer_matches(tmp_path: Path) -> None:
    from tests.tiered.conftest import MIN_SEGMENT, SMALL_BODY_LIMIT

    cfg = _config(tmp_path)
    text = cfg.read_text().replace("max_message_size = 1048576", f"max_message_size = {SMALL_BODY_LIMIT}")
    cfg.write_text(text.replace("[tiered]\n", f"[tiered]\ncommitlog_segment_size = {MIN_SEGMENT}\n"))
    lines = "".join(f"message {i} {'x' * 600}\n" for i in range(200))  # ~2 segments
    tierd_json(
        cfg, "produce", "orders", "--file", "-", "--lines", "-k", "key-kept-in-properties", input=lines
    )
    tierd(cfg, "tier")
    sealed = [r for r in tierd_json(cfg, "segments", "ls", "--type", "CL") if r["sealed"]]
    assert sealed, "the test needs a sealed commitlog segment"
    path = tmp_path / "cold" / sealed[0]["path"]
    raw = bytearray(path.read_bytes())
    at = raw.index(b"key-kept-in-properties")  # a property value: no record CRC covers it
    raw[at] ^= 0x20
    path.chmod(0o644)  # sealed posix segments are read-only
    path.write_bytes(bytes(raw))
    problems = json.loads(tierd(cfg, "--output", "json", "verify", code=1).stdout)["problems"]
    assert [p["area"] for p in problems] == ["cold-segment"], problems
    assert "CRC32C is" in problems[0]["message"]
    assert sealed[0]["path"] in problems[0]["where"]


def test_a_cold_tier_that_lost_committed_bytes_fences_the_queue_and_verify_names_it(
    cfg: Path, tmp_path: Path
) -> None:
    _produce_lines(cfg, "orders", 40, "k")
    tierd(cfg, "tier")
    segment = next(p for p in (tmp_path / "cold").rglob("*") if p.is_file() and "COMMIT_LOG" in p.parts)
    segment.write_bytes(segment.read_bytes()[:-50])  # the backend lost acknowledged bytes
    # the damage is fenced to its queue (docs/tiering.md, "Damage in the bucket"): the store serves
    tierd(cfg, "queues", "ls", "orders")
    report = json.loads(tierd(cfg, "--output", "json", "verify", code=1).stdout)
    lost = [p for p in report["problems"] if p["area"] == "cold-segment"]
    assert len(lost) == 1, report
    assert "queue offsets 39..39 (1 message(s)) are lost" in lost[0]["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["seek", "seed", "--time", "99999999999999999999"], "--time"),
        (["produce", "t", "--file", "{missing}"], "cannot read --file"),
        (["produce", "t", "--file", "{dir}"], "cannot read --file"),
        (["--server", "http://[::1", "topics", "ls"], "server URL"),
        (["--server", "http://127.0.0.1:99999", "topics", "ls"], "server URL"),
    ],
)
def test_bad_arguments_in_a_real_process_are_one_line_without_a_traceback(
    cfg: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    """A time beyond what a date can show, a file that cannot be read and a malformed server URL
    each used to end in a Python traceback; each is one line now and a non-zero exit."""
    tierd(cfg, "produce", "seed", "x")  # a store exists: the errors are about the input
    args = [a.format(missing=tmp_path / "missing.bin", dir=tmp_path) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "tierd.cli", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    assert message in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) <= 6, proc.stderr  # one line, or click's short usage box
