"""The cold key index service: local files compacted into INDEX segments on the backend.

**Lifecycle** (RocketMQ's UNSEALED → SEALED → UPLOAD): :meth:`ColdIndexService.add` appends to
the newest local file; a full one is sealed and a new file created (first), so the newest local
file is always the writable one and every older local file is sealed — that rule alone
restores the statuses after a restart. :meth:`ColdIndexService.maintain` also seals a non-empty
file older than ``max_file_age_ms``, then, oldest first: compacts a sealed file (numpy, in a
worker thread), uploads it (piecewise commits, then seal), records it as UPLOADED
(``on_change`` persists metadata), and only then deletes the local file.

**Index manifest.** A reader of the bucket alone (Spark) sees only uploaded files, which lag the
messages by up to ``max_file_age_ms``. After every upload, and before every expiry, the service
publishes ``{cluster dir}/{broker}/INDEX_MANIFEST.json``: the uploaded segments and, per queue,
the queue offsets ``[first, end)`` whose keys are certainly in them — claimed from the snapshot a
file takes when this process seals it (offsets added before the seal by this process; never
those of a batch a roll split, never those added before a restart), plus ``expired-through``,
the newest end timestamp of a deleted file (messages stored up to then may have lost their
items). Claiming less is always safe: a reader scans what is not claimed.

**Crash safety.** Compaction output never touches local disk, and a local file is deleted only
after the upload committed *and* ``on_change`` returned, so after a crash at any step the sealed
local file is still there and is compacted and uploaded again. The compacted bytes are a pure
function of the sealed file's header (begin, end) and items ``1..count``: no clock; items
ordered by slot, then by descending item index (newest first); the writable file's slot table
and links serve only as a shortcut to that order and are ignored unless they describe it
exactly (a torn chain falls back to a sort) — so a re-upload writes the very same bytes, and the driver's
idempotent-write contract turns what landed before into a no-op and appends the rest. A segment
sealed by an earlier attempt is accepted after comparing it byte for byte; a segment holding
anything else is deleted and written again. A file uploaded and recorded but not yet deleted
locally is dropped at :meth:`~ColdIndexService.load` (the upload wins). Power loss may lose
index items of local files not yet flushed (``maintain`` and ``close`` msync); the messages
themselves are safe in the flat commitlog.

**Concurrency**: one asyncio loop. :meth:`~ColdIndexService.add` and
:meth:`~ColdIndexService.query` run on it and never overlap each other (add is synchronous, and
a query reads all local files before its first await), so the writable file needs no lock;
compaction runs in a worker thread on a sealed, immutable file; ``maintain``, ``expire``,
``load`` and ``close`` are serialised by one asyncio lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import google_crc32c
import numpy as np
import numpy.typing as npt

from tierd.drivers import paths
from tierd.drivers.segment import AppendResult, ByteRange, FileSegment, FileType
from tierd.errors import (
    CorruptionError,
    InvalidArgumentError,
    SegmentNotFoundError,
    SegmentReadError,
    SegmentSealedError,
    StoreClosedError,
)
from tierd.format.key_hash import index_key, key_hash, key_hashes
from tierd.local.index import torn_at_creation
from tierd.tiered.index.compaction import CompactedIndex, compact
from tierd.tiered.index.format import (
    HEADER_SIZE,
    HEADER_STRUCT,
    INT32_MAX,
    MAGIC_COMPACTED,
    U8Array,
    check_geometry,
    writable_size,
)
from tierd.tiered.index.keys import batch_keys
from tierd.tiered.index.reading import segment_slots
from tierd.tiered.index.results import FileStatus, IndexFileInfo, IndexHit, IndexStats
from tierd.tiered.index.uploaded import UploadedFile
from tierd.tiered.index.writable import LocalFile
from tierd.tiered.manifest import IndexCoverage, IndexManifest, index_manifest_path
from tierd.tiered.records import LocalSegment, ManifestSegment

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tierd.drivers.segment import DriverRoot, SegmentDriver
    from tierd.tiered.flatmessage import CommittedBatch

__all__ = [
    "DEFAULT_MAX_FILE_AGE_MS",
    "DEFAULT_UPLOAD_PIECE",
    "DIR_NAME",
    "ChangeCallback",
    "ColdIndexService",
    "Coverage",
]

log = logging.getLogger(__name__)

DIR_NAME: Final = "tiered_index"
#: Uploads go out as commits of this many bytes (one driver write / S3 chunk each).
DEFAULT_UPLOAD_PIECE: Final = 64 * 1024 * 1024
DEFAULT_MAX_FILE_AGE_MS: Final = 3_600_000
_HEADER_READ_CONCURRENCY: Final = 16


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _crc32c(data: U8Array, piece: int = 16 * 1024 * 1024) -> str:
    """CRC32C (8 hex digits) of ``data``; google_crc32c only takes bytes, hence the pieces."""
    crc = 0
    for pos in range(0, len(data), piece):
        crc = google_crc32c.extend(crc, data[pos : pos + piece].tobytes())
    return f"{crc:08x}"


def _append(seg: FileSegment, data: bytes, timestamp: int) -> None:
    result = seg.append(data, timestamp)
    if result is not AppendResult.SUCCESS:  # the segment is sized to fit: a bug if it happens
        raise CorruptionError(f"index segment {seg.path} refused an append: {result.name}", path=seg.path)


# ----------------------------------------------------------------------------- the service
ChangeCallback = Callable[[], Awaitable[None]]
Coverage = dict[tuple[int, int], tuple[int, int]]


def _merge_coverage(published: Coverage, covers: Coverage) -> Coverage:
    """``published`` extended by a sealed file's snapshot: per queue, the union when the two
    ranges meet, else the snapshot alone (the newer range; the offsets between them are not
    covered, and an older range beyond the gap is dropped rather than tracked)."""
    out = dict(published)
    for key, (first, end) in covers.items():
        cur = out.get(key)
        if cur is not None and first <= cur[1] and end >= cur[0]:
            out[key] = (min(cur[0], first), max(cur[1], end))
        else:
            out[key] = (first, end)
    return out


class ColdIndexService:
    """The cold key index of one broker: local files under ``{store_dir}/tiered_index`` plus
    INDEX segments under ``{cluster dir}/{broker}/rmq_sys_INDEX/0/INDEX/`` on ``root``.

    Call :meth:`load` first. ``on_change`` is awaited whenever the set of uploaded segments
    changed (upload committed, expiry, load dropped a missing one) so the caller persists
    :meth:`uploaded_infos` into metadata and manifests; a local file is deleted only after it
    returned. ``max_file_age_ms``: :meth:`maintain` seals a non-empty writable file this old.
    ``upload_piece`` bytes go out per commit. ``clock`` (epoch ms) exists for tests.
    """

    def __init__(
        self,
        store_dir: Path,
        root: DriverRoot,
        cluster: str,
        broker: str,
        slots: int,
        items: int,
        *,
        on_change: ChangeCallback | None = None,
        max_file_age_ms: int = DEFAULT_MAX_FILE_AGE_MS,
        upload_piece: int = DEFAULT_UPLOAD_PIECE,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        check_geometry(slots, items)
        if upload_piece <= 0:
            raise InvalidArgumentError(
                f"upload_piece must be >= 1, got {upload_piece}", upload_piece=upload_piece
            )
        paths.cluster_dir(cluster)  # validates the names now rather than at the first upload
        paths.queue_path(broker, paths.INDEX_TOPIC, paths.INDEX_QUEUE_ID)
        self.directory = Path(store_dir) / DIR_NAME
        self.root = root
        self.cluster = cluster
        self.broker = broker
        self.slots = slots
        self.items = items
        self.max_file_age_ms = max_file_age_ms
        self.upload_piece = upload_piece
        self._on_change = on_change
        self._clock = clock
        self.stats = IndexStats()
        #: Oldest first; the last one is writable (UNSEALED) unless sealed by maintain/add.
        self._local: list[LocalFile] = []
        #: Oldest first.
        self._uploaded: list[UploadedFile] = []
        #: Local files already uploaded and recorded in memory, deleted after on_change succeeds.
        self._unlink_after_change: list[Path] = []
        self._last_begin = -1
        #: Per (topic id, queue id): queue offsets ``[first, end)`` added since this process
        #: started (contiguous; a gap restarts it).
        self._added: dict[tuple[int, int], tuple[int, int]] = {}
        #: Per (topic id, queue id): queue offsets ``[first, end)`` whose keys are all in
        #: uploaded segments (see :meth:`write_manifest`), as published in the index manifest.
        self.coverage: Coverage = {}
        #: Newest end timestamp of an index file deleted by retention (None: none yet).
        self.expired_through: int | None = None
        #: Whether :attr:`coverage` and :attr:`expired_through` were read from the bucket (done
        #: before the first publication, not at load: most start-ups never need it).
        self._manifest_read = False
        self._lock = asyncio.Lock()
        self._inflight: asyncio.Future[Any] | None = None
        self._loaded = False
        self._closed = False

    # ------------------------------------------------------------------ naming / state
    def segment_path(self, begin_timestamp: int) -> str:
        """Driver path of the INDEX segment of the file that began at ``begin_timestamp``."""
        return paths.index_segment_path("", self.cluster, self.broker, begin_timestamp)

    def uploaded_infos(self) -> list[LocalSegment]:
        """Uploaded INDEX segments, oldest first (for metadata and manifests)."""
        return [u.info for u in self._uploaded]

    def files(self) -> list[IndexFileInfo]:
        """Every file, oldest first (diagnostics and tests)."""
        rows = [u.info_row() for u in self._uploaded] + [f.info() for f in self._local]
        return sorted(rows, key=lambda r: r.begin_timestamp)

    @property
    def needs_maintenance(self) -> bool:
        """True when a sealed local file waits for compaction and upload."""
        return any(f.status is FileStatus.SEALED for f in self._local)

    def _check_ready(self) -> None:
        if self._closed:
            raise StoreClosedError(f"cold index service for {self.directory} is closed")
        if not self._loaded:
            raise StoreClosedError(
                f"cold index service for {self.directory} is not loaded: call load() first"
            )

    def _update_gauges(self) -> None:
        self.stats.local_files = len(self._local)
        self.stats.uploaded_files = len(self._uploaded)

    # ------------------------------------------------------------------ load
    async def load(self, uploaded: list[LocalSegment]) -> None:
        """Open local files (the newest writable, the others sealed) and register ``uploaded``
        INDEX segments (from metadata), reading each one's 28-byte header once to learn its
        geometry. A segment that is gone from the backend is dropped with a warning; one with a
        bad header is logged, kept for metadata and expiry, and never queried. A local file whose
        upload is already recorded is deleted (the upload wins). Backend errors propagate (the
        caller retries ``load``)."""
        async with self._lock:
            if self._closed:
                raise StoreClosedError(f"cold index service for {self.directory} is closed")
            for f in self._local:
                f.close()
            self._local, self._uploaded = [], []
            self.directory.mkdir(parents=True, exist_ok=True)
            remote = await self._open_uploaded([i for i in uploaded if i.type == "INDEX"])
            remote_bases = {u.begin for u in remote}
            local: list[LocalFile] = []
            try:
                names = sorted(
                    (int(p.name), p) for p in self.directory.iterdir() if p.name.isdigit() and p.is_file()
                )
                for i, (begin, path) in enumerate(names):
                    if begin in remote_bases:
                        log.info("index file %s is already uploaded; deleting the local copy", path)
                        path.unlink()
                        continue
                    if i == len(names) - 1 and torn_at_creation(
                        path, writable_size(self.slots, self.items), HEADER_SIZE
                    ):
                        log.warning(
                            "index file %s was never initialised (crash while creating it); removing it", path
                        )
                        path.unlink()
                        continue
                    local.append(LocalFile.open(path, self.slots, self.items))
            except BaseException:
                for f in local:
                    f.close()
                raise
            for f in local[:-1]:
                f.status = FileStatus.SEALED
            self._local, self._uploaded = local, remote
            begins = [f.begin for f in local] + [u.begin for u in remote]
            self._last_begin = max([self._last_begin, *begins])
            self._loaded = True
            self._update_gauges()
            if len(remote) != len([i for i in uploaded if i.type == "INDEX"]):
                await self._changed()
            log.info(
                "cold index loaded: %d local file(s) (%d sealed), %d uploaded",
                len(local),
                max(0, len(local) - 1),
                len(remote),
            )

    async def _open_uploaded(self, infos: list[LocalSegment]) -> list[UploadedFile]:
        sem = asyncio.Semaphore(_HEADER_READ_CONCURRENCY)

        async def one(info: LocalSegment) -> UploadedFile | None:
            driver = self.root.driver(self.segment_path(info.base_offset))
            async with sem:
                try:
                    raw = await driver.read(ByteRange(0, HEADER_SIZE))
                except SegmentNotFoundError:
                    log.warning(
                        "index segment %s is listed in metadata but missing; dropping it", driver.path
                    )
                    return None
                except SegmentReadError:  # shorter than a header
                    raw = bytes(HEADER_SIZE)
            self.stats.header_reads += 1
            magic, begin, end, used, count = HEADER_STRUCT.unpack(raw)
            slots = segment_slots(info.size, count)
            if magic != MAGIC_COMPACTED or begin != info.base_offset or not slots or not 0 <= used <= count:
                log.error(
                    "index segment %s has a bad header (magic 0x%08X, begin %d, used %d, count %d, size %d); "
                    "it is kept for expiry but not queried",
                    driver.path,
                    magic,
                    begin,
                    used,
                    count,
                    info.size,
                )
                return UploadedFile(info, driver, slots=0, count=0, end=info.max_store_timestamp or begin)
            return UploadedFile(info, driver, slots=slots, count=count, end=end)

        found = await asyncio.gather(*(one(i) for i in infos))
        return sorted((u for u in found if u is not None), key=lambda u: u.begin)

    # ------------------------------------------------------------------ write
    def add(self, batch: CommittedBatch, topic_id: int) -> int:
        """Index every record of a committed batch under each of its keys (the KEYS tokens and
        UNIQ_KEY, each once). Returns the number of items added. Synchronous: call it on the
        loop, right after the commit made the records readable."""
        self._check_ready()
        n = len(batch.sizes)
        if n == 0:
            return 0
        keys, rec = batch_keys(batch)
        added = 0
        if keys:
            added = self.put_items(
                key_hashes(keys),
                topic_id,
                batch.queue_id,
                np.asarray(batch.flat_offsets, dtype=np.int64)[rec],
                np.asarray(batch.sizes, dtype=np.int64)[rec],
                np.asarray(batch.store_timestamps, dtype=np.int64)[rec],
            )
        # After the items: a file sealed while they went in (a roll inside put_items) must not
        # claim this batch, part of which went into the next file.
        key = (topic_id, batch.queue_id)
        first, end = batch.first_queue_offset, batch.first_queue_offset + n
        prev = self._added.get(key)
        joins = prev is not None and first <= prev[1] and end >= prev[0]
        self._added[key] = (min(prev[0], first), max(prev[1], end)) if prev and joins else (first, end)
        return added

    def put_items(
        self,
        hashes: npt.ArrayLike,
        topic_ids: npt.ArrayLike,
        queue_ids: npt.ArrayLike,
        flat_offsets: npt.ArrayLike,
        sizes: npt.ArrayLike,
        store_timestamps: npt.ArrayLike,
    ) -> int:
        """Append already hashed items (equal-length columns; scalars broadcast), rolling to a
        new file when the writable one fills up. The vectorised core of :meth:`add`."""
        self._check_ready()
        h = np.asarray(hashes)
        if h.dtype != np.uint32:
            if h.size and (h.dtype.kind not in "iu" or int(h.min()) < 0 or int(h.max()) > 0xFFFFFFFF):
                raise InvalidArgumentError("hashes must be unsigned 32-bit integers", dtype=str(h.dtype))
            h = h.astype(np.uint32)
        n = len(h)
        if n == 0:
            return 0
        cols = [
            np.broadcast_to(np.asarray(c, dtype=np.int64), (n,))
            for c in (topic_ids, queue_ids, flat_offsets, sizes, store_timestamps)
        ]
        tid, qid, off, size, ts = cols
        for name, col in (("topic_ids", tid), ("queue_ids", qid), ("sizes", size)):
            if int(col.min()) < 0 or int(col.max()) > INT32_MAX:
                raise InvalidArgumentError(f"{name} must be in [0, {INT32_MAX}]", column=name)
        if int(off.min()) < 0:
            raise InvalidArgumentError("flat_offsets must be >= 0")
        done = 0
        while done < n:
            f = self._writable()
            done += f.put(h[done:], tid[done:], qid[done:], off[done:], size[done:], ts[done:])
            if done < n:
                log.debug("index file %s is full; rolling", f.path)
                self._roll()
        self.stats.items_added += n
        return n

    def _writable(self) -> LocalFile:
        if self._local and self._local[-1].status is FileStatus.UNSEALED:
            return self._local[-1]
        return self._roll()

    def _roll(self) -> LocalFile:
        """Create a new writable file FIRST, then seal the current one, so that the newest local
        file on disk is always the writable one (that is how load() tells statuses apart)."""
        begin = max(self._clock(), self._last_begin + 1)
        f = LocalFile.create(self.directory / str(begin), self.slots, self.items, begin)
        self._last_begin = begin
        if self._local and self._local[-1].status is FileStatus.UNSEALED:
            self._local[-1].status = FileStatus.SEALED
            self._local[-1].covers = dict(self._added)
        self._local.append(f)
        self._update_gauges()
        return f

    # ------------------------------------------------------------------ maintenance
    async def maintain(self) -> None:
        """Seal the writable file if full or older than ``max_file_age_ms``, flush it, then
        compact and upload every sealed file, oldest first. Stops at the first failure and
        raises it (call again later; what was done is kept, what failed is retried)."""
        async with self._lock:
            self._check_ready()
            if self._unlink_after_change:
                await self._changed()
            if self._local:
                w = self._local[-1]
                if (
                    w.status is FileStatus.UNSEALED
                    and w.count
                    and (w.full or self._clock() - w.begin >= self.max_file_age_ms)
                ):
                    self._roll()
                    log.info("sealed index file %s (%d items)", w.path, w.count)
            for f in list(self._local):
                if f.status is not FileStatus.SEALED:
                    if f.dirty:
                        await self._in_thread(f.flush)
                    continue
                if f.count == 0:
                    self._local.remove(f)
                    f.destroy()
                    continue
                await self._upload_file(f)
            self._update_gauges()

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in a worker thread; ``close()`` waits for it even if we are cancelled."""
        fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        self._inflight = fut
        try:
            return await asyncio.shield(fut)
        finally:
            if fut.done():
                self._inflight = None

    async def _upload_file(self, f: LocalFile) -> None:
        t0 = time.perf_counter()

        def work() -> tuple[CompactedIndex, str]:
            f.flush()
            c = compact(f.mm, f.slots, f.items, name=str(f.path), ranks=f.ranks)
            return c, _crc32c(c.data)

        compacted, crc = await self._in_thread(work)
        self.stats.compactions += 1
        self.stats.compaction_seconds += time.perf_counter() - t0
        driver = self.root.driver(self.segment_path(f.begin))
        await self._upload(driver, f.begin, compacted.data)
        info = LocalSegment(
            type="INDEX",
            base_offset=f.begin,
            size=len(compacted.data),
            sealed=True,
            min_store_timestamp=compacted.min_item_time,
            max_store_timestamp=compacted.end_timestamp,
            create_timestamp=f.begin,
            seal_timestamp=self._clock(),
            crc32c=crc,
        )
        uploaded = UploadedFile(
            info, driver, slots=compacted.slots, count=compacted.item_count, end=compacted.end_timestamp
        )
        # Published before the upload is recorded: if this fails, the file stays local and the
        # next maintain() uploads it again (the same bytes) and retries.
        await self._read_manifest()
        coverage = _merge_coverage(self.coverage, f.covers or {})
        await self._write_manifest(coverage, self.expired_through, [*self._uploaded, uploaded])
        self.coverage = coverage
        self._uploaded.append(uploaded)
        self._uploaded.sort(key=lambda u: u.begin)
        self._local.remove(f)
        f.close()
        self._unlink_after_change.append(f.path)
        self._update_gauges()
        log.info(
            "uploaded index file %s: %d items, %d slots, %d bytes in %.2f s",
            f.path,
            compacted.item_count,
            compacted.slots,
            len(compacted.data),
            time.perf_counter() - t0,
        )
        await self._changed()

    async def _upload(self, driver: SegmentDriver, base: int, data: U8Array) -> None:
        """Make the segment hold exactly ``data``, sealed. Safe to repeat after any failure:
        the driver's writes are idempotent, a segment already sealed is compared byte for byte,
        and one holding other bytes is deleted and written again."""
        size = len(data)
        view = data.data
        for attempt in (1, 2):
            seg = FileSegment(driver, FileType.INDEX, base, max_size=size)
            try:
                pos = 0
                while pos < size:
                    piece = view[pos : pos + self.upload_piece]
                    _append(seg, piece.tobytes(), base)
                    await seg.commit()
                    pos += len(piece)
                await seg.seal()
                if await driver.size() == size:
                    break
                problem = f"holds {await driver.size()} bytes after the upload, expected {size}"
            except SegmentSealedError:
                if await self._holds(driver, view):
                    log.info(
                        "index segment %s was already uploaded and sealed with the same bytes", driver.path
                    )
                    break
                problem = "is sealed with different bytes"
            except CorruptionError as e:
                problem = f"holds different bytes ({e})"
            if attempt == 2:
                raise CorruptionError(
                    f"index segment {driver.path} {problem} even after rewriting it", path=driver.path
                )
            log.warning("index segment %s %s; deleting and uploading it again", driver.path, problem)
            await driver.delete()
        self.stats.uploads += 1
        self.stats.uploaded_bytes += size

    async def _holds(self, driver: SegmentDriver, data: memoryview) -> bool:
        if await driver.size() != len(data):
            return False
        pos = 0
        while pos < len(data):
            n = min(self.upload_piece, len(data) - pos)
            if await driver.read(ByteRange(pos, n)) != data[pos : pos + n]:
                return False
            pos += n
        return True

    async def _changed(self) -> None:
        """Tell the owner that uploaded_infos() changed, then delete local files whose upload it
        now records."""
        if self._on_change is not None:
            await self._on_change()
        doomed, self._unlink_after_change = self._unlink_after_change, []
        for path in doomed:
            path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ index manifest
    @property
    def manifest_path(self) -> str:
        """Where the index manifest lives (relative to the root)."""
        return index_manifest_path(self.cluster, self.broker)

    async def _read_manifest(self) -> None:
        """Once per process, before the first publication: load :attr:`coverage` and
        :attr:`expired_through` from the published index manifest. A missing one is a first
        start; one that does not parse is logged and replaced (claiming less coverage is
        always safe)."""
        if self._manifest_read:
            return
        try:
            raw = await self.root.get_object(self.manifest_path)
        except SegmentNotFoundError:
            raw = None
        if raw is not None:
            try:
                m = IndexManifest.model_validate_json(raw)
            except ValueError as e:
                log.error("index manifest %s is not valid (%s); publishing a new one", self.manifest_path, e)
            else:
                self.coverage = {(c.topic_id, c.queue_id): (c.first_offset, c.end_offset) for c in m.coverage}
                self.expired_through = m.expired_through
        self._manifest_read = True

    async def _write_manifest(
        self,
        coverage: Coverage,
        expired_through: int | None,
        uploaded: Sequence[UploadedFile],
    ) -> None:
        """Publish the index manifest (:class:`~tierd.tiered.manifest.IndexManifest`): the
        segments a bucket reader may look keys up in and, per queue, the offsets they cover.

        Coverage is only ever claimed for what is certain: the offsets a file's seal snapshot
        (:attr:`LocalFile.covers`) names were all added by this process before the seal, so
        their items are in that file or an older one — all uploaded before it, oldest first.
        Items added before a restart are not claimed (their local file may have lost unflushed
        items to a power cut), and retention's deletions are published as
        :attr:`expired_through` before they happen."""
        segments = tuple(
            ManifestSegment(
                type="INDEX",
                base_offset=u.begin,
                size=u.info.size,
                sealed=True,
                min_store_timestamp=u.info.min_store_timestamp,
                max_store_timestamp=u.end,
                message_count=u.count,
                crc32c=u.info.crc32c,
            )
            for u in sorted(uploaded, key=lambda u: u.begin)
            if u.slots > 0
        )
        manifest = IndexManifest(
            cluster=self.cluster,
            broker=self.broker,
            segments=segments,
            coverage=tuple(
                IndexCoverage(topic_id=t, queue_id=q, first_offset=a, end_offset=b)
                for (t, q), (a, b) in sorted(coverage.items())
            ),
            expired_through=expired_through,
            written_at=self._clock(),
        )
        await self.root.put_object(self.manifest_path, manifest.model_dump_json(by_alias=True).encode())

    # ------------------------------------------------------------------ query
    async def query(
        self, topic: str, topic_id: int, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[IndexHit]:
        """Candidates for ``key`` of ``topic``: items with its hash and ``topic_id`` whose store
        time may lie in ``[begin_ms, end_ms]``, from every local and uploaded file whose time
        range overlaps the window; newest file first, chain order (newest first) inside a file,
        without duplicates, at most ``max_count``. Hash-only: the caller checks the key.

        An uploaded file costs 2 backend reads (1 if the slot is empty); files older than the
        point where ``max_count`` candidates were found are not read."""
        self._check_ready()
        self.stats.queries += 1
        if max_count <= 0 or begin_ms > end_ms:
            return []
        hash_ = key_hash(index_key(topic, key))
        candidates: list[LocalFile | UploadedFile] = [*self._local, *self._uploaded]
        files = [f for f in candidates if f.overlaps(begin_ms, end_ms)]
        files.sort(key=lambda f: f.begin, reverse=True)
        # Local files are read now, before the first await: maintain() may close one meanwhile.
        local_hits = {
            id(f): f.lookup(hash_, topic_id, begin_ms, end_ms, max_count)
            for f in files
            if isinstance(f, LocalFile)
        }
        found: dict[tuple[int, int], IndexHit] = {}
        for f in files:
            self.stats.files_queried += 1
            if isinstance(f, LocalFile):
                hits = local_hits[id(f)]
            else:
                try:
                    hits = await f.lookup(hash_, topic_id, begin_ms, end_ms, max_count, self.stats)
                except SegmentNotFoundError:
                    log.debug("index segment %s vanished during a query (expired)", f.driver.path)
                    continue
            for hit in hits:
                found.setdefault((hit.queue_id, hit.flat_offset), hit)
            if len(found) >= max_count:
                break
        out = list(found.values())[:max_count]
        self.stats.hits += len(out)
        return out

    # ------------------------------------------------------------------ expiry / close
    async def expire(self, before_ms: int) -> int:
        """Delete uploaded segments and sealed local files whose end timestamp (newest store
        time) is before ``before_ms``; never the writable file. Backend first, then
        ``on_change``. Returns how many files were deleted."""
        async with self._lock:
            self._check_ready()
            doomed_remote = [u for u in self._uploaded if u.end < before_ms]
            doomed_local = [f for f in self._local if f.status is FileStatus.SEALED and f.end < before_ms]
            if doomed_remote or doomed_local:
                # Readers of the bucket learn first that messages stored up to here may have
                # lost their items, then the files go.
                await self._read_manifest()
                expired = max([u.end for u in doomed_remote] + [f.end for f in doomed_local])
                through = expired if self.expired_through is None else max(self.expired_through, expired)
                kept = [u for u in self._uploaded if u not in doomed_remote]
                await self._write_manifest(self.coverage, through, kept)
                self.expired_through = through
            for u in doomed_remote:
                await u.driver.delete()
                self._uploaded.remove(u)
            for f in doomed_local:
                # A failed upload may have left part of it on the backend.
                await self.root.driver(self.segment_path(f.begin)).delete()
                self._local.remove(f)
                f.destroy()
            n = len(doomed_remote) + len(doomed_local)
            self.stats.expired_files += n
            self._update_gauges()
            if doomed_remote:
                await self._changed()
            if n:
                log.info("cold index retention deleted %d file(s) ending before %d", n, before_ms)
            return n

    async def close(self) -> None:
        """Wait for a running compaction, flush and unmap local files. Idempotent. Local files
        stay on disk (nothing is force-uploaded, unlike RocketMQ's shutdown): :meth:`load`
        picks them up again."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._inflight is not None:
                await asyncio.wait([self._inflight])
                self._inflight = None
            try:
                for f in self._local:
                    f.flush()
            finally:
                for f in self._local:
                    f.close()
                self._local = []
                self._update_gauges()
