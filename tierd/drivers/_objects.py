"""Helpers for the whole-object API of the shipped roots (``DriverRoot.put_object`` & co.).

Objects share the backend namespace with segments, so listings must hide what drivers keep for
themselves: chunk objects (reported as their segment), temporary files of atomic writes and
fsspec's ``.sealing`` files. Temporary files are named ``{name}.tierd-tmp-{32 hex digits}`` in
the target's own directory, so a rename over the target is atomic on POSIX filesystems.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from typing import TYPE_CHECKING

from tierd.drivers.segment import validate_segment_path
from tierd.errors import InvalidArgumentError

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

__all__ = [
    "CHUNK_DIR",
    "TEMP_MARKER",
    "create_file_exclusively",
    "fsync_dir",
    "is_temp_name",
    "listed_paths",
    "make_dirs",
    "temp_name",
    "write_file_atomically",
]

#: Marker in the names of temporary files written by atomic object puts.
TEMP_MARKER = ".tierd-tmp-"
_TEMP_NAME = re.compile(re.escape(TEMP_MARKER) + r"[0-9a-f]{32}\Z")
#: Suffix of the directory-like prefix holding a segment's chunks (``tierd.drivers._chunks``).
CHUNK_DIR = ".chunks"


def temp_name(name: str) -> str:
    """A fresh temporary name beside ``name`` (a path or a file name)."""
    return f"{name}{TEMP_MARKER}{uuid.uuid4().hex}"


def is_temp_name(name: str) -> bool:
    """True if ``name`` (a path or a file name) was made by :func:`temp_name`."""
    return _TEMP_NAME.search(name) is not None


def listed_paths(
    names: Iterable[str], prefix: str, *, chunked: bool = False, reserved_suffixes: tuple[str, ...] = ()
) -> list[str]:
    """Turn raw backend names (relative to the root) into the result of ``list_objects(prefix)``.

    With ``chunked``, ``{segment}.chunks/{anything}`` counts as the segment. Temporary names,
    names ending in one of ``reserved_suffixes``, names outside ``prefix + "/"`` (``prefix`` is
    already validated; ``""`` = all) and names that are not valid paths (``a/`` directory
    markers, ``a//b``) are dropped. Returns the distinct paths, sorted.
    """
    below = f"{prefix}/" if prefix else ""
    found: set[str] = set()
    for raw in names:
        name = raw
        if chunked:
            parent, _, _ = name.rpartition("/")
            if parent.endswith(CHUNK_DIR):
                name = parent[: -len(CHUNK_DIR)]
        if not name.startswith(below) or is_temp_name(name):
            continue
        if reserved_suffixes and name.endswith(reserved_suffixes):
            continue
        try:
            validate_segment_path(name)
        except InvalidArgumentError:
            continue
        found.add(name)
    return sorted(found)


def fsync_dir(path: Path | str) -> None:
    """fsync a directory, making the creation, rename or removal of its entries durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path, *, fsync: bool) -> None:
    """Create ``directory`` and its missing parents, fsyncing each new directory's parent."""
    missing: list[Path] = []
    d = directory
    while not d.exists():
        missing.append(d)
        d = d.parent
    for new in reversed(missing):
        try:
            new.mkdir()
        except FileExistsError:
            continue
        if fsync:
            fsync_dir(new.parent)


def _write_temp(file: Path, data: bytes, *, fsync: bool, mode: int) -> Path:
    """A new temporary file beside ``file`` holding ``data`` (fsynced with ``fsync``)."""
    make_dirs(file.parent, fsync=fsync)
    tmp = file.with_name(temp_name(file.name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # undo the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def create_file_exclusively(file: Path, data: bytes, *, fsync: bool, mode: int = 0o644) -> None:
    """Create ``file`` holding ``data`` only if nothing exists at that name.

    A temporary file is written (and fsynced) beside it and hard-linked to ``file``: ``link``
    fails with ``FileExistsError`` when the name is taken — by a file or a directory — and
    otherwise makes the complete file appear at once, so readers never see a partial one and
    two creators cannot both succeed. The temporary is removed either way. Filesystems without
    hard links raise ``OSError`` (``EPERM``/``ENOTSUP``); the caller decides what that means.
    """
    tmp = _write_temp(file, data, fsync=fsync, mode=mode)
    try:
        os.link(tmp, file)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if fsync:
        fsync_dir(file.parent)


def write_file_atomically(file: Path, data: bytes, *, fsync: bool, mode: int = 0o644) -> None:
    """Replace ``file`` with ``data`` atomically: write a temporary file in the same directory,
    fsync it, ``os.replace`` it over ``file`` and fsync the directory (with ``fsync``).

    Readers see the old file or the new one, never a partial write. On any failure the
    temporary file is removed and ``file`` is untouched. Raises ``IsADirectoryError`` if
    ``file`` is a directory.
    """
    tmp = _write_temp(file, data, fsync=fsync, mode=mode)
    try:
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(file.parent)
