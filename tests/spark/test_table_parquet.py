"""Spark reads an Iceberg table's Parquet files without a catalog — docs/table.md's PySpark
snippet as pasted, on a table the writer made from a real cold tier — and gets exactly the
messages the raw source returns, every column, every value. (One test: Spark is slow.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tierd.table import TableWriter

from ..table.conftest import Tier, sealed, tier, writer_config  # noqa: F401 (tier: a fixture)
from ..table.test_docs import DOC, PAGE_STORE, spark_blocks

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

KEY = ["topic", "queue_id", "queue_offset"]


def test_spark_reads_the_parquet_files_as_the_raw_source(
    spark: SparkSession,
    tier: Tier,  # noqa: F811
    tmp_path: Path,
) -> None:
    store = (tmp_path / "hot").resolve()
    writer = TableWriter(writer_config(tier, store, orders={}))
    assert writer.sync("orders").lag == 0
    source = sealed(tier.url, "orders")
    assert source.num_rows > 0

    (snippet,) = spark_blocks()
    scope: dict[str, Any] = {"spark": spark}
    exec(compile(snippet.replace(PAGE_STORE, str(store)), str(DOC), "exec"), scope)
    rows = scope["rows"]
    # The source's columns, and the day partition Spark finds in the directory names.
    assert rows.columns == [*source.column_names, "store_day"]
    read = rows.select(*source.column_names).orderBy(*KEY).toArrow()
    assert read.num_rows == source.num_rows
    for name in source.column_names:  # Spark's own types, the same values
        got, want = read.column(name).to_pylist(), source.column(name)
        if name == "properties":  # a map: compared as sets of entries
            assert [sorted(m) for m in got] == [sorted(m) for m in want.to_pylist()]
        else:
            assert got == want.cast(read.schema.field(name).type).to_pylist(), name
