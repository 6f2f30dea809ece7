"""Build tierd's container image on a machine without Docker or an image registry.

``make test-image`` uses this; so can anyone on a Debian machine with root. It needs nothing but
the Debian archive and the Python package index, which is all this project's machines reach:

1. **Tools**: ``podman``, ``debootstrap`` and ``runc`` (installed with apt when missing).
2. **Engine settings**: podman with ``runc`` (crun refuses hosts with hybrid cgroups) and explicit
   ``default_ulimits`` (setting RLIMIT_NOFILE from the host's value is refused here), its storage
   in a cache directory of its own — never the machine's default.
3. **Base images** ``localhost/tierd-pybase:bookworm``: ``debootstrap --variant=minbase`` plus
   ``python3 python3-venv``, imported with ``podman import``; and for the build stage
   ``localhost/tierd-pybuild:bookworm``, the same plus ``gcc`` and ``python3-dev`` (tierd's C
   batch decoder is compiled there); each made once, then reused.
4. **Wheels** for tierd's runtime dependencies and build backend, downloaded on the host with pip.
5. **Build** the repository's ``Dockerfile`` with ``--network none``: ``BASE`` and ``BUILD_BASE``
   are the local bases,
   pip reads the host's wheels (``PIP_NO_INDEX=1``, ``PIP_FIND_LINKS=/wheels``, mounted read-only).

Every step fails loudly with what to do: a machine that cannot build the image must not look
like one that passed. Run ``python image/build.py`` to build (it prints the image name).
``make test-image`` runs it as a step of its own, bounded by ``IMAGE_BUILD_TIMEOUT`` (a cold build
here — apt, two debootstraps, wheels, the build — takes about ten minutes), and only then the
smoke tests, whose per-test timeout would otherwise count the cold build.

A failed or killed bootstrap leaves a root filesystem with ``/proc`` (and sometimes ``/sys``,
``/dev/pts``) mounted in it. Each run first unmounts and removes what an earlier run left under
the cache (``rootfs-*``), and a failing run does the same for its own before it reports.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "localhost/tierd-pybase:bookworm"
BUILD_BASE_IMAGE = "localhost/tierd-pybuild:bookworm"
#: Debian packages of each local base (the build one compiles tierd's C extension).
BASE_PACKAGES = {
    BASE_IMAGE: ("python3", "python3-venv"),
    BUILD_BASE_IMAGE: ("python3", "python3-venv", "gcc", "libc6-dev", "python3-dev"),
}
IMAGE = "localhost/tierd:test"
SUITE = "bookworm"
APT_PACKAGES = ("podman", "buildah", "debootstrap", "runc")
CONTAINERS_CONF = """\
# Written by image/build.py: runc instead of crun (hybrid cgroups), explicit ulimits.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
"""


class ImageBuildError(RuntimeError):
    """This machine cannot build the image; the message says why and what would fix it."""


def cache_dir() -> Path:
    """Everything this module keeps between runs (podman storage, base rootfs, wheels)."""
    root = os.environ.get("TIERD_IMAGE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tierd-image"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(
    cmd: list[str],
    what: str,
    env: dict[str, str] | None = None,
    stdin: IO[bytes] | None = None,
    timeout: float = 1800,
) -> str:
    """Run ``cmd``; its stdout, or an :class:`ImageBuildError` with the output's last lines."""
    print(f"+ {' '.join(cmd)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, stdin=stdin, capture_output=True, check=False, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ImageBuildError(f"{what} did not finish within {timeout:.0f} s (killed)") from e
    print(f"  {what}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        tail = "\n".join((out + err).strip().splitlines()[-30:])
        raise ImageBuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return out


def ensure_tools() -> None:
    """podman, debootstrap and runc on PATH, installed with apt-get when missing (needs root)."""
    missing = [t for t in ("podman", "debootstrap", "runc") if shutil.which(t) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageBuildError(
            f"missing {', '.join(missing)}: install {' '.join(APT_PACKAGES)} (Debian: apt-get install), "
            "or run as root on a Debian machine so this script can"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", *APT_PACKAGES]
    if subprocess.run(install, capture_output=True, check=False, env=env, timeout=1200).returncode != 0:
        _run(["apt-get", "update", "-q"], "apt-get update", env=env)  # a fresh machine has no lists
        _run(install, "apt-get install " + " ".join(APT_PACKAGES), env=env)


class Podman:
    """``podman`` with this module's settings and storage (see the module docstring)."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        conf = cache / "containers.conf"
        if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
            conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.prefix = ["podman", "--root", str(cache / "storage"), "--runroot", str(cache / "run")]

    def run(self, *args: str, what: str | None = None, timeout: float = 1800) -> str:
        return _run([*self.prefix, *args], what or f"podman {args[0]}", env=self.env, timeout=timeout)

    def exists(self, image: str) -> bool:
        cmd = [*self.prefix, "image", "exists", image]
        return subprocess.run(cmd, env=self.env, capture_output=True, check=False).returncode == 0


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 ``URIs:`` or a ``deb`` line)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    for path in sources:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1 and words[1].rstrip("/").endswith("/debian"):
                return words[1]
            url = next((w for w in words[1:] if "://" in w), "") if words[:1] == ["deb"] else ""
            if url.rstrip("/").endswith("/debian"):
                return url
    return "http://deb.debian.org/debian"


def mounts_below(path: Path) -> list[str]:
    """Mount points at or under ``path``, deepest first (the order to unmount them in)."""
    root = os.path.realpath(path)
    found = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            # Field 2 is the mount point, with spaces and tabs octal-escaped (\040).
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[1])
            if point == root or point.startswith(root + os.sep):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def discard_rootfs(path: Path) -> None:
    """Unmount whatever a bootstrap left mounted under ``path``, then remove it.

    Lazy unmounts (``umount -l``) so a mount still busy with a killed process goes too; removal
    refuses to run while anything is still mounted there, so it never deletes through a bind mount
    into the host.
    """
    for point in mounts_below(path):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=60)
    still = mounts_below(path)
    if still:
        raise ImageBuildError(f"cannot unmount {', '.join(still)}: unmount them by hand, then rerun")
    shutil.rmtree(path, ignore_errors=True)


def discard_leftovers(cache: Path) -> None:
    """Root filesystems an earlier, failed or killed run left in the cache."""
    for leftover in sorted(cache.glob("rootfs-*")):
        print(f"removing {leftover} left by an earlier run", file=sys.stderr, flush=True)
        discard_rootfs(leftover)


def ensure_base(podman: Podman, image: str = BASE_IMAGE) -> str:
    """A local Python base image with :data:`BASE_PACKAGES` (made once with debootstrap, then
    reused)."""
    if podman.exists(image):
        return image
    if os.geteuid() != 0:
        raise ImageBuildError("making the base image with debootstrap needs root")
    discard_leftovers(podman.cache)
    tmp = Path(tempfile.mkdtemp(dir=podman.cache, prefix="rootfs-"))
    try:
        rootfs = tmp / "rootfs"
        bootstrap = ["debootstrap", "--variant=minbase", SUITE, str(rootfs), debian_mirror()]
        _run(bootstrap, "debootstrap", timeout=1200)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        packages = BASE_PACKAGES[image]
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
        _run(
            ["chroot", str(rootfs), *install],
            f"apt-get install {' '.join(packages)} in the base rootfs",
            env=env,
            timeout=1200,
        )
        _run(["chroot", str(rootfs), "apt-get", "clean"], "apt-get clean")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            _run(
                [*podman.prefix, "import", "--change", "CMD=/bin/bash", "-", image],
                "podman import",
                env=podman.env,
                stdin=tar.stdout,
                timeout=600,
            )
        finally:
            if tar.stdout is not None:
                tar.stdout.close()  # podman has read it; an open pipe is a ResourceWarning
            tar.wait()
    finally:
        discard_rootfs(tmp)
    return image


def image_extras() -> str:
    """The extras the Dockerfile installs tierd with (``…tierd-*.whl)[s3,grpc]``): the wheels
    fetched here must cover them, since the build runs offline. Read from the Dockerfile, the
    one place that states them."""
    found = re.search(r"tierd-\*\.whl\)\[([a-z0-9_,]+)\]", (REPO / "Dockerfile").read_text())
    if found is None:
        raise ImageBuildError("cannot find the extras tierd is installed with in the Dockerfile")
    return found[1]


def ensure_wheels(cache: Path) -> Path:
    """Wheels of everything the image's pip needs, for the base image's Python (this one's: both
    are CPython 3.11 on Debian bookworm), keyed by pyproject.toml."""
    extras = image_extras()
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()[:16]
    wheels = cache / f"wheels-{digest}"
    if (wheels / ".complete").exists():
        return wheels
    wheels.mkdir(exist_ok=True)
    requirements = ["setuptools>=77,<82", "wheel", f"{REPO}[{extras}]"]
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), *requirements],
        "pip wheel (tierd's runtime dependencies)",
        timeout=1200,
    )
    for built in wheels.glob("tierd-*.whl"):  # the image builds its own from the sources
        built.unlink()
    (wheels / ".complete").touch()
    return wheels


def build(image: str = IMAGE) -> tuple[Podman, str]:
    """Tools, base, wheels, then ``podman build`` of the repository's Dockerfile, offline."""
    ensure_tools()
    cache = cache_dir()
    podman = Podman(cache)
    base = ensure_base(podman)
    build_base = ensure_base(podman, BUILD_BASE_IMAGE)
    wheels = ensure_wheels(cache)
    podman.run(
        "build",
        "--network",
        "none",
        "--volume",
        f"{wheels}:/wheels:ro",
        "--build-arg",
        f"BASE={base}",
        "--build-arg",
        f"BUILD_BASE={build_base}",
        "--build-arg",
        "PIP_NO_INDEX=1",
        "--build-arg",
        "PIP_FIND_LINKS=/wheels",
        "--tag",
        image,
        "--file",
        str(REPO / "Dockerfile"),
        str(REPO),
        what="podman build of the Dockerfile",
    )
    return podman, image


def _interrupt_on_sigterm() -> None:
    """``timeout`` (the Makefile's bound) sends SIGTERM: turn it into KeyboardInterrupt, so the
    running step's process is killed and the ``finally`` clean-ups run before this one exits."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


if __name__ == "__main__":
    _interrupt_on_sigterm()
    try:
        _, name = build()
    except ImageBuildError as e:
        print(f"image build failed: {e}", file=sys.stderr)
        sys.exit(1)
    print(name)
