"""Topic administration: create, describe, update, delete — and how a message group picks its queue.

A topic still appears by itself on its first produce, with ``store.default_queues`` queues. A
topic *created* (``tierd topics create``, ``POST /v1/topics``, or a ``[topics.<name>]`` table in
the configuration) has its own settings, kept in ``{store.dir}/config/topics.json``:

* ``queues`` — how many queues producers without a queue id (and message groups) spread over.
  It only grows: a queue taken away would strand its messages and send a message group to
  another queue, out of order (:class:`~tierd.errors.QueueShrinkError`).
* ``cold_retention_hours`` — the topic's cold retention (the cold tier's own per-topic setting,
  which the bucket manifests carry, so a restore brings it back).

The file is written like the other metadata (temp file, fsync, rename, fsync of the directory;
the previous table kept as ``topics.json.bak``, which a damaged main file falls back to).
Topics declared in the configuration are applied at every start: created when missing, their
queue count grown to the configured one, their cold retention set when configured.

**Delete** (docs/topics.md) removes the topic from both tiers: the hot consume queues, the
topic's records (marked erased in the shared commitlog until retention frees it, so recovery and
key queries never bring them back), the cold segments, the bucket manifests, the topic's cold
metadata and every consumer group's committed offsets of it. It is refused while a group has
committed offsets on the topic or messages wait for a tiering round, unless forced. A crash
halfway is safe: the intent is recorded in ``topics.json`` *first*, every step is idempotent, and
the next open finishes what the intent lists before the store answers anything.

**Message groups.** :func:`queue_for_group` is the one mapping from a message group (FIFO group,
sharding key) to a queue, used by HTTP produce and by the gRPC API alike: a group's messages all
land on one queue, in the order they were acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tierd.drivers.paths import cluster_dir
from tierd.errors import (
    CorruptionError,
    InvalidArgumentError,
    NotFoundError,
    QueueShrinkError,
    SegmentNotFoundError,
    TierdError,
    TopicDeletingError,
    TopicExistsError,
    TopicInUseError,
)
from tierd.local.mapped_file import fsync_dir
from tierd.local.validation import check_topic
from tierd.repeats import FailureLog
from tierd.tiered.guard import GuardedRoot
from tierd.tiered.roots import open_driver_factory

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.consumption.offsets import ConsumerOffsets
    from tierd.drivers.segment import DriverRoot
    from tierd.local.store import HotStore
    from tierd.tiered.service import TieringService

log = logging.getLogger(__name__)

FILE_NAME: Final = "topics.json"
#: Test hook: ``after-hot`` SIGKILLs the process once a delete removed the hot data (the crash
#: test proves the next open finishes the delete).
CRASH_ENV: Final = "TIERD_TEST_CRASH_DELETE"
#: Seconds a delete waits for the hot store to index what was written before it (and for a
#: running tiering round to end).
DELETE_DISPATCH_WAIT: Final = 30.0
#: Seconds between attempts to finish an interrupted delete whose cold part cannot run yet.
RESUME_RETRY: Final = 5.0


def queue_for_group(group: str, queues: int) -> int:
    """The queue of message group ``group`` among ``queues``: stable across restarts and
    processes (CRC32 of the UTF-8 name, not Python's salted ``hash``), so one group's messages
    stay on one queue, in order — as long as the queue count does not change."""
    if not group:
        raise InvalidArgumentError("a message group must not be empty", group=group)
    return zlib.crc32(group.encode()) % queues


def refuse_hot_retention(topic: str, hours: object) -> NoReturn:
    """Hot retention is store-wide, by design: every topic's records are interleaved in ONE
    commitlog whose files are deleted whole, oldest first. A file holding a short-lived topic's
    records also holds everyone else's, so a per-topic hot retention could not free a byte of
    disk on its own — it could only hide records, which the cold tier's per-topic retention
    already does where it frees space. Refused with that reason, not silently ignored."""
    raise InvalidArgumentError(
        f"topic {topic!r}: hot retention is store-wide (store.file_reserved_time) — every topic "
        "shares one commitlog, deleted file by file, so one topic's hot retention could not free "
        "disk; set the topic's cold_retention_hours instead (docs/topics.md)",
        topic=topic,
        hot_retention_hours=repr(hours),
    )


def refuse_table_opt_in(topic: str, value: object) -> NoReturn:
    """A topic's Iceberg table is configuration, not topic state (docs/table.md, "Why
    configuration only"): opting in comes with the table's body schema, retention and catalog,
    which live in ``[topics.<name>]`` and ``[table]``; the daemon starts its table task — and
    loads the ``table`` extra — from the configuration at start, and ``tierd table sync|lag``
    read the same file. An admin call would have to be a second owner of that knowledge, and
    would answer 200 for a table that is not written until a restart. Refused with the way that
    works, not silently ignored."""
    raise InvalidArgumentError(
        f"topic {topic!r}: a table is opted in in the configuration, not by an admin call — add "
        f'[topics.{topic}] table = "iceberg" (and its body_columns, if any) and restart the '
        "daemon (docs/table.md)",
        topic=topic,
        table=repr(value),
    )


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class _Doc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=_kebab, populate_by_name=True)


class TopicEntry(_Doc):
    queues: int = Field(ge=1)
    cold_retention_hours: float | None = Field(default=None, gt=0)
    created_at: int = 0


class DeleteIntent(_Doc):
    """A delete in progress; ``mark``: the commitlog end when it began (the hot part cuts at the
    end when it runs, which is at or after it: see :meth:`TopicAdmin._finish`)."""

    mark: int = Field(ge=0)
    started_at: int = 0


class TopicTable(_Doc):
    """``topics.json`` (format-version 1; unknown keys refused)."""

    format_version: Literal[1] = 1
    written_at: int = 0
    topics: dict[str, TopicEntry] = Field(default_factory=dict)
    deleting: dict[str, DeleteIntent] = Field(default_factory=dict)
    #: CRC32 of the topics and intents (compact JSON, sorted keys): damaged bytes that still
    #: parse are caught.
    checksum: int | None = None


def encode(table: TopicTable) -> bytes:
    """The table as ``topics.json`` holds it (and the bucket copy)."""
    return json.dumps(table.model_dump(by_alias=True), indent=1).encode()


def bucket_path(cluster: str, broker: str) -> str:
    """The bucket copy, beside the broker manifest and the consumer offsets."""
    return f"{cluster_dir(cluster)}/{broker}/{FILE_NAME}"


async def download(root: DriverRoot, cluster: str, broker: str) -> TopicTable | None:
    """The bucket's copy of the topic table (None: the store never created a topic);
    CorruptionError naming the object when it is damaged."""
    path = bucket_path(cluster, broker)
    try:
        raw = await root.get_object(path)
    except SegmentNotFoundError:
        return None
    try:
        table = TopicTable.model_validate_json(raw)
    except (ValidationError, ValueError) as e:
        raise CorruptionError(
            f"topic table {root.url}/{path} is not valid: {str(e).splitlines()[0]}", path=path
        ) from e
    if table.checksum is not None and table.checksum != _crc(table):
        raise CorruptionError(f"topic table {root.url}/{path}: checksum mismatch (damaged bytes)", path=path)
    return table


async def restore_table(cfg: TierdConfig) -> int:
    """After a restore (``tierd restore``): the bucket's copy becomes the restored store's
    ``topics.json``, so created topics come back with their queue counts and retention, and a
    delete that was under way is finished by the restored store's first open. A damaged copy
    is logged and skipped (the messages matter more; the topics' settings are made again).
    Returns the topics brought back."""
    root = GuardedRoot(open_driver_factory(cfg.backend), cfg.tiered.backend_timeout)
    try:
        table = await download(root, cfg.tiered.cluster, cfg.tiered.broker)
    except CorruptionError as e:
        log.error("restore: %s; restoring without topic settings — create the topics again", e)
        return 0
    finally:
        await root.aclose()
    if table is None:
        return 0
    await asyncio.to_thread(TopicRegistry(cfg.store.dir).save, table)
    log.info("restore: settings of %d topic(s) from the bucket", len(table.topics))
    return len(table.topics)


def _crc(table: TopicTable) -> int:
    body = table.model_dump(by_alias=True, include={"topics", "deleting"})
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


class TopicRegistry:
    """The table in memory, written through to disk (callers serialise writes: the admin's lock)."""

    def __init__(self, store_dir: str | os.PathLike[str]) -> None:
        self.path = Path(store_dir) / "config" / FILE_NAME
        self.backup = self.path.with_name(FILE_NAME + ".bak")
        self.table = self._load()
        #: Bumped by every save: the bucket copy is put again when it moved (:meth:`TopicAdmin.upload`).
        self.version = 0

    def _read(self, path: Path) -> TopicTable:
        try:
            table = TopicTable.model_validate_json(path.read_bytes())
        except (ValidationError, ValueError) as e:
            raise CorruptionError(
                f"topic table {path} is not valid: {str(e).splitlines()[0]}", path=str(path)
            ) from e
        if table.checksum is not None and table.checksum != _crc(table):
            raise CorruptionError(f"topic table {path}: checksum mismatch (damaged bytes)", path=str(path))
        return table

    def _load(self) -> TopicTable:
        problems = []
        for path in (self.path, self.backup):
            try:
                table = self._read(path)
            except FileNotFoundError:
                continue
            except (OSError, CorruptionError) as e:
                problems.append(str(e))
                continue
            if path == self.backup and problems:
                log.error("%s; using the backup %s (one change older)", problems[0], path.name)
            return table
        if problems:
            raise CorruptionError(
                "no readable topic table: " + "; ".join(problems) + " — move the files aside to start "
                "without topic settings (topics keep their data; re-create their settings)",
                path=str(self.path),
            )
        return TopicTable()

    def save(self, table: TopicTable) -> None:
        """Replace the table durably; the previous file becomes the backup."""
        table = table.model_copy(update={"written_at": int(time.time() * 1000)})
        table = table.model_copy(update={"checksum": _crc(table)})
        data = encode(table)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if self.path.exists():
            os.replace(self.path, self.backup)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self.table = table
        self.version += 1


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue of :class:`TopicInfo`: readable offsets per tier (None: nothing there)."""

    queue_id: int
    hot_min_offset: int | None
    hot_max_offset: int | None
    cold_min_offset: int | None
    cold_max_offset: int | None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What ``describe`` answers."""

    name: str
    #: Queues producers spread over (the created count, else what the topic has).
    queues: int
    #: "created" (topic admin), "config" (declared in the configuration) or "auto" (first produce).
    origin: str
    hot_retention_hours: float
    cold_retention_hours: float | None
    #: True when ``cold_retention_hours`` is the topic's own, False for ``tiered.file_reserved_time``.
    cold_retention_own: bool
    hot_messages: int
    cold_messages: int
    cold_bytes: int
    queue_ranges: tuple[QueueView, ...]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class TopicAdmin:
    """Topic settings and lifecycle over the store's two tiers (the facade holds one)."""

    def __init__(
        self, cfg: TierdConfig, hot: HotStore, offsets: ConsumerOffsets, tiering: TieringService | None
    ) -> None:
        self.cfg = cfg
        self.hot = hot
        self.offsets = offsets
        self.tiering = tiering
        self.registry = TopicRegistry(cfg.store.dir)
        self._lock = asyncio.Lock()
        #: Finishes interrupted deletes once the cold tier has loaded (see :meth:`finish_later`).
        self._finisher: asyncio.Task[None] | None = None
        #: The registry version the bucket copy holds (-1: unknown after a start, put it once).
        self._uploaded = -1
        self._upload_lock = asyncio.Lock()
        if not hot.read_only:  # a read-only store has no producer side
            for name, entry in self.registry.table.topics.items():
                hot.preparer.set_queue_count(name, entry.queues)
            hot.deleting = set(self.registry.table.deleting)

    # ------------------------------------------------------------------ reads
    def known(self) -> dict[str, list[int]]:
        """Topic -> queue ids with data in either tier (a created topic may have none yet)."""
        out: dict[str, set[int]] = {t: set(q) for t, q in self.hot.topics().items()}
        if self.tiering is not None:
            for t, q in list(self.tiering.flat.files):
                out.setdefault(t, set()).add(q)
        return {t: sorted(q) for t, q in out.items()}

    def names(self) -> list[str]:
        """Every topic: created or declared, or holding messages (a delete in progress: not)."""
        return sorted(t for t in set(self.known()) | set(self.registry.table.topics) if self.exists(t))

    def queue_count(self, topic: str) -> int:
        """The queues ``topic`` spreads over: its created count, else ``store.default_queues``
        (what produce round-robins over) or one past its highest queue id with data if more."""
        entry = self.registry.table.topics.get(topic)
        if entry is not None:
            return entry.queues
        highest = self._highest_queue(topic)
        return max(self.cfg.store.default_queues, highest + 1 if highest is not None else 0)

    def exists(self, topic: str) -> bool:
        """Whether :meth:`names` lists ``topic``, without building that list (a lookup per
        tier: produce asks it per request)."""
        table = self.registry.table
        if topic in table.deleting:
            return False
        return topic in table.topics or self._has_data(topic)

    def queue_ids(self, topic: str) -> list[int]:
        """``topic``'s queue ids with data in either tier (its :meth:`known` entry), without
        building the whole listing: a look at each id up to its highest (receive asks it per
        call)."""
        highest = self._highest_queue(topic)
        if highest is None:
            return []
        hot, cold = self.hot.cqs, self.tiering.flat.files if self.tiering is not None else None
        return [
            q for q in range(highest + 1) if (topic, q) in hot or (cold is not None and (topic, q) in cold)
        ]

    def _has_data(self, topic: str) -> bool:
        """Whether ``topic`` has a queue in either tier (is in :meth:`known`), by lookup."""
        return self._highest_queue(topic) is not None

    def _highest_queue(self, topic: str) -> int | None:
        """``topic``'s highest queue id with data in either tier (None: none), from the tiers'
        per-topic index, not a pass over every queue of the store."""
        hot = self.hot.cqs.highest_queue(topic)
        cold = self.tiering.flat.files.highest_queue(topic) if self.tiering is not None else None
        if hot is None or cold is None:
            return hot if cold is None else cold
        return max(hot, cold)

    def group_queue(self, topic: str, group: str) -> int:
        """The queue message group ``group`` of ``topic`` goes to (see :func:`queue_for_group`)."""
        return queue_for_group(group, self.queue_count(check_topic(topic)))

    def describe(self, topic: str) -> TopicInfo:
        check_topic(topic)
        table = self.registry.table
        with_data = self.queue_ids(topic)
        entry = table.topics.get(topic)
        if topic in table.deleting:
            raise TopicDeletingError(
                f"topic {topic!r} is being deleted; it is gone once the delete has finished", topic=topic
            )
        if entry is None and not with_data:
            raise NotFoundError(f"topic {topic!r} does not exist", topic=topic)
        ids = sorted(set(with_data) | set(range(self.queue_count(topic))))
        views, hot_n, cold_n, cold_bytes = [], 0, 0, 0
        for qid in ids:
            hot = self.hot.acknowledged_range(topic, qid)
            ff = self.tiering.flat.get(topic, qid) if self.tiering is not None else None
            cold = (ff.min_offset, ff.max_offset) if ff is not None and ff.initialised else None
            if hot is not None:
                hot_n += hot.max_offset - hot.min_offset
            if ff is not None and cold is not None:
                cold_n += cold[1] - cold[0]
                cold_bytes += sum(s.commit_position for s in ff.commitlog.segments)
                cold_bytes += sum(s.commit_position for s in ff.consumequeue.segments)
            views.append(
                QueueView(
                    qid,
                    hot.min_offset if hot is not None else None,
                    hot.max_offset if hot is not None else None,
                    cold[0] if cold is not None else None,
                    cold[1] if cold is not None else None,
                )
            )
        own = entry.cold_retention_hours if entry is not None else None
        if own is None and self.tiering is not None:
            meta = self.tiering.flat.topics.get(topic)
            own = meta.reserve_hours if meta is not None else None
        tiered = self.cfg.tiered.enabled
        return TopicInfo(
            name=topic,
            queues=self.queue_count(topic),
            origin="auto" if entry is None else ("config" if topic in self.cfg.topics else "created"),
            hot_retention_hours=self.cfg.store.file_reserved_time,
            cold_retention_hours=(own or self.cfg.tiered.file_reserved_time) if tiered else None,
            cold_retention_own=own is not None,
            hot_messages=hot_n,
            cold_messages=cold_n,
            cold_bytes=cold_bytes,
            queue_ranges=tuple(views),
        )

    # ------------------------------------------------------------------ changes
    def _check_queues(self, queues: object) -> int:
        limit = self.cfg.store.max_queues
        if not isinstance(queues, int) or isinstance(queues, bool) or not 1 <= queues <= limit:
            raise InvalidArgumentError(
                f"queues must be an integer in [1, {limit}] (store.max_queues), got {queues!r}",
                queues=repr(queues),
            )
        return queues

    @staticmethod
    def _check_hours(hours: object) -> float | None:
        if hours is None:
            return None
        if isinstance(hours, bool) or not isinstance(hours, int | float) or not hours > 0:
            raise InvalidArgumentError(f"retention hours must be positive, got {hours!r}", hours=repr(hours))
        return float(hours)

    async def create(
        self, topic: str, queues: int | None = None, cold_retention_hours: float | None = None
    ) -> TopicInfo:
        """Create ``topic`` with ``queues`` queues (default ``store.default_queues``);
        TopicExistsError when it is created already or holds messages."""
        check_topic(topic)
        n = self._check_queues(self.cfg.store.default_queues if queues is None else queues)
        hours = self._check_hours(cold_retention_hours)
        async with self._lock:
            table = self.registry.table
            if topic in table.deleting:
                raise TopicInUseError(f"topic {topic!r} is being deleted; retry when it is gone", topic=topic)
            if topic in table.topics or self._has_data(topic):
                raise TopicExistsError(f"topic {topic!r} already exists", topic=topic)
            entry = TopicEntry(queues=n, cold_retention_hours=hours, created_at=int(time.time() * 1000))
            await self._save(table.model_copy(update={"topics": {**table.topics, topic: entry}}))
            self.hot.preparer.set_queue_count(topic, n)
        await self._apply_cold_retention(topic, hours)
        return self.describe(topic)

    async def update(
        self,
        topic: str,
        *,
        queues: int | None = None,
        cold_retention_hours: float | Literal["default"] | None = None,
        hot_retention_hours: float | None = None,
    ) -> TopicInfo:
        """Grow the queue count (QueueShrinkError below the current one) and/or set the cold
        retention (``"default"``: back to ``tiered.file_reserved_time``). A topic that appeared
        on first produce becomes a created one. ``hot_retention_hours`` is refused: see
        :func:`refuse_hot_retention`."""
        check_topic(topic)
        if hot_retention_hours is not None:
            refuse_hot_retention(topic, hot_retention_hours)
        async with self._lock:
            table = self.registry.table
            if topic in table.deleting or (topic not in table.topics and not self._has_data(topic)):
                raise NotFoundError(f"topic {topic!r} does not exist", topic=topic)
            current = self.queue_count(topic)
            entry = table.topics.get(topic) or TopicEntry(queues=current, created_at=int(time.time() * 1000))
            changes: dict[str, object] = {}
            if queues is not None:
                n = self._check_queues(queues)
                if n < current:
                    raise QueueShrinkError(
                        f"topic {topic!r} has {current} queues; the count only grows (asked for {n})",
                        topic=topic,
                        current=current,
                        requested=n,
                    )
                changes["queues"] = n
            hours: float | None = None
            if cold_retention_hours == "default":
                changes["cold_retention_hours"] = None
            elif cold_retention_hours is not None:
                hours = self._check_hours(cold_retention_hours)
                changes["cold_retention_hours"] = hours
            entry = entry.model_copy(update=changes)
            await self._save(table.model_copy(update={"topics": {**table.topics, topic: entry}}))
            self.hot.preparer.set_queue_count(topic, entry.queues)
        if "cold_retention_hours" in changes:
            await self._apply_cold_retention(topic, entry.cold_retention_hours, reset=hours is None)
        return self.describe(topic)

    async def _apply_cold_retention(self, topic: str, hours: float | None, *, reset: bool = False) -> None:
        """The cold tier's own per-topic retention (carried by the manifests) follows the
        table; a topic with no cold data yet gets it once its first queue is tiered."""
        t = self.tiering
        if t is None or (hours is None and not reset):
            return
        if t.ready.is_set() and topic in t.flat.topics:  # else sync_cold sets it later
            await t.set_reserve_hours(topic, hours)

    async def sync_cold(self) -> None:
        """Bring the cold tier's per-topic retention in line with the table (before retention
        runs: a topic tiered since it was created gets its setting)."""
        t = self.tiering
        if t is None:
            return
        for name, entry in self.registry.table.topics.items():
            meta = t.flat.topics.get(name)
            hours = entry.cold_retention_hours
            if hours is not None and meta is not None and meta.reserve_hours != hours:
                await t.set_reserve_hours(name, hours)

    def needed_by(self, topic: str) -> list[str]:
        """Why ``topic`` may not be deleted without force (empty: nothing needs it)."""
        reasons = [
            f"consumer group {group!r} has committed offsets on it"
            for group, offsets in sorted(self.offsets.snapshot().items())
            if any(t == topic for t, _ in offsets)
        ]
        t = self.tiering
        if t is not None and t.refused is None:
            pending = 0
            for key in self.hot.queue_keys():
                if key[0] != topic:
                    continue
                rng = self.hot.acknowledged_range(*key)
                ff = t.flat.get(*key)
                cold = ff.max_offset if ff is not None and ff.initialised else (rng.min_offset if rng else 0)
                pending += max(0, rng.max_offset - cold) if rng is not None else 0
            if pending:
                reasons.append(f"{pending} message(s) wait for a tiering round")
        return reasons

    async def delete(self, topic: str, *, force: bool = False) -> None:
        """Delete ``topic`` from both tiers (see the module doc); TopicInUseError naming what
        still needs it unless ``force``."""
        check_topic(topic)
        async with self._lock:
            table = self.registry.table
            if topic not in table.deleting:
                if topic not in table.topics and not self._has_data(topic):
                    raise NotFoundError(f"topic {topic!r} does not exist", topic=topic)
                reasons = self.needed_by(topic)
                if reasons and not force:
                    raise TopicInUseError(
                        f"topic {topic!r} is still needed: {'; '.join(reasons)} (force deletes it anyway)",
                        topic=topic,
                        reasons=reasons,
                    )
                if self.tiering is not None:
                    await self.tiering.wait_ready()  # cold data is deleted too: it must be loaded
                mark = await asyncio.to_thread(self._mark)
                intent = DeleteIntent(mark=mark, started_at=int(time.time() * 1000))
                topics = {k: v for k, v in table.topics.items() if k != topic}
                await self._save(
                    table.model_copy(update={"topics": topics, "deleting": {**table.deleting, topic: intent}})
                )
                self.hot.deleting.add(topic)
                log.info("deleting topic %s (force=%s)", topic, force)
            await self._finish(topic)

    def _mark(self) -> int:
        """The commitlog end once everything before it is indexed: the topic's records end there."""
        self.hot.require_dispatched(DELETE_DISPATCH_WAIT, "deleting a topic")
        return self.hot.end_position

    async def resume(self) -> None:
        """Finish every delete a crash interrupted (open and gc call this)."""
        for topic in list(self.registry.table.deleting):
            async with self._lock:
                if topic not in self.registry.table.deleting:  # finished meanwhile
                    continue
                log.warning("finishing the interrupted delete of topic %s", topic)
                await self._finish(topic)

    def finish_later(self) -> None:
        """Finish interrupted deletes in the background once the cold tier has loaded, retrying
        every :data:`RESUME_RETRY` s while it cannot (the bucket unreachable): open does not
        wait for the bucket, and writes to such a topic are refused until it is gone."""
        if self.registry.table.deleting and (self._finisher is None or self._finisher.done()):
            self._finisher = asyncio.get_running_loop().create_task(self._finish_when_ready())

    async def _finish_when_ready(self) -> None:
        failures = FailureLog(log, "finishing an interrupted topic delete")
        while self.registry.table.deleting:
            try:
                if self.tiering is not None:
                    await self.tiering.wait_ready()
                await self.resume()
                failures.succeeded()
            except TierdError as e:  # one line, repeats rate-limited; the intent stays
                failures.failed(e, f"retrying in {RESUME_RETRY:g} s")
                await asyncio.sleep(RESUME_RETRY)

    async def stop(self) -> None:
        """Stop the background finisher (store close); an unfinished delete resumes next open."""
        task, self._finisher = self._finisher, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _finish(self, topic: str) -> None:
        """Every step of a delete, each idempotent; the intent goes last. No tiering round runs
        meanwhile: one would read the queues being erased and write into the bucket what the
        cold part is deleting."""
        t = self.tiering
        if t is not None:
            # Loaded first: loading seeds the hot queues from the cold ones, which would bring
            # the topic's hot queues back after they were erased.
            await t.wait_ready()
        async with t.rounds_excluded(DELETE_DISPATCH_WAIT) if t is not None else contextlib.nullcontext():
            # Cut at the commitlog's end now, not at the intent's mark: a write that passed the
            # check just before the intent was recorded landed after the mark, and its consume
            # queue goes below — its record must go too, or a recovery would bring it back.
            # Nothing of the topic is appended past this cut (writes to it are refused).
            await asyncio.to_thread(self.hot.erase_topic, topic, None, DELETE_DISPATCH_WAIT)
            if os.environ.get(CRASH_ENV) == "after-hot":
                os.kill(os.getpid(), signal.SIGKILL)
            if t is not None:
                await t.erase_topic(topic)
        for group in self.offsets.groups():
            await asyncio.to_thread(self.offsets.delete, group, topic)
        table = self.registry.table
        await self._save(
            table.model_copy(update={"deleting": {k: v for k, v in table.deleting.items() if k != topic}})
        )
        self.hot.deleting.discard(topic)
        log.info("topic %s deleted from both tiers", topic)

    async def _save(self, table: TopicTable) -> None:
        await asyncio.to_thread(self.registry.save, table)
        try:  # at once, so a restore soon after sees it; the mirror loop retries a failure
            await self.upload()
        except TierdError as e:
            log.warning("copying the topic table to the bucket failed (%s); retrying later", e)

    async def upload(self) -> bool:
        """Put the topic table in the bucket if it changed since the last upload (the
        consumer-offsets mirror calls this too); True if it did. Nothing without a usable cold
        tier, or before any topic was created."""
        t = self.tiering
        if t is None or not t.ready.is_set() or t.refused is not None or not self.registry.path.exists():
            return False
        async with self._upload_lock:
            version = self.registry.version
            if version == self._uploaded:
                return False
            await t.root.put_object(
                bucket_path(self.cfg.tiered.cluster, self.cfg.tiered.broker), encode(self.registry.table)
            )
            self._uploaded = version
            return True

    async def apply_config(self) -> None:
        """Topics declared in the configuration exist at start with their settings."""
        for name, tc in self.cfg.topics.items():
            check_topic(name)
            table = self.registry.table
            if name in table.deleting:
                log.warning(
                    "[topics.%s] is being deleted; declared again, it is made at the next start", name
                )
                continue
            entry = table.topics.get(name)
            queues = tc.queues if tc.queues is not None else None
            if entry is None and not self._has_data(name):
                await self.create(name, queues, tc.cold_retention_hours)
                continue
            if queues is not None and queues < self.queue_count(name):
                log.warning(
                    "[topics.%s] queues = %d is below the topic's %d queues; the count only grows",
                    name,
                    queues,
                    self.queue_count(name),
                )
                queues = None
            await self.update(name, queues=queues, cold_retention_hours=tc.cold_retention_hours)
