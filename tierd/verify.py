"""``tierd verify``: check every byte the store vouches for, and list each problem found.

What is checked, and why each matters to an operator:

- hot commitlog: every record's framing and body CRC, up to the written end (a bad record is a
  message a consumer would be refused). A bad record does not stop the scan: it resumes at the
  next record a consume queue points at (or the next file), so every bad region is reported;
- hot consume queues: every unit points at a record of its own topic, queue and offset, with its
  record's tags code (a wrong unit hands out the wrong message or hides it from a tag filter);
- hot key index: files with a bad header, found when the store opens (a normal open or
  --repair rebuilds them from the commitlog) — reported, so damage is never silent;
- consumer offsets: the main file and its ``.bak``, each on its own (the store opens on either);
- tiering metadata: the main file and its ``.bak`` are read separately (a corrupt main file
  hidden behind a good backup is reported); no metadata at all while the bucket prefix holds
  this broker's data is reported (the daemon refuses to tier over it: run ``tierd restore``);
- cold segments: the backend holds at least the bytes metadata says are committed (else reads
  fail), sealed segments hash to their recorded CRC32C;
- cold consume queues ↔ cold commitlog: every unit points at a whole, CRC-valid record with the
  unit's queue offset (same reason as hot);
- bucket manifests, read as they are — never rewritten first: each parses, names its queue, and
  agrees with metadata and the objects (offsets, segments, sizes, sealed flags, checksums,
  message counts), so a garbage or lying ``MANIFEST.json`` — what Spark and ``restore`` trust —
  is caught; the broker manifest lists the topics and queues metadata has;
- the bucket prefix: objects metadata does not know (another writer's, or leftovers; the
  consumer-offsets copy, the index manifest and owner records are known), and who owns the
  prefix (another store's claim means this one may not write there).

**Read-only by default.** Offline (:func:`verify_store`, what the CLI runs) nothing is started
and nothing under ``store.dir`` changes: no tiering, no roll-forward, no manifest or metadata
write, and the hot store is opened read-only (``HotStore.open(read_only=True)``), so not even its
recovery writes — a torn tail, a missing commitlog file, damaged units or key-index files and
records to re-dispatch are *reported* (its ``findings``), not repaired. ``repair=True`` then
opens the hot store normally — its recovery repairs what it found — and fixes what else can be
fixed safely, listing what it changed: consume-queue units rebuilt from the commitlog (the source
of truth); a metadata or consumer-offsets file restored from the other, readable one; manifests
rewritten from metadata (only by the prefix's owner). Everything
else (corrupt records or segments, missing metadata) is reported with what to do.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tierd.consumption.offsets import bucket_path as offsets_path
from tierd.consumption.offsets import inspect as inspect_offsets
from tierd.consumption.offsets import write_atomically
from tierd.drivers.paths import cluster_dir, index_segment_path
from tierd.errors import CorruptionError, NotFoundError, PrefixOwnedError, TierdError
from tierd.format.cq_unit import UNIT_SIZE, tags_code
from tierd.format.properties import PROPERTY_TAGS, decode_properties
from tierd.format.record import BLANK, INVALID, VALID, RecordView, parse_record_view, scan_record
from tierd.local.recovery import rebuild_units
from tierd.local.store import HotStore
from tierd.tiered.flatfile import stored_crc32c
from tierd.tiered.flatmessage import FlatMessageFile
from tierd.tiered.flatstore import FlatFileStore
from tierd.tiered.guard import GuardedRoot
from tierd.tiered.manifest import (
    MANIFEST_NAME,
    broker_manifest_path,
    index_manifest_path,
    queue_manifest_path,
    read_broker_manifest,
    read_queue_manifest,
)
from tierd.tiered.manifestwriter import ManifestWriter, build_broker_manifest, build_queue_manifest
from tierd.tiered.metadata import MetadataStore, TieredMetadata
from tierd.tiered.ownership import (
    OWNER_DIR,
    Ownership,
    current_owner,
    list_epochs,
    owner_path,
    prefix_url,
    store_id,
)
from tierd.tiered.roots import open_driver_factory

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.drivers.segment import DriverRoot
    from tierd.local.commitlog import CommitLog
    from tierd.local.quarantine import Quarantine
    from tierd.tiered.flatfile import FlatAppendFile
    from tierd.tiered.records import ManifestSegment
    from tierd.tiered.service import TieringService

log = logging.getLogger(__name__)
#: ``progress(done, total, what)`` in bytes — the CLI turns it into a progress bar.
Progress = Callable[[int, int, str], None]
READ_PIECE = 16 * 1024 * 1024
#: Units read per call when collecting the hot record starts (the resync points of the scan).
_UNITS_PER_READ = 1 << 16

#: Appended to a lost range found by a read-only open (recorded by the next open).
_NOT_RECORDED = " — not yet recorded: the next open records it"

#: Fixes ``repair`` knows (a problem's ``fix``).
FIX_MAIN_FROM_BACKUP = "restore the main metadata file from its backup"
FIX_BACKUP_FROM_MAIN = "rewrite the backup from the main metadata file"
FIX_MANIFESTS = "rewrite the bucket manifests from the metadata"
FIX_UNITS = "rebuild the consume-queue unit from the commitlog"
FIX_OFFSETS_FROM_BACKUP = "restore the consumer offsets from their backup"
FIX_OFFSETS_BACKUP = "rewrite the consumer-offsets backup from the main file"
#: What the hot store's recovery does on a normal open; --repair opens the store that way.
FIX_RECOVERY = "let recovery repair it (what the next normal open does)"
FIX_RECORD_LOSS = "record the range as quarantined and give its lost messages holes (they stay lost)"


@dataclass(slots=True)
class Problem:
    #: hot-commitlog, hot-quarantine, hot-consumequeue, metadata, cold-segment, cold-consumequeue,
    #: cold-hole, manifest, bucket, ownership
    area: str
    #: Where: a file, a segment or object path, or ``topic/queue@offset``.
    where: str
    message: str
    #: What ``--repair`` does about it (None: nothing it can do safely; the message says what to).
    fix: str | None = None
    #: True once ``--repair`` fixed it.
    fixed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "area": self.area,
            "where": self.where,
            "message": self.message,
            "fix": self.fix,
            "fixed": self.fixed,
        }


@dataclass(slots=True)
class VerifyReport:
    records: int = 0
    units: int = 0
    segments: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: What ``--repair`` changed, one line each.
    repairs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem is left (none found, or every one repaired)."""
        return all(p.fixed for p in self.problems)

    def counts(self) -> dict[str, int]:
        """Problems not repaired, per area."""
        return dict(sorted(collections.Counter(p.area for p in self.problems if not p.fixed).items()))

    def add(self, area: str, where: str, message: str, fix: str | None = None) -> None:
        self.problems.append(Problem(area, where, message, fix))

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "records": self.records,
            "units": self.units,
            "segments": self.segments,
            "bytes": self.bytes,
            "counts": self.counts(),
            "problems": [p.as_dict() for p in self.problems],
            "repairs": list(self.repairs),
        }


class _Tally:
    """Progress in bytes over the whole run."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = total, 0, progress

    def add(self, n: int, what: str) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total, what)


# ---------------------------------------------------------------------------------------- hot
def _record_starts(hot: HotStore) -> list[int]:
    """Every commitlog offset a hot consume queue points at, sorted: where a scan that met a bad
    record can resume (records are not self-synchronising; the queues know where they start)."""
    parts = []
    for cq in list(hot.cqs.values()):
        offset = cq.min_offset
        while offset < cq.max_offset:
            units = cq.read_units(offset, min(_UNITS_PER_READ, cq.max_offset - offset))
            if not len(units):
                break
            parts.append(units["offset"].astype(np.int64))
            offset += len(units)
    if not parts:
        return []
    return np.unique(np.concatenate(parts)).tolist()  # type: ignore[no-any-return]


def _verify_hot(hot: HotStore, report: VerifyReport, tally: _Tally) -> None:
    cl = hot.commitlog
    # A read-only open holds a missing newest file's range in memory only, past the files' end.
    pos, end = cl.min_offset, max([cl.max_offset, *(r.end for r in hot.quarantine.ranges)])
    starts: list[int] | None = None
    while pos < end:
        damaged = hot.quarantine.covers(pos)
        if damaged is not None:  # found by recovery: reported, then stepped over like a read does
            if damaged.start in hot.quarantine.pending:  # found by this read-only open
                what = f"{damaged.describe()}{_NOT_RECORDED}"
                report.add("hot-quarantine", str(pos), what, FIX_RECORD_LOSS)
            else:
                report.add("hot-quarantine", str(pos), damaged.describe())
            tally.add(damaged.end - pos, "hot commitlog")
            pos = damaged.end
            continue
        f = cl.files.find(pos)
        if f is None:
            report.add("hot-commitlog", str(pos), f"offset {pos} is in no commitlog file")
            break
        at = pos - f.file_from_offset
        status, size, _ = scan_record(f.view, at, f.size, True)
        if status == VALID:
            report.records += 1
            pos += size
            tally.add(size, "hot commitlog")
            continue
        if status == BLANK:  # end-of-file marker: the next record starts the next file
            tally.add(size, "hot commitlog")
            pos += size
            continue
        try:  # framing intact, CRC wrong: the record is exactly where it says, the next follows it
            size = parse_record_view(f.view, at, f.size, False).size
            what = "its body CRC does not match"
            resume = pos + size
        except TierdError as e:
            what = f"bad framing ({e})"
            if starts is None:
                starts = _record_starts(hot)
            resume = _resume_at(starts, pos, f.file_from_offset + f.size, end)
        skipped = (
            f"scan resumed at {resume}"
            if resume < end
            else f"the {end - pos} bytes from there to the end are unreadable"
        )
        report.add(
            "hot-commitlog",
            f"{f.path}@{at}",
            f"record at commitlog offset {pos} is corrupt: {what}; {skipped}",
        )
        tally.add(resume - pos, "hot commitlog")
        pos = resume
    for topic, queue_ids in sorted(hot.topics().items()):
        for qid in queue_ids:
            _verify_hot_queue(hot, topic, qid, report)
    for path, problem in hot.index.damaged:  # found when the store opened (its header checks)
        if hot.read_only:
            what = (
                f"{problem}; key queries miss the keys it held until the next open, which drops it (and "
                "later index files) and rebuilds their keys from the commitlog: no key is lost"
            )
            report.add("hot-index", str(path), what, FIX_RECOVERY)
        else:
            what = (
                f"{problem}; the store dropped it (and later index files) and rebuilt their keys from "
                "the commitlog when it opened: no key is lost"
            )
            report.add("hot-index", str(path), what)
    for found in hot.findings:  # what recovery would have repaired, had it been allowed to write
        report.add(found.area, found.where, found.message, FIX_RECOVERY)


def _resume_at(starts: list[int], pos: int, file_end: int, end: int) -> int:
    """Where the scan goes on after an unparseable record at ``pos``: the next record a queue
    points at, or the next commitlog file (records never straddle files), whichever is first."""
    i = bisect.bisect_right(starts, pos)
    return min(starts[i] if i < len(starts) else end, file_end, end)


def _verify_hot_queue(hot: HotStore, topic: str, qid: int, report: VerifyReport) -> None:
    cq = hot.queue(topic, qid)
    if cq is None:
        return
    cl = hot.commitlog
    offset = cq.min_offset
    while offset < cq.max_offset:
        units = cq.read_units(offset, min(_UNITS_PER_READ, cq.max_offset - offset))
        if len(units) == 0:
            report.add("hot-consumequeue", f"{topic}/{qid}@{offset}", "no consume queue file holds it")
            return
        for i, unit in enumerate(units):
            _check_hot_unit(
                cl,
                hot.quarantine,
                topic,
                qid,
                offset + i,
                int(unit["offset"]),
                int(unit["size"]),
                report,
                int(unit["tags_code"]),
            )
        offset += len(units)


def _check_hot_unit(
    cl: CommitLog,
    quarantine: Quarantine,
    topic: str,
    qid: int,
    offset: int,
    phys: int,
    size: int,
    report: VerifyReport,
    tags_code: int | None = None,
) -> None:
    report.units += 1
    where = f"{topic}/{qid}@{offset}"
    if phys < 0 or size <= 0:
        what = f"damaged unit (offset {phys}, size {size}) between written ones"
        report.add("hot-consumequeue", where, what, FIX_UNITS)
        return
    if phys < cl.min_offset:
        return  # its commitlog file expired: the unit is below the readable floor
    if quarantine.covers(phys) is not None:
        return  # a hole: the message was lost in a quarantined range, reported with the range
    f = cl.files.find(phys)
    if f is None:
        report.add("hot-consumequeue", where, f"points at missing offset {phys}", FIX_UNITS)
        return
    try:
        view = parse_record_view(f.view, phys - f.file_from_offset, f.size)
    except TierdError as e:
        report.add("hot-consumequeue", where, f"points at no record: {e}", FIX_UNITS)
        return
    if (view.topic, view.queue_id, view.queue_offset, view.size) != (topic, qid, offset, size):
        report.add(
            "hot-consumequeue",
            where,
            f"points at {view.topic}/{view.queue_id}@{view.queue_offset} "
            f"({view.size} bytes, unit says {size})",
            FIX_UNITS,
        )
    elif tags_code is not None and tags_code != _tags_code(view):
        report.add("hot-consumequeue", where, f"tags code {tags_code} is not its record's", FIX_UNITS)


def _tags_code(view: RecordView) -> int:
    tag = decode_properties(view.properties).get(PROPERTY_TAGS) if view.properties else None
    return tags_code(tag) if tag else 0


def _repair_units(hot: HotStore, report: VerifyReport) -> None:
    """Rebuild every unit found wrong from the commitlog (the source of truth); a unit whose
    record is gone stays reported."""
    bad: dict[tuple[str, int], dict[int, Problem]] = collections.defaultdict(dict)
    for p in report.problems:
        if p.fix == FIX_UNITS and not p.fixed:
            name, _, at = p.where.rpartition("@")
            topic, _, qid = name.rpartition("/")
            bad[topic, int(qid)][int(at)] = p
    for (topic, queue_id), problems in sorted(bad.items()):
        cq = hot.queue(topic, queue_id)
        if cq is None:
            continue
        max_record = hot.cfg.max_record_size
        rebuilt = rebuild_units(cq, hot.commitlog, hot.quarantine, sorted(problems), max_record)
        cq.flush()
        for offset in rebuilt:
            problems[offset].fixed = True
        if rebuilt:
            report.repairs.append(
                f"rebuilt {len(rebuilt)} consume-queue unit(s) of {topic}/{queue_id} from the commitlog"
            )


def _verify_offsets(store_dir: Path, report: VerifyReport) -> None:
    """The committed consumer offsets and their backup, each on its own (the store opens on
    either; a damaged one hidden behind the other is still reported)."""
    main, backup = inspect_offsets(store_dir)
    if main.good:
        if backup.exists and not backup.good:
            report.add(
                "consumer-offsets", str(backup.path), f"unreadable: {backup.problem}", FIX_OFFSETS_BACKUP
            )
        return
    if backup.good:
        state = main.problem if main.exists else "missing"
        report.add(
            "consumer-offsets",
            str(main.path),
            f"{state}; the store falls back to the backup {backup.path.name} (one commit older: "
            "consumers may see a few messages again)",
            FIX_OFFSETS_FROM_BACKUP,
        )
    elif main.exists or backup.exists:
        found = "; ".join(f"{f.path.name}: {f.problem or 'missing'}" for f in (main, backup))
        report.add(
            "consumer-offsets",
            str(main.path),
            f"no readable consumer offsets ({found}); the store will not open: move the files aside "
            "(consumers then start where their policy says) or restore them from the bucket copy",
        )


def _repair_offsets(store_dir: Path, report: VerifyReport) -> None:
    wanted = {p.fix for p in report.problems if not p.fixed}
    main, backup = inspect_offsets(store_dir)
    if FIX_OFFSETS_FROM_BACKUP in wanted:
        _copy_file(backup.path, main.path)
        report.repairs.append(f"restored {main.path} from {backup.path.name}")
    elif FIX_OFFSETS_BACKUP in wanted:
        _copy_file(main.path, backup.path)
        report.repairs.append(f"rewrote {backup.path} from {main.path.name}")
    _mark(report, {FIX_OFFSETS_FROM_BACKUP, FIX_OFFSETS_BACKUP})


# ---------------------------------------------------------------------------------- cold view
@dataclass
class ColdView:
    """What verify checks on the cold side: the flat files as metadata describes them (offline:
    built read-only from the metadata file; live: the running service's own)."""

    cfg: TierdConfig
    root: DriverRoot
    flat: FlatFileStore
    metadata: MetadataStore
    #: This store's id (None when it never had one: it never tiered).
    store_id: str | None
    #: Sizes metadata recorded per segment path (the backend must hold at least these).
    recorded: dict[str, int] = field(default_factory=dict)
    #: The running service, when verifying a live store.
    live: TieringService | None = None
    #: False when there is no usable metadata (missing or unreadable): cold checks are skipped.
    usable: bool = True

    @property
    def prefix(self) -> str:
        return prefix_url(self.root.url, self.cfg.tiered.cluster, self.cfg.tiered.broker)


def _check_metadata(metadata: MetadataStore, report: VerifyReport) -> TieredMetadata | None:
    """Report what is wrong with the two metadata files; return the metadata to verify against
    (None when there is none to use)."""
    main, backup = metadata.inspect()
    if main.meta is not None:
        if backup.exists and backup.meta is None:
            report.add("metadata", str(backup.path), f"unreadable: {backup.problem}", FIX_BACKUP_FROM_MAIN)
        return main.meta
    if backup.meta is not None:
        state = f"unreadable ({main.problem})" if main.exists else "missing"
        report.add(
            "metadata",
            str(main.path),
            f"{state}; the daemon falls back to the backup {backup.path.name}",
            FIX_MAIN_FROM_BACKUP,
        )
        return backup.meta
    if main.exists or backup.exists:
        found = "; ".join(f"{f.path.name}: {f.problem or 'missing'}" for f in (main, backup))
        report.add(
            "metadata",
            str(main.path),
            f"no readable tiering metadata ({found}); the daemon will not tier: rebuild it from the "
            "bucket with `tierd restore --from URL` into an empty store.dir",
        )
    return None


async def _load_view(cfg: TierdConfig, root: DriverRoot, report: VerifyReport) -> ColdView:
    """Build the cold view read-only: metadata checked and parsed, flat files made from it, the
    last segment of each sized from the backend. No roll-forward, no save."""
    metadata = MetadataStore(Path(cfg.store.dir))
    meta = await asyncio.to_thread(_check_metadata, metadata, report)
    flat = FlatFileStore(root, cfg.tiered, metadata)
    view = ColdView(cfg, root, flat, metadata, store_id(Path(cfg.store.dir), create=False))
    if meta is None:
        view.usable = False
        return view
    flat.topics = {t.name: t for t in meta.topics}
    flat.loaded_index = list(meta.index)
    for q in meta.queues:
        if not q.commitlog or not q.consumequeue:
            report.add("metadata", f"{q.topic}/{q.queue_id}", "listed without segments")
            continue
        ff = FlatMessageFile(root, cfg.tiered, q.topic, q.queue_id)
        try:
            await ff.commitlog.load(list(q.commitlog))
            await ff.consumequeue.load(list(q.consumequeue))
        except TierdError as e:
            report.add("cold-segment", f"{q.topic}/{q.queue_id}", f"cannot be loaded from the backend: {e}")
            continue
        flat.files[q.topic, q.queue_id] = ff
        for file, segs in ((ff.commitlog, q.commitlog), (ff.consumequeue, q.consumequeue)):
            for s in segs:
                view.recorded[file.path_of(s.base_offset)] = s.size
    return view


def _live_view(tiering: TieringService) -> ColdView:
    ownership = tiering.ownership
    return ColdView(
        tiering.cfg,
        tiering.root,
        tiering.flat,
        tiering.metadata,
        ownership.store_id if ownership is not None else None,
        live=tiering,
    )


# --------------------------------------------------------------------------------------- cold
async def _verify_segments(view: ColdView, file: FlatAppendFile, report: VerifyReport, tally: _Tally) -> None:
    """Backend sizes against committed positions and recorded sizes; sealed content against its
    CRC32C."""
    for seg, info in zip(file.segments, file.infos(), strict=True):
        report.segments += 1
        try:
            stored = await seg.driver.size()
        except TierdError as e:
            report.add("cold-segment", seg.path, f"cannot be read: {e}")
            continue
        expected = max(seg.commit_position, view.recorded.get(seg.path, 0))
        if stored < expected:
            report.add(
                "cold-segment",
                seg.path,
                f"backend holds {stored} bytes, metadata says {expected} are committed",
            )
            continue
        if info.sealed and info.crc32c is not None:
            crc = await stored_crc32c(seg, lambda n: tally.add(n, "cold segment checksums"))
            if crc != info.crc32c:
                report.add("cold-segment", seg.path, f"CRC32C is {crc}, recorded {info.crc32c}")


async def _verify_cold_queue(ff: FlatMessageFile, report: VerifyReport, tally: _Tally) -> None:
    """Every cold CQ unit points at a whole, CRC-valid record carrying the unit's offset. The
    commitlog is read in pieces of up to 16 MiB covering many units (one request each)."""
    where = f"{ff.topic}/{ff.queue_id}"
    offset, end = ff.min_offset, ff.max_offset
    while offset < end:
        try:
            units = await ff.read_units(offset, min(READ_PIECE // UNIT_SIZE, end - offset))
        except TierdError as e:
            report.add("cold-consumequeue", f"{where}@{offset}", f"units cannot be read: {e}")
            return
        phys = units["offset"].astype(np.int64)
        ends = phys + units["size"].astype(np.int64)
        held = ff.commitlog.commit_offset
        beyond = np.flatnonzero(ends > held)
        if len(beyond) and bool(np.all(ends[beyond[0] :] > held)):
            # A commitlog that lost its tail (a truncated object): one problem for the range.
            first = offset + int(beyond[0])
            last_seg = ff.commitlog.segments[-1]
            report.add(
                "cold-segment",
                last_seg.path,
                f"holds the commitlog of {where} up to flat offset {held}, but its consume queue "
                f"references bytes up to {int(ends[-1])}: queue offsets {first}..{end - 1} "
                f"({end - first} message(s)) are lost from the bucket (a truncated or lost object); "
                "the queue is fenced, the others are not affected",
            )
            units, phys, ends = units[: beyond[0]], phys[: beyond[0]], ends[: beyond[0]]
            end = first
            if not len(units):
                return
        i = 0
        while i < len(units):
            j = max(i + 1, int(np.searchsorted(ends, phys[i] + READ_PIECE, side="right")))
            try:
                span = int(ends[j - 1] - phys[i])
                raw = await ff.read_commitlog(int(phys[i]), span) if span else b""  # 0: holes only
            except TierdError as e:
                report.add("cold-consumequeue", f"{where}@{offset + i}", str(e))
                raw = b""
            for k in range(i, j):
                report.units += 1
                _check_cold_unit(
                    raw,
                    int(phys[k] - phys[i]),
                    int(phys[k]),
                    int(ends[k] - phys[k]),
                    offset + k,
                    where,
                    report,
                )
            tally.add(int(ends[j - 1] - phys[i]), "cold records")
            i = j
        offset += len(units)


def _check_cold_unit(
    raw: bytes, at: int, phys: int, size: int, queue_offset: int, where: str, report: VerifyReport
) -> None:
    if size == 0:
        report.add(
            "cold-hole",
            f"{where}@{queue_offset}",
            "lost to damage found in the hot commitlog before it was tiered (quarantined there)",
        )
        return
    status, got, view = (
        scan_record(raw, at, min(len(raw), at + size), True) if at >= 0 else (INVALID, 0, None)
    )
    if status != VALID or got != size or view is None:
        report.add(
            "cold-consumequeue",
            f"{where}@{queue_offset}",
            f"flat commitlog offset {phys}: no valid {size}-byte record there (bad framing or CRC)",
        )
    elif view.queue_offset != queue_offset:
        report.add(
            "cold-consumequeue",
            f"{where}@{queue_offset}",
            f"record at flat offset {phys} carries queue offset {view.queue_offset}",
        )
    else:
        report.records += 1


# ----------------------------------------------------------------------------------- manifests
def _segment_problems(key: tuple[str, int], listed: ManifestSegment, truth: ManifestSegment) -> list[str]:
    """How a manifest's entry for one segment disagrees with metadata and the backend. An open
    segment's entry may lag (it is rewritten every ``manifest_interval``): it may list *fewer*
    bytes and messages than there are, never more."""
    name = f"{key[0]} segment {key[1]}"
    out = []
    state = {True: "sealed", False: "open"}
    if listed.sealed != truth.sealed:
        out.append(f"{name}: listed as {state[listed.sealed]}, it is {state[truth.sealed]}")
    if (listed.size != truth.size) if truth.sealed else (listed.size > truth.size):
        out.append(f"{name}: lists {listed.size} bytes, the backend holds {truth.size}")
    counted, there = listed.message_count, truth.message_count
    if (counted != there) if truth.sealed else (counted > there):
        out.append(f"{name}: lists {counted} messages, there are {there}")
    first, real = listed.first_queue_offset, truth.first_queue_offset
    if counted and real is not None and first != real:
        out.append(f"{name}: says it starts at queue offset {first}, it starts at {real}")
    if listed.sealed and None not in (listed.crc32c, truth.crc32c) and listed.crc32c != truth.crc32c:
        out.append(f"{name}: CRC32C {listed.crc32c}, the segment's is {truth.crc32c}")
    return out


async def _verify_manifest(view: ColdView, ff: FlatMessageFile, report: VerifyReport) -> None:
    cfg = view.cfg.tiered
    path = queue_manifest_path(cfg.cluster, cfg.broker, ff.topic, ff.queue_id)
    try:
        m = await read_queue_manifest(view.root, cfg.cluster, cfg.broker, ff.topic, ff.queue_id)
    except NotFoundError:
        report.add(
            "manifest",
            path,
            "missing: readers of the bucket (Spark, restore) do not see this queue",
            FIX_MANIFESTS,
        )
        return
    except TierdError as e:
        fix = FIX_MANIFESTS if e.code == "corruption" else None
        report.add("manifest", path, str(e), fix)
        return
    truth = await build_queue_manifest(ff, cfg.cluster, cfg.broker)
    problems = []
    ident = (m.cluster, m.broker, m.topic, m.queue_id)
    if ident != (truth.cluster, truth.broker, truth.topic, truth.queue_id):
        problems.append(f"describes {'/'.join(map(str, ident))}, not this queue")
    if m.max_offset > truth.max_offset:
        problems.append(
            f"claims readable offsets up to {m.max_offset}, the cold tier holds up to {truth.max_offset}"
        )
    if m.min_offset != truth.min_offset:
        problems.append(f"says the queue starts at offset {m.min_offset}, it starts at {truth.min_offset}")
    known = {(s.type, s.base_offset): s for s in truth.segments}
    listed = {(s.type, s.base_offset): s for s in m.segments}
    for key in sorted(set(known) - set(listed)):
        problems.append(f"does not list {key[0]} segment {key[1]}")
    for key in sorted(set(listed) - set(known)):
        problems.append(f"lists {key[0]} segment {key[1]}, which the store does not have")
    for key in sorted(set(known) & set(listed)):
        problems += _segment_problems(key, listed[key], known[key])
    for p in problems:
        report.add("manifest", path, p, FIX_MANIFESTS)


async def _verify_broker_manifest(view: ColdView, report: VerifyReport) -> None:
    cfg = view.cfg.tiered
    path = broker_manifest_path(cfg.cluster, cfg.broker)
    try:
        m = await read_broker_manifest(view.root, cfg.cluster, cfg.broker)
    except NotFoundError:
        if view.flat.files:
            report.add("manifest", path, "missing: the bucket does not describe this broker", FIX_MANIFESTS)
        return
    except TierdError as e:
        report.add("manifest", path, str(e), FIX_MANIFESTS if e.code == "corruption" else None)
        return
    truth = build_broker_manifest(view.flat)
    listed = {t.name: (t.id, t.queues) for t in m.topics}
    known = {t.name: (t.id, t.queues) for t in truth.topics}
    for name in sorted(set(known) | set(listed)):
        if listed.get(name) != known.get(name):
            lists = f"id {listed[name][0]}, queues {list(listed[name][1])}" if name in listed else "nothing"
            has = f"id {known[name][0]}, queues {list(known[name][1])}" if name in known else "no such topic"
            report.add("manifest", path, f"topic {name!r}: lists {lists}; metadata has {has}", FIX_MANIFESTS)


# -------------------------------------------------------------------------------------- bucket
def _expected_paths(view: ColdView) -> set[str]:
    cfg = view.cfg.tiered
    out = {
        broker_manifest_path(cfg.cluster, cfg.broker),
        index_manifest_path(cfg.cluster, cfg.broker),
        offsets_path(cfg.cluster, cfg.broker),
    }
    for (topic, qid), ff in view.flat.files.items():
        out.add(queue_manifest_path(cfg.cluster, cfg.broker, topic, qid))
        for file in (ff.commitlog, ff.consumequeue):
            out.update(seg.path for seg in file.segments)
    infos = view.live.index.uploaded_infos() if view.live is not None else view.flat.loaded_index
    out.update(index_segment_path("", cfg.cluster, cfg.broker, i.base_offset).lstrip("/") for i in infos)
    return out


async def _verify_bucket(view: ColdView, report: VerifyReport) -> None:
    """Objects under the broker prefix that metadata does not know, and who owns the prefix."""
    cfg = view.cfg.tiered
    base = f"{cluster_dir(cfg.cluster)}/{cfg.broker}"
    try:
        found = await view.root.list_objects(base)
    except TierdError as e:
        report.add("bucket", view.prefix, f"cannot be listed: {e}")
        return
    try:
        owner = await current_owner(view.root, cfg.cluster, cfg.broker)
    except CorruptionError as e:
        owner = None
        epoch = max(await list_epochs(view.root, cfg.cluster, cfg.broker))
        report.add(
            "ownership",
            owner_path(cfg.cluster, cfg.broker, epoch),
            f"the highest owner record is unreadable ({e}): who owns the prefix is unknown, so no "
            "store writes there (reads work). If this store should own it, stop the store that "
            f"wrote it (if any) and run `tierd takeover --unreadable {epoch}`",
        )
    except TierdError as e:
        report.add("bucket", view.prefix, f"cannot be listed: {e}")
        return
    owner_records = f"{base}/{OWNER_DIR}/"
    objects = [p for p in found if not p.startswith(owner_records)]
    if not view.usable:
        if objects:
            segments = sum(1 for p in objects if not p.endswith(MANIFEST_NAME))
            report.add(
                "metadata",
                str(view.metadata.path),
                f"no usable tiering metadata, but the bucket prefix {view.prefix} holds {len(objects)} "
                f"object(s) of this broker ({segments} segment(s)); the daemon refuses to tier over "
                "them: rebuild the metadata with `tierd restore --from URL` into an empty store.dir",
            )
    else:
        unknown: dict[str, list[str]] = collections.defaultdict(list)
        expected = _expected_paths(view)
        for p in objects:
            if p not in expected:
                unknown[p.rsplit("/", 1)[0]].append(p)
        for directory, paths in sorted(unknown.items()):
            report.add(
                "bucket",
                directory,
                f"{len(paths)} object(s) that the metadata does not know (another writer's, or "
                f"leftovers), e.g. {paths[0]}",
            )
    if owner is not None and owner.store_id != view.store_id:
        report.add(
            "ownership",
            view.prefix,
            f"owned by {owner.describe()}, not by this store ({view.store_id or 'no id yet'}): this "
            "store may not write there",
        )


# -------------------------------------------------------------------------------------- repair
def _copy_file(src: Path, dst: Path) -> None:
    """Replace ``dst`` with a copy of ``src`` atomically."""
    write_atomically(dst, src.read_bytes())


async def _repair(view: ColdView, report: VerifyReport) -> None:
    """Apply the fixes of the problems found; record what changed and mark what got fixed."""
    wanted = {p.fix for p in report.problems if p.fix is not None}
    metadata = view.metadata
    if FIX_MAIN_FROM_BACKUP in wanted or FIX_BACKUP_FROM_MAIN in wanted:
        if view.live is not None:
            await view.live.flat.save()
            await view.live.flat.save()  # the second save makes the backup a good copy too
            report.repairs.append(f"rewrote {metadata.path.name} and its backup from the running store")
        elif FIX_MAIN_FROM_BACKUP in wanted:
            await asyncio.to_thread(_copy_file, metadata.backup, metadata.path)
            report.repairs.append(f"restored {metadata.path} from {metadata.backup.name}")
        else:
            await asyncio.to_thread(_copy_file, metadata.path, metadata.backup)
            report.repairs.append(f"rewrote {metadata.backup} from {metadata.path.name}")
        _mark(report, {FIX_MAIN_FROM_BACKUP, FIX_BACKUP_FROM_MAIN})
    if FIX_MANIFESTS in wanted:
        try:
            n = await _rewrite_manifests(view)
        except TierdError as e:
            report.repairs.append(f"manifests NOT rewritten: {e}")
        else:
            report.repairs.append(f"rewrote {n} bucket manifest(s) from the metadata")
            _mark(report, {FIX_MANIFESTS})


def _mark(report: VerifyReport, fixes: set[str]) -> None:
    for p in report.problems:
        if p.fix in fixes:
            p.fixed = True


async def _rewrite_manifests(view: ColdView) -> int:
    """Every manifest, from metadata — only as the prefix's owner (claimed here if unowned)."""
    if view.live is not None:
        view.live.manifests.forget()
        async with view.live._manifest_lock:
            return await view.live.manifests.write_changed()
    cfg = view.cfg.tiered
    if view.store_id is None:
        raise PrefixOwnedError("this store has no id: it never tiered, so it owns no prefix to repair")
    root = view.root
    ownership = Ownership(root, cfg.cluster, cfg.broker, view.store_id, Path(view.cfg.store.dir))
    await ownership.claim()
    if isinstance(root, GuardedRoot):
        root.fence = ownership.ensure
    writer = ManifestWriter(root, view.flat)
    writer.forget()  # its ledger says they were written; the bucket says otherwise
    return await writer.write_changed()


# --------------------------------------------------------------------------------------- entry
async def _verify_cold(view: ColdView, report: VerifyReport, tally: _Tally) -> None:
    if view.usable:
        for _, ff in sorted(view.flat.files.items()):
            await _verify_segments(view, ff.commitlog, report, tally)
            await _verify_segments(view, ff.consumequeue, report, tally)
            await _verify_cold_queue(ff, report, tally)
            await _verify_manifest(view, ff, report)
        await _verify_broker_manifest(view, report)
    await _verify_bucket(view, report)


def _total(hot: HotStore, view: ColdView | None) -> int:
    total = hot.commitlog.max_offset - hot.commitlog.min_offset
    if view is not None:
        for ff in view.flat.files.values():
            total += sum(s.commit_position for s in ff.commitlog.segments)
            total += sum(i.size for i in ff.commitlog.infos() if i.sealed)
    return total


async def _check(
    hot: HotStore, view: ColdView | None, report: VerifyReport, progress: Progress | None
) -> None:
    """Every check, nothing written."""
    tally = _Tally(_total(hot, view), progress)
    _verify_hot(hot, report, tally)
    await asyncio.to_thread(_verify_offsets, hot.dir, report)
    if view is not None:
        await _verify_cold(view, report, tally)
    report.bytes = tally.done


async def _repair_all(hot: HotStore, view: ColdView | None, report: VerifyReport) -> None:
    """Repair what the checks found (``hot`` open for writing: its recovery ran)."""
    await asyncio.to_thread(_repair_units, hot, report)
    await asyncio.to_thread(_repair_offsets, hot.dir, report)
    if view is not None:
        await _repair(view, report)


def _recovered(report: VerifyReport) -> None:
    """After the normal open --repair makes: what recovery repaired is marked so. A lost range
    is recorded, not undone: it stays a problem (its messages are gone)."""
    for p in report.problems:
        if p.fix == FIX_RECOVERY and not p.fixed:
            p.fixed = True
            report.repairs.append(f"recovery repaired {p.area} {p.where}")
        elif p.fix == FIX_RECORD_LOSS:
            p.fix = None
            p.message = p.message.removesuffix(_NOT_RECORDED)
            report.repairs.append(
                f"recorded the quarantined range at commitlog offset {p.where} (its messages are lost)"
            )


def _log_problems(report: VerifyReport) -> None:
    for p in report.problems:
        log.log(
            logging.INFO if p.fixed else logging.ERROR,
            "verify: %s %s: %s%s",
            p.area,
            p.where,
            p.message,
            " (repaired)" if p.fixed else "",
        )


async def _run(
    hot: HotStore, view: ColdView | None, report: VerifyReport, progress: Progress | None, repair: bool
) -> VerifyReport:
    await _check(hot, view, report, progress)
    if repair:
        await _repair_all(hot, view, report)
    _log_problems(report)
    return report


async def verify(
    hot: HotStore, tiering: TieringService | None, progress: Progress | None = None, *, repair: bool = False
) -> VerifyReport:
    """Check a running store, both tiers (read-only unless ``repair``); every problem found."""
    report = VerifyReport()
    view = None
    if tiering is not None:
        await asyncio.to_thread(_check_metadata, tiering.metadata, report)
        view = _live_view(tiering)
    return await _run(hot, view, report, progress, repair)


async def verify_store(
    cfg: TierdConfig, progress: Progress | None = None, *, repair: bool = False
) -> VerifyReport:
    """Check a stopped store's directory and its bucket without starting anything (see module
    doc); ``repair`` fixes what it safely can and says so in :attr:`VerifyReport.repairs`."""
    store_dir = Path(cfg.store.dir)
    if not store_dir.is_dir():
        raise NotFoundError(f"no store at {store_dir} (store.dir)", path=str(store_dir))
    # Checked read-only (nothing under store.dir changes, not even by recovery); --repair then
    # opens the store normally, which repairs what recovery repairs, and fixes the rest.
    hot = await asyncio.to_thread(functools.partial(HotStore.open, cfg.store, read_only=True))
    try:
        report = VerifyReport()
        view = None
        root = None
        try:
            if cfg.tiered.enabled:
                root = GuardedRoot(open_driver_factory(cfg.backend), cfg.tiered.backend_timeout)
                view = await _load_view(cfg, root, report)
            await _check(hot, view, report, progress)
            if repair:
                await asyncio.to_thread(hot.close)
                hot = await asyncio.to_thread(HotStore.open, cfg.store)
                _recovered(report)
                await asyncio.to_thread(hot.require_dispatched, 30, "verify --repair")
                await _repair_all(hot, view, report)
        finally:
            if root is not None:
                await root.aclose()
        _log_problems(report)
        return report
    finally:
        await asyncio.to_thread(hot.close)
