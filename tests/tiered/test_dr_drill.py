"""A DR drill next to a live owner: a real ``tierd serve`` process owns the bucket (posix and a
real moto S3 server) while an operator reads it with ``tierd --bucket URL`` and ``tierd restore
--dry-run`` from a scratch config. Before, the only drill was ``tierd restore`` into a scratch
directory: it took the prefix over and the live daemon refused every tiering command from then
on. Now nothing in the bucket changes (every object's bytes, the owner record), the daemon goes
on producing and tiering, and only ``restore --take-over`` fences it — after a plain restore was
refused naming it."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from tierd.testing.s3server import create_bucket

from ..service.conftest import TierdProcess, service_config, toml

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tierd.testing.s3server import S3Server

OWNER_DIR = "OWNER.d"


def cli(cfg: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``tierd --config CFG ...`` as a shell runs it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    return subprocess.run(
        [sys.executable, "-m", "tierd.cli", "--config", str(cfg), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "TIERD_GRPC__PORT": "0"},
        stdin=None if stdin is not None else subprocess.DEVNULL,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout) if proc.stdout.startswith(("{", "[")) else proc.stdout


class Bucket:
    """The drill's bucket: its URL, a ``[backend]`` section, and a byte-exact snapshot."""

    def __init__(
        self, url: str, backend: dict[str, Any], s3: S3Server | None = None, path: Path | None = None
    ) -> None:
        self.url, self.backend, self.s3, self.path = url, backend, s3, path

    def snapshot(self) -> dict[str, bytes]:
        if self.path is not None:
            files = [p for p in self.path.rglob("*") if p.is_file()]
            return {str(p.relative_to(self.path)): p.read_bytes() for p in files}
        assert self.s3 is not None
        bucket, prefix = self.url.removeprefix("s3://").split("/", 1)
        client = self.s3.boto3_client()
        try:
            out = {}
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    out[obj["Key"]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            return out
        finally:
            client.close()


@pytest.fixture(params=["posix", "moto"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Bucket:
    if request.param == "posix":
        cold = tmp_path / "cold"
        return Bucket(str(cold), {"name": "posix", "url": str(cold)}, path=cold)
    s3: S3Server = request.getfixturevalue("moto_server")
    url = f"s3://{create_bucket(s3)}/tierd"
    return Bucket(url, {"name": "s3", "url": url, "storage_options": s3.storage_options}, s3=s3)


@pytest.fixture
def live(tmp_path: Path, bucket: Bucket) -> Iterator[tuple[Path, TierdProcess]]:
    """The owner: ``tierd serve`` on its own store directory (tiering only when asked)."""
    cfg = tmp_path / "live.toml"
    data = service_config(tmp_path / "live", bucket.backend)
    data["server"]["port"] = free_port()  # the CLI finds the daemon through its config
    cfg.write_text(toml(data))
    proc = TierdProcess(cfg)
    try:
        proc.wait_for("cold tier ready", 60)
        yield cfg, proc
    finally:
        proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def owner_records(snapshot: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in snapshot.items() if f"/{OWNER_DIR}/" in k}


def bodies(result: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(m["body"]) for m in result["messages"]]


def test_a_dr_drill_reads_the_bucket_without_taking_it_from_its_live_owner(
    tmp_path: Path, bucket: Bucket, live: tuple[Path, TierdProcess]
) -> None:
    live_cfg, daemon = live
    q0 = [f"a{i}" for i in range(12)]
    q1 = [f"b{i}" for i in range(7)]
    ok(cli(live_cfg, "produce", "orders", "-q", "0", "--lines", stdin="\n".join(q0)))
    ok(cli(live_cfg, "produce", "orders", "-q", "1", "--lines", stdin="\n".join(q1)))
    assert ok(cli(live_cfg, "-o", "json", "tier"))["committed"] == 19
    ok(cli(live_cfg, "groups", "commit", "billing", "orders", "--offset", "5", "-q", "0"))
    ok(cli(live_cfg, "tier"))  # uploads the committed offsets too
    before = bucket.snapshot()
    owner = json.loads(next(iter(owner_records(before).values())))

    # The drill: a scratch configuration (same [backend] settings), a directory that stays empty.
    drill_dir = tmp_path / "drill"
    drill_cfg = tmp_path / "drill.toml"
    drill_cfg.write_text(toml(service_config(drill_dir, bucket.backend)))
    ro = ("--bucket", bucket.url, "-o", "json")

    assert ok(cli(drill_cfg, *ro, "topics", "ls")) == [{"topic": "orders", "queues": [0, 1]}]
    got = ok(cli(drill_cfg, *ro, "consume", "orders", "-q", "0", "--offset", "0", "-n", "100"))
    assert (got["status"], got["source"]) == ("FOUND", "cold")
    assert bodies(got) == [b.encode() for b in q0]
    assert bodies(ok(cli(drill_cfg, *ro, "consume", "orders", "-q", "1", "-n", "100"))) == [
        b.encode() for b in q1
    ]
    queues = {q["queue_id"]: q for q in ok(cli(drill_cfg, *ro, "queues", "ls", "orders"))}
    assert (queues[0]["cold_min_offset"], queues[0]["cold_max_offset"]) == (0, 12)
    assert (queues[1]["cold_min_offset"], queues[1]["cold_max_offset"]) == (0, 7)
    assert ok(cli(drill_cfg, *ro, "groups", "show", "billing"))  # the owner's committed offsets
    checked = ok(cli(drill_cfg, *ro, "verify"))
    assert checked["ok"], checked["problems"]
    assert checked["segments"] >= 4

    # Writes are refused, with one line, not acknowledged into a scratch store and lost.
    refused = cli(drill_cfg, "--bucket", bucket.url, "produce", "orders", "x")
    assert refused.returncode == 1
    assert refused.stderr.startswith("tierd: error: produce is refused: the bucket ")
    assert "read-only" in refused.stderr
    repair = cli(drill_cfg, "--bucket", bucket.url, "verify", "--repair")
    assert repair.returncode == 1
    assert "verify --repair is refused" in repair.stderr

    # What a restore would bring back, and whom it would fence: nothing written.
    dry = ok(cli(drill_cfg, "-o", "json", "restore", "--from", bucket.url, "--dry-run"))
    assert dry["dry_run"] is True
    assert (dry["topics"], dry["queues"], dry["messages"]) == (1, 2, 19)
    assert dry["bytes"] > sum(len(b) for b in q0 + q1)
    assert [(r["queue_id"], r["first"], r["end"]) for r in dry["ranges"]] == [(0, 0, 12), (1, 0, 7)]
    assert dry["offsets"] == {"billing": [{"topic": "orders", "queue_id": 0, "offset": 5}]}
    assert dry["damaged"] == []
    assert (dry["fences"]["store_id"], dry["fences"]["epoch"]) == (owner["store-id"], owner["epoch"])
    assert dry["owner"] is None

    # A real restore without --take-over is refused, naming the owner it would fence.
    plain = cli(drill_cfg, "restore", "--from", bucket.url)
    assert plain.returncode == 1, plain.stdout
    assert plain.stderr.startswith("tierd: error: cold-tier prefix ")
    assert owner["store-id"] in plain.stderr
    assert owner["host"] in plain.stderr
    assert f"epoch {owner['epoch']}" in plain.stderr
    assert "--take-over" in plain.stderr
    assert plain.stderr.count("\n") == 1

    after = bucket.snapshot()
    assert after.keys() == before.keys()
    assert all(after[k] == before[k] for k in before), [k for k in before if after[k] != before[k]]
    assert not (drill_dir / "hot" / "config" / "tieredStoreMetadata.json").exists()

    # The owner was not fenced: it keeps producing and tiering, and the drill sees that too.
    ok(cli(live_cfg, "produce", "orders", "-q", "0", "--lines", stdin="c0\nc1\n"))
    assert ok(cli(live_cfg, "-o", "json", "tier"))["committed"] == 2
    assert owner_records(bucket.snapshot()) == owner_records(before)
    again = ok(cli(drill_cfg, *ro, "consume", "orders", "-q", "0", "--offset", "10", "-n", "100"))
    assert bodies(again) == [b"a10", b"a11", b"c0", b"c1"]

    # --take-over does what it says: the restored store owns the prefix, the daemon is fenced.
    taken = ok(cli(drill_cfg, "-o", "json", "restore", "--from", bucket.url, "--take-over"))
    assert taken["messages"] == 21
    assert taken["fences"]["store_id"] == owner["store-id"]
    assert taken["owner"]["epoch"] == owner["epoch"] + 1
    ok(cli(live_cfg, "produce", "orders", "-q", "0", "late"))
    fenced = cli(live_cfg, "tier")
    assert fenced.returncode == 1
    assert "was taken over by store " in fenced.stderr
    assert daemon.proc.poll() is None  # fenced, not crashed: its hot store still serves


def test_restore_into_a_scratch_directory_no_longer_fences_the_live_owner(
    tmp_path: Path, bucket: Bucket, live: tuple[Path, TierdProcess]
) -> None:
    """The old drill, as operators ran it: a plain restore next to the running daemon. It used to
    exit 0 having taken the prefix over, and the daemon's next `tier` failed with prefix_owned."""
    live_cfg, _ = live
    ok(cli(live_cfg, "produce", "orders", "-q", "0", "first"))
    ok(cli(live_cfg, "tier"))
    drill_cfg = tmp_path / "drill.toml"
    drill_cfg.write_text(toml(service_config(tmp_path / "drill", bucket.backend)))
    refused = cli(drill_cfg, "restore", "--from", bucket.url)
    assert refused.returncode == 1, refused.stdout
    assert "--take-over" in refused.stderr
    ok(cli(live_cfg, "produce", "orders", "-q", "0", "second"))
    assert ok(cli(live_cfg, "-o", "json", "tier"))["committed"] == 1  # still the owner
