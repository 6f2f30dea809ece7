"""The recovery scan of the hot commitlog: find its valid end, and *resync past damage*.

RocketMQ ends its recovery scan at the first record that does not check out and truncates the
log there — a single flipped byte in the middle of a commitlog then deletes every acknowledged
message after it. tierd tells the two cases apart:

* **the end**: zero bytes (never written), or an invalid record after which no valid record
  follows anywhere — a torn tail; the log ends there;
* **damage**: an invalid record followed, later, by records that check out. The scan *resyncs*
  to the next position whose record has a known magic, consistent framing, a matching body CRC,
  a PHYSICALOFFSET equal to its own position (the strongest test: a record's bytes name where
  they belong) and a plausible queue offset — then continues. The bytes in between form a
  damaged range, reported with the messages known to be lost in it.

Ranges already quarantined (:mod:`tierd.local.quarantine`) are stepped over without a check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tierd.errors import CorruptRecordError
from tierd.format.cq_unit import encode_units
from tierd.format.record import (
    BLANK,
    END_FILE_MIN_BLANK,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    VALID,
    RecordView,
    parse_record_view,
    scan_record,
)
from tierd.local.dispatch import DispatchBatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from tierd.local.commitlog import CommitLog
    from tierd.local.consumequeue import ConsumeQueue
    from tierd.local.mapped_file import MappedFile
    from tierd.local.quarantine import Lost, Quarantine

#: The smallest record (no body, no topic bytes, no properties): bounds how many messages a
#: damaged range can have held.
MIN_RECORD = MIN_RECORD_SIZE
_MAGICS = (MAGIC_V1.to_bytes(4, "big"), MAGIC_V2.to_bytes(4, "big"))
_NO_QUEUE_UNIT = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)


@dataclass(slots=True)
class Damage:
    """A damaged range found by the scan, with the messages known lost in it."""

    start: int
    end: int
    lost: list[Lost] = field(default_factory=list)
    #: True when the range was quarantined before this scan (stepped over, not re-reported).
    known: bool = False


@dataclass(slots=True)
class ScanResult:
    #: End of the last valid record (the commitlog's new end).
    valid_end: int
    #: Valid records at or after ``collect_from``, for re-dispatch.
    records: list[tuple[int, RecordView]]
    damage: list[Damage]
    #: Records checked (including those before ``collect_from``).
    checked: int = 0
    #: Whether valid records of a torn last append were cut (see :func:`scan_commitlog`).
    cut_torn_append: bool = False


class _Scan:
    def __init__(
        self,
        cl: CommitLog,
        check_crc: bool,
        max_record: int,
        unit_at: Callable[[str, int, int], int | None],
    ) -> None:
        self.cl = cl
        self.check_crc = check_crc
        #: A run of zeros this long holds no record: past it nothing was ever written.
        self.zero_run = bytes(max_record + END_FILE_MIN_BLANK)
        self.unit_at = unit_at
        #: Per queue: (last queue offset seen, its commitlog offset).
        self.last: dict[tuple[str, int], tuple[int, int]] = {}

    # -------------------------------------------------------------------- resync
    def _candidate(self, f: MappedFile, at: int, after: int) -> RecordView | None:
        """The record at ``at`` of ``f`` if it checks out as a resync point after damage that
        started at commitlog offset ``after``."""
        status, _, view = scan_record(f.view, at, f.size, self.check_crc)
        pos = f.file_from_offset + at
        if status != VALID or view is None or view.physical_offset != pos:
            return None
        if view.sys_flag & SYSFLAG_TRANSACTION_MASK in _NO_QUEUE_UNIT:
            return view
        key = (view.topic, view.queue_id)
        bound = (pos - after) // MIN_RECORD + 1  # messages the damaged bytes could have held
        seen = self.last.get(key)
        if seen is not None:
            return view if seen[0] < view.queue_offset <= seen[0] + bound else None
        unit = self.unit_at(view.topic, view.queue_id, view.queue_offset)
        return view if unit is None or unit == pos else None

    def resync(self, pos: int) -> tuple[int, RecordView] | None:
        """The first position after ``pos`` (a damaged record) where a record checks out, or
        None when nothing valid follows (the search ends at a run of zeros longer than any
        record: the writer never got past it)."""
        for f in self.cl.files:
            if f.file_from_offset + f.size <= pos:
                continue
            at = max(0, pos + 1 - f.file_from_offset)
            if at == 0:  # a file starts on a record boundary
                view = self._candidate(f, 0, pos)
                if view is not None:
                    return f.file_from_offset, view
                at = 1
            mm = f.mm
            zeros = mm.find(self.zero_run, at)
            limit = f.size if zeros < 0 else zeros
            while at < limit:
                hits = [i for i in (mm.find(m, at + 4, limit + 4) for m in _MAGICS) if i >= 0]
                if not hits:
                    break
                at = min(hits) - 4
                view = self._candidate(f, at, pos)
                if view is not None:
                    return f.file_from_offset + at, view
                at += 1
            if zeros >= 0:
                return None
        return None

    # -------------------------------------------------------------------- damage
    def _damaged_record(self, pos: int, end: int) -> Lost | None:
        """The message the damaged range ``[pos, end)`` held, when it is exactly one record
        whose header still reads consistently (the usual case: rot in the body)."""
        f = self.cl.files.find(pos)
        if f is None:
            return None
        try:
            view = parse_record_view(f.view, pos - f.file_from_offset, f.size, check_crc=False)
        except CorruptRecordError:
            return None
        if view.physical_offset != pos or pos + view.size != end:
            return None
        if view.sys_flag & SYSFLAG_TRANSACTION_MASK in _NO_QUEUE_UNIT:
            return None
        seen = self.last.get((view.topic, view.queue_id))
        if seen is not None and view.queue_offset != seen[0] + 1:
            return None
        return view.topic, view.queue_id, view.queue_offset

    def track(self, pos: int, view: RecordView, damage: list[Damage]) -> None:
        """Remember the record's queue offset; a jump since the queue's previous record across
        a damaged range means the messages in between were lost there."""
        if view.sys_flag & SYSFLAG_TRANSACTION_MASK in _NO_QUEUE_UNIT:
            return
        key = (view.topic, view.queue_id)
        seen = self.last.get(key)
        if seen is not None and view.queue_offset > seen[0] + 1:
            for d in reversed(damage):
                if seen[1] < d.start < pos:
                    known = set(d.lost)
                    d.lost += [
                        lost
                        for q in range(seen[0] + 1, view.queue_offset)
                        if (lost := (view.topic, view.queue_id, q)) not in known
                    ]
                    break
        self.last[key] = (view.queue_offset, pos)


def scan_commitlog(
    cl: CommitLog,
    start: int,
    *,
    check_crc: bool,
    collect_from: int,
    max_record: int,
    quarantine: Quarantine,
    unit_at: Callable[[str, int, int], int | None],
) -> ScanResult:
    """Walk records from ``start`` (a record boundary) to the end, resyncing past damage (see
    the module doc). Records at or after ``collect_from`` are returned for re-dispatch.
    ``max_record`` is the largest record the store accepts; ``unit_at(topic, queue id, queue
    offset)`` the commitlog offset a consume queue already holds for that message (None: none),
    which a resync candidate of a queue not seen yet in this scan must agree with."""
    scan = _Scan(cl, check_crc, max_record, unit_at)
    records: list[tuple[int, RecordView]] = []
    damage: list[Damage] = []
    checked = 0
    pos = start
    while True:
        known = quarantine.covers(pos)
        if known is not None:
            damage.append(Damage(known.start, known.end, list(known.lost), known=True))
            pos = known.end
            continue
        f = cl.files.find(pos)
        if f is None:
            break
        at = pos - f.file_from_offset
        # A file always ends in a record or a blank marker (8 bytes), which scan_record
        # recognises; fewer bytes than a marker means the walk left the record chain.
        if f.size - at < END_FILE_MIN_BLANK:
            break
        status, size, view = scan_record(f.view, at, f.size, check_crc)
        if status == VALID:
            assert view is not None
            checked += 1
            scan.track(pos, view, damage)
            if pos >= collect_from:
                records.append((pos, view))
            pos += size
            continue
        if status == BLANK:
            pos = f.file_from_offset + f.size
            continue
        # The end of the log (zeros; the search stops at once) or a torn tail — unless records
        # that check out follow: then this is damage (even zeros: a lost page).
        found = scan.resync(pos)
        if found is None:
            break
        end, _ = found
        lost = scan._damaged_record(pos, end)
        damage.append(Damage(pos, end, [lost] if lost is not None else []))
        pos = end
    if damage and not damage[-1].known and damage[-1].start >= collect_from:
        # A kill during the last append can leave its end written before its middle (memcpy
        # may copy the last bytes first): valid records after a hole, all of that one append
        # (one store timestamp), at the very end. That is a torn tail, not damage: appends
        # before the checkpoint had completed, so only one after it can be torn.
        torn = damage[-1].start
        after = [view.store_timestamp for at, view in records if at >= torn]
        if len(set(after)) == 1:
            damage.pop()
            records = [r for r in records if r[0] < torn]
            return ScanResult(torn, records, damage, checked - len(after), cut_torn_append=True)
    return ScanResult(pos, records, damage, checked)


# ---------------------------------------------------------------------------- unit rebuild
def find_queue_records(
    cl: CommitLog,
    quarantine: Quarantine,
    topic: str,
    queue_id: int,
    wanted: set[int],
    lo: int,
    hi: int,
    max_record: int,
) -> list[tuple[int, RecordView]]:
    """The records of ``topic``/``queue_id`` with a queue offset in ``wanted`` among the records
    of commitlog ``[lo, hi)`` (``lo`` a record boundary), walking records like recovery does:
    blank markers followed, quarantined ranges stepped over, damage resynced past."""
    scan = _Scan(cl, True, max_record, lambda topic, queue_id, offset: None)
    found: list[tuple[int, RecordView]] = []
    pos = max(lo, cl.min_offset)
    while pos < hi and len(found) < len(wanted):
        known = quarantine.covers(pos)
        if known is not None:
            pos = known.end
            continue
        f = cl.files.find(pos)
        if f is None or f.size - (pos - f.file_from_offset) < END_FILE_MIN_BLANK:
            break
        status, size, view = scan_record(f.view, pos - f.file_from_offset, f.size, True)
        if status == VALID:
            assert view is not None
            if view.topic == topic and view.queue_id == queue_id and view.queue_offset in wanted:
                found.append((pos, view))
            pos += size
        elif status == BLANK:
            pos = f.file_from_offset + f.size
        else:
            resync = scan.resync(pos)
            if resync is None:
                break
            pos = resync[0]
    return found


def rebuild_units(
    cq: ConsumeQueue, cl: CommitLog, quarantine: Quarantine, offsets: list[int], max_record: int
) -> list[int]:
    """Rewrite the units at queue ``offsets`` from the commitlog, the source of truth: each run
    of them is searched for between the records its nearest sound neighbours point at (the
    whole commitlog when a neighbour is unsound too). Only a record that names this queue and
    offset makes a unit, so a rebuilt unit is never wrong. Returns the offsets rebuilt; the
    others have no record left (expired or lost) and keep their unit."""
    rebuilt: list[int] = []
    for first, end in _runs(sorted(set(offsets))):
        before = _sound_position(cq, cl, first - 1, end=True)
        after = _sound_position(cq, cl, end, end=False)
        found = find_queue_records(
            cl,
            quarantine,
            cq.topic,
            cq.queue_id,
            set(range(first, end)),
            cl.min_offset if before is None else before,
            cl.max_offset if after is None else after,
            max_record,
        )
        if not found:
            continue
        batch = DispatchBatch.from_records(found, cl.max_offset)
        for j, (_, view) in enumerate(found):
            cq.put_units(
                view.queue_offset,
                encode_units(batch.offsets[j : j + 1], batch.sizes[j : j + 1], batch.tags_codes[j : j + 1]),
            )
            rebuilt.append(view.queue_offset)
    return sorted(rebuilt)


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets as runs ``[first, end)`` of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for o in offsets:
        if runs and runs[-1][1] == o:
            runs[-1] = (runs[-1][0], o + 1)
        else:
            runs.append((o, o + 1))
    return runs


def _sound_position(cq: ConsumeQueue, cl: CommitLog, offset: int, *, end: bool) -> int | None:
    """Where the record of the unit at queue ``offset`` starts (or ends, with ``end``) when the
    unit is sound — it points at a whole record of this queue and offset — else None."""
    if not cq.min_offset <= offset < cq.max_offset:
        return None
    units = cq.read_units(offset, 1)
    if not len(units):
        return None
    phys, size = int(units["offset"][0]), int(units["size"][0])
    f = cl.files.find(phys) if phys >= cl.min_offset else None
    if f is None:
        return None
    try:
        view = parse_record_view(f.view, phys - f.file_from_offset, f.size, check_crc=False)
    except CorruptRecordError:
        return None
    if (view.topic, view.queue_id, view.queue_offset, view.size) != (cq.topic, cq.queue_id, offset, size):
        return None
    return phys + size if end else phys
