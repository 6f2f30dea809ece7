"""SQL: ``CREATE TABLE ... USING tierd`` (with OPTIONS or LOCATION), temporary views, query
options, and the registration that makes ``USING tierd`` work without Python code.

Spark's catalog adds properties of its own to a table's options (``provider``, ``owner``,
``location``, ``comment``, every TBLPROPERTIES entry) and PySpark 4.3 does not hand a table's
options to the data source when the table is read; the source keeps them in the table's schema.
Real typos in OPTIONS must still fail, naming the option.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.errors import PySparkException

from tierd.spark.source import TierdDataSource
from tierd.testing.s3server import create_bucket

from ..tiered.conftest import cold_config
from .conftest import SEGMENT, Produced, messages, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tierd.testing.s3server import S3Server

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Produced]:
    root = tmp_path_factory.mktemp("sql")
    cfg = cold_config(
        root,
        {"name": "posix", "url": str(root / "cold"), "storage_options": {"fsync": False}},
        **SEGMENT,
        consumequeue_segment_size=400,
    )
    return root / "cold", produce(cfg, [messages(0, 120), messages(120, 60)])


def _count(produced: Produced, topic: str | None = None, queue_id: int | None = None) -> int:
    return sum(1 for t, q, _ in produced.messages if topic in (None, t) and queue_id in (None, q))


def _scalar(spark: SparkSession, sql: str) -> Any:
    row = spark.sql(sql).first()
    assert row is not None
    return row[0]


def test_tables_with_options_or_location_read_their_options(
    spark: SparkSession, cold: tuple[Path, Produced]
) -> None:
    root, produced = cold
    spark.sql("DROP TABLE IF EXISTS orders_t")
    spark.sql("DROP TABLE IF EXISTS q1_t")
    # TBLPROPERTIES may use an option's name: a table property, never the option.
    spark.sql(
        f"CREATE TABLE orders_t USING tierd OPTIONS (path '{root}', Topic 'orders') "
        "COMMENT 'orders from the cold tier' TBLPROPERTIES ('topic' = 'audit', 'team' = 'data')"
    )
    spark.sql(f"CREATE TABLE q1_t USING tierd OPTIONS (queue_ids '1') LOCATION 'file://{root}'")
    try:
        assert _scalar(spark, "SELECT count(*) FROM orders_t") == _count(produced, "orders")
        assert _scalar(spark, "SELECT count(*) FROM q1_t") == _count(produced, queue_id=1)
        # Options of one query (WITH) override the table's.
        assert _scalar(spark, "SELECT count(*) FROM orders_t WITH ('queue_ids' = '0')") == _count(
            produced, "orders", 0
        )
        row = spark.sql(
            "SELECT topic, uniq_key, keys FROM q1_t WHERE queue_offset = 0 AND topic = 'audit'"
        ).first()
        assert row is not None
        assert row.uniq_key == "u3"
        assert list(row["keys"]) == ["k3", "g3"]
    finally:
        spark.sql("DROP TABLE orders_t")
    assert (root / "212d6b50_DefaultCluster").is_dir()  # dropping a table leaves the cold tier alone
    assert _scalar(spark, "SELECT count(*) FROM q1_t") == _count(produced, queue_id=1)
    spark.sql("DROP TABLE q1_t")


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("OPTIONS (path '{root}', topc 'orders')", r"unknown option\(s\) \['topc'\]"),
        (
            'OPTIONS (path \'{root}\', storage_options \'{{"key": "AKIA", "secret": "s"}}\')',
            "must not hold credentials",
        ),
        ("", "option path is required"),
        ("OPTIONS (path 'relative/dir')", "option path must be a URL"),
    ],
)
def test_a_table_with_bad_options_is_refused_at_create(
    spark: SparkSession, cold: tuple[Path, Produced], ddl: str, message: str
) -> None:
    root, _ = cold
    with pytest.raises(PySparkException, match=message):
        spark.sql(f"CREATE TABLE bad_t USING tierd {ddl.format(root=root)}")
    assert not spark.catalog.tableExists("bad_t")


def test_a_table_on_s3_takes_credentials_from_the_environment(
    spark: SparkSession, moto_server: S3Server, tmp_path: Path
) -> None:
    url = f"s3://{create_bucket(moto_server)}/cold"
    so = moto_server.storage_options
    cfg = cold_config(tmp_path, {"name": "s3", "url": url, "storage_options": so}, **SEGMENT)
    produced = produce(cfg, [messages(0, 90)])
    endpoint = json.dumps({"endpoint_url": moto_server.endpoint_url})
    spark.sql(f"CREATE TABLE s3_t USING tierd OPTIONS (storage_options '{endpoint}') LOCATION '{url}'")
    try:
        assert _scalar(spark, "SELECT count(*) FROM s3_t") == len(produced.messages)
        assert _scalar(spark, "SELECT count(*) FROM s3_t WHERE array_contains(keys, 'k7')") == 1
    finally:
        spark.sql("DROP TABLE s3_t")


def test_a_temporary_view_using_tierd(spark: SparkSession, cold: tuple[Path, Produced]) -> None:
    root, produced = cold
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW audit_v USING tierd OPTIONS (path '{root}', topic 'audit')")
    assert _scalar(spark, "SELECT count(*) FROM audit_v") == _count(produced, "audit")


def test_sql_only_users_get_the_source_without_python_code() -> None:
    """PySpark's lookup (``pyspark/sql/worker/lookup_data_sources.py``) imports every top-level
    ``pyspark_*`` module on its path and registers its ``DefaultSource``; the package ships one
    (the cluster test runs ``spark-sql`` against it)."""
    assert "pyspark_tierd" in {m.name for m in pkgutil.iter_modules([str(REPO)])}
    assert importlib.import_module("pyspark_tierd").DefaultSource is TierdDataSource
    top_level = importlib.metadata.distribution("tierd").read_text("top_level.txt") or ""
    assert "pyspark_tierd" in top_level.split()  # installed with the package, not only in the repo
