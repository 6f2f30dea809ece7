"""Committed consumer offsets per (group, topic, queue), durable on the store's disk and
mirrored to the bucket.

RocketMQ keeps ``config/consumerOffset.json`` and flushes it every 5 s, so a crash forgets the
last seconds of commits. Here a commit is **durable when it returns**: the whole table is
written to ``{store.dir}/config/consumer-offsets.json`` (temp file, fsync, rename, fsync of the
directory — a crash leaves the old table or the new one, never a torn one). Concurrent commits
share one write (group commit: whoever writes takes every change made so far), so a burst of
commits from many consumers costs a few writes, not one each.

The bucket holds a copy, ``{cluster_dir}/{broker}/consumer-offsets.json``, uploaded when the
table changed: on the manifest interval, after ``tier_now`` and at close — and the first time
after every start, since a commit made just before a crash may never have reached it. ``tierd restore``
brings it back, so a sidecar rebuilt from the bucket resumes its consumers (at most one
manifest interval behind — consumers then see a few messages again, never skip one).

File format (JSON, kebab-case keys, versioned like the bucket manifests)::

    {"format-version": 1, "written-at": 1700000000000,
     "groups": {"billing": {"orders": {"0": 1200, "1": 980}}}, "checksum": 1234567890}

``checksum`` is the CRC32 of the groups (compact JSON, sorted keys): a flipped byte that still
parses — an offset read as another, a group renamed — is caught, not served to consumers (files
written before it existed have none and are not checked).

**Damage.** Each write first turns the previous table into ``consumer-offsets.json.bak`` (as
the tiering metadata does), so one damaged file never costs every consumer its position: the
store falls back to the backup — one commit older, so consumers see a few messages again, never
skip one — with one ERROR line, and ``tierd verify`` reports the damaged file (``--repair``
restores it). A damaged main file is moved to ``.corrupt`` on the next write, never rotated over
the good backup.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tierd.drivers.paths import cluster_dir
from tierd.errors import CorruptionError, InvalidGroupError, SegmentNotFoundError
from tierd.local.mapped_file import fsync_dir
from tierd.local.validation import TOPIC_PATTERN

if TYPE_CHECKING:
    from collections.abc import Mapping

    from tierd.drivers.segment import DriverRoot

log = logging.getLogger(__name__)

FILE_NAME: Final = "consumer-offsets.json"
#: Consumer groups a store keeps offsets for (each is a metric label value too).
MAX_GROUPS: Final = 1024
QueueKey = tuple[str, int]


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class OffsetTable(BaseModel):
    """The file's shape (``format-version`` 1; unknown keys refused)."""

    # defer_build: the validator is built on first use, not at import — a new store never reads
    # the file, and start-up is part of issue 31's budget.
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=_kebab, populate_by_name=True, defer_build=True
    )

    format_version: Literal[1] = 1
    written_at: int = 0
    #: group → topic → queue id (as a string: JSON keys) → committed offset.
    groups: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    #: CRC32 of ``groups`` as :func:`_groups_crc` encodes them (None: written before checksums).
    checksum: int | None = None


def _groups_crc(groups: Mapping[str, Mapping[str, Mapping[str, int]]]) -> int:
    """The checksum of a table's groups: over a canonical encoding (compact, keys sorted), so
    it does not depend on how the file was indented."""
    return zlib.crc32(json.dumps(groups, sort_keys=True, separators=(",", ":")).encode())


def check_group(group: object) -> str:
    """A group name: 1–255 characters from ``A-Z a-z 0-9 _ % | -`` (the topic alphabet)."""
    if not isinstance(group, str) or not TOPIC_PATTERN.fullmatch(group):
        raise InvalidGroupError(
            f"consumer group must be 1-255 characters from A-Z a-z 0-9 _ % | -, got {group!r}",
            group=repr(group),
        )
    return group


def bucket_path(cluster: str, broker: str) -> str:
    return f"{cluster_dir(cluster)}/{broker}/{FILE_NAME}"


def _encode(groups: Mapping[str, Mapping[QueueKey, int]]) -> bytes:
    nested: dict[str, dict[str, dict[str, int]]] = {}
    for group, offsets in sorted(groups.items()):
        topics: dict[str, dict[str, int]] = {}
        for (topic, queue_id), offset in sorted(offsets.items()):
            topics.setdefault(topic, {})[str(queue_id)] = offset
        nested[group] = topics
    table = OffsetTable(written_at=int(time.time() * 1000), groups=nested, checksum=_groups_crc(nested))
    return json.dumps(table.model_dump(by_alias=True), indent=1).encode()


def decode(raw: bytes, where: str) -> dict[str, dict[QueueKey, int]]:
    """Parse a table (local file or bucket copy); CorruptionError naming ``where`` if invalid."""
    try:
        table = OffsetTable.model_validate_json(raw)
        groups = {
            group: {(topic, int(q)): off for topic, queues in topics.items() for q, off in queues.items()}
            for group, topics in table.groups.items()
        }
    except (ValidationError, ValueError) as e:
        raise CorruptionError(
            f"consumer offsets {where} are not valid: {str(e).splitlines()[0]}", path=where
        ) from e
    if table.checksum is not None and table.checksum != _groups_crc(table.groups):
        raise CorruptionError(
            f"consumer offsets {where} are not valid: checksum {table.checksum} does not match "
            "the offsets (damaged bytes)",
            path=where,
            checksum=table.checksum,
        )
    return groups


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: the old content or the new survives a crash, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


@dataclass(frozen=True, slots=True)
class OffsetsFile:
    """One copy of the table on disk as :func:`inspect` found it."""

    path: Path
    exists: bool
    #: Why it cannot be used (None: it parses and checks out, or it does not exist).
    problem: str | None = None

    @property
    def good(self) -> bool:
        return self.exists and self.problem is None


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def inspect(store_dir: str | os.PathLike[str]) -> tuple[OffsetsFile, OffsetsFile]:
    """The main file and its backup, each read and checked on its own (``tierd verify``: a
    damaged main file hidden behind a good backup is still a problem to report)."""
    path = Path(store_dir) / "config" / FILE_NAME
    out = []
    for candidate in (path, backup_path(path)):
        try:
            decode(candidate.read_bytes(), str(candidate))
        except FileNotFoundError:
            out.append(OffsetsFile(candidate, False))
        except (OSError, CorruptionError) as e:
            out.append(OffsetsFile(candidate, True, str(e)))
        else:
            out.append(OffsetsFile(candidate, True))
    return out[0], out[1]


class ConsumerOffsets:
    """The table in memory, written through to disk (thread-safe; writes block, so async
    callers run :meth:`commit` in a worker thread)."""

    def __init__(self, store_dir: str | os.PathLike[str]) -> None:
        self.path = Path(store_dir) / "config" / FILE_NAME
        self.backup = backup_path(self.path)
        #: Where a damaged main file goes on the next write (the good backup is kept).
        self.corrupt = self.path.with_name(self.path.name + ".corrupt")
        self._groups: dict[str, dict[QueueKey, int]] = {}
        self._lock = threading.Lock()  # the table
        self._write_lock = threading.Lock()  # one writer at a time
        #: Bumped by every change; what is on disk / in the bucket carries the version it had.
        self.version = 0
        self._durable = 0
        self._uploaded = 0
        self._upload_lock = asyncio.Lock()  # one upload at a time: an older copy never lands last
        #: Whether the main file on disk checks out (it may become the backup on the next write).
        self._main_good = False
        self._groups = self._load()
        if self._groups or self.path.exists() or self.backup.exists():
            # What the bucket holds is not known after a start (a commit made shortly before a
            # crash never reached it): the first upload puts the table whatever its version.
            self._uploaded = -1

    def _load(self) -> dict[str, dict[QueueKey, int]]:
        """The main file, or the backup when the main one is damaged or missing (one ERROR
        line); CorruptionError naming both when neither can be read."""
        main, backup = inspect(self.path.parent.parent)
        if main.good:
            self._main_good = True
            return decode(self.path.read_bytes(), str(self.path))
        if backup.good:
            log.error(
                "%s; using the backup %s (one commit older: consumers may see a few messages "
                "again); `tierd verify --repair` restores the file",
                main.problem if main.exists else f"consumer offsets {self.path} are missing",
                self.backup.name,
            )
            return decode(self.backup.read_bytes(), str(self.backup))
        if main.exists or backup.exists:
            raise CorruptionError(
                "no readable consumer offsets: "
                + "; ".join(f"{f.path.name}: {f.problem or 'missing'}" for f in (main, backup))
                + " — move the files aside to start without committed offsets (consumers then "
                "start where their policy says), or restore them from the bucket copy",
                path=str(self.path),
            )
        return {}

    # ------------------------------------------------------------------ reads
    def groups(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)

    def get(self, group: str) -> dict[QueueKey, int]:
        """The group's committed offsets (empty for an unknown group)."""
        with self._lock:
            return dict(self._groups.get(group, {}))

    def snapshot(self) -> dict[str, dict[QueueKey, int]]:
        with self._lock:
            return {g: dict(o) for g, o in self._groups.items()}

    # ------------------------------------------------------------------ writes
    def commit(self, group: str, offsets: Mapping[QueueKey, int]) -> None:
        """Set committed offsets of ``group``; durable on disk when this returns."""
        with self._lock:
            known = self._groups.get(group)
            if known is None:
                if len(self._groups) >= MAX_GROUPS:
                    raise InvalidGroupError(
                        f"this store already keeps offsets of {MAX_GROUPS} consumer groups (the limit); "
                        f"delete unused ones (`tierd groups delete GROUP`) before committing for {group!r}",
                        group=group,
                        limit=MAX_GROUPS,
                    )
                known = self._groups[group] = {}
            known.update(offsets)
            self.version += 1
            version = self.version
        self._persist(version)

    def delete(self, group: str, topic: str | None = None) -> int:
        """Forget ``group`` (or only its offsets of ``topic``); returns queues forgotten."""
        with self._lock:
            offsets = self._groups.get(group, {})
            doomed = [k for k in offsets if topic is None or k[0] == topic]
            for k in doomed:
                del offsets[k]
            if group in self._groups and not offsets:
                del self._groups[group]
            if not doomed:
                return 0
            self.version += 1
            version = self.version
        self._persist(version)
        return len(doomed)

    def _persist(self, version: int) -> None:
        """Make the table as of ``version`` durable. A writer takes the newest table, so a
        commit that waited for the lock often finds its change already written."""
        with self._write_lock:
            if self._durable >= version:
                return
            with self._lock:
                data = _encode(self._groups)
                current = self.version
            self._write(data)
            self._durable = current

    def _write(self, data: bytes) -> None:
        """Replace the main file; the previous one becomes the backup if it checks out (a
        damaged one is moved to ``.corrupt``: rotating it would lose the good backup). A crash
        between the renames leaves the backup alone, which :meth:`_load` falls back to."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if self.path.exists():
            os.replace(self.path, self.backup if self._main_good else self.corrupt)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self._main_good = True

    # ------------------------------------------------------------------ bucket copy
    async def upload(self, root: DriverRoot, cluster: str, broker: str) -> bool:
        """Put the table in the bucket if it changed since the last upload; True if it did."""
        async with self._upload_lock:
            with self._lock:
                if self.version == self._uploaded:
                    return False
                data = _encode(self._groups)
                version = self.version
            await root.put_object(bucket_path(cluster, broker), data)
            self._uploaded = version
            return True


async def download(root: DriverRoot, cluster: str, broker: str) -> dict[str, dict[QueueKey, int]]:
    """The bucket's copy of the table (empty when the store never committed an offset)."""
    path = bucket_path(cluster, broker)
    try:
        raw = await root.get_object(path)
    except SegmentNotFoundError:
        return {}
    return decode(raw, f"{root.url}/{path}")


def restore_offsets(
    store_dir: str | os.PathLike[str],
    groups: Mapping[str, Mapping[QueueKey, int]],
    ends: Mapping[QueueKey, int],
) -> tuple[int, int]:
    """Write ``groups`` (from the bucket) as a restored store's table. An offset beyond the
    restored queue's end — messages consumed from the lost hot store, never tiered — is
    lowered to that end, where the restored queue continues, and logged: left as it was, the
    group would skip the first new messages. Returns (groups, offsets lowered)."""
    lowered = 0
    fixed: dict[str, dict[QueueKey, int]] = {}
    for group, offsets in groups.items():
        fixed[group] = {}
        for key, offset in offsets.items():
            end = ends.get(key)
            if end is not None and offset > end:
                log.warning(
                    "restore: group %s committed %s/%d up to %d, but the bucket holds it only up to %d "
                    "(the rest was never tiered); the group resumes at %d",
                    group,
                    key[0],
                    key[1],
                    offset,
                    end,
                    end,
                )
                offset = end
                lowered += 1
            fixed[group][key] = offset
    if fixed:
        write_atomically(Path(store_dir) / "config" / FILE_NAME, _encode(fixed))
    return len(fixed), lowered


__all__ = [
    "FILE_NAME",
    "MAX_GROUPS",
    "ConsumerOffsets",
    "OffsetTable",
    "OffsetsFile",
    "backup_path",
    "bucket_path",
    "check_group",
    "download",
    "inspect",
    "restore_offsets",
]
