"""The ``tierd`` PySpark data source: the Spark-facing shell around :mod:`tierd.spark.plan` and
:mod:`tierd.spark.decode`.

Everything that crosses to Spark's Python workers — the data source, the reader, the partitions
— holds plain data only (options, constraints, :class:`~tierd.spark.plan.SegmentRange`);
filesystems are opened inside ``partitions()`` and ``read()``.

Filter pushdown (Spark ≥ 4.1) is off unless ``spark.sql.python.filterPushdown.enabled`` is true,
and Spark then *rejects* any reader whose class defines ``pushFilters``
(``DATA_SOURCE_PUSHDOWN_DISABLED``). The setting is not passed to the data source, so
:meth:`TierdDataSource.reader` learns it from the planning worker that is calling it (see
:func:`pushdown_enabled`) and returns :class:`TierdPushdownReader` or the plain
:class:`TierdReader`. Rows are identical either way; pushdown only lets planning skip segments.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tierd.errors import InvalidArgumentError
from tierd.spark.plan import Constraints, ReadOptions, SegmentRange, plan_ranges

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    import pyarrow as pa

__all__ = [
    "SPARK_SCHEMA",
    "Column",
    "TierdDataSource",
    "TierdPartition",
    "TierdPushdownReader",
    "TierdReader",
    "select_columns",
]

#: DESIGN's columns; ``decode.ARROW_SCHEMA`` is the same schema in Arrow terms.
SPARK_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("queue_id", IntegerType()),
        StructField("queue_offset", LongType()),
        StructField("physical_offset", LongType()),
        StructField("store_timestamp", TimestampType()),
        StructField("born_timestamp", TimestampType()),
        StructField("tags", StringType()),
        StructField("keys", ArrayType(StringType())),
        StructField("msg_id", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("body", BinaryType()),
        StructField("sys_flag", IntegerType()),
        StructField("reconsume_times", IntegerType()),
        StructField("born_host", StringType()),
        StructField("store_host", StringType()),
    ]
)

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
    """One commitlog range (``value`` is the :class:`~tierd.spark.plan.SegmentRange`)."""

    def __init__(self, segment_range: SegmentRange) -> None:
        super().__init__(segment_range)
        self.range = segment_range

    def __repr__(self) -> str:
        r = self.range
        end = "end" if r.end is None else r.end
        return f"TierdPartition({r.topic}/{r.queue_id} {r.path} [{r.start}, {end}))"


class TierdReader(DataSourceReader):
    """Plans from manifests and decodes ranges; no ``pushFilters`` (see module docstring)."""

    def __init__(self, options: ReadOptions, columns: tuple[Column, ...] | None = None) -> None:
        self.options = options
        self.constraints = Constraints.from_options(options)
        #: What Spark asked for (default: every column, as :data:`SPARK_SCHEMA` names them).
        self.columns = columns if columns is not None else select_columns(SPARK_SCHEMA)

    def partitions(self) -> list[InputPartition]:
        from tierd.spark.storage import open_storage

        storage = open_storage(self.options.url, self.options.storage_options)
        return [TierdPartition(r) for r in plan_ranges(storage, self.options, self.constraints)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        r = getattr(partition, "range", None)
        if r is None:  # Spark substitutes InputPartition(None) for an empty plan
            return
        import pyarrow as pa

        from tierd.spark.decode import ARROW_SCHEMA, read_range
        from tierd.spark.storage import open_storage

        storage = open_storage(self.options.url, self.options.storage_options)
        decoded = pa.schema([ARROW_SCHEMA.field(c.column) for c in self.columns])
        # Names and nullability as Spark was told: it checks the schema of every batch.
        pairs = zip(decoded, self.columns, strict=True)
        told = pa.schema([f.with_name(c.name).with_nullable(c.nullable) for f, c in pairs])
        same = told.equals(decoded)
        for batch in read_range(storage, r, self.constraints, schema=decoded):
            yield batch if same else pa.RecordBatch.from_arrays(batch.columns, schema=told)


class TierdPushdownReader(TierdReader):
    """:class:`TierdReader` that also takes Spark's filters on topic, queue_id, queue_offset and
    store_timestamp. A filter is claimed only when it is enforced exactly: segments are pruned by
    manifest bounds *and* each decoded row is checked, so Spark may drop it from its plan."""

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
        if col == "tags" and not f.nullable:
            raise InvalidArgumentError(
                "column 'tags' is null for messages without tags; declare it nullable", column=f.name
            )
        chosen.append(Column(f.name, col, f.nullable))
    if not chosen:
        raise InvalidArgumentError("the given schema has no columns", schema=schema.simpleString())
    return tuple(chosen)


class TierdDataSource(DataSource):
    """``spark.read.format("tierd")``: the messages of a tierd cold tier, read from the bucket.

    Options are validated when the DataFrame is created (``.load()``), so a typo fails there
    with a message naming the option, not later inside a task.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(dict(options))
        self.read_options = ReadOptions.parse(dict(options))

    @classmethod
    def name(cls) -> str:
        return "tierd"

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        # Spark hands a user-specified .schema(...) here: a selection of the columns is honoured
        # (only those are decoded), anything else refused now rather than inside a task.
        columns = select_columns(schema)
        if pushdown_enabled():
            return TierdPushdownReader(self.read_options, columns)
        return TierdReader(self.read_options, columns)
