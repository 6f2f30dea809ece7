"""What a batch read of the cold tier reads, and reading it — without pyspark.

The Spark source (:mod:`tierd.spark.source`) and the Arrow reader (:mod:`tierd.arrow`) read the
same way: a key lookup through the cold index when the read is restricted to keys, else every
range the manifests leave after pruning, record-filtered through the consume queue's tag codes
when ``tags`` is restricted. This module is the one place that decides between those paths, so
both readers return the same rows for the same constraints. Spark wraps each :class:`ReadPart`
in its ``InputPartition``; the Arrow reader reads them in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa

    from tierd.spark.filters import Constraints
    from tierd.spark.options import ReadOptions
    from tierd.spark.plan import CqSegment, SegmentRange
    from tierd.spark.storage import ColdStorage

__all__ = ["ReadPart", "plan_parts", "read_part"]


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
) -> Iterator[pa.RecordBatch]:
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
