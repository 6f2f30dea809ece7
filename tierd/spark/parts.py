"""What a batch read of the cold tier reads, and reading it — without pyspark.

The Spark source (:mod:`tierd.spark.source`) and the Arrow reader (:mod:`tierd.arrow`) read the
same way: a key lookup through the cold index when the read is restricted to keys, else every
range the manifests leave after pruning, record-filtered through the consume queue's tag codes
when ``tags`` is restricted. This module is the one place that decides between those paths, so
both readers return the same rows for the same constraints. Spark wraps each :class:`ReadPart`
in its ``InputPartition`` (its tasks run in parallel); the Arrow reader reads them in order
through :func:`read_parts`, which reads ahead.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast

from tierd.errors import TierdError

if TYPE_CHECKING:
    from collections.abc import Generator, Iterable, Iterator

    import pyarrow as pa

    from tierd.spark.filters import Constraints
    from tierd.spark.options import ReadOptions
    from tierd.spark.plan import CqSegment, SegmentRange
    from tierd.spark.storage import ColdStorage

__all__ = ["READ_AHEAD_PARTS", "READ_AHEAD_PIECES", "ReadPart", "plan_parts", "read_part", "read_parts"]

log = logging.getLogger(__name__)

#: Pieces (:data:`~tierd.spark.decode.READ_PIECE`, the decoder's unit of reading) of the parts
#: after the one being consumed that :func:`read_parts` reads ahead, as the plan knows their
#: sizes; one part is always read ahead, however large. Two: enough to keep a request in flight
#: while a whole piece decodes, few enough that a scan's memory stays a handful of pieces.
READ_AHEAD_PIECES: Final = 2
#: At most this many parts are read ahead, however small (a thread and a request each): enough
#: to keep requests for small parts (open segments' tails, key lookups' records) in flight
#: while the earlier ones decode, without a thread per queue of a thousand-queue topic.
READ_AHEAD_PARTS: Final = 8
#: Seconds between two looks at the stop flag while a reader waits on its hand-over queue.
_POLL: Final = 0.05
#: Bound on waiting, when a scan stops early, for the parts read ahead to stop: they stop at
#: their next batch, so only a request in flight (bounded by the client's own timeouts) or one
#: piece's decoding can hold them up.
_STOP_WAIT: Final = 120.0


@dataclass(frozen=True, slots=True)
class ReadPart:
    """One unit of a read: commitlog ranges (``spans``: exact record runs a key lookup found,
    else whole ranges, record-filtered by consume-queue tag codes when ``cq`` is given)."""

    ranges: tuple[SegmentRange, ...]
    spans: bool = False
    cq: tuple[CqSegment, ...] | None = None


def plan_parts(storage: ColdStorage, options: ReadOptions, c: Constraints) -> list[ReadPart]:
    """The parts of a batch read, in (cluster, broker, topic, queue, position) order within each
    path: key lookups read only what the index found (plus what it cannot vouch for), other
    reads every range the manifest bounds leave."""
    from tierd.spark.lookup import plan_key_lookup
    from tierd.spark.plan import load_queues, plan_ranges

    queues = load_queues(storage, options, c)
    keys = c.lookup_keys
    if keys is not None:
        kp = plan_key_lookup(storage, options, c, queues, keys)
        return [ReadPart((r,)) for r in kp.scans] + [ReadPart(tuple(s), spans=True) for s in kp.lookups]
    cq = {q.key: q.cq_segments() for q in queues} if c.tags is not None else {}
    return [
        ReadPart((r,), cq=cq.get(f"{r.cluster}/{r.broker}/{r.topic}/{r.queue_id}"))
        for r in plan_ranges(storage, options, c, queues)
    ]


def read_part(
    storage: ColdStorage, part: ReadPart, constraints: Constraints, schema: pa.Schema
) -> Generator[pa.RecordBatch]:
    """Decode one part into ``schema`` (a selection of :data:`~tierd.spark.decode.ARROW_SCHEMA`),
    every row checked against ``constraints``; one batch per piece read (bounded memory)."""
    from tierd.spark.decode import read_range
    from tierd.spark.sparse import read_spans, read_tagged

    if part.spans:
        yield from read_spans(storage, part.ranges, constraints, schema)
        return
    for r in part.ranges:
        it = None
        if part.cq is not None and constraints.tags is not None:
            it = read_tagged(storage, r, part.cq, constraints.tags, constraints, schema)
        yield from it if it is not None else read_range(storage, r, constraints, schema=schema)


def _part_bytes(part: ReadPart) -> int:
    """What the plan knows a part will read (the read-ahead's byte bound counts this)."""
    return sum(r.known_bytes for r in part.ranges)


def _where(part: ReadPart) -> str:
    """A part for messages: its first segment, and how many ranges it has."""
    more = f" and {len(part.ranges) - 1} more ranges" if len(part.ranges) > 1 else ""
    return f"{part.ranges[0].path}{more}" if part.ranges else "an empty part"


class _Ahead:
    """One part being read in its own thread: each batch is handed over through a one-slot queue,
    so the thread runs at most one batch ahead of its consumer (plus the piece its read has in
    flight) and then waits. Its outcome — the end, or the exception it raised — is handed over
    in order after its batches."""

    _END: Final = object()

    def __init__(
        self,
        storage: ColdStorage,
        part: ReadPart,
        constraints: Constraints,
        schema: pa.Schema,
        stop: threading.Event,
    ) -> None:
        self.part = part
        self.bytes = _part_bytes(part)
        self._args = (storage, part, constraints, schema)
        self._stop = stop
        self._handover: queue.Queue[object] = queue.Queue(maxsize=1)
        self.thread = threading.Thread(target=self._run, name="tierd-read-ahead", daemon=True)
        self.thread.start()

    def _offer(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._handover.put(item, timeout=_POLL)
            except queue.Full:
                continue
            else:
                return True
        return False

    def _run(self) -> None:
        batches = read_part(*self._args)
        try:
            for batch in batches:
                if not self._offer(batch):
                    return  # the scan stopped: close the read (its own read-ahead included)
            self._offer(self._END)
        except BaseException as e:  # handed to the consumer, raised there in order
            self._offer(e)
        finally:
            batches.close()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The part's batches, then its end or its exception. Waits as long as the read does:
        its requests are bounded by the client's timeouts, which end it with a typed error."""
        while True:
            try:
                item = self._handover.get(timeout=_POLL)
            except queue.Empty:
                if self.thread.is_alive() or not self._handover.empty():
                    continue
                raise TierdError(f"the read of {_where(self.part)} ended without a result") from None
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield cast("pa.RecordBatch", item)


def read_parts(
    storage: ColdStorage,
    parts: Iterable[ReadPart],
    constraints: Constraints,
    schema: pa.Schema,
    *,
    ahead_bytes: int | None = None,
    ahead_parts: int = READ_AHEAD_PARTS,
) -> Generator[pa.RecordBatch]:
    """:func:`read_part` of each part, in order, with the next parts read ahead: each part is
    read and decoded in a thread of its own while the parts before it are consumed, so a part's
    first request — which nothing overlapped when parts were read one after another — is in
    flight while the previous part decodes, and two parts decode at once where the decoder
    releases the GIL.

    Bounded: parts are started ahead while the bytes the plan knows of for them stay within
    ``ahead_bytes`` (default :data:`READ_AHEAD_PIECES` pieces; at least one part is always
    ahead) and they are at most ``ahead_parts`` (0 in either reads one part at a time, in this
    thread); each runs at most one batch ahead of its consumer. Batches come
    out in the parts' order and a failure surfaces where it happened: after every batch of the
    parts before it, never in place of one. Stopping early (closing this iterator) stops the
    parts read ahead at their next batch and waits for them, so no read outlives the scan."""
    from tierd.spark.decode import READ_PIECE

    budget = READ_AHEAD_PIECES * READ_PIECE if ahead_bytes is None else ahead_bytes
    if budget <= 0 or ahead_parts <= 0:
        for part in parts:
            yield from read_part(storage, part, constraints, schema)
        return
    storage.records_fs  # noqa: B018 - made once here, not by two reads racing to make it
    pending = iter(parts)
    stop = threading.Event()
    running: deque[_Ahead] = deque()
    planned = 0  # known bytes of the parts running beyond the one being consumed

    def fill() -> None:
        nonlocal planned
        while len(running) < 2 or (planned < budget and len(running) <= ahead_parts):
            part = next(pending, None)
            if part is None:
                return
            reader = _Ahead(storage, part, constraints, schema, stop)
            running.append(reader)
            if len(running) > 1:
                planned += reader.bytes

    try:
        fill()
        while running:
            yield from running[0].batches()
            running.popleft()
            if running:
                planned -= running[0].bytes
            fill()
    finally:
        stop.set()
        for reader in running:
            reader.thread.join(_STOP_WAIT)
            if reader.thread.is_alive():
                log.warning(
                    "a part read ahead (%s) did not stop within %.0f s of the scan stopping; "
                    "it ends with its request",
                    _where(reader.part),
                    _STOP_WAIT,
                )
