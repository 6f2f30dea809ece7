"""The ``tierd`` PySpark data source: the Spark-facing shell around planning
(:mod:`~tierd.spark.plan`, :mod:`~tierd.spark.lookup`, :mod:`~tierd.spark.stream`) and reading
(:mod:`~tierd.spark.decode`, :mod:`~tierd.spark.sparse`).

Everything that crosses to Spark's Python workers — the data source, the readers, the
partitions — holds plain data only (options, constraints, ranges); filesystems are opened inside
``partitions()`` and ``read()``. PySpark pickles a batch reader's read function *before* it calls
``partitions()``, so what planning learns (the driver's credential source, for error messages)
travels in the partitions.

Filter pushdown (Spark ≥ 4.1) is off unless ``spark.sql.python.filterPushdown.enabled`` is true,
and Spark then *rejects* any reader whose class defines ``pushFilters``
(``DATA_SOURCE_PUSHDOWN_DISABLED``). The setting is not passed to the data source, so
:meth:`TierdDataSource.reader` learns it from the planning worker that is calling it (see
:func:`pushdown_enabled`) and returns :class:`TierdPushdownReader` or the plain
:class:`TierdReader`. Rows are identical either way; pushdown only lets planning skip reads.

Catalog tables: see :mod:`tierd.spark.options` — at ``CREATE TABLE`` the source stores the
table's options in the metadata of the schema it returns; reads of the table find them in the
schema Spark hands to :meth:`TierdDataSource.reader`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructField, StructType

from tierd.errors import CredentialsError, InvalidArgumentError, SegmentNotFoundError
from tierd.spark.decode import ARROW_SCHEMA
from tierd.spark.filters import Constraints
from tierd.spark.options import (
    TABLE_OPTIONS_METADATA,
    ReadOptions,
    check_table_options,
    is_catalog,
    normalize,
    table_options,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    import pyarrow as pa

    from tierd.spark.plan import CqSegment, SegmentRange
    from tierd.spark.storage import ColdStorage

__all__ = [
    "SPARK_SCHEMA",
    "Column",
    "TierdDataSource",
    "TierdPartition",
    "TierdPushdownReader",
    "TierdReader",
    "read_partition",
    "select_columns",
]

#: DESIGN's columns (plus ``uniq_key``) in Spark terms: derived from ``decode.ARROW_SCHEMA``, the
#: one declaration (the decoder builds its batches from it and the Arrow reader returns it), so
#: the two cannot drift apart. Nullability carries over: only ``tags`` and ``uniq_key`` can be null.
#: Timestamps with a zone become ``TimestampType`` (not NTZ), as Spark's own conversion makes them.
SPARK_SCHEMA: Final = from_arrow_schema(ARROW_SCHEMA, prefer_timestamp_ntz=False)

#: The columns that can be null (the nullable ones of :data:`SPARK_SCHEMA`), and when they are.
NULLABLE_COLUMNS: Final = {"tags": "tags", "uniq_key": "a UNIQ_KEY property"}

_OPS: dict[type[Filter], str] = {
    EqualTo: "==",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
    In: "in",
}
#: Planning workers of PySpark 4.x: the pushdown worker only runs with pushdown enabled; the
#: plain planner has the setting in a local variable when it creates the reader.
_PUSHDOWN_WORKER = "data_source_pushdown_filters.py"
_PLAN_WORKER = "plan_data_source_read.py"


def pushdown_enabled() -> bool:
    """Is ``spark.sql.python.filterPushdown.enabled`` on for the read being planned?

    PySpark hands the setting to its planning worker, not to the data source, so look at the
    caller: in ``data_source_pushdown_filters`` it is on by construction; ``plan_data_source_read``
    holds it as ``enable_pushdown``. Anywhere else (another Spark version, a direct call) the
    answer is False, which is always safe: the plain reader works in both settings.
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.endswith(_PUSHDOWN_WORKER):
            return True
        if filename.endswith(_PLAN_WORKER) and "enable_pushdown" in frame.f_locals:
            return bool(frame.f_locals["enable_pushdown"])
        frame = frame.f_back  # type: ignore[assignment]
    return False


class TierdPartition(InputPartition):
    """What one task reads: commitlog ranges (``spans``: exact record runs a key lookup found,
    else whole ranges, record-filtered by consume-queue tag codes when ``cq`` is given)."""

    def __init__(
        self,
        ranges: Sequence[SegmentRange],
        *,
        spans: bool = False,
        cq: Sequence[CqSegment] | None = None,
        credentials: str | None = None,
        stream: bool = False,
    ) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)
        self.spans = spans
        #: A micro-batch's: a segment deleted before it is read is data loss (failOnDataLoss).
        self.stream = stream
        self.cq = tuple(cq) if cq is not None else None
        #: Where the driver's S3 credentials came from when it planned (for error messages).
        self.credentials = credentials

    def __repr__(self) -> str:
        r = self.ranges[0]
        end = "end" if r.end is None else r.end
        more = f" +{len(self.ranges) - 1} spans" if len(self.ranges) > 1 else ""
        return f"TierdPartition({r.topic}/{r.queue_id} {r.path} [{r.start}, {end}){more})"


def plan_partitions(storage: ColdStorage, options: ReadOptions, c: Constraints) -> list[TierdPartition]:
    """The partitions of a batch read: one per :func:`~tierd.spark.parts.plan_parts` part (a key
    lookup through the cold index when the read is restricted to keys, else every selected range,
    tag-filtered through the consume queue when ``tags`` is restricted)."""
    from tierd.spark.parts import plan_parts

    source = storage.credentials_source()
    return [
        TierdPartition(p.ranges, spans=p.spans, cq=p.cq, credentials=source)
        for p in plan_parts(storage, options, c)
    ]


def read_partition(
    options: ReadOptions, constraints: Constraints, columns: tuple[Column, ...], partition: InputPartition
) -> Iterator[pa.RecordBatch]:
    """Decode one partition into the columns Spark was told (names, order, nullability)."""
    if not isinstance(partition, TierdPartition):  # Spark's InputPartition(None) for an empty plan
        return
    import pyarrow as pa

    from tierd.spark.parts import ReadPart, read_part
    from tierd.spark.storage import credentials_advice, open_storage, report_stats

    storage = open_storage(options.url, options.storage_options)
    before = (storage.requests, storage.bytes_read)
    decoded = pa.schema([ARROW_SCHEMA.field(c.column) for c in columns])
    # Names and nullability as Spark was told: it checks the schema of every batch.
    pairs = zip(decoded, columns, strict=True)
    told = pa.schema([f.with_name(c.name).with_nullable(c.nullable) for f, c in pairs])
    same = told.equals(decoded)
    part = ReadPart(partition.ranges, partition.spans, partition.cq)

    try:
        for batch in read_part(storage, part, constraints, decoded):
            yield batch if same else pa.RecordBatch.from_arrays(batch.columns, schema=told)
    except CredentialsError as e:
        failure = e.detail.get("failure", str(e))
        raise CredentialsError(f"{failure}. {credentials_advice(partition.credentials)}", **e.detail) from e
    except SegmentNotFoundError as e:
        if not partition.stream:
            raise
        from tierd.spark.stream import data_loss, log

        what = f"the records of {partition!r} ({e})"
        if options.fail_on_data_loss:
            raise data_loss(what) from e
        log.warning("skipping %s: deleted by cold retention before this query read them", what)
    finally:
        report_stats(storage, "read", before)


class TierdReader(DataSourceReader):
    """Plans from manifests (and the cold index) and decodes ranges; no ``pushFilters`` (see
    module docstring)."""

    def __init__(self, options: ReadOptions, columns: tuple[Column, ...] | None = None) -> None:
        self.options = options
        self.constraints = Constraints.from_options(options)
        #: What Spark asked for (default: every column, as :data:`SPARK_SCHEMA` names them).
        self.columns = columns if columns is not None else select_columns(SPARK_SCHEMA)

    def partitions(self) -> list[InputPartition]:
        from tierd.spark.storage import open_storage, report_stats

        storage = open_storage(self.options.url, self.options.storage_options)
        before = (storage.requests, storage.bytes_read)
        try:
            return list(plan_partitions(storage, self.options, self.constraints))
        finally:
            report_stats(storage, "plan", before)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.constraints, self.columns, partition)


class TierdPushdownReader(TierdReader):
    """:class:`TierdReader` that also takes Spark's filters on topic, queue_id, queue_offset,
    store_timestamp, tags and uniq_key. A filter is claimed only when it is enforced exactly:
    reads are pruned (manifest bounds, the cold index, consume-queue tag codes) *and* each
    decoded row is checked, so Spark may drop it from its plan."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        rejected: list[Filter] = []
        for f in filters:
            if not self._push(f):
                rejected.append(f)
        return rejected

    def _push(self, f: Filter) -> bool:
        op = _OPS.get(type(f))
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        if op is None or len(attribute) != 1:
            return False
        return self.constraints.push(str(attribute[0]).lower(), op, getattr(f, "value", None))


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the schema Spark asked for: its name there, the tierd column it is."""

    name: str
    column: str
    nullable: bool


def select_columns(schema: StructType) -> tuple[Column, ...]:
    """The tierd columns a (user-specified) schema selects, in its order.

    ``.schema("topic string, body binary")`` is how a job reads only what it needs: PySpark gives
    Python data sources no column pruning, so without it all 15 columns are decoded and moved
    into the JVM even for ``count(*)``. Names match case-insensitively; types must be tierd's."""
    ours = {f.name: f.dataType for f in SPARK_SCHEMA.fields}
    chosen: list[Column] = []
    for f in schema.fields:
        col = f.name.lower()
        if col not in ours:
            raise InvalidArgumentError(
                f"column {f.name!r} of the given schema is not a tierd column; the columns are "
                f"{SPARK_SCHEMA.simpleString()} (any selection, any order)",
                column=f.name,
            )
        if f.dataType.simpleString() != ours[col].simpleString():
            raise InvalidArgumentError(
                f"column {f.name!r} is {ours[col].simpleString()} in tierd, the given schema says "
                f"{f.dataType.simpleString()}",
                column=f.name,
            )
        if any(c.column == col for c in chosen):
            raise InvalidArgumentError(f"column {f.name!r} appears twice in the given schema", column=f.name)
        if not f.nullable and col in NULLABLE_COLUMNS:
            raise InvalidArgumentError(
                f"column {col!r} is null for messages without {NULLABLE_COLUMNS[col]}; declare it nullable",
                column=f.name,
            )
        chosen.append(Column(f.name, col, f.nullable))
    if not chosen:
        raise InvalidArgumentError("the given schema has no columns", schema=schema.simpleString())
    return tuple(chosen)


class TierdDataSource(DataSource):
    """``spark.read.format("tierd")`` / ``spark.readStream.format("tierd")`` / ``CREATE TABLE t
    USING tierd``: the messages of a tierd cold tier, read from the bucket.

    Options are validated when the DataFrame is created (``.load()``) or the table is created,
    so a typo fails there with a message naming the option, not later inside a task.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(dict(options))
        #: Created by Spark's catalog (``CREATE TABLE``): the options are the table's.
        self.catalog = is_catalog(options)
        if self.catalog:
            check_table_options(options)
        self.read_options = ReadOptions.parse(dict(options))

    @classmethod
    def name(cls) -> str:
        return "tierd"

    def schema(self) -> StructType:
        self.read_options.require_path()
        if not self.catalog:
            return SPARK_SCHEMA
        # CREATE TABLE: Spark keeps this schema in the catalog, metadata included, and hands it
        # back to reader() on every read of the table — the one way the table's options reach it.
        stored = json.dumps(normalize(self.options), sort_keys=True)
        first, *rest = SPARK_SCHEMA.fields
        marked = StructField(first.name, first.dataType, first.nullable, {TABLE_OPTIONS_METADATA: stored})
        return StructType([marked, *rest])

    def _options(self, schema: StructType) -> ReadOptions:
        """The read's options: a table's (from its schema), overridden by the query's own."""
        stored = table_options(schema)
        if not stored:
            return self.read_options.require_path()
        return ReadOptions.parse({**stored, **normalize(self.options)}).require_path()

    def reader(self, schema: StructType) -> DataSourceReader:
        # Spark hands a user-specified .schema(...) (or a table's schema) here: a selection of
        # the columns is honoured (only those are decoded), anything else refused now rather
        # than inside a task.
        columns = select_columns(schema)
        options = self._options(schema)
        if pushdown_enabled():
            return TierdPushdownReader(options, columns)
        return TierdReader(options, columns)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from tierd.spark.stream import TierdStreamReader

        return TierdStreamReader(self._options(schema), select_columns(schema))
