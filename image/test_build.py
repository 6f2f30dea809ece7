"""The image build's clean-up: a failed or killed bootstrap must not leave mounts or files behind.

A cold build that failed once left a root filesystem with ``/proc`` mounted under the cache, and
no later run removed it. These tests make that state for real (root mounts ``proc`` and a
``tmpfs`` under a ``rootfs-*`` directory) and check that the next run unmounts and removes it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from typing import TYPE_CHECKING

from build import ImageBuildError, discard_leftovers, mounts_below

if TYPE_CHECKING:
    from pathlib import Path


def _mount(kind: str, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", kind, kind, str(target)], check=True, capture_output=True)


def test_a_leftover_rootfs_with_proc_mounted_is_unmounted_and_removed(tmp_path: Path) -> None:
    leftover = tmp_path / "rootfs-abc123" / "rootfs"
    (leftover / "etc").mkdir(parents=True)
    (leftover / "etc" / "os-release").write_text("debian\n")
    _mount("proc", leftover / "proc")
    _mount("tmpfs", leftover / "dev" / "shm")
    assert len(mounts_below(tmp_path)) == 2
    keep = tmp_path / "storage"
    keep.mkdir()

    discard_leftovers(tmp_path)

    assert mounts_below(tmp_path) == []
    assert not (tmp_path / "rootfs-abc123").exists()
    assert keep.exists(), "only rootfs-* directories are an earlier run's leftovers"


def test_mounts_are_listed_deepest_first(tmp_path: Path) -> None:
    outer = tmp_path / "rootfs-x"
    _mount("tmpfs", outer)
    try:
        _mount("tmpfs", outer / "a" / "b")
        points = mounts_below(tmp_path)
        assert points == [str(outer / "a" / "b"), str(outer)]
    finally:
        discard_leftovers(tmp_path)
    assert mounts_below(tmp_path) == []


def test_a_mount_that_will_not_go_is_reported_not_deleted_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rmtree`` through a mount would delete the mounted filesystem's files: refuse instead."""
    target = tmp_path / "rootfs-y" / "proc"
    _mount("tmpfs", target)
    (target / "precious").write_text("x")
    real_run = subprocess.run

    def umount_refused(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        if cmd[0] == "umount":
            return subprocess.CompletedProcess(cmd, 32, b"", b"target is busy")
        return real_run(cmd, **kwargs)  # type: ignore[call-overload,no-any-return]

    with monkeypatch.context() as patched:
        patched.setattr(subprocess, "run", umount_refused)
        with pytest.raises(ImageBuildError, match="cannot unmount"):
            discard_leftovers(tmp_path)
    assert (target / "precious").exists()
    discard_leftovers(tmp_path)
    assert not target.exists()
