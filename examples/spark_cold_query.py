"""Query a tierd cold tier with Spark: messages per topic and hour, and every message of one key.

Nothing but the bucket is needed — no running tierd, no local metadata, no Hadoop S3A jars: the
``tierd`` PySpark data source reads the manifests tierd keeps in the bucket and decodes the
segment objects itself.

Examples:

  # a local cold tier (backend.url of a posix profile)
  python examples/spark_cold_query.py file:///var/lib/tierd/cold --key order-42

  # S3 (credentials from AWS_* env vars or the provider chain), only two topics, one week
  python examples/spark_cold_query.py s3://my-bucket/tierd --topic orders,payments \\
      --since 2025-01-01 --until 2025-01-08 --key order-42

  # an S3-compatible server (MinIO, moto, ...): pass fsspec storage options as JSON
  python examples/spark_cold_query.py s3://bucket/prefix \\
      --storage-options '{"endpoint_url": "http://127.0.0.1:9000", "key": "...", "secret": "..."}'

  # on a cluster: install tierd[spark] on every node, give executors credentials, then
  spark-submit --master spark://host:7077 examples/spark_cold_query.py s3://bucket/prefix --key order-42

The key lookup goes through the cold key index (two small reads per index file, then only the
matching records; what the index does not cover yet is scanned). Filters on topic, queue_id,
queue_offset and store_timestamp skip whole segments when
``spark.sql.python.filterPushdown.enabled`` is true (``--pushdown``); results are the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="spark_cold_query.py",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "path", help="the cold tier: backend.url tierd wrote to (s3://bucket/prefix, file:///dir)"
    )
    ap.add_argument("--topic", help="only these topics (comma-separated); default: all")
    ap.add_argument("--key", help="also list every message with this key (a KEYS token or the UNIQ_KEY)")
    ap.add_argument(
        "--since", help="only messages stored at or after this time (e.g. 2025-01-01 or 2025-01-01T12:00)"
    )
    ap.add_argument("--until", help="only messages stored before this time")
    ap.add_argument(
        "--storage-options", default="{}", help="JSON passed to fsspec/s3fs (endpoint_url, key, secret, ...)"
    )
    ap.add_argument("--cluster", help="tiered.cluster of the writer (default: every cluster found)")
    ap.add_argument("--broker", help="tiered.broker of the writer (default: every broker found)")
    ap.add_argument(
        "--sealed-only",
        action="store_true",
        help="skip segments still being written (by default their committed chunks are read too)",
    )
    ap.add_argument("--pushdown", action="store_true", help="enable spark.sql.python.filterPushdown.enabled")
    ap.add_argument(
        "--master", default=None, help="Spark master when not run by spark-submit (default local[*])"
    )
    ap.add_argument("--limit", type=int, default=50, help="rows to show per result (default 50)")
    args = ap.parse_args(argv)
    try:
        json.loads(args.storage_options)
    except json.JSONDecodeError as e:
        ap.error(f"--storage-options must be JSON: {e}")
    return args


#: Columns each query needs: naming them in ``.schema(...)`` has only those decoded (Python data
#: sources get no column pruning from Spark, so a plain ``load()`` builds all 15).
PER_HOUR = "topic string, store_timestamp timestamp, body binary"
BY_KEY = (
    "topic string, queue_id int, queue_offset bigint, store_timestamp timestamp, msg_id string, "
    "tags string, keys array<string>, uniq_key string"
)


def load(spark: SparkSession, args: argparse.Namespace, columns: str, key: str | None = None) -> DataFrame:
    from pyspark.sql import functions as F

    reader = (
        spark.read.format("tierd")
        .schema(columns)
        .option("path", args.path)
        .option("storage_options", args.storage_options)
        .option("include_open_segments", str(not args.sealed_only).lower())
    )
    for name in ("topic", "cluster", "broker"):
        value = getattr(args, name)
        if value:
            reader = reader.option(name, value)
    if key is not None:
        reader = reader.option("key", key)  # through the cold index, not a scan
    df = reader.load()
    # Compare with timestamps in UTC (the session time zone is set below), so bounds are exact.
    if args.since:
        df = df.where(F.col("store_timestamp") >= F.to_timestamp(F.lit(args.since)))
    if args.until:
        df = df.where(F.col("store_timestamp") < F.to_timestamp(F.lit(args.until)))
    return df


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from tierd.spark import register

    builder = SparkSession.builder.appName("tierd-cold-query").config("spark.sql.session.timeZone", "UTC")
    if args.master or "SPARK_HOME" not in os.environ:
        builder = builder.master(args.master or "local[*]")
    spark = builder.getOrCreate()
    spark.conf.set("spark.sql.python.filterPushdown.enabled", str(args.pushdown).lower())
    register(spark)
    try:
        print("== messages per topic and hour (UTC)")
        (
            load(spark, args, PER_HOUR)
            .groupBy("topic", F.date_trunc("hour", "store_timestamp").alias("hour"))
            .agg(F.count("*").alias("messages"), F.sum(F.length("body")).alias("body_bytes"))
            .orderBy("topic", "hour")
            .show(args.limit, truncate=False)
        )
        if args.key:
            print(f"== messages with key {args.key!r}")
            (
                load(spark, args, BY_KEY, key=args.key)
                .orderBy("store_timestamp")
                .show(args.limit, truncate=False)
            )
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
