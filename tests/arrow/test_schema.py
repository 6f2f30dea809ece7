"""One declaration of the columns: ``decode.ARROW_SCHEMA``. The Arrow reader returns it, and the
Spark source's ``SPARK_SCHEMA`` is derived from it — so the two readers cannot disagree on a
column's name, order, type or nullability. What is checked here is that the derivation is
exact both ways: Spark renders ``SPARK_SCHEMA`` back into Arrow as ``ARROW_SCHEMA`` itself (the
schema Spark checks every batch against), so a column Spark cannot hold exactly (an unsigned
integer, a millisecond or zone-less timestamp, a renamed list element) fails here, not in a job.
"""

from __future__ import annotations

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

import tierd.arrow
from tierd.spark.decode import ARROW_SCHEMA
from tierd.spark.source import NULLABLE_COLUMNS, SPARK_SCHEMA


def test_the_arrow_reader_returns_the_one_declaration() -> None:
    assert tierd.arrow.SCHEMA is ARROW_SCHEMA


def test_spark_schema_round_trips_to_the_arrow_declaration() -> None:
    assert isinstance(SPARK_SCHEMA, StructType)
    assert SPARK_SCHEMA.names == ARROW_SCHEMA.names
    assert [f.nullable for f in SPARK_SCHEMA.fields] == [f.nullable for f in ARROW_SCHEMA]
    back = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
    assert back.equals(ARROW_SCHEMA), f"Spark reads the columns as {back}, declared {ARROW_SCHEMA}"


def test_the_nullable_columns_are_named_where_refusals_explain_them() -> None:
    """A user schema that declares a column non-nullable is refused with an explanation taken
    from ``NULLABLE_COLUMNS``; it must name exactly the declaration's nullable columns."""
    assert set(NULLABLE_COLUMNS) == {f.name for f in ARROW_SCHEMA if f.nullable}
