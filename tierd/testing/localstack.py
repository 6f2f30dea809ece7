"""LocalStack's S3 in host mode — no Docker — as a third real S3 server for tests and development.

LocalStack runs only under Python >= 3.12 and only with a few pins (unpinned, it fails at import
or while generating its TLS certificate), so it gets a virtualenv of its own, built from
:data:`REQUIREMENTS` with an interpreter found on the machine (:func:`find_python`): the
``TIERD_LOCALSTACK_PYTHON`` variable, ``python3.12``/``3.13``/``3.14`` on PATH, pyenv's
versions, or ``uv python find``. Nothing is downloaded but packages from the package index; when
no such Python exists, :class:`LocalStackUnavailable` says so and how to fix it — tests fail
loudly rather than skip.

The venv is built once (about 30 s) at ``TIERD_LOCALSTACK_VENV``, else ``.venv-localstack`` in a
source checkout, else ``~/.cache/tierd/localstack-venv``, and rebuilt when :data:`REQUIREMENTS`
change. :func:`start_localstack` runs ``python -m localstack.runtime.main`` with S3 only, on a
free loopback port, every file under the given directory (S3's spill directory too, moved from
its hard-coded ``/tmp`` path), no DNS server, no telemetry, no
certificate download, and polls its health endpoint with a deadline.

Manual use (the host-mode recipe of ``localstack/README.md``)::

    python -m tierd.testing.localstack --port 4566     # Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tierd.testing.s3server import REGION, S3Server, ServerStartError, free_port, log_tail, terminate

__all__ = [
    "MIN_PYTHON",
    "REQUIREMENTS",
    "LocalStackUnavailable",
    "ensure_venv",
    "find_python",
    "start_localstack",
]

#: The pins that make LocalStack's community S3 start on a host (issue 21); ``base-runtime`` is
#: all S3 needs (the full ``runtime`` extra adds ~200 MB and minutes of install).
REQUIREMENTS = (
    "localstack-core[base-runtime]==2026.3.0",
    "cbor2<5.8",
    "pyopenssl==24.2.1",
    "cryptography==43.0.3",
    "service_identity==24.2.0",
)
MIN_PYTHON = (3, 12)
#: LocalStack accepts any credentials (like moto).
ACCESS_KEY = SECRET_KEY = "test"
#: The runtime's entry point, with S3's object spill directory moved from its hard-coded
#: ``/tmp/localstack-s3-storage`` (shared by every instance on the machine) into our directory.
_BOOT = (
    "import sys\n"
    "import localstack.services.s3.provider as s3\n"
    "s3.DEFAULT_S3_TMP_DIR = sys.argv[1]\n"
    "from localstack.runtime.main import main\n"
    "main()\n"
)


class LocalStackUnavailable(ServerStartError):
    """LocalStack cannot be installed or started here (no Python >= 3.12, pip failed, ...)."""


def _version_ok(python: str) -> bool:
    probe = f"import sys, venv; print(sys.version_info[:2] >= {MIN_PYTHON})"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == "True"


def find_python() -> str:
    """An interpreter >= 3.12 with ``venv`` (see the module docstring for the search order)."""
    candidates: list[str] = []
    if os.environ.get("TIERD_LOCALSTACK_PYTHON"):
        candidates.append(os.environ["TIERD_LOCALSTACK_PYTHON"])
    for name in ("python3.13", "python3.12", "python3.14"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
    pyenv = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    versions = sorted(glob.glob(f"{pyenv}/versions/3.1[2-9]*/bin/python3"), reverse=True)
    candidates += versions
    uv = shutil.which("uv")
    if uv:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            out = subprocess.run(
                [uv, "python", "find", f">={MIN_PYTHON[0]}.{MIN_PYTHON[1]}"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(out.stdout.strip())
    for python in candidates:
        if _version_ok(python):
            return python
    tried = ", ".join(candidates) or "none found"
    raise LocalStackUnavailable(
        f"LocalStack needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} and none was found (tried: {tried}). "
        "Install one (pyenv install 3.13, apt install python3.12 on Debian 13, or uv python install) "
        "or point TIERD_LOCALSTACK_PYTHON at it"
    )


def default_venv() -> Path:
    """Where the LocalStack venv lives (see the module docstring)."""
    if os.environ.get("TIERD_LOCALSTACK_VENV"):
        return Path(os.environ["TIERD_LOCALSTACK_VENV"])
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists():
        return checkout / ".venv-localstack"
    return Path.home() / ".cache" / "tierd" / "localstack-venv"


def ensure_venv(venv: Path | None = None, *, timeout: float = 900.0) -> Path:
    """Build (or reuse) the LocalStack venv and return its interpreter. Serialised across
    processes with a lock file; rebuilt from scratch when :data:`REQUIREMENTS` changed."""
    venv = venv or default_venv()
    venv.parent.mkdir(parents=True, exist_ok=True)
    stamp = venv / ".tierd-requirements"
    wanted = "\n".join(REQUIREMENTS) + "\n"
    python = venv / "bin" / "python"
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text() == wanted:
            return python
        shutil.rmtree(venv, ignore_errors=True)
        base = find_python()
        log = venv.parent / f".{venv.name}-install.log"
        started = time.monotonic()
        with log.open("w") as out:
            for cmd in (
                [base, "-m", "venv", str(venv)],
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *REQUIREMENTS],
            ):
                left = max(timeout - (time.monotonic() - started), 1)
                try:
                    subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=left, check=True)
                except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                    raise LocalStackUnavailable(
                        f"installing LocalStack into {venv} failed ({e}):\n{log_tail(log)}"
                    ) from e
        stamp.write_text(wanted)
        return python


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            state = json.load(resp).get("services", {}).get("s3")
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return state in ("available", "running")


def start_localstack(
    workdir: Path, *, port: int | None = None, timeout: float = 120.0, attempts: int = 2
) -> S3Server:
    """Start LocalStack's S3 on ``port`` (default: a free one) of 127.0.0.1 with everything under
    ``workdir``."""
    python = ensure_venv()
    workdir.mkdir(parents=True, exist_ok=True)
    last: Exception | None = None
    for attempt in range(attempts):
        run = workdir / f"run{attempt}"
        dirs = {name: run / name for name in ("fs", "volume", "tmp", "s3")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        listen = port or free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LOCALSTACK_", "PYTHON"))}
        env.update(
            {
                "GATEWAY_LISTEN": f"127.0.0.1:{listen}",
                "SERVICES": "s3",
                "EAGER_SERVICE_LOADING": "1",
                "DNS_ADDRESS": "0",
                "OVERRIDE_IN_DOCKER": "0",
                "SKIP_SSL_CERT_DOWNLOAD": "1",
                "LOCALSTACK_TELEMETRY_DISABLED": "1",
                "DISABLE_EVENTS": "1",
                "LS_LOG": "warn",
                "FILESYSTEM_ROOT": str(dirs["fs"]),
                "LOCALSTACK_VOLUME_DIR": str(dirs["volume"]),
                "TMPDIR": str(dirs["tmp"]),
            }
        )
        log = run / "localstack.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(python), "-c", _BOOT, str(dirs["s3"])],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=run,
                start_new_session=True,
            )
        health = f"http://127.0.0.1:{listen}/_localstack/health"
        deadline = time.monotonic() + timeout
        delay = 0.05
        while not _healthy(health):
            if proc.poll() is not None or time.monotonic() > deadline:
                terminate(proc)
                last = ServerStartError(f"localstack did not become healthy at {health}:\n{log_tail(log)}")
                break
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
        else:
            endpoint = f"http://127.0.0.1:{listen}"
            return S3Server("localstack", endpoint, ACCESS_KEY, SECRET_KEY, run, proc, REGION)
    raise ServerStartError(f"localstack did not start after {attempts} attempts") from last


def main(argv: list[str] | None = None) -> int:  # pragma: no cover — manual helper
    parser = argparse.ArgumentParser(description="Run LocalStack's S3 in host mode until Ctrl-C.")
    parser.add_argument("--port", type=int, default=4566, help="loopback port (default 4566)")
    parser.add_argument("--dir", type=Path, default=Path("data/localstack"), help="state and logs")
    args = parser.parse_args(argv)
    server = start_localstack(args.dir, port=args.port)
    print(f"LocalStack S3 at {server.endpoint_url} (credentials test/test); Ctrl-C stops it", flush=True)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
