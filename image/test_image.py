"""The container image, built from this repository and run as Kubernetes would run it.

``make test-image`` (and ``.ci/run`` after ``make test``) runs this file; ``make test`` does not,
because it needs root, apt and podman (see image/build.py). Each container runs with ``--init``,
a read-only root filesystem, the image's non-root user, no capabilities and no privilege
escalation, sharing the host's network (as containers share a pod's) so it reaches an S3 server
on the host's loopback. Per backend: produce (HTTP from outside, the CLI from inside the
container), tier, read back from the cold tier, then SIGTERM with messages still pending: the
container must drain them to the cold tier and exit 0.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING

import httpx
import pytest

from tierd.testing.s3server import create_bucket, start_moto

sys.path.insert(0, os.path.dirname(__file__))
from build import Podman, build

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

UID = 10001
TIERD = [sys.executable, "-m", "tierd.cli"]


@pytest.fixture(scope="module")
def image() -> tuple[Podman, str]:
    return build()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Container:
    def __init__(self, podman: Podman, name: str, url: str, ops_url: str) -> None:
        self.podman = podman
        self.name = name
        self.url = url
        self.ops_url = ops_url

    def exec(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [*self.podman.prefix, "exec", *(["-i"] if stdin is not None else []), self.name, *args]
        return subprocess.run(
            cmd, input=stdin, text=True, capture_output=True, env=self.podman.env, timeout=120, check=False
        )

    def logs(self) -> str:
        cmd = [*self.podman.prefix, "logs", self.name]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=self.podman.env, timeout=60, check=False
        )
        return proc.stdout + proc.stderr

    def stop(self) -> int:
        """SIGTERM (to the init process, which forwards it), wait, return tierd's exit code."""
        self.podman.run("stop", "--time", "90", self.name, timeout=120)
        state = self.podman.run("inspect", "--format", "{{.State.ExitCode}}", self.name)
        return int(state.strip())


@contextmanager
def container(image: tuple[Podman, str], data: Path, env: dict[str, str]) -> Iterator[Container]:
    podman, name_ = image
    data.mkdir(parents=True, exist_ok=True)
    os.chown(data, UID, UID)
    port, ops = _free_port(), _free_port()
    name = f"tierd-image-test-{uuid.uuid4().hex[:8]}"
    settings = {
        "TIERD_SERVER__PORT": str(port),
        "TIERD_SERVER__OPS_HOST": "127.0.0.1",  # the host's network: keep even probes on loopback
        "TIERD_SERVER__OPS_PORT": str(ops),
        "TIERD_TIERED__DISPATCH_INTERVAL": "3600",  # tier only when asked, or at shutdown
        **env,
    }
    podman.run(
        "run",
        "--detach",
        "--name",
        name,
        "--init",
        "--read-only",
        "--user",
        f"{UID}:{UID}",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--network",
        "host",
        "--volume",
        f"{data}:/var/lib/tierd",
        *[arg for k, v in settings.items() for arg in ("--env", f"{k}={v}")],
        name_,
    )
    box = Container(podman, name, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ops}")
    try:
        _wait_ready(box)
        yield box
    finally:
        subprocess.run(
            [*podman.prefix, "rm", "--force", "--time", "5", name],
            env=podman.env,
            capture_output=True,
            timeout=120,
            check=False,
        )


def _wait_ready(box: Container, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{box.ops_url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)  # polling interval; the deadline bounds the wait
    raise AssertionError(f"the container never became ready; its log:\n{box.logs()}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _read_all_cold(box: Container, topic: str, queue: int) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        r = httpx.get(
            f"{box.url}/v1/topics/{topic}/queues/{queue}/messages",
            params={"offset": offset, "max": 64, "policy": "FORCE"},
            timeout=60,
        ).json()
        if r["status"] != "FOUND":
            return out
        assert r["source"] == "cold", r
        out += [base64.b64decode(m["body"]) for m in r["messages"]]
        offset = r["next_offset"]


def _exercise(box: Container) -> None:
    """Produce from both sides, tier, read back cold, check the container's confinement."""
    assert box.exec("id", "-u").stdout.strip() == str(UID)
    assert box.exec("touch", "/opt/tierd/x").returncode != 0  # read-only root filesystem
    assert box.exec("python3", "-m", "pip", "--version").returncode != 0  # no pip at runtime
    assert box.exec("touch", "/tmp/ok").returncode == 0  # /tmp stays writable

    # From outside: HTTP, as the app container of a pod would.
    r = httpx.post(
        f"{box.url}/v1/topics/orders/messages:batch",
        json={"messages": [{"body": _b64(b"http-%d" % i), "queue_id": 0} for i in range(20)]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    # From inside: the CLI (`kubectl exec … -- tierd …`): the daemon holds the store, so the CLI
    # asks it over HTTP (address from the image's config plus the TIERD_* environment).
    put = box.exec("tierd", "produce", "orders", "--queue", "0", stdin="cli-1\ncli-2\n")
    assert put.returncode == 0, put.stderr
    assert "stored 2 messages in orders" in put.stdout
    tier = box.exec("tierd", "--output", "json", "tier")
    assert tier.returncode == 0, tier.stderr
    assert json.loads(tier.stdout) == {
        "committed": 22,
        "pending": 0,
        "queues": [{"topic": "orders", "queue_id": 0, "committed": 22, "pending": 0}],
    }
    expected = [b"http-%d" % i for i in range(20)] + [b"cli-1", b"cli-2"]
    assert _read_all_cold(box, "orders", 0) == expected
    ls = box.exec("tierd", "--output", "json", "segments", "ls", "--topic", "orders")
    assert ls.returncode == 0, ls.stderr
    assert {s["type"] for s in json.loads(ls.stdout)} == {"COMMIT_LOG", "CONSUME_QUEUE"}

    # Pending at SIGTERM: the shutdown commits them to the cold tier before exiting 0.
    r = httpx.post(
        f"{box.url}/v1/topics/late/messages:batch",
        json={"messages": [{"body": _b64(b"late-%d" % i), "queue_id": 1} for i in range(7)]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert box.stop() == 0
    log = box.logs()
    assert "committed 7 message(s) to the cold tier during shutdown" in log, log
    assert "stopped cleanly" in log, log
    assert "Traceback" not in log, log


def _bucket_counts(config: Path, url: str, env: dict[str, str] | None = None) -> dict[tuple[str, int], int]:
    """Messages per queue in the cold tier, from its manifests alone (the host's tierd CLI)."""
    args = [
        "--config",
        str(config),
        "--output",
        "json",
        "segments",
        "ls",
        "--backend-url",
        url,
        "--type",
        "CQ",
    ]
    proc = subprocess.run(
        [*TIERD, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    counts: dict[tuple[str, int], int] = {}
    for row in json.loads(proc.stdout):
        key = (row["topic"], row["queue_id"])
        counts[key] = counts.get(key, 0) + row["message_count"]
    return counts


def test_the_image_tiers_to_a_posix_volume_and_drains_on_sigterm(
    image: tuple[Podman, str], tmp_path: Path
) -> None:
    data = tmp_path / "volume"
    with container(image, data, {}) as box:
        _exercise(box)
    config = tmp_path / "host.toml"
    config.write_text(f'[store]\ndir = "{tmp_path / "unused"}"\n')
    assert _bucket_counts(config, str(data / "cold")) == {("orders", 0): 22, ("late", 1): 7}


def test_the_image_tiers_to_s3_and_drains_on_sigterm(image: tuple[Podman, str], tmp_path: Path) -> None:
    s3 = start_moto(tmp_path / "moto")
    try:
        bucket = create_bucket(s3)
        options = f'{{ endpoint_url = "{s3.endpoint_url}", region_name = "{s3.region}" }}'
        env = {
            "TIERD_BACKEND__NAME": "s3",
            "TIERD_BACKEND__URL": f"s3://{bucket}/prod",
            "TIERD_BACKEND__STORAGE_OPTIONS": options,
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        }
        with container(image, tmp_path / "volume", env) as box:
            _exercise(box)
        config = tmp_path / "host.toml"
        config.write_text(
            f'[store]\ndir = "{tmp_path / "unused"}"\n[backend]\nname = "s3"\nurl = "s3://{bucket}/prod"\n'
            f"storage_options = {options}\n"
        )
        creds = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        assert _bucket_counts(config, f"s3://{bucket}/prod", creds) == {("orders", 0): 22, ("late", 1): 7}
        client = s3.boto3_client()
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
        client.close()
        assert any(k.startswith("prod/") for k in keys), keys
    finally:
        s3.stop()


def test_the_image_decodes_cold_batches_with_the_c_decoder(image: tuple[Podman, str]) -> None:
    """The build stage compiles tierd's C batch decoder (the runtime stage has no compiler):
    the image's tierd must use it, not fall back to the Python decoder."""
    podman, name = image
    check = "import tierd.format.batch as b, tierd.format._records as c; print(b.ACCELERATED, c.__file__)"
    out = podman.run(
        "run",
        "--rm",
        "--read-only",
        "--user",
        f"{UID}:{UID}",
        "--network",
        "none",
        "--entrypoint",
        "/opt/tierd/bin/python",
        name,
        "-c",
        check,
    )
    accelerated, path = out.split()
    assert accelerated == "True"
    assert path.startswith("/opt/tierd/")
    assert path.endswith(".so")
    compilers = podman.run("run", "--rm", "--entrypoint", "/bin/sh", name, "-c", "command -v gcc cc || true")
    assert compilers.strip() == ""  # compiled in the build stage only
