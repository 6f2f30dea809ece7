"""FlatMessageFile: the cold commitlog + consume queue of one topic/queue (FORMATS §2.2).

Records are copied byte for byte from the hot commitlog except PHYSICALOFFSET, rewritten (with
numpy, for the whole batch at once) to the record's offset in this queue's flat commitlog. The
flat consume queue holds 20-byte units pointing into it. Commit order is commitlog first, consume
queue second, so a committed unit always points at committed bytes — and **the consume queue's
committed end is the only thing readers trust**.

After a crash the commitlog may hold records the consume queue does not reference yet (the CL
commit landed, the CQ commit did not). :meth:`recover` rolls them forward: each is parsed,
CRC-checked, checked to carry the next queue offset and its own flat offset, and indexed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tierd.drivers.segment import DriverRoot, FileType
from tierd.errors import CorruptionError
from tierd.format.columns import decode_field, field_span
from tierd.format.cq_unit import UNIT_SIZE, decode_units, encode_units, tags_code
from tierd.format.layout import field_column, set_field_column
from tierd.format.properties import decode_properties as _decode_properties
from tierd.format.record import VALID, scan_record
from tierd.tiered.flatfile import ChangeHook, FlatAppendFile, ignore_change

if TYPE_CHECKING:
    from tierd.config import TieredConfig

log = logging.getLogger(__name__)
#: Where a record's QUEUEOFFSET is: a segment whose first record's QUEUEOFFSET is committed has
#: at least ``_QUEUE_OFFSET_END`` bytes.
_QUEUE_OFFSET_AT, _QUEUE_OFFSET_END = field_span("queue_offset")
#: Roll-forward reads the orphan commitlog tail in pieces of this size.
RECOVERY_READ = 16 * 1024 * 1024


@dataclass(slots=True)
class CommittedBatch:
    """Messages that became readable in the cold tier by one commit (the index hand-off)."""

    topic: str
    queue_id: int
    first_queue_offset: int
    flat_offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    store_timestamps: npt.NDArray[np.int64]
    records: bytes = field(repr=False)


class FlatMessageFile:
    def __init__(
        self,
        root: DriverRoot,
        cfg: TieredConfig,
        topic: str,
        queue_id: int,
        on_change: ChangeHook = ignore_change,
    ) -> None:
        self.topic, self.queue_id = topic, queue_id
        self.commitlog = FlatAppendFile(
            root,
            cfg.cluster,
            cfg.broker,
            topic,
            queue_id,
            FileType.COMMIT_LOG,
            cfg.commitlog_segment_size,
            on_change=on_change,
            roll_after_ms=int(cfg.rolling_interval * 3_600_000),
            roll_min_size=cfg.rolling_min_size,
        )
        cq_size = max(UNIT_SIZE, cfg.consumequeue_segment_size - cfg.consumequeue_segment_size % UNIT_SIZE)
        self.consumequeue = FlatAppendFile(
            root,
            cfg.cluster,
            cfg.broker,
            topic,
            queue_id,
            FileType.CONSUME_QUEUE,
            cq_size,
            on_change=on_change,
        )
        #: Appended but not yet committed (handed to the index once committed).
        self._uncommitted: list[CommittedBatch] = []

    # ------------------------------------------------------------------ offsets (queue offsets)
    @property
    def initialised(self) -> bool:
        return not self.consumequeue.empty

    # The offsets of a file that is not initialised raise CorruptionError (FlatAppendFile):
    # every file a FlatFileStore holds is.
    @property
    def min_offset(self) -> int:
        return self.consumequeue.min_offset // UNIT_SIZE

    @property
    def max_offset(self) -> int:
        """One past the last committed (readable) message."""
        return self.consumequeue.commit_offset // UNIT_SIZE

    @property
    def append_offset(self) -> int:
        """One past the last appended (possibly uncommitted) message."""
        return self.consumequeue.append_offset // UNIT_SIZE

    @property
    def needs_commit(self) -> bool:
        return self.commitlog.needs_commit or self.consumequeue.needs_commit

    @property
    def pending_bytes(self) -> int:
        """Commitlog bytes the next commit uploads from the last segment (what an upload rate
        limit meters; the consume queue's 20 bytes a message are not counted)."""
        return self.commitlog.pending_bytes

    async def first_queue_offsets(self) -> list[int | None]:
        """Queue offset of each commitlog segment's first record: tracked at append, else read
        from the record's QUEUEOFFSET field (one 8-byte ranged read) and remembered."""
        cl = self.commitlog
        out: list[int | None] = []
        for seg in cl.segments:
            known = cl.first_queue_offset(seg.base_offset)
            if known is None and seg.commit_position >= _QUEUE_OFFSET_END:
                raw = await seg.read(_QUEUE_OFFSET_AT, _QUEUE_OFFSET_END - _QUEUE_OFFSET_AT)
                known = decode_field("queue_offset", raw)
                cl.learn_first_queue_offset(seg.base_offset, known)
            out.append(known)
        return out

    async def init_offset(self, queue_offset: int) -> None:
        """Start tiering this queue at ``queue_offset`` (flat commitlog starts at 0)."""
        await self.commitlog.init_offset(0)
        await self.consumequeue.init_offset(queue_offset * UNIT_SIZE)

    # ------------------------------------------------------------------ append / commit
    async def append_batch(
        self,
        records: bytes | bytearray | memoryview,
        sizes: npt.NDArray[np.int64],
        first_queue_offset: int,
        tags_codes: npt.NDArray[np.int64],
        store_timestamps: npt.NDArray[np.int64],
    ) -> None:
        """Append consecutive messages of this queue, starting at ``first_queue_offset``.

        Verifies every record carries the expected QUEUEOFFSET (a wrong message is never
        tiered), rewrites PHYSICALOFFSET to the flat offset, and splits the batch at segment
        boundaries so no record straddles two segments."""
        self._check_continues(first_queue_offset, "batch")
        n = len(sizes)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        if int(ends[-1]) != len(records):
            raise CorruptionError(f"record sizes add up to {int(ends[-1])}, batch has {len(records)} bytes")
        # A bytearray (the dispatcher's gather buffer) is patched in place; bytes are copied.
        buf = np.frombuffer(records, np.uint8)
        if not buf.flags.writeable:
            buf = buf.copy()
        qoffs = field_column(buf, starts, "queue_offset")
        expected = np.arange(first_queue_offset, first_queue_offset + n, dtype=np.int64)
        if not np.array_equal(qoffs, expected):
            bad = int(np.flatnonzero(qoffs != expected)[0])
            raise CorruptionError(
                f"{self.topic}/{self.queue_id}: record {bad} of the batch has queue offset "
                f"{int(qoffs[bad])}, expected {int(expected[bad])}",
                index=bad,
            )
        flat = self.commitlog.append_offset + starts
        set_field_column(buf, starts, "physical_offset", flat)
        patched = buf.tobytes()
        await self._append_split(self.commitlog, patched, ends, store_timestamps, first_queue_offset)
        units = encode_units(flat, sizes, tags_codes)
        await self._append_split(
            self.consumequeue,
            units,
            np.arange(1, n + 1, dtype=np.int64) * UNIT_SIZE,
            store_timestamps,
            first_queue_offset,
        )
        self._uncommitted.append(
            CommittedBatch(
                self.topic,
                self.queue_id,
                first_queue_offset,
                flat,
                sizes.astype(np.int64),
                store_timestamps,
                patched,
            )
        )

    async def append_holes(self, first_queue_offset: int, count: int, timestamp: int) -> None:
        """Append ``count`` consecutive queue offsets whose messages were lost before they could
        be tiered (quarantined damage in the hot commitlog): consume-queue units of size 0 at
        the current commitlog end, and no commitlog bytes. A reader meeting one reports the
        hole (:class:`~tierd.errors.LostMessagesError`); nothing is ever fabricated."""
        self._check_continues(first_queue_offset, "hole")
        flat = np.full(count, self.commitlog.append_offset, np.int64)
        units = encode_units(flat, np.zeros(count, np.int64), np.zeros(count, np.int64))
        await self._append_split(
            self.consumequeue,
            units,
            np.arange(1, count + 1, dtype=np.int64) * UNIT_SIZE,
            np.full(count, timestamp, np.int64),
            first_queue_offset,
        )

    def _check_continues(self, first_queue_offset: int, what: str) -> None:
        if first_queue_offset != self.append_offset:
            raise CorruptionError(
                f"{self.topic}/{self.queue_id}: {what} starts at queue offset {first_queue_offset}, "
                f"cold tier expects {self.append_offset}",
                expected=self.append_offset,
                got=first_queue_offset,
            )

    @staticmethod
    async def _append_split(
        file: FlatAppendFile,
        data: bytes,
        ends: npt.NDArray[np.int64],
        timestamps: npt.NDArray[np.int64],
        first_queue_offset: int,
    ) -> None:
        """Append ``data`` (items ending at ``ends``, the first being queue offset
        ``first_queue_offset``) in runs that fit the current segment."""
        i, n = 0, len(ends)
        while i < n:
            rel = int(ends[i - 1]) if i else 0
            k = int(np.searchsorted(ends, rel + file.room(), side="right"))
            if k <= i:
                if file.segments[-1].append_position == 0:
                    raise CorruptionError(
                        f"an item of {int(ends[i]) - rel} bytes exceeds the segment size {file.max_size}",
                        size=int(ends[i]) - rel,
                    )
                await file.roll()
                continue
            await file.append(
                data[rel : int(ends[k - 1])], int(timestamps[i:k].min()), first_queue_offset + i
            )
            file.extend_max_timestamp(int(timestamps[i:k].max()))
            i = k

    @property
    def uncommitted_batches(self) -> int:
        return len(self._uncommitted)

    async def commit_commitlog(self) -> None:
        """Upload buffered commitlog bytes only. Readers see nothing new until :meth:`commit`
        also commits the consume queue — deferring that saves one PUT per batch on object
        stores, and a crash in between is repaired by :meth:`recover` (roll-forward)."""
        await self.commitlog.commit()

    async def commit(self) -> list[CommittedBatch]:
        """Commit commitlog, then consume queue. Returns the batches that became readable.
        Raises on failure; the data stays buffered and a later call retries (see FileSegment)."""
        await self.commitlog.commit()
        await self.consumequeue.commit()
        done, self._uncommitted = self._uncommitted, []
        return done

    # ------------------------------------------------------------------ reads
    async def read_units(self, queue_offset: int, count: int) -> npt.NDArray[np.void]:
        raw = await self.consumequeue.read(queue_offset * UNIT_SIZE, count * UNIT_SIZE)
        return decode_units(raw)

    async def read_commitlog(self, flat_offset: int, length: int) -> bytes:
        return await self.commitlog.read(flat_offset, length)

    async def read_commitlog_into(self, flat_offset: int, out: memoryview) -> int:
        """Commitlog bytes from ``flat_offset`` received into ``out``; how many (fewer only at
        the committed end)."""
        return await self.commitlog.read_into(flat_offset, out)

    # ------------------------------------------------------------------ recovery
    async def recover(self) -> int:
        """Make the consume queue reference every whole, valid record the commitlog holds
        (roll-forward after a crash between the two commits). Returns how many were added."""
        cq = self.consumequeue
        if cq.empty or self.commitlog.empty:
            return 0
        last = cq.segments[-1]
        whole = last.commit_position - last.commit_position % UNIT_SIZE
        if whole != last.commit_position:
            log.warning("%s: dropping a torn consume-queue unit at the end", last.path)
            last.init_position(whole)
        if self.max_offset > self.min_offset:
            unit = (await self.read_units(self.max_offset - 1, 1))[0]
            truth_end = int(unit["offset"]) + int(unit["size"])
        else:
            truth_end = self.commitlog.min_offset
        cl_end = self.commitlog.commit_offset
        if cl_end < truth_end:
            raise CorruptionError(
                f"{self.topic}/{self.queue_id}: consume queue references commitlog bytes up to {truth_end}, "
                f"but the commitlog holds only {cl_end}",
                truth_end=truth_end,
                commitlog_end=cl_end,
            )
        added = 0
        pos = truth_end
        next_qoff = self.max_offset
        while pos < cl_end:
            chunk = await self.commitlog.read(pos, min(RECOVERY_READ, cl_end - pos))
            at = 0
            offs: list[int] = []
            sizes: list[int] = []
            tags: list[int] = []
            stamps: list[int] = []
            while at < len(chunk):
                status, size, view = scan_record(chunk, at, len(chunk), True)
                if (
                    status != VALID
                    or view is None
                    or view.physical_offset != pos + at
                    or view.queue_offset != next_qoff
                ):
                    break
                offs.append(pos + at)
                sizes.append(size)
                tags.append(
                    tags_code(_decode_properties(view.properties).get("TAGS")) if view.properties else 0
                )
                stamps.append(view.store_timestamp)
                next_qoff += 1
                at += size
            if offs:
                units = encode_units(
                    np.array(offs, np.int64), np.array(sizes, np.int64), np.array(tags, np.int64)
                )
                ts = np.array(stamps, np.int64)
                await self._append_split(
                    cq,
                    units,
                    np.arange(1, len(offs) + 1, dtype=np.int64) * UNIT_SIZE,
                    ts,
                    next_qoff - len(offs),
                )
                added += len(offs)
            if at < len(chunk) or not offs:
                end = pos + at
                if end < cl_end:
                    seg = self.commitlog.segments[-1]
                    if end < seg.base_offset:
                        # Rolled segments are whole (FlatAppendFile.load): this is real damage.
                        raise CorruptionError(
                            f"{self.topic}/{self.queue_id}: the cold commitlog holds no valid record at "
                            f"flat offset {end}, inside the rolled segment before {seg.path}",
                            flat_offset=end,
                        )
                    log.warning(
                        "%s: commitlog bytes after flat offset %d are not a valid record; the next "
                        "commit rewrites them",
                        seg.path,
                        end,
                    )
                    seg.init_position(end - seg.base_offset)
                break
            pos += at
        if added:
            await cq.commit()
            log.info(
                "%s/%d: rolled %d committed commitlog records forward into the consume queue",
                self.topic,
                self.queue_id,
                added,
            )
        return added

    async def expire(self, expire_before_ms: int) -> tuple[int, int]:
        """Cold retention: delete leading consume-queue segments whose newest message is older than
        ``expire_before_ms`` (never the last segment), then the commitlog segments lying wholly
        before the first unit still referenced. Consume queue first, so a unit never points at
        deleted bytes (RocketMQ #9371). Returns (CQ segments, CL segments) deleted."""
        cq = self.consumequeue
        if cq.empty:
            return 0, 0
        keep_from = cq.segments[-1].base_offset
        for seg in cq.segments[:-1]:
            if seg.max_timestamp is None or seg.max_timestamp >= expire_before_ms:
                keep_from = seg.base_offset
                break
        cq_deleted = await cq.destroy_before(keep_from)
        cl_deleted = 0
        if self.max_offset > self.min_offset:
            first = (await self.read_units(self.min_offset, 1))[0]
            cl_deleted = await self.commitlog.destroy_before(int(first["offset"]))
        if cq_deleted or cl_deleted:
            log.info(
                "%s/%d: cold retention deleted %d consume-queue and %d commitlog segment(s); queue now "
                "starts at offset %d",
                self.topic,
                self.queue_id,
                cq_deleted,
                cl_deleted,
                self.min_offset,
            )
        return cq_deleted, cl_deleted

    async def destroy(self) -> None:
        await self.consumequeue.destroy()
        await self.commitlog.destroy()
