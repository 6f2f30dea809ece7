"""TieringService: the cold tier's lifecycle inside one :class:`~tierd.MessageStore`.

Start-up never blocks the hot store: flat files are loaded from metadata and reconciled with the
backend in a background task that retries (with backoff) while the backend is unreachable;
until it succeeds the hot store keeps accepting writes and hot retention deletes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tierd.errors import (
    BackendError,
    CorruptionError,
    InvalidArgumentError,
    NotFoundError,
    NotReadyError,
    TierdError,
    UnsafeBackendError,
)
from tierd.tiered.dispatcher import Dispatcher
from tierd.tiered.flatstore import FlatFileStore
from tierd.tiered.index import ColdIndexService
from tierd.tiered.manifest import ManifestWriter
from tierd.tiered.metadata import MetadataStore
from tierd.tiered.registry import open_driver_factory

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.local.store import HotStore
    from tierd.tiered.flatmessage import CommittedBatch
    from tierd.tiered.segment import DriverRoot

log = logging.getLogger(__name__)
START_RETRY_CAP = 30.0
#: How often a waiter for start-up looks at the last start failure.
READY_POLL = 0.2
#: Seconds a caller refused with NotReadyError is told to wait before retrying.
READY_RETRY_AFTER = 2
#: Cold retention runs this often (RocketMQ's tieredStoreDeleteFileInterval).
RETENTION_INTERVAL = 3600.0


class TieringService:
    def __init__(self, cfg: TierdConfig, hot: HotStore, root: DriverRoot | None = None) -> None:
        self.cfg = cfg
        self.hot = hot
        self.root = root if root is not None else open_driver_factory(cfg.backend)
        self.metadata = MetadataStore(Path(cfg.store.dir))
        self.flat = FlatFileStore(self.root, cfg.tiered, self.metadata)
        self.dispatcher = Dispatcher(hot, self.flat, cfg.tiered)
        self.manifests = ManifestWriter(self.root, self.flat)
        self.index = ColdIndexService(
            Path(cfg.store.dir),
            self.root,
            cfg.tiered.cluster,
            cfg.tiered.broker,
            cfg.tiered.index_slots,
            cfg.tiered.index_items,
            on_change=self.flat.save,
        )
        self.dispatcher.on_committed.append(self._index_batch)
        self._manifest_lock = asyncio.Lock()
        self.ready = asyncio.Event()
        self.start_error: Exception | None = None
        #: Set when the backend's capability check refuses writes (an S3 server that ignores
        #: preconditions, without ``backend.single_writer``): nothing is tiered, the hot store
        #: keeps everything, cold reads of what is already there still work.
        self.refused: UnsafeBackendError | None = None
        self._tasks: list[asyncio.Task[None]] = []
        hot.delete_guard = self.dispatcher.allows_delete

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._start(), name="tierd-tiering-start"))

    async def _start(self) -> None:
        delay = 0.5
        while True:
            try:
                await self._check_backend()
                n = await self.flat.load()
                break
            except Exception as e:
                self.start_error = e
                log.warning(
                    "cold tier not available yet (%s); retrying in %.0f s — hot store keeps working", e, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, START_RETRY_CAP)
        await self.index.load(self.flat.loaded_index)
        self.flat.index_infos = self.index.uploaded_infos
        self.start_error = None
        self._align_hot_queues()
        if self.refused is None:
            self.dispatcher.after_round = self._write_manifests
            await self._write_manifests()
        log.info("cold tier ready: %d queue(s) loaded from metadata, backend %r", n, self.root)
        self.ready.set()
        if self.refused is not None:
            log.error(
                "tiering refused — nothing is written to %r; the hot store keeps accepting and keeping "
                "messages (no hot retention) and cold reads still work: %s",
                self.root,
                self.refused,
            )
            return
        self._tasks.append(asyncio.create_task(self.dispatcher.run(), name="tierd-dispatcher"))
        self._tasks.append(asyncio.create_task(self._maintenance(), name="tierd-tiering-maintenance"))

    async def _check_backend(self) -> None:
        """The backend's capability check before any write (an S3 probe); a refusal is kept in
        :attr:`refused`, other failures propagate to the start-up retry loop."""
        try:
            await self.root.check_capabilities()
        except UnsafeBackendError as e:
            self.refused = e

    async def apply_retention(self, now_ms: int | None = None) -> int:
        """Expire cold segments older than each topic's reserve time (``tiered.file_reserved_time``
        unless set per topic). Returns segments deleted."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        deleted = 0
        for (topic, _), ff in list(self.flat.files.items()):
            meta = self.flat.topics.get(topic)
            hours = meta.reserve_hours if meta and meta.reserve_hours else self.cfg.tiered.file_reserved_time
            cq, cl = await ff.expire(now - int(hours * 3_600_000))
            deleted += cq + cl
        # Index files mix topics: they go when even the longest-kept topic no longer needs them.
        longest = max(
            [
                self.cfg.tiered.file_reserved_time,
                *(t.reserve_hours for t in self.flat.topics.values() if t.reserve_hours),
            ]
        )
        deleted += await self.index.expire(now - int(longest * 3_600_000))
        return deleted

    async def set_reserve_hours(self, topic: str, hours: float | None) -> None:
        """Per-topic cold retention (None: back to ``tiered.file_reserved_time``)."""
        if hours is not None and hours <= 0:
            raise InvalidArgumentError(f"reserve hours must be positive, got {hours!r}", hours=hours)
        await self.wait_ready()
        meta = self.flat.topics.get(topic)
        if meta is None:
            raise NotFoundError(f"topic {topic!r} has no data in the cold tier", topic=topic)
        self.flat.topics[topic] = meta.model_copy(update={"reserve_hours": hours})
        await self.flat.save()

    async def _maintenance(self) -> None:
        """Periodic upkeep: retry failed seals, save metadata (sizes move with every commit),
        apply cold retention every RETENTION_INTERVAL."""
        next_retention = time.monotonic() + RETENTION_INTERVAL
        while True:
            await asyncio.sleep(self.cfg.tiered.manifest_interval)
            try:
                for ff in list(self.flat.files.values()):
                    await ff.commitlog.seal_pending()
                    await ff.consumequeue.seal_pending()
                await self.index.maintain()
                await self.flat.save()
                await self._write_manifests()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + RETENTION_INTERVAL
                    await self.apply_retention()
            except Exception:
                log.exception("tiering maintenance failed; retrying next interval")

    def _index_batch(self, batch: CommittedBatch) -> None:
        """Dispatcher hand-off: committed (readable) messages go into the cold key index."""
        topic = self.flat.topics.get(batch.topic)
        if topic is not None:
            self.index.add(batch, topic.id)

    def _align_hot_queues(self) -> None:
        """Safety net: a hot queue must never hand out an offset the cold tier already holds."""
        for (topic, qid), ff in self.flat.files.items():
            try:
                self.hot.seed_queue(topic, qid, ff.max_offset)
            except TierdError as e:
                log.error("hot queue %s/%d is behind its cold tier (%d): %s", topic, qid, ff.max_offset, e)

    def check_ready(self, waited: float = 0.0) -> None:
        """Return if the cold tier has loaded; else raise what a caller that cannot wait (any
        longer) gets: :class:`~tierd.errors.BackendError` when the last start failure is one
        that retrying cannot fix (corrupt data, bad settings), otherwise the retriable
        :class:`~tierd.errors.NotReadyError` naming it."""
        if self.ready.is_set():
            return
        err = self.start_error
        if isinstance(err, CorruptionError | InvalidArgumentError):
            detail = {**err.detail, "backend": repr(self.root)}
            raise BackendError(f"the cold tier cannot start: {err}", **detail) from err
        after = f" after {waited:g} s" if waited else " yet"
        raise NotReadyError(
            f"the cold tier has not loaded{after} ({err or 'still starting'}); answers that need it "
            "are refused until it has — retry shortly",
            backend=repr(self.root),
            reason=str(err or "starting"),
            retry_after=READY_RETRY_AFTER,
        )

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait for start-up (metadata loaded, backend reachable), at most ``timeout`` seconds
        (default ``tiered.ready_timeout``); then :meth:`check_ready`'s error. A failure that
        retrying cannot fix is raised at once."""
        loop = asyncio.get_running_loop()
        wait = self.cfg.tiered.ready_timeout if timeout is None else timeout
        deadline = loop.time() + wait
        while not self.ready.is_set():
            err = self.start_error
            left = deadline - loop.time()
            if left <= 0 or isinstance(err, CorruptionError | InvalidArgumentError):
                self.check_ready(wait)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), min(left, READY_POLL))

    async def tier_now(self, timeout: float | None = None) -> int:
        """Commit everything pending to the cold tier now (waits for start-up first, at most
        ``timeout`` s, default ``tiered.ready_timeout``), then bring the bucket manifests up to
        date."""
        await self.wait_ready(timeout)
        if self.refused is not None:
            raise self.refused
        n = await self.dispatcher.tier_now()
        await self._write_manifests()
        return n

    async def _write_manifests(self) -> None:
        """Bring bucket manifests up to date: after every dispatch round (so after every seal),
        after ``tier_now``, on the maintenance timer and at close — never from inside a commit,
        and one writer at a time so an older manifest never lands after a newer one."""
        try:
            async with self._manifest_lock:
                await self.manifests.write_changed()
        except Exception:  # manifests are rewritten next time; data is safe without them
            log.exception("writing bucket manifests failed; retrying at the next interval")

    async def close(self, grace: float = 30.0) -> None:
        """Stop the loop, try to commit what is pending within ``grace`` seconds, save metadata."""
        self.dispatcher.stop()
        writable = self.refused is None
        if (
            self.ready.is_set() and grace > 0 and writable
        ):  # grace 0: a short-lived admin command, not a shutdown
            try:
                await asyncio.wait_for(self.dispatcher.tier_now(), grace)
            except TimeoutError:
                log.warning(
                    "closing with tiering unfinished after %.0f s; it resumes at the next start", grace
                )
            except Exception:
                log.exception("final tiering round failed; it resumes at the next start")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ready.is_set() and writable:
            await self.index.close()
            await self.flat.save()
            await self._write_manifests()
        elif self.ready.is_set():
            await self.flat.save()  # local metadata only: the backend takes no writes
        await self.root.aclose()
