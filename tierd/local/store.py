"""The hot store: commitlog + consume queues + key index on local disk (RocketMQ layout).

Synchronous by design (mmap-backed). Threads it owns:

* ``tierd-flush``: commitlog durability (interval flush, or group commit in ``sync`` mode);
* ``tierd-reput``: builds consume queues and the index from appended batches;
* ``tierd-housekeeping``: flushes queues/index, advances the checkpoint, applies retention.

Layout under ``store.dir``: ``commitlog/``, ``consumequeue/{topic}/{queue}/``, ``index/``,
``checkpoint``, ``abort``, ``lock`` (FORMATS §1), and ``layout.json`` (the file-shaping settings
the store was created with; see :mod:`tierd.local.layout`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from tierd.consumption.subscription import MAX_SCAN_UNITS
from tierd.descriptors import descriptor_bound
from tierd.errors import (
    ConfigError,
    CorruptionError,
    CorruptRecordError,
    InvalidArgumentError,
    NotReadyError,
    StoreClosedError,
    StoreFullError,
    TopicDeletingError,
)
from tierd.format.batch import ACCELERATED as BATCH_ACCELERATED
from tierd.format.cq_unit import encode_units
from tierd.format.host import encode_host
from tierd.format.layout import max_record_size
from tierd.format.message_id import offset_msg_id, offset_msg_id_template
from tierd.local.checkpoint import AbortMarker, Checkpoint, StoreLock
from tierd.local.commitlog import CommitLog, FlushService, Prefaulter
from tierd.local.consumequeue import ConsumeQueue, flush_queues
from tierd.local.dispatch import DispatchBatch, ReputService
from tierd.local.index import IndexService
from tierd.local.layout import check_layout
from tierd.local.mapped_file import FileCache, PendingDirSyncs, fsync_dir
from tierd.local.prepare import ACCELERATED as PREPARE_ACCELERATED
from tierd.local.prepare import Preparer
from tierd.local.quarantine import COPY_LIMIT, Quarantine
from tierd.local.recovery import rebuild_units, scan_commitlog
from tierd.local.validation import check_key, check_queue, check_topic
from tierd.message import GetStatus, Message, PutResult, new_put_result
from tierd.queue_map import QueueMap
from tierd.repeats import FailureLog

if TYPE_CHECKING:
    import concurrent.futures

    import numpy.typing as npt

    from tierd.config import StoreConfig
    from tierd.consumption.subscription import TagFilter
    from tierd.format.message_ext import MessageExt
    from tierd.local.recovery import Damage

log = logging.getLogger(__name__)

#: Upper bounds of one ``get`` (documented in docs/limits.md).
MAX_GET_COUNT = 4096
#: Where deleted topics' commitlog marks are kept (under ``{store.dir}/config``).
ERASED_FILE = "erased-topics.json"
MAX_GET_BYTES = 32 * 1024 * 1024


def byte_bounded_count(sizes: list[int], max_bytes: int) -> int:
    """How many of ``sizes`` (in order) fit in ``max_bytes`` — at least one, so a message larger
    than the bound is still delivered (alone) and a reader never stalls."""
    total = 0
    for i, size in enumerate(sizes):
        if i and total + size > max_bytes:
            return i
        total += size
    return len(sizes)


class QueryBudget:
    """When a key query stops reading messages: once those kept exceed ``max_bytes`` (None: no
    bound) and number at least two, at the first message stored in another millisecond than the
    last one kept. Each tier's query reads its hits newest first, so every message a
    byte-bounded page (:func:`byte_bounded_count` of the merged, sorted result: at most
    ``max_bytes``, or its first message alone) holds is read, and so is the first one it leaves
    out — which tells the page that more follow. A page never ends inside a millisecond whose
    messages were not all read (the merged order breaks ties by queue offset, not by when each
    tier read them, and the HTTP continuation counts messages by their millisecond). So a tier
    holds at most ``max_bytes`` + one message (two, when the first alone crosses the bound),
    plus the rest of the last millisecond's — before, it read ``max_count`` whole messages
    (1,024 × 4 MiB) before anything trimmed them.

    ``skip_at_end``: that many messages stored exactly at ``end`` are read without counting —
    a continued page reads again the messages the previous page returned, to leave them out."""

    __slots__ = ("_counted", "_free", "_last", "end", "max_bytes", "used")

    def __init__(self, max_bytes: int | None, end: int, skip_at_end: int = 0) -> None:
        self.max_bytes = max_bytes
        self.end = end
        self._free = skip_at_end
        self.used = 0
        self._counted = 0
        self._last: int | None = None

    def stop_before(self, store_timestamp: int) -> bool:
        """Whether the query stops before a message stored at ``store_timestamp`` (its own
        or a later hit's: every later hit is older)."""
        return (
            self.max_bytes is not None
            and self.used > self.max_bytes
            and self._counted >= 2
            and store_timestamp != self._last
        )

    def add(self, size: int, store_timestamp: int) -> None:
        """Count a message the query keeps."""
        if store_timestamp == self.end and self._free > 0:
            self._free -= 1
        else:
            self.used += size
            self._counted += 1
        self._last = store_timestamp


#: How long a read of an acknowledged-but-not-yet-dispatched offset waits for the reput thread.
READ_YOUR_WRITES_WAIT = 5.0
HOUSEKEEPING_INTERVAL = 1.0
#: With ``flush = "sync"`` the checkpoint follows the durable end this closely (seconds): a
#: crash then re-dispatches at most this much, not everything since the last second's tick.
SYNC_CHECKPOINT_INTERVAL = 0.1

#: A consume-queue unit's size is a Java int.
MAX_UNIT_SIZE = 2**31 - 1

#: Hook the tiering layer installs: may the commitlog bytes before this offset be deleted?
DeleteGuard = Callable[[int], bool]

#: Disk space producers may never take, whatever ``store.disk_max_used_ratio`` allows: the
#: store's own writes need it once producers are refused — the tiering metadata, consumer
#: offsets and manifest ledger (each rewritten through a temporary copy beside the old one) and
#: the consume-queue and index files of what was acknowledged. Without it a full disk wedged the
#: store: tiering could not record its progress, so retention could free nothing (issue 29).
METADATA_HEADROOM_MIN = 8 * 1024 * 1024
#: The headroom is at least this many times what ``{store.dir}/config`` holds (a rewrite needs
#: the new copy beside the old one and its backup).
METADATA_HEADROOM_FACTOR = 3
#: Seconds between looks at the disk by writers refused for a full disk.
FULL_RECHECK = 1.0


class PutBatchResult(Sequence[PutResult]):
    """Results of ``put_batch`` as columns; :class:`PutResult` objects are built on access only."""

    __slots__ = ("_store_host", "commitlog_offsets", "queue_ids", "queue_offsets")

    def __init__(
        self,
        queue_ids: npt.NDArray[np.int32],
        queue_offsets: npt.NDArray[np.int64],
        commitlog_offsets: npt.NDArray[np.int64],
        store_host: bytes,
    ) -> None:
        self.queue_ids = queue_ids
        self.queue_offsets = queue_offsets
        self.commitlog_offsets = commitlog_offsets
        self._store_host = store_host

    def __len__(self) -> int:
        return len(self.queue_offsets)

    @overload
    def __getitem__(self, i: int) -> PutResult: ...
    @overload
    def __getitem__(self, i: slice) -> list[PutResult]: ...
    def __getitem__(self, i: int | slice) -> PutResult | list[PutResult]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        phys = int(self.commitlog_offsets[i])
        return PutResult(
            int(self.queue_ids[i]), int(self.queue_offsets[i]), phys, offset_msg_id(self._store_host, phys)
        )

    def __iter__(self) -> Iterator[PutResult]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"PutBatchResult({len(self)} messages)"


@dataclass(frozen=True, slots=True)
class HotGetResult:
    status: GetStatus
    messages: tuple[MessageExt, ...]
    next_offset: int
    min_offset: int
    max_offset: int
    #: Queue offset of an unreadable message (corrupt, not the one its unit names, or lost in a
    #: quarantined range) that ended the read: the messages stop before it and ``next_offset``
    #: is it — never past it, except for a known hole read on its own (OFFSET_FOUND_NULL with
    #: ``next_offset`` after the hole).
    unreadable: int | None = None


@dataclass(frozen=True, slots=True)
class QueueRange:
    """A hot queue's offsets: ``min_offset`` is its first message still on disk, ``max_offset``
    the next offset past its last (see :meth:`HotStore.queue_range`)."""

    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class SourceUnits:
    """Consume-queue units of one queue from ``offset`` on, as the tiering layer copies them
    (:meth:`HotStore.source_units`). Either ``lost`` > 0 — the first ``lost`` messages were lost
    to quarantined damage (there are no units: the cold tier records them as a hole) — or the
    units of readable messages, cut before the first lost one."""

    offset: int
    lost: int
    #: Commitlog offset of each record (pass the units to :meth:`HotStore.source_records`).
    positions: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    tags_codes: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.sizes)

    def head(self, n: int) -> SourceUnits:
        """The first ``n`` units."""
        return SourceUnits(self.offset, self.lost, self.positions[:n], self.sizes[:n], self.tags_codes[:n])


@dataclass(frozen=True, slots=True)
class RecoveryFinding:
    """Something a read-only open (``tierd verify``) found that recovery repairs on a normal
    open — and did not repair, because nothing may be written: ``tierd verify`` reports each."""

    #: The ``tierd verify`` problem area (hot-commitlog, hot-consumequeue, hot-dispatch).
    area: str
    #: Where: a file, ``file@position``, ``topic/queue@offset`` or a commitlog offset.
    where: str
    #: What is wrong and what the next open (or ``tierd verify --repair``) does about it.
    message: str


@functools.cache
def note_python_fallbacks() -> None:
    """Say once per process, when a store opens, that a C extension was not built (they are
    optional: an install without a compiler falls back to Python). Nothing changes but speed —
    the same checks, the same bytes — so an operator seeing slow batch writes or cold reads
    should learn why."""
    missing = [
        what
        for what, built in (
            ("put and put_batch encoder (tierd.format._records)", PREPARE_ACCELERATED),
            ("cold-read decoder (tierd.format._records)", BATCH_ACCELERATED),
        )
        if not built
    ]
    if missing:
        log.warning(
            "C extension not built, running in Python (same results, slower): %s; "
            "reinstall with a C compiler and Python headers to build it",
            ", ".join(missing),
        )


class HotStore:
    def __init__(self, cfg: StoreConfig) -> None:
        if cfg.commitlog_file_size < max_record_size(cfg.max_message_size) + 8:
            raise ConfigError(
                f"store.commitlog_file_size ({cfg.commitlog_file_size}) must hold the largest record: "
                f"store.max_message_size + 64 KiB + 8 = {max_record_size(cfg.max_message_size) + 8}",
                commitlog_file_size=cfg.commitlog_file_size,
            )
        self.cfg = cfg
        self.dir = Path(cfg.dir)
        self.store_host = encode_host(cfg.store_host)
        #: ``% phys`` gives a message id (commitlog offsets are >= 0: no mask needed).
        self._msg_id = offset_msg_id_template(self.store_host)
        self._closed = True
        #: Its topics' highest queue ids are kept too: produce asks for a topic's count per request.
        self.cqs: QueueMap[ConsumeQueue] = QueueMap()
        self._cq_lock = threading.Lock()
        #: Consume-queue files open at once (each holds a descriptor; docs/hot-store.md).
        self.queue_files = FileCache(
            descriptor_bound("consume_queues", cfg.max_open_queue_files, "store.max_open_queue_files")
        )
        #: Consume-queue directories with entries not yet durable (synced before each checkpoint).
        self.dir_syncs = PendingDirSyncs(self.dir / "consumequeue")
        #: Installed by the tiering layer; local retention never deletes what it refuses.
        self.delete_guard: DeleteGuard = lambda offset: True
        self.disk_usage: Callable[[Path], float] = _disk_usage_ratio
        self.disk_total: Callable[[Path], int] = _disk_total
        self.full_reason: str | None = None
        #: Bytes producers may still append before the disk is looked at again (write
        #: admission: the usage limit is enforced on every write, not only by retention runs).
        self._room = 0
        self._room_lock = threading.Lock()
        #: One retention run at a time (the housekeeping thread, or a writer over the limit).
        self._retention_lock = threading.Lock()
        self._checked_at = 0.0
        self.last_exit_ok = True
        #: Whether the last open cut a torn or garbage commitlog tail.
        self.recovery_truncated = False
        #: Reads that met a record failing its checks (CRC, framing, unit mismatch) — a metric.
        self.corrupt_reads = 0
        #: Records key queries read back (hits checked against their record).
        self.query_reads = 0
        #: Commitlog offsets of corrupt records already logged (each is logged once).
        self._reported: dict[int, None] = {}
        #: Opened for ``tierd verify`` without --repair (see :meth:`open`).
        self.read_only = False
        #: What a read-only open found for recovery to repair (empty otherwise: it repaired it).
        self.findings: list[RecoveryFinding] = []
        #: Deleted topics: topic -> commitlog offset before which its records are gone (they stay
        #: in the shared commitlog until retention; recovery and key queries skip them). Kept in
        #: ``{dir}/config/erased-topics.json``.
        self.erased: dict[str, int] = {}
        #: Topics whose delete is under way (tierd.topics): writes to them are refused until it
        #: has finished — else a producer would make the topic anew halfway through the delete.
        self.deleting: set[str] = set()

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, cfg: StoreConfig, *, read_only: bool = False) -> HotStore:
        """Open (and recover) the store.

        ``read_only`` (``tierd verify`` without --repair) changes nothing under ``store.dir``:
        files are opened and mapped read-only, no thread starts, and recovery only *finds* what
        it would repair — a torn tail, a missing commitlog file, damaged units or index files,
        records to re-dispatch — and lists it in :attr:`findings` (missing or damaged ranges
        are kept in memory as quarantined, so reads and checks step over them as they will
        after a normal open). Nothing may be written through such a store."""
        note_python_fallbacks()
        store = cls(cfg)
        store.read_only = read_only
        store._open()
        return store

    def _open(self) -> None:
        ro = self.read_only
        if not ro:
            self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = StoreLock(self.dir / "lock", read_only=ro)
        try:
            check_layout(self.dir, self.cfg, read_only=ro)  # before any data file is opened (never resized)
            self._abort = AbortMarker(self.dir / "abort")
            self.last_exit_ok = not self._abort.found_at_start
            self.checkpoint = Checkpoint(self.dir / "checkpoint", read_only=ro)
            self.commitlog = CommitLog(
                self.dir / "commitlog", self.cfg.commitlog_file_size, self.store_host, read_only=ro
            )
            self.index = IndexService(
                self.dir / "index", self.cfg.index_slots, self.cfg.index_items, read_only=ro
            )
            self.quarantine = Quarantine(self.dir, read_only=ro)
            self.quarantine.load()
            if ro:
                self.queue_files.read_only = True
            self._recover()
        except BaseException:
            self._lock.release()
            raise
        if ro:
            self._closed = False
            return
        self._abort.create()
        self.preparer = Preparer(
            max_body=self.cfg.max_message_size,
            max_queues=self.cfg.max_queues,
            default_queues=self.cfg.default_queues,
            store_host=self.store_host,
        )
        self.flusher = FlushService(self.commitlog, self.cfg.flush == "sync", self.cfg.flush_interval_ms)
        self.prefaulter = Prefaulter(self.commitlog)
        self.reput = ReputService(self._queue_for, self.index, self.commitlog.max_offset)
        self.commitlog.on_append = self.reput.submit
        self._stop = threading.Event()
        self._housekeeper = threading.Thread(
            target=self._housekeeping, name="tierd-housekeeping", daemon=True
        )
        self._closed = False
        self.flusher.start()
        self.prefaulter.start()
        self.reput.start()
        self._housekeeper.start()

    def _recover(self) -> None:
        """FORMATS §1.4. Load files, find the valid end of the commitlog (CRC-checked from the
        checkpoint's dispatched offset), truncate torn or garbage tails, and re-dispatch every
        record the consume queues or index may lack."""
        cl = self.commitlog
        cl.files.load()
        self.erased = _load_erased(self.dir)
        self._prune_erased()
        self.index.load(self.last_exit_ok, self.checkpoint.min_timestamp_index)
        cq_root = self.dir / "consumequeue"
        for topic_dir in sorted(cq_root.iterdir()) if cq_root.exists() else []:
            for qdir in sorted(topic_dir.iterdir()):
                if qdir.name.isdigit():
                    cq = ConsumeQueue(
                        cq_root,
                        topic_dir.name,
                        int(qdir.name),
                        self.cfg.consumequeue_file_units,
                        self.queue_files,
                        self.dir_syncs,
                    )
                    cq.load()
                    self.cqs[topic_dir.name, int(qdir.name)] = cq
        ends = {key: cq.recover() for key, cq in self.cqs.items()}
        start = min(max(ends.values(), default=0), self.checkpoint.dispatched_offset) if self.cqs else 0
        # A queue whose last unit was torn or damaged lost it: re-dispatch from its end.
        start = min([start, *(ends[key] for key, cq in self.cqs.items() if cq.cut_written)])
        self._quarantine_missing_files()
        if self.index.rebuild_from is not None:  # index files destroyed as possibly torn
            start = min(start, self.index.rebuild_from)
        start = max(start, cl.min_offset)
        if cl.files.files and cl.files.find(start) is None and start != cl.min_offset:
            start = cl.min_offset
        check_from = self._check_from(start)
        scan = scan_commitlog(
            cl,
            check_from,
            check_crc=self.cfg.check_crc_on_recover,
            collect_from=start,
            max_record=max_record_size(self.cfg.max_message_size),
            quarantine=self.quarantine,
            unit_at=self._unit_at,
        )
        valid_end, records = scan.valid_end, scan.records
        if self.erased:  # a deleted topic's records never come back as a queue
            records = [(at, v) for at, v in records if at >= self.erased.get(v.topic, -1)]
        junk = []
        for f in cl.files.files:
            at = max(0, valid_end - f.file_from_offset)
            if f.file_from_offset + f.size > valid_end and any(f.mm[at : at + 64]):
                junk.append(f)
        if junk or scan.cut_torn_append:
            log.warning(
                "recovery: commitlog truncated at offset %d: invalid or torn data after the last "
                "valid record",
                valid_end,
            )
        self.recovery_truncated = bool(junk) or scan.cut_torn_append
        if self.read_only:
            self._find_unrepaired(valid_end, start, records, scan.damage)
        cl.truncate(valid_end)  # read-only: reads stop there; nothing is erased
        if self.read_only:
            return
        for cq in self.cqs.values():
            cq.truncate_from_physical(valid_end)
        self.index.truncate_to(valid_end)
        self._rebuild_damaged_units()
        fresh = [d for d in scan.damage if not d.known]
        for d in fresh:  # recorded before any hole is written, so a crash here loses no record of it
            q = self.quarantine.add(d.start, d.end, self._bytes(d.start, d.end), d.lost)
            log.error("recovery: %s; every record after it was kept", q.describe())
        if records:
            replay = ReputService(self._queue_for, self.index, start)
            for i in range(0, len(records), 65536):
                chunk = records[i : i + 65536]
                end = records[i + 65536][0] if i + 65536 < len(records) else valid_end
                replay.dispatch(DispatchBatch.from_records(chunk, end))
            cl.last_store_timestamp = max(cl.last_store_timestamp, replay.dispatched_timestamp)
            log.info(
                "recovery: re-dispatched %d records from commitlog offset %d (last exit %s)",
                len(records),
                start,
                "normal" if self.last_exit_ok else "abnormal",
            )
        if cl.files.files and not cl.last_store_timestamp and valid_end > cl.min_offset:
            cl.last_store_timestamp = self.checkpoint.physic_timestamp
        self._write_holes(scan.damage)
        if not self.last_exit_ok or fresh:
            log.info(
                "recovery: checked %d records from commitlog offset %d; %d damaged range(s) quarantined",
                scan.checked,
                check_from,
                len(fresh),
            )
        for (topic, qid), cq in self.cqs.items():
            cl.queue_offsets[topic, qid] = cq.max_offset
        flush_queues(self.cqs.values(), self.dir_syncs)
        self.index.flush()
        cl.flush()
        self.checkpoint.dispatched_offset = valid_end
        self.checkpoint.flush()

    def _find_unrepaired(
        self, valid_end: int, start: int, records: Sequence[tuple[int, object]], damage: list[Damage]
    ) -> None:
        """Read-only open: list what :meth:`_recover` would now change on disk (see
        :attr:`findings`). Missing files and damaged ranges are in :attr:`quarantine` already
        (in memory), damaged units and index files in ``cq.damaged`` and ``index.damaged``."""
        for d in damage:  # held in memory only, so reads and checks step over the range
            if not d.known:
                self.quarantine.add(d.start, d.end, b"", d.lost)
        cl = self.commitlog
        written = cl.max_offset
        if self.recovery_truncated and written > valid_end:
            f = cl.files.find(valid_end)
            where = f"{f.path}@{valid_end - f.file_from_offset}" if f is not None else str(valid_end)
            self.findings.append(
                RecoveryFinding(
                    "hot-commitlog",
                    where,
                    f"torn or invalid data after the last valid record, at commitlog offset {valid_end} "
                    f"(an append cut short by a crash: never acknowledged as durable); the next open "
                    "cuts it",
                )
            )
        for (topic, qid), cq in sorted(self.cqs.items()):
            if cq.cut_written:
                self.findings.append(
                    RecoveryFinding(
                        "hot-consumequeue",
                        f"{topic}/{qid}@{cq.max_offset}",
                        "the last unit is torn (a crash while it was written); the next open cuts it "
                        "and rebuilds it from the commitlog",
                    )
                )
        if records and (not self.last_exit_ok or any(cq.cut_written for cq in self.cqs.values())):
            self.findings.append(
                RecoveryFinding(
                    "hot-dispatch",
                    str(start),
                    f"{len(records)} record(s) from commitlog offset {start} may be missing from their "
                    "consume queues and the key index (the store was not closed cleanly); the next open "
                    "dispatches them again",
                )
            )

    def _quarantine_missing_files(self) -> None:
        """Commitlog files missing below the checkpoint's durable end: their messages are lost
        — a hole per message (their units point into a quarantined range), one ERROR line,
        reported by ``tierd verify`` — and the log goes on after that end (see
        :meth:`CommitLog.recreate_missing`), so neither a queue offset nor a message id is
        reused."""
        end = self.checkpoint.dispatched_offset
        missing = self.commitlog.recreate_missing(end)
        if missing is None:
            return
        start, names = missing
        lost = [
            (topic, qid, offset)
            for (topic, qid), cq in sorted(self.cqs.items())
            for offset in cq.offsets_pointing_into(start, end)
        ]
        q = self.quarantine.add(
            start, end, b"", lost, f"missing (commitlog file(s) {', '.join(names)} not found at open)"
        )
        log.error("recovery: %s; the log continues after them, no offset is reused", q.describe())

    def _rebuild_damaged_units(self) -> None:
        """Rebuild from the commitlog the units recovery found damaged mid-queue (one ERROR
        line per queue); left as they are when opened for ``tierd verify`` without --repair."""
        for cq in self.cqs.values():
            if not cq.damaged:
                continue
            rebuilt = rebuild_units(
                cq,
                self.commitlog,
                self.quarantine,
                cq.damaged,
                max_record_size(self.cfg.max_message_size),
            )
            first, last = cq.damaged[0], cq.damaged[-1]
            log.error(
                "recovery: consume queue %s/%d offset %s: %d damaged unit(s) (not a valid unit, valid "
                "units after them); %d rebuilt from the commitlog%s",
                cq.topic,
                cq.queue_id,
                first if first == last else f"{first}..{last}",
                len(cq.damaged),
                len(rebuilt),
                ""
                if len(rebuilt) == len(cq.damaged)
                else "; the others have no record left: `tierd verify` lists them",
            )

    def _check_from(self, start: int) -> int:
        """Where recovery starts checking records: the re-dispatch start after a clean exit;
        after an abnormal one at least ``store.recovery_check_bytes`` further back (from a file
        start: a record boundary), so damage in the newest data is found and quarantined now."""
        if self.last_exit_ok or not self.cfg.recovery_check_bytes:
            return start
        f = self.commitlog.files.find(max(self.commitlog.min_offset, start - self.cfg.recovery_check_bytes))
        return min(start, f.file_from_offset) if f is not None else start

    def _unit_at(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        cq = self.cqs.get((topic, queue_id))
        if cq is None or not cq.min_offset <= queue_offset < cq.max_offset:
            return None
        unit = cq.read_units(queue_offset, 1)
        return int(unit["offset"][0]) if len(unit) and int(unit["size"][0]) > 0 else None

    def _bytes(self, start: int, end: int) -> bytes:
        """Commitlog bytes ``[start, end)`` (at most COPY_LIMIT), across files."""
        out = bytearray()
        pos, end = start, min(end, start + COPY_LIMIT)
        while pos < end and (f := self.commitlog.files.find(pos)) is not None:
            at = pos - f.file_from_offset
            piece = f.mm[at : min(f.size, at + end - pos)]
            out += piece
            pos += len(piece)
        return bytes(out)

    def _write_holes(self, damage: list[Damage]) -> None:
        """Give every message lost in a damaged range a consume-queue unit pointing into the
        range (a *hole*: reads report it and step over it), where the queue lacks a unit."""
        for d in damage:
            hole = encode_units(
                np.array([d.start], np.int64),
                np.array([min(d.end - d.start, MAX_UNIT_SIZE)], np.int64),
                np.zeros(1, np.int64),
            )
            for topic, qid, qoff in sorted(d.lost):
                cq = self._queue_for(topic, qid)
                if qoff < cq.min_offset or qoff > cq.max_offset:
                    continue  # expired, or not next to the queue's end (a unit there would leave a gap)
                at = self._unit_at(topic, qid, qoff)
                if at is not None and self.quarantine.covers(at) is None:
                    continue  # a real message holds that offset: the loss was misattributed
                cq.put_units(qoff, hole)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.read_only:  # nothing was started, nothing is written
            for cq in self.cqs.values():
                cq.close()
            self.index.close()
            self.commitlog.close()
            self.checkpoint.close()
            self._lock.release()
            return
        self._stop.set()
        self._housekeeper.join()
        self.prefaulter.stop()
        self.reput.stop()
        self.flusher.stop()
        self._checkpoint_now()
        for cq in self.cqs.values():
            cq.close()
        self.index.close()
        self.commitlog.close()
        self.checkpoint.close()
        self._abort.remove()
        self._lock.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    # ------------------------------------------------------------------ queues
    def _queue_for(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.cqs.get((topic, queue_id))
        if cq is None:
            with self._cq_lock:
                cq = self.cqs.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(
                        self.dir / "consumequeue",
                        topic,
                        queue_id,
                        self.cfg.consumequeue_file_units,
                        self.queue_files,
                        self.dir_syncs,
                    )
                    cq.load()
                    self.cqs[topic, queue_id] = cq
        return cq

    def seed_queue(self, topic: str, queue_id: int, offset: int) -> None:
        """Make an empty queue continue at ``offset`` (after a restore from the cold tier, new
        messages must not reuse offsets the cold tier already holds)."""
        check_topic(topic)
        with self.commitlog.lock:
            key = (topic, queue_id)
            if self.commitlog.queue_offsets.get(key, 0) >= offset:
                return
            cq = self._queue_for(topic, queue_id)
            if cq.max_offset > 0 and cq.max_offset != self.commitlog.queue_offsets.get(key, 0):
                raise CorruptionError(f"{topic}/{queue_id} is being written; cannot move its start")
            cq.set_floor(offset)
            self.commitlog.queue_offsets[key] = offset

    def erase_topic(self, topic: str, mark: int | None = None, timeout: float = 30.0) -> int:
        """Delete ``topic`` from the hot store: its consume queues (files and all), its queue
        offsets (a topic made again starts at 0) and — through a durable mark — its records
        before commitlog offset ``mark`` (default: the end now), which stay in the shared
        commitlog until retention but are never dispatched, recovered or found by key again.
        Idempotent (a delete resumed after a crash runs it again). Returns the mark."""
        self._check_open()
        check_topic(topic)
        with self.commitlog.lock:  # no append of the topic between the mark and the cut
            end = self.commitlog.max_offset
            mark = end if mark is None else min(mark, end)
            if not self.reput.wait_dispatched(end, timeout):
                raise NotReadyError(
                    f"deleting topic {topic!r}: the hot store did not index what was written before "
                    f"within {timeout:g} s",
                    topic=topic,
                )
            if self.erased.get(topic, -1) < mark:
                self.erased[topic] = mark
                _save_erased(self.dir, self.erased)
            with self._cq_lock:
                doomed = [key for key in self.cqs if key[0] == topic]
                queues = [self.cqs.pop(key) for key in doomed]
            for key in [k for k in self.commitlog.queue_offsets if k[0] == topic]:
                del self.commitlog.queue_offsets[key]
            self.preparer.set_queue_count(topic, self.preparer.queue_counts.get(topic))
        for cq in queues:
            cq.close()
        path = self.dir / "consumequeue" / topic
        if path.exists():
            shutil.rmtree(path)
            fsync_dir(path.parent)
        return mark

    def _prune_erased(self) -> None:
        """Forget the marks of deleted topics no commitlog file holds records of any more
        (retention freed everything below the mark): nothing is left for them to hide."""
        if self.read_only:
            return
        first = self.commitlog.min_offset
        kept = {t: mark for t, mark in self.erased.items() if mark > first}
        if kept != self.erased:
            self.erased = kept
            _save_erased(self.dir, kept)

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, qid in list(self.cqs):
            out.setdefault(topic, []).append(qid)
        for qids in out.values():
            qids.sort()
        return dict(sorted(out.items()))

    # ------------------------------------------------------------------ writes
    def put(self, message: Message) -> tuple[PutResult, concurrent.futures.Future[None] | None]:
        """Append one message. In ``sync`` flush mode the returned future completes once the bytes
        are durable; the caller must wait for it before acknowledging."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        # The checks and the admission's common case inline: a method call each is a tenth of
        # a microsecond, a put ~3 µs of Python (docs/performance.md, "Single put").
        if self.full_reason is not None and (refused := self._refused()) is not None:
            raise refused
        if self.deleting and message.topic in self.deleting:
            raise _deleting(message.topic)
        p = self.preparer.prepare_one(message, time.time_ns() // 1_000_000)
        with self._room_lock:
            self._room -= p[5]
            room = self._room
        if room < 0:
            self._over_room(p[5])
        qoff, phys, end = self.commitlog.append_one(p)
        fut = self.flusher.request(end) if self.flusher.sync else None
        return new_put_result(p[0][1], qoff, phys, self._msg_id % phys), fut

    def put_batch(
        self, messages: Sequence[Message]
    ) -> tuple[PutBatchResult, concurrent.futures.Future[None] | None]:
        self._check_open()
        if (refused := self._refused()) is not None:
            raise refused
        if self.deleting and (doomed := self.deleting.intersection(m.topic for m in messages)):
            raise _deleting(min(doomed))
        batch = self.preparer.prepare(messages, time.time_ns() // 1_000_000)
        self._admit(int(batch.sizes.sum()))
        qoffs, phys, end = self.commitlog.append(batch)
        fut = self.flusher.request(end) if self.flusher.sync else None
        return PutBatchResult(batch.queue_ids, qoffs, phys, self.store_host), fut

    def _admit(self, nbytes: int) -> None:
        """Write admission: refuse ``nbytes`` more when the disk is over its limit (see
        :meth:`disk_limit`) and retention cannot bring it under. The disk is looked at only when
        the bytes appended since the last look could have reached the limit — not on every
        write, and not only once a retention interval (a burst filled the disk to ENOSPC
        between two runs)."""
        with self._room_lock:
            self._room -= nbytes
            if self._room >= 0:
                return
        self._over_room(nbytes)

    def _over_room(self, nbytes: int) -> None:
        """:meth:`_admit` once the room ran out (``nbytes`` already taken from it): look at the
        disk, refuse if it is over its limit."""
        self._check_disk(nbytes)
        if self.full_reason is not None:
            raise StoreFullError(self.full_reason)

    def _refused(self) -> StoreFullError | None:
        """The error a write gets while writes are refused, or None. A refused writer looks at
        the disk again at most every :data:`FULL_RECHECK` seconds, so writes resume soon after
        space frees (tiering caught up, retention can delete), not a retention interval later."""
        if self.full_reason is None:
            return None
        if time.monotonic() - self._checked_at >= FULL_RECHECK:
            self._check_disk()
        return StoreFullError(self.full_reason) if self.full_reason is not None else None

    def disk_limit(self, total: int) -> float:
        """The share of the disk (``total`` bytes) producers may fill: ``store.disk_max_used_ratio``,
        less the headroom the store keeps for its own metadata (:data:`METADATA_HEADROOM_MIN`)."""
        config = self.dir / "config"
        own = 0
        if config.is_dir():
            for f in config.iterdir():
                with contextlib.suppress(OSError):
                    own += f.stat().st_size
        headroom = max(METADATA_HEADROOM_MIN, METADATA_HEADROOM_FACTOR * own)
        return min(self.cfg.disk_max_used_ratio, 1.0 - headroom / total) if total else 0.0

    def _room_now(self) -> tuple[int, bool]:
        """(bytes producers may still append, whether the disk is over its limit) as it is now."""
        total = self.disk_total(self.dir)
        usage = self.disk_usage(self.dir)
        room = int((self.disk_limit(total) - usage) * total)
        return room, room < 0

    def _check_disk(self, nbytes: int = 0) -> None:
        """Look at the disk; over the limit, run retention now (which refuses writes when it
        cannot free enough: :attr:`full_reason`)."""
        self._checked_at = time.monotonic()
        room, over = self._room_now()
        if over or room < nbytes or self.full_reason is not None:
            self.apply_retention()
            room, over = self._room_now()
        with self._room_lock:
            self._room = room - nbytes if self.full_reason is None else 0

    # ------------------------------------------------------------------ reads
    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.cqs.get((topic, queue_id))

    def _visible_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue, after waiting (bounded) until every offset already acknowledged to a
        producer is dispatched into it — readers see their own writes."""
        cq = self.cqs.get((topic, queue_id))
        assigned = self.commitlog.queue_offsets.get((topic, queue_id), 0)
        if assigned > (cq.max_offset if cq else 0):
            self.reput.wait_dispatched(self.commitlog.max_offset, READ_YOUR_WRITES_WAIT)
            cq = self.cqs.get((topic, queue_id))
        return cq

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._visible_queue(topic, queue_id)
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._visible_queue(topic, queue_id)
        return cq.max_offset if cq else 0

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        tags: TagFilter | None = None,
        max_bytes: int = MAX_GET_BYTES,
        *,
        wait: bool = True,
    ) -> HotGetResult:
        """Read up to ``max_count`` messages from ``offset`` with GetMessageStatus semantics
        (docs/reading.md has the table); ``tags`` keeps only messages of those tags. The read
        stops before the message that would take the bytes read past ``max_bytes`` (RocketMQ's
        ``maxTransferBytesOnMessageInDisk``; the first message always comes, whatever its size).
        ``wait``: first wait (bounded) until the queue holds every offset acknowledged so far;
        False reads what is dispatched now (a caller on an event loop waits off it first)."""
        self._check_open()
        check_topic(topic)
        check_queue(queue_id, self.cfg.max_queues)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"offset must be a non-negative integer, got {offset!r}")
        if not isinstance(max_count, int) or max_count < 1:
            raise InvalidArgumentError(f"max_count must be a positive integer, got {max_count!r}")
        max_count = min(max_count, MAX_GET_COUNT)
        cq = self._visible_queue(topic, queue_id) if wait else self.cqs.get((topic, queue_id))
        if cq is None:
            return HotGetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, (), 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        if hi == 0:
            return HotGetResult(GetStatus.NO_MESSAGE_IN_QUEUE, (), 0, lo, hi)
        if offset < lo:
            return HotGetResult(GetStatus.OFFSET_TOO_SMALL, (), lo, lo, hi)
        if offset == hi:
            return HotGetResult(GetStatus.OFFSET_OVERFLOW_ONE, (), offset, lo, hi)
        if offset > hi:
            return HotGetResult(GetStatus.OFFSET_OVERFLOW_BADLY, (), hi, lo, hi)
        if tags is not None and not tags.matches_all:
            return self._get_filtered(cq, offset, max_count, tags, max_bytes)
        messages: list[MessageExt] = []
        pos = offset
        total = 0
        unreadable: int | None = None
        full = False
        while pos < hi and len(messages) < max_count and not full and unreadable is None:
            units = cq.read_units(pos, min(max_count - len(messages), hi - pos))
            if not len(units):
                break
            for phys, size in zip(units["offset"].tolist(), units["size"].tolist(), strict=True):
                if messages and total + size > max_bytes:
                    full = True  # the unit's size says so: the record is not even read
                    break
                if self.quarantine.ranges and self.quarantine.covers(phys) is not None:
                    if not messages:  # a known hole: report it, and where the queue goes on
                        end = self._hole_end(cq, pos, hi)
                        return HotGetResult(GetStatus.OFFSET_FOUND_NULL, (), end, lo, hi, offset)
                    unreadable = pos
                    break
                msg = self._read_checked(phys, size, topic, queue_id, pos)
                if msg is None:
                    # Stop here: FOUND never has a gap and next_offset never passes a message
                    # the consumer did not get (the router may serve it from the cold tier).
                    unreadable = pos
                    break
                pos += 1
                messages.append(msg)
                total += size
        if not messages:
            return HotGetResult(GetStatus.OFFSET_FOUND_NULL, (), offset, lo, hi, unreadable)
        return HotGetResult(GetStatus.FOUND, tuple(messages), pos, lo, hi, unreadable)

    def _get_filtered(
        self, cq: ConsumeQueue, offset: int, max_count: int, tags: TagFilter, max_bytes: int = MAX_GET_BYTES
    ) -> HotGetResult:
        """A read that skips other tags: units are matched on their tags code with numpy (no
        record read for a miss), candidates are read and kept only when their decoded tag is
        one of ``tags`` (a hash collision is skipped). At most :data:`MAX_SCAN_UNITS` units are
        examined; ``next_offset`` is one past the last unit examined."""
        lo, hi = cq.min_offset, cq.max_offset
        end = min(hi, offset + MAX_SCAN_UNITS)
        messages: list[MessageExt] = []
        unreadable: int | None = None
        total = 0
        pos = offset
        full = False
        while pos < end and len(messages) < max_count and not full and unreadable is None:
            units = cq.read_units(pos, end - pos)
            if not len(units):
                break
            stop = pos + len(units)
            phys, sizes = units["offset"], units["size"]
            for i in np.flatnonzero(tags.unit_mask(units["tags_code"])).tolist():
                size = int(sizes[i])
                if messages and total + size > max_bytes:
                    full, stop = True, pos + i  # this candidate is the next read's first
                    break
                if self.quarantine.ranges and self.quarantine.covers(int(phys[i])) is not None:
                    continue  # a known hole (its tag is unknown): filtered reads step over it
                msg = self._read_checked(int(phys[i]), size, cq.topic, cq.queue_id, pos + i)
                if msg is None:  # a candidate it cannot read: stop before it, never step over it
                    unreadable = stop = pos + i
                    break
                if tags.matches(msg):
                    messages.append(msg)
                    total += size
                    if len(messages) >= max_count:
                        stop = pos + i + 1
                        break
            pos = stop
        if messages:
            return HotGetResult(GetStatus.FOUND, tuple(messages), pos, lo, hi, unreadable)
        if unreadable == offset:
            return HotGetResult(GetStatus.OFFSET_FOUND_NULL, (), offset, lo, hi, unreadable)
        return HotGetResult(GetStatus.NO_MATCHED_MESSAGE, (), pos, lo, hi, unreadable)

    def _hole_end(self, cq: ConsumeQueue, pos: int, hi: int) -> int:
        """First queue offset from ``pos`` whose unit is not a quarantined hole."""
        while pos < hi:
            units = cq.read_units(pos, min(hi - pos, 1024))
            if not len(units):
                break
            holes = self.quarantine.covers_many(units["offset"].astype(np.int64))
            pos += len(units) if holes.all() else int(np.argmin(holes))
            if not holes.all():
                break
        return pos

    def _read_checked(
        self, phys: int, size: int, topic: str, queue_id: int, queue_offset: int
    ) -> MessageExt | None:
        """Decode and cross-check a record against the unit that points at it: a message is
        returned only if it is exactly the one the consumer asked for."""
        if phys < self.commitlog.min_offset:
            return None  # expired locally
        try:
            msg = self.commitlog.read(phys, check_crc=True)
        except CorruptRecordError as e:
            self._corrupt(phys, f"{topic}/{queue_id} offset {queue_offset} is a corrupt record ({e})")
            return None
        if (
            msg.size != size
            or msg.topic != topic
            or msg.queue_id != queue_id
            or msg.queue_offset != queue_offset
        ):
            self._corrupt(
                phys,
                f"consume queue {topic}/{queue_id} offset {queue_offset} disagrees with the record there "
                f"({msg.topic}/{msg.queue_id} offset {msg.queue_offset}, {msg.size} bytes)",
            )
            return None
        return msg

    def _corrupt(self, phys: int, what: str) -> None:
        """Count a read that met a bad record; log each record once (one line, no traceback)."""
        self.corrupt_reads += 1
        if phys in self._reported:
            return
        self._reported[phys] = None
        if len(self._reported) > 4096:
            del self._reported[next(iter(self._reported))]
        log.error(
            "hot commitlog offset %d: %s; reads stop before it (`tierd verify` lists damage)", phys, what
        )

    # ------------------------------------------------------------------ tiering source
    # What the layers above (the tiering dispatcher, the read router, the facade) may ask of
    # the hot store besides reads and writes: every call here answers from what is dispatched
    # *now* and never waits — they run on an event loop. A caller that needs its own writes
    # visible first checks :meth:`dispatch_pending` and, off its loop, :meth:`require_dispatched`.
    def queue_keys(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) the hot store has or has acknowledged a message in, sorted
        (a snapshot: writers and the dispatch thread add queues as messages arrive)."""
        return sorted(set(self.cqs) | set(self.commitlog.queue_offsets))

    def queue_range(self, topic: str, queue_id: int) -> QueueRange | None:
        """The offsets the queue's consume queue holds now — what a read can serve — or None
        for a queue the hot store does not have. Never waits for the dispatch thread."""
        cq = self.cqs.get((topic, queue_id))
        return QueueRange(cq.min_offset, cq.max_offset) if cq is not None else None

    def acknowledged_range(self, topic: str, queue_id: int) -> QueueRange | None:
        """Like :meth:`queue_range`, but ``max_offset`` counts every offset acknowledged to a
        producer, dispatched or not — read-your-writes offsets without waiting. None for a
        queue never written."""
        cq = self.cqs.get((topic, queue_id))
        assigned = self.commitlog.queue_offsets.get((topic, queue_id))
        if cq is None:
            return QueueRange(0, assigned) if assigned is not None else None
        return QueueRange(cq.min_offset, max(cq.max_offset, assigned or 0))

    def dispatch_pending(self, key: tuple[str, int] | None = None) -> bool:
        """Whether offsets acknowledged in queue ``key`` (None: anything appended, in any queue)
        are not in the consume queues (or the index) yet. Never waits."""
        if key is None:
            return self.reput.dispatched_offset < self.commitlog.max_offset
        cq = self.cqs.get(key)
        return self.commitlog.queue_offsets.get(key, 0) > (cq.max_offset if cq is not None else 0)

    def source_units(self, topic: str, queue_id: int, offset: int, max_count: int) -> SourceUnits | None:
        """Up to ``max_count`` units of the queue from ``offset`` (None: no such queue or
        nothing there yet), split at quarantined damage (see :class:`SourceUnits`)."""
        cq = self.cqs.get((topic, queue_id))
        if cq is None:
            return None
        units = cq.read_units(offset, max_count)
        if not len(units):
            return None
        positions = units["offset"].astype(np.int64)
        if self.quarantine.ranges:  # messages lost to damage found in the hot commitlog
            holes = self.quarantine.covers_many(positions)
            if holes[0]:
                lost = len(holes) if holes.all() else int(np.argmin(holes))
                none = np.zeros(0, np.int64)
                return SourceUnits(offset, lost, none, none, none)
            if holes.any():
                units = units[: int(np.argmax(holes))]
                positions = positions[: len(units)]
        return SourceUnits(
            offset, 0, positions, units["size"].astype(np.int64), units["tags_code"].astype(np.int64)
        )

    def source_records(self, units: SourceUnits, into: bytearray | None = None) -> memoryview:
        """The records of ``units`` back to back, copied once into one buffer (``into`` when it
        is large enough; see :meth:`CommitLog.gather`)."""
        return self.commitlog.gather(units.positions.tolist(), units.sizes.tolist(), into)

    def store_timestamp(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Store timestamp (ms) of the message at ``offset``; None when the hot store lacks it
        (never had it, expired, or lost to damage). Reads the record's header only."""
        phys = self.position(topic, queue_id, offset)
        if phys is None or phys < self.commitlog.min_offset:
            return None
        if self.quarantine.ranges and self.quarantine.covers(phys):
            return None
        ts = self.commitlog.store_timestamp_at(phys)
        return ts if ts is not None and ts >= 0 else None

    def position(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Commitlog offset of the message at queue ``offset`` (None: not in the queue)."""
        cq = self.cqs.get((topic, queue_id))
        if cq is None or not cq.min_offset <= offset < cq.max_offset:
            return None
        unit = cq.read_units(offset, 1)
        return int(unit["offset"][0]) if len(unit) else None

    @property
    def end_position(self) -> int:
        """The commitlog's write position: where the next record goes."""
        return self.commitlog.max_offset

    def earliest_time(self, topic: str, queue_id: int) -> int | None:
        """Store timestamp of the queue's first readable message (None: none)."""
        cq = self._visible_queue(topic, queue_id)
        return self.store_timestamp(topic, queue_id, cq.min_offset) if cq else None

    def offset_for_time(
        self, topic: str, queue_id: int, timestamp: int, boundary: Literal["lower", "upper"] = "lower"
    ) -> int:
        """First offset stored at or after ``timestamp`` (``lower``), or the last of the run of
        messages stored exactly then (``upper``). Before everything → min offset; after
        everything → max offset."""
        cq = self._visible_queue(topic, queue_id)
        if cq is None or cq.max_offset <= cq.min_offset:
            return cq.min_offset if cq else 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if _before(self.store_timestamp(topic, queue_id, mid), timestamp):
                lo = mid + 1
            else:
                hi = mid
        if (
            boundary == "upper"
            and lo < cq.max_offset
            and self.store_timestamp(topic, queue_id, lo) == timestamp
        ):
            while lo + 1 < cq.max_offset and self.store_timestamp(topic, queue_id, lo + 1) == timestamp:
                lo += 1
        return lo

    def query(
        self,
        topic: str,
        key: str,
        max_count: int,
        begin: int,
        end: int,
        *,
        wait: bool = True,
        budget: QueryBudget | None = None,
    ) -> list[MessageExt]:
        """Messages of ``topic`` whose KEYS or UNIQ_KEY contain ``key``, newest first. Index hits
        are verified against the record: a hash collision never yields a wrong message.
        ``wait``: as in :meth:`get`, for the whole index. ``budget``: stop reading records where
        it says (a byte bound, see :class:`QueryBudget`)."""
        self._check_open()
        check_topic(topic)
        check_key(key)
        if wait:
            self.reput.wait_dispatched(self.commitlog.max_offset, READ_YOUR_WRITES_WAIT)
        out: list[MessageExt] = []
        seen: set[int] = set()
        # Index items keep whole seconds since their file's start: widen by one second, then
        # filter on the record's exact store timestamp below.
        for phys in self.index.query(topic, key, max(max_count * 4, 64), max(0, begin - 1000), end):
            if phys in seen or phys < self.commitlog.min_offset or phys < self.erased.get(topic, -1):
                continue
            seen.add(phys)
            # The header's store time first (no body decoded): the index keeps whole seconds,
            # so hits just after ``end`` are common, and the budget's stop needs only the time.
            # The record read below checks it again.
            try:
                stored = self.commitlog.store_timestamp_at(phys)
            except (struct.error, ValueError, IndexError):
                stored = None  # not a readable header: the record read decides
            if stored is not None:
                if not begin <= stored <= end:
                    continue
                if budget is not None and budget.stop_before(stored):
                    break
            self.query_reads += 1
            try:
                msg = self.commitlog.read(phys, check_crc=True)
            except CorruptRecordError:
                continue
            if (
                msg.topic == topic
                and (key in msg.keys or msg.uniq_key == key)
                and begin <= msg.store_timestamp <= end
            ):
                if budget is not None:
                    if budget.stop_before(msg.store_timestamp):
                        break
                    budget.add(msg.size, msg.store_timestamp)
                out.append(msg)
                if len(out) >= max_count:
                    break
        return out

    # ------------------------------------------------------------------ housekeeping
    def _checkpoint_now(self) -> None:
        dispatched = self.reput.dispatched_offset
        logics_ts = self.reput.dispatched_timestamp
        flush_queues(list(self.cqs.values()), self.dir_syncs)
        self.index.flush()
        ck = self.checkpoint
        ck.physic_timestamp = max(ck.physic_timestamp, self.flusher.flushed_timestamp)
        ck.logics_timestamp = max(ck.logics_timestamp, logics_ts)
        ck.index_timestamp = max(ck.index_timestamp, logics_ts)
        ck.dispatched_offset = min(dispatched, self.flusher.flushed_offset)
        ck.flush()

    def _housekeeping(self) -> None:
        next_retention = time.monotonic() + self.cfg.retention_interval
        every = SYNC_CHECKPOINT_INTERVAL if self.cfg.flush == "sync" else HOUSEKEEPING_INTERVAL
        last = (-1, -1)
        failures = FailureLog(log, "housekeeping (flush, checkpoint, retention)")
        while not self._stop.wait(every):
            try:
                now = (self.reput.dispatched_offset, self.flusher.flushed_offset)
                if now != last:  # idle: nothing new is durable, no fsyncs
                    self._checkpoint_now()
                    last = now
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + self.cfg.retention_interval
                    self.apply_retention()
            except Exception as e:
                failures.failed(e, f"retrying every {every:g} s")
            else:
                failures.succeeded()

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete commitlog files older than ``file_reserved_time`` — or, when the disk is over
        its limit (:meth:`disk_limit`), the oldest files regardless of age — but only files that
        are fully dispatched and that :attr:`delete_guard` allows (the tiering layer refuses data
        not yet cold). If the disk stays too full, refuse writes with a clear reason; once it is
        under the limit again, accept them."""
        with self._retention_lock:
            return self._apply_retention(now_ms)

    def _apply_retention(self, now_ms: int | None) -> int:
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        expire_before = now - int(self.cfg.file_reserved_time * 3_600_000)
        files = list(self.commitlog.files)
        over = self._room_now()[1]
        doomed = 0
        for f, nxt in itertools.pairwise(files):
            end = f.file_from_offset + f.size
            newest = self.commitlog.store_timestamp_at(nxt.file_from_offset)
            if end > self.reput.dispatched_offset or not self.delete_guard(end):
                break
            if not over and (newest is None or not 0 <= newest < expire_before):
                break
            doomed += 1
        if doomed:
            self.commitlog.files.delete_first(doomed)
            new_min = self.commitlog.min_offset
            for cq in list(self.cqs.values()):
                cq.delete_before_physical(new_min)
            self.index.delete_files_before(new_min)
            self._prune_erased()
            log.info(
                "retention: deleted %d commitlog file(s); hot data now starts at offset %d", doomed, new_min
            )
        if over and self._room_now()[1]:
            total = self.disk_total(self.dir)
            reason = (
                f"disk under {self.dir} is over {self.disk_limit(total):.1%} of its {total} bytes "
                f"(store.disk_max_used_ratio {self.cfg.disk_max_used_ratio:.0%}, less the headroom kept "
                "for the store's own metadata) and no more data may be deleted (not yet moved to the "
                "cold tier or not yet dispatched); writes are refused until space frees"
            )
            if self.full_reason is None:
                log.error("%s", reason)
            self.full_reason = reason
        elif self.full_reason is not None:
            log.warning("disk usage back under store.disk_max_used_ratio; accepting writes again")
            self.full_reason = None
        return doomed

    def wait_dispatched(self, timeout: float | None = None) -> bool:
        """Block until everything appended so far is in the consume queues and index (read-only:
        nothing is dispatched; what recovery would dispatch is in :attr:`findings`)."""
        if self.read_only:
            return True
        return self.reput.wait_dispatched(self.commitlog.max_offset, timeout)

    def require_dispatched(self, timeout: float, what: str) -> None:
        """:meth:`wait_dispatched` for callers that must not go on without it (``tier_now``
        would tier only part of what was written and call it done): NotReadyError naming
        ``what`` and the dispatch thread's last error once ``timeout`` seconds have passed."""
        if self.wait_dispatched(timeout):
            return
        err = self.reput.last_error
        behind = self.commitlog.max_offset - self.reput.dispatched_offset
        raise NotReadyError(
            f"{what}: the hot store has not added the last {behind} commitlog bytes to its consume "
            f"queues and index within {timeout:g} s"
            + (f" — dispatch keeps failing: {err}" if err is not None else " — dispatch is behind"),
            what=what,
            timeout=timeout,
            behind_bytes=behind,
            retry_after=5,
        )

    def listen_dispatched(self, listener: Callable[[list[tuple[str, int]]], None]) -> None:
        """Call ``listener`` with the (topic, queue) keys of every dispatched batch, once its
        messages are readable (long polling wakes on it). It runs on the dispatch thread: it
        must be quick and must not block."""
        self.reput.listener = listener


def _deleting(topic: str) -> TopicDeletingError:
    return TopicDeletingError(
        f"topic {topic!r} is being deleted; writes to it are refused until the delete has "
        "finished (then the topic starts anew)",
        topic=topic,
    )


def _load_erased(directory: Path) -> dict[str, int]:
    path = directory / "config" / ERASED_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise CorruptionError(f"deleted-topic marks {path} are not valid: {e}", path=str(path)) from e
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise CorruptionError(f"deleted-topic marks {path}: not topic -> offset", path=str(path))
    return {str(k): v for k, v in data.items()}


def _save_erased(directory: Path, erased: dict[str, int]) -> None:
    """Temp file, fsync, rename, fsync of the directory: a crash leaves the old marks or the new."""
    path = directory / "config" / ERASED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(erased, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _before(stored: int | None, timestamp: int) -> bool:
    """Whether a message stored at ``stored`` (None: unknown — lost to damage) sorts before
    ``timestamp`` in a search by time; unknown ones do, as the oldest possible."""
    return stored is None or stored < timestamp


def _disk_usage_ratio(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


def _disk_total(path: Path) -> int:
    return shutil.disk_usage(path).total


__all__ = ["HotGetResult", "HotStore", "PutBatchResult", "QueueRange", "SourceUnits"]
