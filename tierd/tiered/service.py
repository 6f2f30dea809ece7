"""TieringService: the cold tier's lifecycle inside one :class:`~tierd.MessageStore`.

Start-up never blocks the hot store. A background task (1) reads the local tiering metadata —
after that the pod can serve its local producers and consumers (:attr:`metadata_loaded`, what
``/readyz`` waits for); (2) claims the bucket prefix (:mod:`tierd.tiered.ownership`) and
refuses a prefix that holds data this store has no metadata for; (3) reconciles the flat files
with the backend. Steps 2–3 retry with backoff while the backend is unreachable; until they
succeed the hot store keeps accepting writes and hot retention deletes nothing.

Every backend call goes through a :class:`~tierd.tiered.guard.GuardedRoot`: bounded by
``tiered.backend_timeout``, refused once another store owns the prefix, and recorded in
:attr:`health` (``GET /v1/status``, metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tierd.drivers.paths import cluster_dir
from tierd.errors import (
    BackendError,
    CorruptionError,
    InvalidArgumentError,
    NotFoundError,
    NotReadyError,
    PrefixOwnedError,
    SegmentNotFoundError,
    TierdError,
    UnsafeBackendError,
)
from tierd.repeats import FailureLog
from tierd.tiered.dispatcher import Dispatcher, QueueTiered, RoundResult, TierReport
from tierd.tiered.flatstore import FlatFileStore
from tierd.tiered.guard import BackendHealth, GuardedRoot
from tierd.tiered.index import ColdIndexService
from tierd.tiered.manifest import MANIFEST_NAME, broker_manifest_path
from tierd.tiered.manifestwriter import ManifestWriter
from tierd.tiered.metadata import MetadataStore
from tierd.tiered.ownership import Ownership, current_owner, owner_dir, prefix_url, store_id
from tierd.tiered.roots import open_driver_factory

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tierd.config import TierdConfig
    from tierd.drivers.segment import DriverRoot
    from tierd.local.store import HotStore
    from tierd.tiered.flatmessage import CommittedBatch
    from tierd.tiered.metadata import TieredMetadata

log = logging.getLogger(__name__)
START_RETRY_CAP = 30.0
#: How often a waiter for start-up looks at the last start failure.
READY_POLL = 0.2
#: Seconds a caller refused with NotReadyError is told to wait before retrying.
READY_RETRY_AFTER = 2
#: Cold retention runs this often (RocketMQ's tieredStoreDeleteFileInterval).
RETENTION_INTERVAL = 3600.0


async def bucket_data_without_metadata(root: DriverRoot, cfg: TierdConfig, our_id: str | None) -> str | None:
    """Why the bucket prefix must not be tiered into by a store *without* tiering metadata, or
    None when it is safe (nothing of this broker's there). Another store's claim is left to
    :meth:`~tierd.tiered.ownership.Ownership.claim`, which names the owner."""
    cluster, broker = cfg.tiered.cluster, cfg.tiered.broker
    owner = await current_owner(root, cluster, broker)
    if owner is not None and owner.store_id == our_id:
        return f"this store's own owner record ({owner.describe()})"
    if owner is not None:
        return None
    try:
        await root.get_object(broker_manifest_path(cluster, broker))
    except SegmentNotFoundError:
        return None
    return f"a broker manifest ({broker_manifest_path(cluster, broker)})"


def metadata_missing_error(cfg: TierdConfig, root: DriverRoot, what: str) -> CorruptionError:
    """Both metadata files are missing but the bucket holds data: refuse, as for corrupt ones."""
    meta = MetadataStore(Path(cfg.store.dir))
    prefix = prefix_url(root.url, cfg.tiered.cluster, cfg.tiered.broker)
    return CorruptionError(
        f"no tiering metadata ({meta.path} and its .bak are missing) but the bucket prefix {prefix} "
        f"holds this broker's data — {what}; tiering now would write everything again over it. "
        "Rebuild the metadata from the bucket with `tierd restore --from URL` (into an empty "
        "store.dir), or point this store at a prefix of its own",
        path=str(meta.path),
        prefix=prefix,
    )


class TieringService:
    #: The flat-file store (the read-only open of a bucket substitutes one whose load never writes).
    flat_class: type[FlatFileStore] = FlatFileStore

    def __init__(self, cfg: TierdConfig, hot: HotStore, root: DriverRoot | None = None) -> None:
        self.cfg = cfg
        self.hot = hot
        #: Backend call outcomes (reachable, last success, recent errors): /v1/status, metrics.
        self.health = BackendHealth()
        self.root = GuardedRoot(
            root if root is not None else open_driver_factory(cfg.backend),
            cfg.tiered.backend_timeout,
            self.health,
        )
        self.metadata = MetadataStore(Path(cfg.store.dir))
        self.flat = self.flat_class(self.root, cfg.tiered, self.metadata)
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
        self.dispatcher.on_failure = lambda key, err: self.health.note(f"commit {key[0]}/{key[1]}", err)
        self._manifest_lock = asyncio.Lock()
        self._manifest_failures = FailureLog(log, "writing bucket manifests")
        self._maintenance_failures = FailureLog(log, "tiering maintenance")
        #: Set once the cold tier is usable: metadata loaded, prefix claimed, flat files reconciled.
        self.ready = asyncio.Event()
        #: True once the local tiering metadata was read (the pod can serve local clients).
        self.metadata_loaded = False
        self.start_error: Exception | None = None
        #: Set when the backend's capability check refuses writes (an S3 server that ignores
        #: preconditions, without ``backend.single_writer``): nothing is tiered (the prefix is not
        #: even claimed), the hot store keeps everything, cold reads of what is there still work.
        self.refused: UnsafeBackendError | None = None
        #: This store's claim on its bucket prefix (None until the store id is known).
        self.ownership: Ownership | None = None
        self._tasks: list[asyncio.Task[None]] = []
        hot.delete_guard = self.dispatcher.allows_delete

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._start(), name="tierd-tiering-start"))

    async def _start(self) -> None:
        delay = 0.5
        meta: TieredMetadata | None = None
        while True:
            try:
                if not self.metadata_loaded:
                    meta = await asyncio.to_thread(self.metadata.load)
                    self.metadata_loaded = True
                await self._check_backend()
                n = await self._open_cold(meta)
                break
            except Exception as e:
                again = str(e) == str(self.start_error)
                self.start_error = e
                if isinstance(e, TierdError):
                    self.health.note("start", e)
                if isinstance(e, PrefixOwnedError | CorruptionError | InvalidArgumentError):
                    # Retrying cannot fix these without an operator: say so once, retry slowly.
                    if not again:
                        log.error("the cold tier cannot start: %s — hot store keeps working", e)
                    delay = START_RETRY_CAP
                else:
                    log.warning(
                        "cold tier not available yet (%s); retrying in %.0f s — hot store keeps working",
                        e,
                        delay,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, START_RETRY_CAP)
        await self.index.load(self.flat.loaded_index)
        self.flat.index_infos = self.index.uploaded_infos
        self.start_error = None
        self._align_hot_queues()
        if self.refused is None:
            self.dispatcher.before_round = self._check_owner
            self.dispatcher.after_round = self._write_manifests
            await self._write_manifests()
        log.info(
            "cold tier ready: %d queue(s) loaded from metadata (%d damaged and fenced), backend %r",
            n,
            len(self.flat.damaged),
            self.root,
        )
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

    async def _open_cold(self, meta: TieredMetadata | None) -> int:
        """Claim the prefix and load the flat files (backend I/O; retried by :meth:`_start`)."""
        tiered = self.cfg.tiered
        if self.ownership is None:
            our_id = await asyncio.to_thread(store_id, Path(self.cfg.store.dir))
            assert our_id is not None
            self.ownership = Ownership(
                self.root, tiered.cluster, tiered.broker, our_id, Path(self.cfg.store.dir)
            )
        ownership = self.ownership
        if ownership.record is None and self.refused is None:
            if meta is None:
                found = await bucket_data_without_metadata(self.root, self.cfg, ownership.store_id)
                if found is not None:
                    raise metadata_missing_error(self.cfg, self.root, found)
                # Metadata first, then the claim: stopped in between, the next start would find
                # our owner record without metadata and refuse the prefix as someone's data.
                await self.flat.save()
            elif meta.queues and not await self._prefix_known():
                raise BackendError(
                    f"the cold-tier prefix {prefix_url(self.root.url, tiered.cluster, tiered.broker)} "
                    "holds neither an owner record nor a broker manifest, yet the "
                    f"tiering metadata lists {len(meta.queues)} queue(s) there: the bucket was wiped, or "
                    "backend.url does not reach it (an unmounted directory, another bucket)",
                    backend=repr(self.root),
                )
            try:
                await ownership.claim()
            except PrefixOwnedError:
                if ownership.unreadable is None:
                    raise
                # Nobody can tell who owns the prefix: write nothing (the fence refuses every
                # write with this error) but load, so that reads work — an unreadable record
                # used to keep the whole cold tier down, with no way out.
                log.error("%s", ownership.fenced)
            self.root.fence = ownership.ensure
        return await self.flat.load_from(meta)

    async def _prefix_known(self) -> bool:
        """Whether the prefix shows this broker was tiered there (owner records or manifest)."""
        tiered = self.cfg.tiered
        if await self.root.list_objects(owner_dir(tiered.cluster, tiered.broker)):
            return True
        try:
            await self.root.get_object(broker_manifest_path(tiered.cluster, tiered.broker))
        except SegmentNotFoundError:
            return False
        return True

    async def _check_owner(self) -> None:
        """Before every commit round: the prefix must still be ours (one listing)."""
        if self.ownership is not None:
            await self.ownership.verify()

    async def apply_retention(self, now_ms: int | None = None) -> int:
        """Expire cold segments older than each topic's reserve time (``tiered.file_reserved_time``
        unless set per topic). Returns segments deleted."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        await self._check_owner()
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

    @contextlib.asynccontextmanager
    async def rounds_excluded(self, timeout: float) -> AsyncIterator[None]:
        """No tiering round runs inside: a topic delete erases what a round would read from the
        hot store and write into the bucket. Waits at most ``timeout`` s for a running round."""
        lock = self.dispatcher.round_lock
        try:
            await asyncio.wait_for(lock.acquire(), timeout)
        except TimeoutError:
            raise NotReadyError(
                f"a tiering round is still running after {timeout:g} s; retry when it has ended",
                timeout=timeout,
            ) from None
        try:
            yield
        finally:
            lock.release()

    async def erase_topic(self, topic: str) -> int:
        """Remove ``topic`` from the cold tier (inside :meth:`rounds_excluded`): its queues and
        metadata are forgotten first, in one metadata write, then every object under the topic's
        directory in the bucket goes — segments, queue manifests, and whatever an earlier
        attempt cut short left behind — then the broker manifest is rewritten without it.
        Idempotent: a delete resumed after a crash runs it again. Returns objects deleted."""
        await self.wait_ready()
        flat = self.flat
        for key in [k for k in flat.files if k[0] == topic]:
            del flat.files[key]
        for key in [k for k in flat.damaged if k[0] == topic]:
            del flat.damaged[key]
        flat.topics.pop(topic, None)
        self.manifests.forget_topic(topic)
        await flat.save()
        deleted = 0
        topic_dir = f"{cluster_dir(self.cfg.tiered.cluster)}/{self.cfg.tiered.broker}/{topic}"
        for path in await self.root.list_objects(topic_dir):
            with contextlib.suppress(SegmentNotFoundError):
                if path.endswith("/" + MANIFEST_NAME):
                    await self.root.delete_object(path)
                else:  # a segment: its driver removes it whole (chunks, sealed object)
                    await self.root.driver(path).delete()
            deleted += 1
        async with self._manifest_lock:  # raises: the delete stays pending and is retried
            await self.manifests.write_changed()
        return deleted

    async def _maintenance(self) -> None:
        """Periodic upkeep: retry failed seals, save metadata (sizes move with every commit),
        apply cold retention every RETENTION_INTERVAL."""
        next_retention = time.monotonic() + RETENTION_INTERVAL
        while True:
            await asyncio.sleep(self.cfg.tiered.manifest_interval)
            try:
                await self._check_owner()
                for ff in list(self.flat.files.values()):
                    await ff.commitlog.seal_pending()
                    await ff.consumequeue.seal_pending()
                await self.index.maintain()
                await self.flat.save()
                await self._write_manifests()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + RETENTION_INTERVAL
                    await self.apply_retention()
                self._maintenance_failures.succeeded()
            except Exception as e:  # one line for an explained failure; repeats counted
                if isinstance(e, TierdError):
                    self.health.note("maintenance", e)
                self._maintenance_failures.failed(e, "retrying next interval")

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
        longer) gets: :class:`~tierd.errors.PrefixOwnedError` when another store owns the
        prefix, :class:`~tierd.errors.BackendError` when the last start failure is one that
        retrying cannot fix (corrupt data, bad settings), otherwise the retriable
        :class:`~tierd.errors.NotReadyError` naming it."""
        if self.ready.is_set():
            return
        err = self.start_error
        if isinstance(err, PrefixOwnedError):
            raise err
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
        """Wait for start-up (metadata loaded, prefix claimed, backend reachable), at most
        ``timeout`` seconds (default ``tiered.ready_timeout``); then :meth:`check_ready`'s error.
        A failure that retrying cannot fix is raised at once."""
        loop = asyncio.get_running_loop()
        wait = self.cfg.tiered.ready_timeout if timeout is None else timeout
        deadline = loop.time() + wait
        while not self.ready.is_set():
            err = self.start_error
            left = deadline - loop.time()
            if left <= 0 or isinstance(err, PrefixOwnedError | CorruptionError | InvalidArgumentError):
                self.check_ready(wait)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), min(left, READY_POLL))

    async def tier_now(self, timeout: float | None = None) -> TierReport:
        """Commit everything pending to the cold tier now (waits for start-up first, at most
        ``timeout`` s, default ``tiered.ready_timeout``), then bring the bucket manifests up to
        date. Returns what each queue committed.

        Raises :class:`~tierd.errors.PrefixOwnedError` when another store owns the prefix, and a
        :class:`~tierd.errors.BackendError` naming each failed queue and the backend's error when
        any pending message could not be committed (or the manifests could not be written) —
        never a success with messages left behind by a failure."""
        if self.start_error is not None:
            # Start-up is failing (and retrying in the background): say why now, do not wait.
            self.check_ready()
        await self.wait_ready(timeout)
        if self.refused is not None:
            raise self.refused
        result = await self.dispatcher.tier_now()
        report = self._report(result)
        if result.failed:
            raise self._round_error(result, report)
        try:
            async with self._manifest_lock:
                await self.manifests.write_changed()
        except TierdError as e:
            self.health.note("manifests", e)
            if isinstance(e, PrefixOwnedError):
                raise
            raise BackendError(
                f"committed {report.committed} message(s), but the bucket manifests could not be "
                f"written: {e}",
                **report.as_dict(),
            ) from e
        return report

    def _report(self, result: RoundResult) -> TierReport:
        queues = []
        for key in self.hot.queue_keys():
            hot = self.hot.queue_range(*key)
            if hot is None:
                continue
            ff = self.flat.get(*key)
            cold = ff.max_offset if ff is not None and ff.initialised else hot.min_offset
            pending = max(0, hot.max_offset - max(cold, hot.min_offset))
            committed = result.committed.get(key, 0)
            if committed or pending:
                queues.append(QueueTiered(key[0], key[1], committed, pending))
        return TierReport(tuple(queues))

    @staticmethod
    def _round_error(result: RoundResult, report: TierReport) -> TierdError:
        """The one error a failed ``tier_now`` raises: the ownership error if the prefix is lost
        (409 over HTTP), else a backend error naming every failed queue and its cause (502)."""
        owned = next((e for e in result.failed.values() if isinstance(e, PrefixOwnedError)), None)
        if owned is not None:
            return owned
        failed = sorted(result.failed.items())
        shown = "; ".join(f"{t}/{q}: {e}" for (t, q), e in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        return BackendError(
            f"tiering failed for {len(failed)} queue(s), {report.pending} message(s) still pending "
            f"(committed {report.committed}): {shown}{more}",
            **report.as_dict(),
            failed={f"{t}/{q}": str(e) for (t, q), e in failed},
        )

    async def _write_manifests(self) -> None:
        """Bring bucket manifests up to date: after every dispatch round (so after every seal),
        on the maintenance timer and at close — never from inside a commit, and one writer at a
        time so an older manifest never lands after a newer one."""
        try:
            async with self._manifest_lock:
                await self.manifests.write_changed()
            self._manifest_failures.succeeded()
        except Exception as e:  # manifests are rewritten next time; data is safe without them
            if isinstance(e, TierdError):
                self.health.note("manifests", e)
            self._manifest_failures.failed(e, "retrying at the next interval")

    async def close(self, grace: float = 30.0) -> None:
        """Stop the loop, try to commit what is pending within ``grace`` seconds, save metadata."""
        self.dispatcher.stop()
        fenced = self.ownership is not None and self.ownership.fenced is not None
        writable = self.refused is None and not fenced
        if self.ready.is_set() and grace > 0 and writable:  # grace 0: an admin command
            try:
                result = await asyncio.wait_for(self.dispatcher.tier_now(), grace)
                if result.failed:
                    log.warning(
                        "final tiering round failed for %d queue(s); they resume at the next start",
                        len(result.failed),
                    )
            except TimeoutError:
                log.warning(
                    "closing with tiering unfinished after %.0f s; it resumes at the next start", grace
                )
            except Exception as e:  # one line for an explained failure
                FailureLog(log, "final tiering round").failed(e, "it resumes at the next start")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ready.is_set():
            await self.index.close()
            await self.flat.save()
            if writable:
                await self._write_manifests()
        await self.root.aclose()

    def damaged(self) -> list[dict[str, object]]:
        """Queues whose cold files are damaged, each with the queue offsets it lost (``first``,
        ``end``) and why: they are fenced, every other queue works (docs/tiering.md, "Damage in
        the bucket"). ``GET /v1/status`` and the metrics report them."""
        return [d.as_dict() for _, d in sorted(self.flat.damaged.items())]

    def status(self) -> dict[str, object]:
        """The cold tier's health as ``GET /v1/status`` reports it (see docs/http.md)."""
        h = self.health
        stats = self.dispatcher.stats
        ownership = self.ownership
        behind = 0
        oldest_ms: int | None = None
        for key in self.hot.queue_keys():
            hot = self.hot.queue_range(*key)
            if hot is None:
                continue
            ff = self.flat.get(*key)
            cold = ff.max_offset if ff is not None and ff.initialised else hot.min_offset
            first = max(cold, hot.min_offset)
            n = max(0, hot.max_offset - first)
            if n:
                behind += n
                ts = self.hot.store_timestamp(key[0], key[1], first)
                if ts is not None and (oldest_ms is None or ts < oldest_ms):
                    oldest_ms = ts
        now = int(time.time() * 1000)
        owner = ownership.owner if ownership is not None else None
        return {
            "ready": self.ready.is_set(),
            "metadata_loaded": self.metadata_loaded,
            "start_error": _error_dict(self.start_error) if not self.ready.is_set() else None,
            "backend": {
                "url": self.root.url,
                "reachable": h.reachable,
                "last_success": h.last_ok_ms,
                "last_failure": h.last_failure_ms,
                "calls": h.calls,
                "failures": h.failures,
                "timeouts": h.timeouts,
                "capabilities": dict(report) if (report := self.root.capability_report()) else None,
            },
            "ownership": {
                "prefix": prefix_url(self.root.url, self.cfg.tiered.cluster, self.cfg.tiered.broker),
                "owner": owner.as_dict() if owner is not None else None,
                "store_id": ownership.store_id if ownership is not None else None,
                "epoch": ownership.epoch if ownership is not None else None,
                "owned_by_this_store": ownership is not None
                and owner is not None
                and owner.store_id == ownership.store_id
                and ownership.fenced is None,
                "error": _error_dict(ownership.fenced) if ownership is not None else None,
            },
            "damaged": self.damaged(),
            "last_commit": stats.last_commit_ms,
            "lag": {
                "messages": behind,
                "seconds": max(0.0, (now - oldest_ms) / 1000) if oldest_ms is not None else 0.0,
            },
            "errors": [e.as_dict() for e in h.recent],
        }


def _error_dict(err: BaseException | None) -> dict[str, object] | None:
    if err is None:
        return None
    if isinstance(err, TierdError):
        return {"error": err.code, "message": err.message, "detail": err.detail}
    return {"error": type(err).__name__, "message": str(err), "detail": {}}
