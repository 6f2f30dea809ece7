"""The commitlog: every message of every topic, appended in one sequence of files.

Appends happen under one lock which also assigns queue offsets, so commitlog order and queue
order always agree. A batch is laid out with numpy (offsets, file roll points) and written with
one ``memcpy`` per file. Each append hands a :class:`~tierd.local.dispatch.DispatchBatch` to the
reput thread, which builds consume queues and the key index from it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tierd.errors import CorruptRecordError, MessageTooLargeError
from tierd.format.batch import encode_batch
from tierd.format.record import (
    END_FILE_MIN_BLANK,
    blank_marker,
    decode_record,
    encode_record,
    store_timestamp_at,
)
from tierd.local.mapped_file import MappedFile, MappedFileQueue, offset_to_name
from tierd.local.prepare import place, untracked
from tierd.repeats import FailureLog

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tierd.format.message_ext import MessageExt
    from tierd.local.dispatch import DispatchBatch, SingleRecord
    from tierd.local.prepare import EncodedBatch, PreparedBatch, PreparedOne

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class CommitLog:
    def __init__(
        self, directory: Path, file_size: int, store_host: bytes, *, read_only: bool = False
    ) -> None:
        def open_file(path: Path, size: int, create: bool) -> MappedFile:
            return MappedFile(path, size, create, read_only=read_only)

        self.files: MappedFileQueue[MappedFile] = MappedFileQueue(
            directory, file_size, open_file, read_only=read_only
        )
        self.file_size = file_size
        self.store_host = store_host
        self.lock = threading.Lock()
        #: Next queue offset per (topic, queue id); only touched under ``lock``.
        self.queue_offsets: dict[tuple[str, int], int] = {}
        self.last_store_timestamp = 0
        #: Milliseconds since the epoch for STORETIMESTAMP; replaceable in tests.
        self.clock: Callable[[], int] = _now_ms
        #: Called under the lock with each appended batch, in commitlog order.
        self.on_append: Callable[[DispatchBatch | SingleRecord], None] = lambda batch: None

    # ------------------------------------------------------------------ offsets
    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    @property
    def max_offset(self) -> int:
        return self.files.max_offset

    # ------------------------------------------------------------------ append
    def append(
        self, batch: PreparedBatch | EncodedBatch
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
        """Append a prepared batch; return (queue offsets, physical offsets, end offset).

        All-or-nothing: the layout is planned and every file it needs is created *before* a byte
        is written or a queue offset assigned, so a failure (disk full) leaves no half batch
        behind — no phantom records, no holes in queue offsets."""
        from tierd.local.dispatch import DispatchBatch
        from tierd.local.prepare import EncodedBatch, stamp

        sizes = batch.sizes
        n = len(sizes)
        ends = np.cumsum(sizes)
        with self.lock:
            current = self.files.last_file()
            plan = self._plan(ends, sizes, current)
            self._create_files(plan, ends)
            now = self.clock()
            store_ts = now if now > self.last_store_timestamp else self.last_store_timestamp
            self.last_store_timestamp = store_ts
            qoffs = self._assign_queue_offsets(batch)
            phys = np.empty(n, np.int64)
            for start, i, k in plan:
                f = self.files.find(start)
                assert f is not None
                if current is not None and current is not f and current.free > 0:
                    current.write(blank_marker(current.free))
                    current.wrote = current.size
                current = f
                rel = int(ends[i - 1]) if i else 0
                phys[i:k] = f.file_from_offset + f.wrote - rel + ends[i:k] - sizes[i:k]
                if isinstance(batch, EncodedBatch):
                    # The records are encoded; write where and when they landed, then the run.
                    stop = stamp(batch.records, rel, qoffs[i:k], int(phys[i]), store_ts)
                    f.write_pieces([memoryview(batch.records)[rel:stop]])
                else:
                    f.write_pieces(self._encode(batch, i, k, qoffs, phys, store_ts))
            end = self.files.max_offset
            self.on_append(DispatchBatch.from_prepared(batch, qoffs, phys, store_ts, end))
        return qoffs, phys, end

    def _plan(
        self, ends: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64], current: MappedFile | None
    ) -> list[tuple[int, int, int]]:
        """Split records into runs per file: ``(file start offset, first, end)``. A record goes to
        the next file when it plus an 8-byte end marker does not fit in the rest of this one."""
        size = self.file_size
        start = current.file_from_offset if current else self.files.max_offset - self.files.max_offset % size
        wrote = current.wrote if current else 0
        plan: list[tuple[int, int, int]] = []
        i, n = 0, len(sizes)
        while i < n:
            rel = int(ends[i - 1]) if i else 0
            k = int(np.searchsorted(ends, rel + size - wrote - END_FILE_MIN_BLANK, side="right"))
            if k <= i:
                if wrote == 0:
                    raise MessageTooLargeError(
                        f"record of {int(sizes[i])} bytes does not fit in a commitlog file of {size} bytes "
                        "(store.commitlog_file_size)",
                        size=int(sizes[i]),
                    )
                start, wrote = start + size, 0
                continue
            plan.append((start, i, k))
            wrote += int(ends[k - 1]) - rel
            i = k
        return plan

    def _create_files(self, plan: list[tuple[int, int, int]], ends: npt.NDArray[np.int64]) -> None:
        """Create the files a plan needs and reserve disk blocks for every run of it (room for
        an end marker included); on failure remove the files just made (they are empty and
        last), so only the last file is ever without its end marker, and nothing is written."""
        created: list[MappedFile] = []
        try:
            for start in sorted({start for start, _, _ in plan}):
                if self.files.find(start) is None:
                    created.append(self.files.new_file(start))
            for start, i, k in plan:
                f = self.files.find(start)
                assert f is not None
                rel = int(ends[i - 1]) if i else 0
                f.reserve(f.wrote + int(ends[k - 1]) - rel + END_FILE_MIN_BLANK)
        except BaseException:
            self.files.discard(created)
            raise

    def append_one(self, p: PreparedOne) -> tuple[int, int, int]:
        """Append one prepared message; return (queue offset, physical offset, end offset).

        The single-put path runs this once per message, so it is written flat: no property or
        helper call that the common case (the record fits in the current file, whose blocks
        are already reserved) does not need. The record arrives encoded (by the encoder that
        writes a batch's records, see :meth:`~tierd.local.prepare.Preparer.prepare_one`); one
        :func:`~tierd.local.prepare.place` call copies it into the mapping and writes its queue
        offset, physical offset and store timestamp. Nothing counts as written (``wrote``, queue
        offset) until all of it is."""
        key, record, tags, hashes, store_ts_at, size = p
        with self.lock:
            now = self.clock()
            store_ts = self.last_store_timestamp
            if now > store_ts:
                self.last_store_timestamp = store_ts = now
            files = self.files.files
            f = files[-1] if files else None
            if f is None or f.size - f.wrote < size + END_FILE_MIN_BLANK:
                f = self._next_file(f, size)
            pos = f.wrote
            end_at = pos + size
            if end_at + END_FILE_MIN_BLANK > f.reserved:
                f.reserve(end_at + END_FILE_MIN_BLANK)  # before any byte or queue offset
            table = self.queue_offsets
            qoff = table.get(key, 0)
            phys = f.file_from_offset + pos
            # The mapping itself, not the ``mm`` property (a call a put); a closed file has none
            # and the property raises the typed error.
            place(f._mm or f.mm, pos, record, qoff, phys, store_ts, store_ts_at)
            f.wrote = end_at
            table[key] = qoff + 1
            end = phys + size
            self.on_append(untracked((key, qoff, phys, size, tags, store_ts, hashes, end)))
        return qoff, phys, end

    def _next_file(self, f: MappedFile | None, size: int) -> MappedFile:
        """The file a record of ``size`` bytes goes to when the last one lacks room: end the
        last one with its blank marker and start the next."""
        # free == 0: the file already ends in its blank marker (e.g. recovery dropped a torn
        # first record of the next file); just start the next file.
        if f is not None and f.free > 0:
            if f.wrote == 0:
                raise MessageTooLargeError(
                    f"record of {size} bytes does not fit in a commitlog file of {f.size} bytes "
                    "(store.commitlog_file_size)",
                    size=size,
                )
            f.write(blank_marker(f.free))
            f.wrote = f.size
        return self.files.writable_file(self.files.max_offset)

    def _assign_queue_offsets(self, batch: PreparedBatch | EncodedBatch) -> npt.NDArray[np.int64]:
        table = self.queue_offsets
        n = len(batch.sizes)
        if len(batch.groups) == 1:
            key = batch.groups[0][0]
            base = table.get(key, 0)
            table[key] = base + n
            return np.arange(base, base + n, dtype=np.int64)
        qoffs = np.empty(n, np.int64)
        for key, idx in batch.groups:
            base = table.get(key, 0)
            table[key] = base + len(idx)
            qoffs[idx] = np.arange(base, base + len(idx), dtype=np.int64)
        return qoffs

    def _encode(
        self,
        b: PreparedBatch,
        i: int,
        k: int,
        qoffs: npt.NDArray[np.int64],
        phys: npt.NDArray[np.int64],
        store_ts: int,
    ) -> list[bytes]:
        if b.uniform_v4:
            return encode_batch(
                bodies=b.bodies[i:k],
                tails=b.tails[i:k],
                magics=b.magics[i:k],
                crcs=b.crcs[i:k],
                queue_ids=b.queue_ids[i:k],
                flags=b.flags[i:k],
                queue_offsets=qoffs[i:k],
                physical_offsets=phys[i:k],
                sizes=b.sizes[i:k],
                body_lengths=b.body_lengths[i:k],
                born_timestamps=b.born_timestamps[i:k],
                born_host=b.born_hosts[0],
                store_timestamp=store_ts,
                store_host=self.store_host,
            )
        return [
            encode_record(
                body=b.bodies[j],
                topic_part=b.topic_parts[j],
                magic=int(b.magics[j]),
                properties=b.tails[j][len(b.topic_parts[j]) + 2 :],
                queue_id=int(b.queue_ids[j]),
                flag=int(b.flags[j]),
                queue_offset=int(qoffs[j]),
                physical_offset=int(phys[j]),
                sys_flag=0,
                born_timestamp=int(b.born_timestamps[j]),
                born_host=b.born_hosts[j % len(b.born_hosts)],
                store_timestamp=store_ts,
                store_host=self.store_host,
                body_crc=int(b.crcs[j]),
            )
            for j in range(i, k)
        ]

    # ------------------------------------------------------------------ reads
    def read(self, offset: int, *, check_crc: bool = False) -> MessageExt:
        """Decode the record at commitlog ``offset``; raise CorruptRecordError if it is not one."""
        f = self.files.find(offset)
        if f is None:
            raise CorruptRecordError(
                f"commitlog offset {offset} is not stored (range {self.min_offset}..{self.max_offset})",
                position=offset,
            )
        return decode_record(f.view, offset - f.file_from_offset, limit=f.wrote, check_crc=check_crc)

    def read_bytes(self, offset: int, size: int) -> bytes:
        f = self.files.find(offset)
        at = offset - f.file_from_offset if f else -1
        if f is None or at + size > f.wrote:
            raise CorruptRecordError(f"commitlog range {offset}+{size} is not stored", position=offset)
        return bytes(f.view[at : at + size])

    def gather(self, offsets: list[int], sizes: list[int], into: bytearray | None = None) -> memoryview:
        """The records at ``offsets`` back to back, copied once into one buffer (the tiering
        dispatcher's read path: one copy per record instead of a bytes object each): the first
        bytes of ``into`` (a buffer reused from batch to batch: fresh pages would be zeroed and
        faulted in for every batch), or a new buffer when that is missing or too small. The
        view's ``obj`` is the buffer used."""
        total = sum(sizes)
        if into is None or len(into) < total:
            into = bytearray(total)
        mv = memoryview(into)[:total]
        pos = 0
        f = None
        for off, size in zip(offsets, sizes, strict=True):
            if f is None or not f.file_from_offset <= off < f.file_from_offset + f.size:
                f = self.files.find(off)
                if f is None:
                    raise CorruptRecordError(f"commitlog offset {off} is not stored", position=off)
            at = off - f.file_from_offset
            if at + size > f.wrote:
                raise CorruptRecordError(f"commitlog range {off}+{size} is not stored", position=off)
            mv[pos : pos + size] = f.view[at : at + size]
            pos += size
        return mv

    def store_timestamp_at(self, offset: int) -> int | None:
        """STORETIMESTAMP of the record at ``offset`` without decoding the body; None when the
        commitlog no longer (or never) held that offset."""
        f = self.files.find(offset)
        if f is None:
            return None
        return store_timestamp_at(f.view, offset - f.file_from_offset)

    def recreate_missing(self, end: int) -> tuple[int, list[str]] | None:
        """Files missing below ``end`` (the durable end the checkpoint recorded) at the top of
        the log — deleted or lost while the store was stopped: recreate them as zeros, so the
        log continues *after* ``end`` and no commitlog offset (a message id) is handed out
        twice. Returns where the missing bytes start and the missing files' names, or None.
        Read-only: the names are those it would recreate; nothing is created."""
        last = self.files.last_file()
        present = last.file_from_offset + last.size if last is not None else 0
        if end <= present:
            return None
        # No file left at all: recreate only the one holding ``end`` (the older ones would only
        # hold expired or missing bytes; their offsets are below the new floor either way).
        pos = present if last is not None else end - end % self.file_size
        names: list[str] = []
        while pos < end or (last is None and not names):
            if self.files.read_only:
                names.append(offset_to_name(pos))
            else:
                names.append(self.files.new_file(pos).path.name)
            pos += self.file_size
        return present, names

    def truncate(self, offset: int) -> None:
        self.files.truncate(offset)
        last = self.files.last_file()
        if last is not None:
            last.wrote = min(last.size, offset - last.file_from_offset)
            last.flushed = last.wrote
        for f in self.files.files[:-1]:
            f.wrote = f.flushed = f.size

    def flush(self) -> int:
        return self.files.flush()

    def close(self) -> None:
        self.files.close()


class Prefaulter:
    """Keeps the pages ahead of the commitlog write position faulted in (see
    :meth:`MappedFile.populate`), so appends copy into ready pages. Best effort: disables itself
    where the kernel lacks the call."""

    AHEAD = 32 * 1024 * 1024
    CHUNK = 8 * 1024 * 1024

    def __init__(self, commitlog: CommitLog) -> None:
        self.commitlog = commitlog
        self._wake = threading.Event()
        self._stopping = False
        self.enabled = True
        self._thread = threading.Thread(target=self._run, name="tierd-prefault", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping and self.enabled:
            self._wake.wait(0.05)
            self._wake.clear()
            f = self.commitlog.files.last_file()
            # Within the reserved range only: populating a hole would allocate it unchecked.
            while (
                f is not None and not self._stopping and f.populated < min(f.reserved, f.wrote + self.AHEAD)
            ):
                if not f.populate(self.CHUNK):
                    log.info("page pre-faulting unavailable on this kernel; appends fault pages themselves")
                    self.enabled = False
                    return

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()


class FlushService:
    """Makes commitlog bytes durable.

    ``async`` mode flushes every ``interval_ms``. ``sync`` mode is group commit: each put
    registers the end offset it needs durable and gets a future; the flusher thread takes every
    pending request at once, does one ``fdatasync`` (which releases the GIL, so producers keep
    appending meanwhile), and completes all requests it covered. Concurrent producers therefore
    share fsyncs, and a put returns only after its bytes are on disk.
    """

    def __init__(self, commitlog: CommitLog, sync: bool, interval_ms: int) -> None:
        self.commitlog = commitlog
        self.sync = sync
        self.interval = interval_ms / 1000
        self._cond = threading.Condition()
        self._requests: list[tuple[int, concurrent.futures.Future[None]]] = []
        self._stopping = False
        self.flushed_offset = commitlog.max_offset
        #: Store timestamp of the newest record known durable (for the checkpoint).
        self.flushed_timestamp = commitlog.last_store_timestamp
        self.fsyncs = 0
        self._failures = FailureLog(log, "commitlog flush")
        self.requests_served = 0
        self._thread = threading.Thread(target=self._run, name="tierd-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def request(self, end_offset: int) -> concurrent.futures.Future[None]:
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                fut.set_exception(RuntimeError("store is closing"))
                return fut
            self._requests.append((end_offset, fut))
            self._cond.notify()
        return fut

    def _flush_once(self) -> None:
        ts = self.commitlog.last_store_timestamp
        self.flushed_offset = self.commitlog.flush()
        self.flushed_timestamp = ts
        self.fsyncs += 1

    def _run(self) -> None:
        while True:
            with self._cond:
                if self.sync:
                    while not self._requests and not self._stopping:
                        self._cond.wait(self.interval)
                        if not self._requests and not self._stopping:
                            break  # idle tick: still flush (covers async-mode appends, e.g. recovery)
                else:
                    self._cond.wait_for(lambda: self._stopping, self.interval)
                requests, self._requests = self._requests, []
                stopping = self._stopping
            try:
                self._flush_once()
            except Exception as e:
                # A failing disk fails every attempt alike: one line, then one a minute.
                self._failures.failed(e, f"retrying every {self.interval * 1000:.0f} ms")
                for _, fut in requests:
                    fut.set_exception(e)
                if stopping:
                    return  # stop() tries once more itself and reports the error to the closer
                continue
            self._failures.succeeded()
            done = self.flushed_offset
            pending: list[tuple[int, concurrent.futures.Future[None]]] = []
            for end, fut in requests:
                if end <= done:
                    fut.set_result(None)
                else:
                    pending.append((end, fut))
            self.requests_served += len(requests) - len(pending)
            if pending:
                with self._cond:
                    self._requests[:0] = pending
            if stopping and not self._requests:
                return

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        self._flush_once()
