"""The restrictions of one read — options and the filters Spark pushes — as plain data, and the
exact row checks that make claiming a filter safe.

:class:`Constraints` is a conjunction. Planning prunes with it (manifest bounds, the cold index,
consume-queue tag codes); every decoded row is then checked against it (:func:`row_mask` on the
header fields, :func:`property_mask` on tags and keys), so a filter reported to Spark as handled
is handled exactly, whatever the pruning skipped or kept.

Spark's Python data sources receive filters only in these shapes (PySpark 4.3, with
``spark.sql.python.filterPushdown.enabled``): ``EqualTo``, ``In``, ``<``, ``<=``, ``>``, ``>=``,
``IsNull``/``IsNotNull``, ``Not``, ``String*`` on a top-level column. ``array_contains(keys, 'k')``
arrives as ``IsNotNull(keys)`` only — a key lookup is the ``key`` option or ``uniq_key = ...``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from tierd.spark.options import ReadOptions
    from tierd.spark.plan import SegmentRange

__all__ = ["Constraints", "Interval", "property_mask", "row_mask"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# ----------------------------------------------------------------------------- constraints
@dataclass(frozen=True, slots=True)
class Interval:
    """Inclusive integer interval; ``None`` is unbounded on that side."""

    lo: int | None = None
    hi: int | None = None

    def meet(self, other: Interval) -> Interval:
        lo = self.lo if other.lo is None else other.lo if self.lo is None else max(self.lo, other.lo)
        hi = self.hi if other.hi is None else other.hi if self.hi is None else min(self.hi, other.hi)
        return Interval(lo, hi)

    @property
    def empty(self) -> bool:
        return self.lo is not None and self.hi is not None and self.lo > self.hi

    def overlaps(self, lo: int | None, hi: int | None) -> bool:
        """Does ``[lo, hi]`` (None = unknown/unbounded) intersect this interval?"""
        if self.empty:
            return False
        if self.hi is not None and lo is not None and lo > self.hi:
            return False
        return not (self.lo is not None and hi is not None and hi < self.lo)

    def contains(self, v: int) -> bool:
        return (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _micros(v: object) -> int | None:
    """Exact microseconds since the epoch of a Spark timestamp literal; None if it has no zone
    (a naive value's instant depends on the session time zone, so it is not claimed)."""
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return (v - _EPOCH) // dt.timedelta(microseconds=1)
    return None


def _ts_interval(op: str, us: int) -> Interval:
    """Bounds on store_timestamp in *milliseconds* equivalent to ``ts_us <op> us`` where
    ts_us = ms * 1000 — exact integer arithmetic, so claiming the filter is safe."""
    floor, ceil = us // 1000, -(-us // 1000)
    if op == ">=":
        return Interval(ceil, None)
    if op == ">":
        return Interval(floor + 1, None)
    if op == "<=":
        return Interval(None, floor)
    if op == "<":
        return Interval(None, ceil - 1)
    # "=="
    return Interval(us // 1000, us // 1000) if us % 1000 == 0 else Interval(1, 0)


def _int_interval(op: str, v: int) -> Interval:
    return {
        ">=": Interval(v, None),
        ">": Interval(v + 1, None),
        "<=": Interval(None, v),
        "<": Interval(None, v - 1),
        "==": Interval(v, v),
    }[op]


@dataclass(slots=True)
class Constraints:
    """Conjunction of the restrictions of one read: the ``topic``/``queue_ids`` options and the
    filters pushed by Spark. Plain data (pickled to workers with the reader)."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    queue_id: Interval = field(default_factory=Interval)
    queue_offsets: frozenset[int] | None = None
    queue_offset: Interval = field(default_factory=Interval)
    #: store_timestamp bounds in milliseconds.
    store_ms: Interval = field(default_factory=Interval)
    #: Messages with one of these keys (a KEYS token or the UNIQ_KEY): the ``key`` option.
    keys: frozenset[str] | None = None
    #: Messages whose UNIQ_KEY is one of these (``uniq_key = / IN`` pushed).
    uniq_keys: frozenset[str] | None = None
    #: Messages whose TAGS is one of these (``tags = / IN`` pushed).
    tags: frozenset[str] | None = None
    #: Whether rows must be filtered in ``read`` (a pushed filter was accepted, or an option
    #: that selects rows was given).
    row_filters: bool = False

    @classmethod
    def from_options(cls, opts: ReadOptions) -> Constraints:
        return cls(
            topics=frozenset(opts.topics) if opts.topics is not None else None,
            queue_ids=frozenset(opts.queue_ids) if opts.queue_ids is not None else None,
            keys=frozenset({opts.key}) if opts.key is not None else None,
            row_filters=opts.key is not None,
        )

    @property
    def property_filters(self) -> bool:
        """Do rows have to be checked on their properties (tags, keys)?"""
        return self.keys is not None or self.uniq_keys is not None or self.tags is not None

    @property
    def lookup_keys(self) -> frozenset[str] | None:
        """Keys the cold index can find every matching message by (None: no key constraint)."""
        # Either set alone finds every candidate of the conjunction; the rows are checked anyway.
        if self.keys is None or (self.uniq_keys is not None and len(self.uniq_keys) < len(self.keys)):
            return self.uniq_keys
        return self.keys

    def push(self, column: str, op: str, value: object) -> bool:
        """Add ``column <op> value`` (op: ``== < <= > >= in``); True if it is now enforced
        exactly (pruning plus :func:`row_mask`), False if Spark must evaluate it."""
        accepted = self._push(column, op, value)
        self.row_filters |= accepted
        return accepted

    def _push(self, column: str, op: str, value: object) -> bool:
        if column in ("tags", "uniq_key"):
            strings = _strings(op, value)
            if strings is None:
                return False
            if column == "tags":
                self.tags = strings if self.tags is None else self.tags & strings
            else:
                self.uniq_keys = strings if self.uniq_keys is None else self.uniq_keys & strings
            return True
        if column == "topic":
            if op == "==" and isinstance(value, str):
                values: frozenset[Any] = frozenset({value})
            elif op == "in" and isinstance(value, tuple | list) and all(isinstance(v, str) for v in value):
                values = frozenset(value)
            else:
                return False
            self.topics = values if self.topics is None else self.topics & values
            return True
        if column in ("queue_id", "queue_offset"):
            if op == "in":
                if not isinstance(value, tuple | list) or not all(_is_int(v) for v in value):
                    return False
                ints = frozenset(int(v) for v in value)
                if column == "queue_id":
                    self.queue_ids = ints if self.queue_ids is None else self.queue_ids & ints
                else:
                    self.queue_offsets = ints if self.queue_offsets is None else self.queue_offsets & ints
                return True
            if not _is_int(value) or op not in ("==", "<", "<=", ">", ">="):
                return False
            iv = _int_interval(op, int(value))  # type: ignore[call-overload]
            if column == "queue_id":
                self.queue_id = self.queue_id.meet(iv)
            else:
                self.queue_offset = self.queue_offset.meet(iv)
            return True
        if column == "store_timestamp":
            us = _micros(value)
            if us is None or op not in ("==", "<", "<=", ">", ">="):
                return False
            self.store_ms = self.store_ms.meet(_ts_interval(op, us))
            return True
        return False

    def allows_topic(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics

    def allows_queue(self, queue_id: int) -> bool:
        return (self.queue_ids is None or queue_id in self.queue_ids) and self.queue_id.contains(queue_id)

    def offset_bounds(self) -> Interval:
        """queue_offset bounds including those implied by an IN list."""
        if self.queue_offsets is None:
            return self.queue_offset
        if not self.queue_offsets:
            return Interval(1, 0)
        return self.queue_offset.meet(Interval(min(self.queue_offsets), max(self.queue_offsets)))

    def may_match(self, r: SegmentRange) -> bool:
        """Can range ``r`` hold a matching row, judging by its manifest bounds?"""
        if not (self.allows_topic(r.topic) and self.allows_queue(r.queue_id)):
            return False
        if not self.offset_bounds().overlaps(r.first_queue_offset, r.last_queue_offset):
            return False
        return self.store_ms.overlaps(r.min_store_ms, r.max_store_ms)


def _strings(op: str, value: object) -> frozenset[str] | None:
    """The values of ``= 'x'`` or ``IN ('x', 'y')`` on a string column; None for anything else."""
    if op == "==" and isinstance(value, str):
        return frozenset({value})
    if op == "in" and isinstance(value, tuple | list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    return None


def row_mask(
    c: Constraints, queue_offsets: npt.NDArray[np.int64], store_ms: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_] | None:
    """Rows of one range (one topic and queue, already checked by planning) that satisfy the
    pushed offset and timestamp filters; None when every row does."""
    import numpy as np

    mask: npt.NDArray[np.bool_] | None = None

    def both(m: npt.NDArray[np.bool_]) -> None:
        nonlocal mask
        mask = m if mask is None else mask & m

    for iv, col in ((c.queue_offset, queue_offsets), (c.store_ms, store_ms)):
        if iv.lo is not None:
            both(col >= iv.lo)
        if iv.hi is not None:
            both(col <= iv.hi)
    if c.queue_offsets is not None:
        both(np.isin(queue_offsets, np.fromiter(c.queue_offsets, np.int64, len(c.queue_offsets))))
    return mask


def property_mask(c: Constraints, tags: pa.Array, keys: pa.Array, uniq: pa.Array) -> npt.NDArray[np.bool_]:
    """Rows that satisfy the tag and key constraints, from the decoded ``tags`` (string),
    ``keys`` (list of strings) and ``uniq`` (UNIQ_KEY, string) columns — vectorised; a message
    matches ``keys`` when one of its KEYS tokens or its UNIQ_KEY is one of them (what the cold
    index indexes)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(tags)

    def member(values: pa.Array, wanted: frozenset[str]) -> npt.NDArray[np.bool_]:
        hit = pc.is_in(values, value_set=pa.array(sorted(wanted), pa.string()))
        return np.asarray(pc.fill_null(hit, False).to_numpy(zero_copy_only=False), dtype=bool)

    mask = np.ones(n, dtype=bool)
    if c.tags is not None:
        mask &= member(tags, c.tags)
    if c.uniq_keys is not None:
        mask &= member(uniq, c.uniq_keys)
    if c.keys is not None:
        tokens = keys.flatten()
        hit_rows = np.asarray(pc.list_parent_indices(keys).to_numpy(zero_copy_only=False), dtype=np.int64)
        token_hit = member(tokens, c.keys)
        any_key = np.zeros(n, dtype=bool)
        any_key[hit_rows[token_hit]] = True
        mask &= any_key | member(uniq, c.keys)
    return mask
