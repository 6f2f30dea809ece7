"""Flat files: one logical, append-only file of the cold tier made of ordered segments.

A :class:`FlatAppendFile` is RocketMQ's FlatAppendFile: the segments of one queue's commitlog
(or consume queue) on the backend, each a :class:`~tierd.drivers.segment.FileSegment` named by
its base offset. Only the last segment is writable; when an append does not fit it is committed,
sealed (S3: chunks composed into one object) and a new segment starts at the append offset, so
a record never straddles two segments. Reads may cross one segment boundary.

Concurrency: one asyncio loop; the dispatcher is the only writer of a flat file (it serialises
appends and commits per queue); readers only see committed bytes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import google_crc32c

from tierd.drivers import paths
from tierd.drivers.segment import AppendResult, DriverRoot, FileSegment, FileType
from tierd.errors import CorruptionError, SegmentNotFoundError, SegmentReadError
from tierd.tiered.records import LocalSegment, local_segment_data

log = logging.getLogger(__name__)
#: Bytes read per request when a segment's checksum is computed from the backend.
CRC_PIECE = 16 * 1024 * 1024

#: Called after the set of segments changed (created, sealed, deleted) so metadata is persisted
#: *before* data is written into a new segment.
ChangeHook = Callable[["FlatAppendFile"], Awaitable[None]]


@dataclass(slots=True)
class _SegmentState:
    """What a flat file tracks of one of its segments beside the segment itself (size and
    store-timestamp range live on the :class:`FileSegment`); spelled as the record it becomes
    (:class:`~tierd.tiered.records.LocalSegment`)."""

    #: When the segment was created (ms; 0: not known — restored — so never rolled by age).
    create_timestamp: int
    seal_timestamp: int | None = None
    #: Queue offset of the segment's first item (commitlog: first record; consume queue: base / 20).
    first_queue_offset: int | None = None
    #: CRC32C (hex) of a sealed segment's content.
    crc32c: str | None = None
    #: Running CRC32C of everything appended in this process (None: unknown, e.g. after a
    #: restart — then computed by reading the segment back at seal time).
    running_crc: int | None = None


async def ignore_change(_: FlatAppendFile) -> None:
    """The default :data:`ChangeHook`: a file nobody needs to hear about."""
    return None


class FlatAppendFile:
    def __init__(
        self,
        root: DriverRoot,
        cluster: str,
        broker: str,
        topic: str,
        queue_id: int,
        file_type: FileType,
        max_size: int,
        *,
        on_change: ChangeHook = ignore_change,
        roll_after_ms: int | None = None,
        roll_min_size: int = 0,
    ) -> None:
        self.root = root
        self.cluster, self.broker, self.topic, self.queue_id = cluster, broker, topic, queue_id
        self.file_type = file_type
        self.max_size = max_size
        self.on_change = on_change
        #: Roll a segment this old (ms since created) holding at least ``roll_min_size`` bytes
        #: before the next append (RocketMQ's commitLogRollingInterval / MinimumSize): a quiet
        #: queue's segment gets sealed — checksummed, one object — instead of staying open for ever.
        self.roll_after_ms = roll_after_ms
        self.roll_min_size = roll_min_size
        self.segments: list[FileSegment] = []
        #: Per segment (by base offset): what the file tracks of it beside the segment itself.
        self._state: dict[int, _SegmentState] = {}
        #: Sealed-but-not-yet-composed segments (a failed seal is retried, never blocks appends).
        self.unsealed_full: list[FileSegment] = []
        #: A :meth:`seal_pending` pass is running (there is one at a time).
        self._sealing = False

    # ------------------------------------------------------------------ naming
    def path_of(self, base_offset: int) -> str:
        return paths.segment_path(
            "", self.cluster, self.broker, self.topic, self.queue_id, self.file_type, base_offset
        )

    def _new_segment(self, base_offset: int, *, fresh: bool = True) -> FileSegment:
        seg = FileSegment(
            self.root.driver(self.path_of(base_offset)), self.file_type, base_offset, max_size=self.max_size
        )
        state = self._state.setdefault(base_offset, _SegmentState(int(time.time() * 1000)))
        state.running_crc = 0 if fresh else None
        return seg

    # ------------------------------------------------------------------ state
    @property
    def empty(self) -> bool:
        return not self.segments

    def _first_segment(self) -> FileSegment:
        """The first segment; a file without segments has no offsets (it exists only between
        construction and :meth:`init_offset` / :meth:`load`, or after :meth:`destroy`)."""
        if not self.segments:
            raise CorruptionError(f"{self.path_of(0)}: flat file has no segments (not initialised)")
        return self.segments[0]

    @property
    def min_offset(self) -> int:
        return self._first_segment().base_offset

    @property
    def commit_offset(self) -> int:
        """End of the committed prefix: the first segment still holding uncommitted bytes bounds
        it (a rolled segment may still be waiting for its commit)."""
        self._first_segment()
        for seg in self._open_tail():
            if seg.needs_commit:
                return seg.commit_offset
        return self.segments[-1].commit_offset

    def _open_tail(self) -> list[FileSegment]:
        """The trailing segments not closed yet: the last one plus any rolled segment whose bytes
        are not committed (``commit`` closes them) — the only ones that can hold pending bytes."""
        i = len(self.segments)
        while i > 0 and not self.segments[i - 1].closed:
            i -= 1
        return self.segments[i:]

    @property
    def append_offset(self) -> int:
        self._first_segment()
        return self.segments[-1].append_offset

    @property
    def needs_commit(self) -> bool:
        return any(s.needs_commit for s in self._open_tail())

    @property
    def pending_bytes(self) -> int:
        """Bytes appended to the last segment and not committed yet (what the next commit of
        it uploads)."""
        if not self.segments:
            return 0
        last = self.segments[-1]
        return last.append_position - last.commit_position

    @property
    def sealed_count(self) -> int:
        """Live segments that are sealed (cheaper than counting :meth:`infos`)."""
        return sum(self._sealed(s) for s in self.segments)

    def _sealed(self, seg: FileSegment) -> bool:
        return self._state[seg.base_offset].seal_timestamp is not None

    def first_queue_offset(self, base_offset: int) -> int | None:
        """Queue offset of the first item of the segment at ``base_offset`` (None: not known)."""
        return self._state[base_offset].first_queue_offset

    def learn_first_queue_offset(self, base_offset: int, queue_offset: int) -> None:
        """Record the first queue offset of a segment, read back from it by its owner."""
        self._state[base_offset].first_queue_offset = queue_offset

    def extend_max_timestamp(self, timestamp: int) -> None:
        """Widen the last segment's store-timestamp range to ``timestamp`` (an append records
        the oldest of its items; the newest comes from its caller, which has them all)."""
        seg = self.segments[-1]
        if seg.max_timestamp is None or timestamp > seg.max_timestamp:
            seg.max_timestamp = timestamp

    def _fields(self, seg: FileSegment) -> dict[str, Any]:
        state = self._state[seg.base_offset]
        return {
            "type": self.file_type.name,
            "base_offset": seg.base_offset,
            "size": seg.commit_position,
            "sealed": state.seal_timestamp is not None,
            "min_store_timestamp": seg.min_timestamp,
            "max_store_timestamp": seg.max_timestamp,
            "first_queue_offset": state.first_queue_offset,
            "crc32c": state.crc32c,
            "create_timestamp": state.create_timestamp,
            "seal_timestamp": state.seal_timestamp,
        }

    def infos(self) -> list[LocalSegment]:
        """Every segment's record, oldest first."""
        return [LocalSegment(**self._fields(s)) for s in self.segments]

    def infos_data(self) -> list[dict[str, Any]]:
        """:meth:`infos` as the JSON objects they dump to, without building the models (see
        :func:`~tierd.tiered.records.local_segment_data`)."""
        return [local_segment_data(self._fields(s)) for s in self.segments]

    # ------------------------------------------------------------------ lifecycle
    async def init_offset(self, base_offset: int) -> None:
        """Start an empty file at ``base_offset`` (a queue seen for the first time)."""
        if self.segments:
            raise CorruptionError(f"{self.path_of(base_offset)}: file already initialised", base=base_offset)
        self.segments.append(self._new_segment(base_offset))
        await self.on_change(self)

    async def load(self, infos: list[LocalSegment]) -> None:
        """Rebuild from metadata. Sealed segments trust their recorded size; every other one
        asks the backend — the last may have grown after the metadata was written, and a rolled
        segment may hold more (its commit landed, the metadata save did not) or less (the
        process died between the roll and the commit of its buffered bytes).

        A rolled segment that is shorter than the offset its successor starts at was never
        completed: its successors were created by the roll but can hold nothing (commits go
        oldest first), so they are deleted and the short segment becomes the last, writable
        one again — the dispatcher re-appends the same records and rolls at the same point."""
        self.segments = []
        ordered = sorted(infos, key=lambda x: x.base_offset)
        for i, info in enumerate(ordered):
            self._state[info.base_offset] = _SegmentState(
                info.create_timestamp, info.seal_timestamp, info.first_queue_offset, info.crc32c
            )
            seg = self._new_segment(info.base_offset, fresh=False)
            seg.min_timestamp, seg.max_timestamp = info.min_store_timestamp, info.max_store_timestamp
            if info.seal_timestamp is not None and i < len(ordered) - 1:
                seg.init_position(info.size)
            else:
                stored = await seg.load_position()
                if stored < info.size and i < len(ordered) - 1:
                    raise CorruptionError(
                        f"segment {seg.path} holds {stored} bytes on the backend but {info.size} were "
                        "committed: the backend lost committed data",
                        path=seg.path,
                        size=stored,
                        committed=info.size,
                    )
            self.segments.append(seg)
        await self._drop_unreached()
        for seg in self.segments[:-1]:
            seg.close()
            if not self._sealed(seg):
                self.unsealed_full.append(seg)

    async def _drop_unreached(self) -> None:
        """Cut the segment list after the first rolled segment that does not reach its
        successor's base offset (see :meth:`load`)."""
        for i, (seg, nxt) in enumerate(itertools.pairwise(self.segments)):
            span = nxt.base_offset - seg.base_offset
            if seg.commit_position == span:
                continue
            later = self.segments[i + 1 :]
            if seg.commit_position > span or self._sealed(seg):
                raise CorruptionError(
                    f"segment {seg.path} holds {seg.commit_position} bytes, but the next segment starts "
                    f"{span} bytes after it",
                    path=seg.path,
                    size=seg.commit_position,
                    span=span,
                )
            if any(s.commit_position for s in later):
                raise CorruptionError(
                    f"segment {seg.path} ends at {seg.commit_offset}, short of the next segment's start "
                    f"{nxt.base_offset}, yet a later segment holds data: the {self.file_type.name} of "
                    f"{self.topic}/{self.queue_id} has a hole",
                    path=seg.path,
                    end=seg.commit_offset,
                    next_base=nxt.base_offset,
                )
            log.warning(
                "%s: rolled segment holds %d of %d bytes (the process stopped before its last commit); "
                "dropping %d empty later segment(s) and appending to it again",
                seg.path,
                seg.commit_position,
                span,
                len(later),
            )
            for s in later:
                await s.destroy()
                self._state.pop(s.base_offset, None)
            self.segments = self.segments[: i + 1]
            return

    # ------------------------------------------------------------------ writes
    async def append(self, data: bytes, timestamp: int, first_queue_offset: int | None = None) -> None:
        """Append ``data`` (whole records or units) to the last segment, rolling first if it is
        full. ``first_queue_offset`` is the queue offset of the first item in ``data``. Raises if
        ``data`` cannot fit even an empty segment."""
        seg = self.segments[-1]
        if self._old_enough_to_roll(seg):
            await self.roll()
            seg = self.segments[-1]
        result = seg.append(data, timestamp)
        if result is AppendResult.FILE_FULL:
            if seg.append_position == 0:
                raise CorruptionError(
                    f"{len(data)} bytes never fit a {self.max_size}-byte segment", size=len(data)
                )
            await self.roll()
            seg = self.segments[-1]
            result = seg.append(data, timestamp)
        elif result is AppendResult.BUFFER_FULL:
            await self.commit()
            result = seg.append(data, timestamp)
        if result is not AppendResult.SUCCESS:
            raise CorruptionError(f"append to {seg.path} failed: {result.name}")
        state = self._state[seg.base_offset]
        if first_queue_offset is not None and state.first_queue_offset is None:
            state.first_queue_offset = first_queue_offset
        if state.running_crc is not None:
            state.running_crc = google_crc32c.extend(state.running_crc, data)

    def _old_enough_to_roll(self, seg: FileSegment) -> bool:
        if self.roll_after_ms is None or seg.append_position < max(1, self.roll_min_size):
            return False
        created = self._state[seg.base_offset].create_timestamp  # 0: not known (restored): never by age
        return created > 0 and time.time() * 1000 - created >= self.roll_after_ms

    def room(self) -> int:
        """Bytes the last segment still accepts."""
        seg = self.segments[-1]
        return self.max_size - seg.append_position

    async def roll(self) -> None:
        """Start a new segment at the append offset (metadata saved first). The old segment's
        buffered bytes are committed by the next :meth:`commit`, which then seals it — so an
        append never fails halfway because a commit did (a batch is appended whole or not at
        all, and a failed commit is retried as a unit)."""
        old = self.segments[-1]
        self.segments.append(self._new_segment(old.append_offset))
        await self.on_change(self)

    async def seal_pending(self) -> None:
        """Seal the rolled segments waiting for it, oldest first; stop at the first failure
        (logged; the next roll or maintenance pass retries).

        One pass at a time: the dispatcher calls this after a commit that rolled, the
        maintenance task on its timer, and a pass awaits the backend for each segment. A second
        pass starting meanwhile returns at once — the running one takes the list from its
        head until it is empty, so it also seals what was added after it started — instead of
        sealing the same segment again and recording it twice."""
        if self._sealing:
            return
        self._sealing = True
        try:
            while self.unsealed_full:
                seg = self.unsealed_full[0]
                try:
                    await seg.seal()
                    state = self._state.get(seg.base_offset)
                    if state is not None and state.crc32c is None:
                        state.crc32c = await self._content_crc(seg)
                except Exception as e:  # retried on the next roll or maintenance round
                    log.warning("sealing %s failed, will retry: %s", seg.path, e)
                    return
                if seg not in self.unsealed_full:  # expired (destroy_before) while it was sealed
                    continue
                self.unsealed_full.remove(seg)
                self._state[seg.base_offset].seal_timestamp = int(time.time() * 1000)
                await self.on_change(self)
        finally:
            self._sealing = False

    async def _content_crc(self, seg: FileSegment) -> str:
        """CRC32C of a segment's committed bytes: the running value when this process wrote all
        of it, else read back."""
        crc = self._state[seg.base_offset].running_crc
        return f"{crc:08x}" if crc is not None else await stored_crc32c(seg)

    async def commit(self) -> int:
        """Commit every segment with buffered bytes, oldest first; then close and seal the full
        ones. Returns bytes committed. Raises on failure (bytes stay buffered; call again)."""
        done = 0
        tail = self._open_tail()
        for seg in tail:
            if seg.needs_commit:
                done += await seg.commit()
        rolled = tail[:-1]  # the open tail always ends with the last segment
        for seg in rolled:
            seg.close()
            self.unsealed_full.append(seg)
        if rolled:
            await self.seal_pending()
        return done

    # ------------------------------------------------------------------ reads
    def _segment_index(self, offset: int) -> int:
        lo, hi = 0, len(self.segments) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.segments[mid].base_offset <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def segment_end(self, offset: int) -> int:
        """End (exclusive, committed) of the segment holding ``offset`` — readers cut batches
        there so one batch costs one backend read per file."""
        seg = self.segments[self._segment_index(offset)]
        return seg.base_offset + seg.commit_position

    def segment_start(self, offset: int) -> int:
        """Base offset of the segment holding ``offset``."""
        return self.segments[self._segment_index(offset)].base_offset

    def object_bounds(self, offset: int, end: int) -> list[int]:
        """Offsets strictly inside ``[offset, end)`` of the segment holding ``offset`` where its
        stored objects meet (a hint from the driver's cache, no I/O): readers cut batches there
        so a sequential read costs one request per stored object."""
        seg = self.segments[self._segment_index(offset)]
        base = seg.base_offset
        return [base + p for p in seg.object_bounds(offset - base, end - base)]

    async def read(self, offset: int, length: int) -> bytes:
        """Committed bytes from ``offset``; crosses into the next segment if the range runs past
        the end of the first. Shorter than ``length`` only at the committed end."""
        i = self._check_read(offset, length)
        out: list[bytes] = []
        remaining = length
        while remaining > 0 and i < len(self.segments):
            seg = self.segments[i]
            pos = offset - seg.base_offset
            if pos >= seg.commit_position:
                break
            chunk = await seg.read(pos, remaining)
            out.append(chunk)
            remaining -= len(chunk)
            offset += len(chunk)
            i += 1
        return b"".join(out)

    async def read_into(self, offset: int, out: memoryview) -> int:
        """:meth:`read` of ``out.nbytes`` bytes received into ``out`` (memory the caller reuses;
        see :meth:`~tierd.drivers.segment.SegmentDriver.read_into`). Returns the bytes read:
        fewer only at the committed end."""
        i = self._check_read(offset, out.nbytes)
        done = 0
        while done < out.nbytes and i < len(self.segments):
            seg = self.segments[i]
            pos = offset + done - seg.base_offset
            if pos >= seg.commit_position:
                break
            done += await seg.read_into(pos, out[done:])
            i += 1
        return done

    def _check_read(self, offset: int, length: int) -> int:
        """Index of the segment a read of ``length`` bytes at ``offset`` starts in; raises
        :class:`~tierd.errors.SegmentReadError` outside the committed range."""
        if not self.segments:
            raise SegmentReadError(
                f"{self.path_of(0)}: cannot read {length} bytes at offset {offset}: no segments",
                offset=offset,
                length=length,
            )
        if offset < self.min_offset or offset >= self.commit_offset or length <= 0:
            raise SegmentReadError(
                f"{self.path_of(self.min_offset)}: cannot read {length} bytes at offset {offset}; "
                f"committed range is [{self.min_offset}, {self.commit_offset})",
                offset=offset,
                length=length,
            )
        return self._segment_index(offset)

    # ------------------------------------------------------------------ expiry
    async def destroy_before(self, offset: int) -> int:
        """Delete whole segments that end at or before ``offset`` (never the last one)."""
        doomed = 0
        while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
            seg = self.segments.pop(0)
            self._state.pop(seg.base_offset, None)
            if seg in self.unsealed_full:
                self.unsealed_full.remove(seg)
            with contextlib.suppress(SegmentNotFoundError):
                await seg.destroy()
            doomed += 1
        if doomed:
            await self.on_change(self)
        return doomed

    async def destroy(self) -> None:
        for seg in self.segments:
            await seg.destroy()
        self.segments = []
        self._state.clear()
        self.unsealed_full = []
        await self.on_change(self)


async def stored_crc32c(seg: FileSegment, on_piece: Callable[[int], None] | None = None) -> str:
    """CRC32C (8 hex digits) of a segment's committed bytes as the backend holds them, read in
    16 MiB pieces; ``on_piece(bytes)`` after each (progress)."""
    crc, pos = 0, 0
    while pos < seg.commit_position:
        piece = await seg.read(pos, min(CRC_PIECE, seg.commit_position - pos))
        crc = google_crc32c.extend(crc, piece)
        pos += len(piece)
        if on_piece is not None:
            on_piece(len(piece))
    return f"{crc:08x}"
