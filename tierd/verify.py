"""``tierd verify``: check every byte the store vouches for, and list each problem found.

What is checked, and why each matters to an operator:

- hot commitlog: every record's framing and body CRC, up to the written end (a bad record is a
  message a consumer would be refused);
- hot consume queues: every unit points at a record of its own topic, queue and offset (a wrong
  unit hands out the wrong message);
- cold segments: the backend holds at least the bytes metadata says are committed (else reads
  fail), sealed segments hash to their recorded CRC32C;
- cold consume queues ↔ cold commitlog: every unit points at a whole, CRC-valid record with the
  unit's queue offset (same reason as hot);
- bucket manifests: they exist, list the segments the store knows, and their CRC32Cs agree.

Verification reads; it never repairs. It runs on a stopped store (it opens the directory).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tierd.errors import TierdError
from tierd.local.codec import BLANK, INVALID, VALID, parse_record_view, scan_record
from tierd.local.consumequeue import UNIT_SIZE, decode_units
from tierd.tiered.flatfile import stored_crc32c
from tierd.tiered.manifest import ManifestSegment, read_queue_manifest

if TYPE_CHECKING:
    from tierd.local.commitlog import CommitLog
    from tierd.local.quarantine import Quarantine
    from tierd.local.store import HotStore
    from tierd.tiered.flatfile import FlatAppendFile
    from tierd.tiered.flatmessage import FlatMessageFile
    from tierd.tiered.service import TieringService

log = logging.getLogger(__name__)
#: ``progress(done, total, what)`` in bytes — the CLI turns it into a progress bar.
Progress = Callable[[int, int, str], None]
READ_PIECE = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Problem:
    #: hot-commitlog, hot-quarantine, hot-consumequeue, cold-segment, cold-consumequeue,
    #: cold-hole, manifest
    area: str
    #: Where: a file, a segment path or ``topic/queue@offset``.
    where: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(slots=True)
class VerifyReport:
    records: int = 0
    units: int = 0
    segments: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "records": self.records,
            "units": self.units,
            "segments": self.segments,
            "bytes": self.bytes,
            "problems": [p.as_dict() for p in self.problems],
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
def _verify_hot(hot: HotStore, report: VerifyReport, tally: _Tally) -> None:
    cl = hot.commitlog
    pos, end = cl.min_offset, cl.max_offset
    while pos < end:
        damaged = hot.quarantine.covers(pos)
        if damaged is not None:  # found by recovery: reported, then stepped over like a read does
            report.problems.append(Problem("hot-quarantine", str(pos), damaged.describe()))
            tally.add(damaged.end - pos, "hot commitlog")
            pos = damaged.end
            continue
        f = cl.files.find(pos)
        if f is None:
            report.problems.append(
                Problem("hot-commitlog", str(pos), f"offset {pos} is in no commitlog file")
            )
            break
        at = pos - f.file_from_offset
        status, size, _ = scan_record(f.view, at, f.size, True)
        if status == VALID:
            report.records += 1
            pos += size
            tally.add(size, "hot commitlog")
        elif status == BLANK:  # end-of-file marker: the next record starts the next file
            tally.add(size, "hot commitlog")
            pos += size
        else:
            report.problems.append(
                Problem(
                    "hot-commitlog",
                    f"{f.path}@{at}",
                    f"record at commitlog offset {pos} is corrupt (bad framing or CRC); "
                    f"{end - pos} bytes from there on are unreadable",
                )
            )
            break
    for topic, queue_ids in sorted(hot.topics().items()):
        for qid in queue_ids:
            _verify_hot_queue(hot, topic, qid, report)


def _verify_hot_queue(hot: HotStore, topic: str, qid: int, report: VerifyReport) -> None:
    cq = hot.queue(topic, qid)
    if cq is None:
        return
    cl = hot.commitlog
    offset = max(cq.min_offset, cq.files.min_offset // UNIT_SIZE)
    while offset < cq.max_offset:
        qf = cq.files.find(offset * UNIT_SIZE)
        if qf is None:
            report.problems.append(
                Problem("hot-consumequeue", f"{topic}/{qid}@{offset}", "no consume queue file holds it")
            )
            return
        start = offset * UNIT_SIZE - qf.file_from_offset
        stop = min(qf.wrote, (cq.max_offset * UNIT_SIZE) - qf.file_from_offset)
        units = decode_units(qf.read(start, stop))
        if len(units) == 0:
            return
        for i, unit in enumerate(units):
            _check_hot_unit(
                cl, hot.quarantine, topic, qid, offset + i, int(unit["offset"]), int(unit["size"]), report
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
) -> None:
    report.units += 1
    if phys < cl.min_offset:
        return  # its commitlog file expired: the unit is below the readable floor
    if quarantine.covers(phys) is not None:
        return  # a hole: the message was lost in a quarantined range, reported with the range
    where = f"{topic}/{qid}@{offset}"
    f = cl.files.find(phys)
    if f is None:
        report.problems.append(Problem("hot-consumequeue", where, f"points at missing offset {phys}"))
        return
    try:
        view = parse_record_view(f.view, phys - f.file_from_offset, f.size)
    except TierdError as e:
        report.problems.append(Problem("hot-consumequeue", where, f"points at no record: {e}"))
        return
    if (view.topic, view.queue_id, view.queue_offset, view.size) != (topic, qid, offset, size):
        report.problems.append(
            Problem(
                "hot-consumequeue",
                where,
                f"points at {view.topic}/{view.queue_id}@{view.queue_offset} "
                f"({view.size} bytes, unit says {size})",
            )
        )


# --------------------------------------------------------------------------------------- cold
async def _verify_segments(file: FlatAppendFile, report: VerifyReport, tally: _Tally) -> None:
    """Backend sizes against committed positions; sealed content against its CRC32C."""
    for seg, info in zip(file.segments, file.infos(), strict=True):
        report.segments += 1
        try:
            stored = await seg.driver.size()
        except TierdError as e:
            report.problems.append(Problem("cold-segment", seg.path, f"cannot be read: {e}"))
            continue
        if stored < seg.commit_position:
            report.problems.append(
                Problem(
                    "cold-segment",
                    seg.path,
                    f"backend holds {stored} bytes, metadata says {seg.commit_position} are committed",
                )
            )
            continue
        if info.sealed and info.crc32c is not None:
            crc = await stored_crc32c(seg, lambda n: tally.add(n, "cold segment checksums"))
            if crc != info.crc32c:
                report.problems.append(
                    Problem("cold-segment", seg.path, f"CRC32C is {crc}, recorded {info.crc32c}")
                )


async def _verify_cold_queue(ff: FlatMessageFile, report: VerifyReport, tally: _Tally) -> None:
    """Every cold CQ unit points at a whole, CRC-valid record carrying the unit's offset. The
    commitlog is read in pieces of up to 16 MiB covering many units (one request each)."""
    where = f"{ff.topic}/{ff.queue_id}"
    offset, end = ff.min_offset, ff.max_offset
    while offset < end:
        units = await ff.read_units(offset, min(READ_PIECE // UNIT_SIZE, end - offset))
        phys = units["offset"].astype(np.int64)
        ends = phys + units["size"].astype(np.int64)
        i = 0
        while i < len(units):
            j = max(i + 1, int(np.searchsorted(ends, phys[i] + READ_PIECE, side="right")))
            try:
                span = int(ends[j - 1] - phys[i])
                raw = await ff.read_commitlog(int(phys[i]), span) if span else b""  # 0: holes only
            except TierdError as e:
                report.problems.append(Problem("cold-consumequeue", f"{where}@{offset + i}", str(e)))
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
        report.problems.append(
            Problem(
                "cold-hole",
                f"{where}@{queue_offset}",
                "lost to damage found in the hot commitlog before it was tiered (quarantined there)",
            )
        )
        return
    status, got, view = (
        scan_record(raw, at, min(len(raw), at + size), True) if at >= 0 else (INVALID, 0, None)
    )
    if status != VALID or got != size or view is None:
        report.problems.append(
            Problem(
                "cold-consumequeue",
                f"{where}@{queue_offset}",
                f"flat commitlog offset {phys}: no valid {size}-byte record there (bad framing or CRC)",
            )
        )
    elif view.queue_offset != queue_offset:
        report.problems.append(
            Problem(
                "cold-consumequeue",
                f"{where}@{queue_offset}",
                f"record at flat offset {phys} carries queue offset {view.queue_offset}",
            )
        )
    else:
        report.records += 1


async def _verify_manifest(tiering: TieringService, ff: FlatMessageFile, report: VerifyReport) -> None:
    cfg = tiering.cfg.tiered
    where = f"{ff.topic}/{ff.queue_id}"
    try:
        m = await read_queue_manifest(tiering.root, cfg.cluster, cfg.broker, ff.topic, ff.queue_id)
    except TierdError as e:
        report.problems.append(Problem("manifest", where, str(e)))
        return
    known = {(i.file_type.name, i.base_offset): i for i in (*ff.commitlog.infos(), *ff.consumequeue.infos())}
    listed: dict[tuple[str, int], ManifestSegment] = {(s.type, s.base_offset): s for s in m.segments}
    for key in sorted(set(known) - set(listed)):
        report.problems.append(Problem("manifest", where, f"does not list {key[0]} segment {key[1]}"))
    for key in sorted(set(listed) - set(known)):
        report.problems.append(
            Problem("manifest", where, f"lists {key[0]} segment {key[1]}, which the store does not have")
        )
    for key in sorted(set(known) & set(listed)):
        s, i = listed[key], known[key]
        if s.sealed and s.crc32c is not None and i.crc32c is not None and s.crc32c != i.crc32c:
            report.problems.append(
                Problem("manifest", where, f"{key[0]} {key[1]}: CRC32C {s.crc32c}, store has {i.crc32c}")
            )


async def verify(
    hot: HotStore, tiering: TieringService | None, progress: Progress | None = None
) -> VerifyReport:
    """Check both tiers; returns every problem found (an empty list means all is well)."""
    report = VerifyReport()
    total = hot.commitlog.max_offset - hot.commitlog.min_offset
    files = sorted(tiering.flat.files.items()) if tiering is not None else []
    for _, ff in files:
        total += sum(s.commit_position for s in ff.commitlog.segments)
        total += sum(i.size for i in ff.commitlog.infos() if i.sealed)
    tally = _Tally(total, progress)
    _verify_hot(hot, report, tally)
    for _, ff in files:
        await _verify_segments(ff.commitlog, report, tally)
        await _verify_segments(ff.consumequeue, report, tally)
        await _verify_cold_queue(ff, report, tally)
        assert tiering is not None
        await _verify_manifest(tiering, ff, report)
    report.bytes = tally.done
    for p in report.problems:
        log.error("verify: %s %s: %s", p.area, p.where, p.message)
    return report
