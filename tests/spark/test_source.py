"""``spark.read.format("tierd")`` against real cold tiers: a moto S3 server (open segments are
chunk objects there) and a posix directory read as ``file://``.

store ──put/tier_now──▶ bucket (segments, chunks, MANIFEST.json) ──Spark (local[2])──▶ rows
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from tierd.spark.decode import ARROW_SCHEMA
from tierd.spark.source import NULLABLE_COLUMNS, SPARK_SCHEMA
from tierd.testing.s3server import create_bucket

from ..tiered.conftest import cold_config
from .conftest import SCALE, SEGMENT, Produced, Rec, craft_queue, messages, produce

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

    from tierd.testing.s3server import S3Server


@pytest.fixture(scope="module")
def s3_cold(
    moto_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any], Produced]:
    """A fresh bucket: 3 commits of 200 messages, 24 kB segments — sealed segments plus open ones
    made of several chunk objects."""
    bucket = create_bucket(moto_server)
    url = f"s3://{bucket}/cold"
    so = moto_server.storage_options
    cfg = cold_config(
        tmp_path_factory.mktemp("s3src"),
        {"name": "s3", "url": url, "storage_options": so},
        **SEGMENT,
        consumequeue_segment_size=400,
    )
    produced = produce(cfg, [messages(0, 200), messages(200, 200), messages(400, 200)])
    client = moto_server.boto3_client()
    try:
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    finally:
        client.close()
    assert any("/COMMIT_LOG/" in k and ".chunks/" in k for k in keys)  # open segments are chunks
    return url, so, produced


@pytest.fixture(scope="module")
def file_cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Produced]:
    root = tmp_path_factory.mktemp("filesrc")
    cfg = cold_config(
        root,
        {"name": "posix", "url": str(root / "cold"), "storage_options": {"fsync": False}},
        **SEGMENT,
        consumequeue_segment_size=400,
    )
    return f"file://{root / 'cold'}", produce(cfg, [messages(0, 300), messages(300, 100)])


def _read(spark: SparkSession, url: str, so: dict[str, Any] | None = None, **options: str) -> DataFrame:
    reader = spark.read.format("tierd").option("path", url)
    if so is not None:
        reader = reader.option("storage_options", json.dumps(so))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_arrow_schema_is_what_spark_expects() -> None:
    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_only_tags_and_uniq_key_are_nullable() -> None:
    """Spark trusts a non-nullable column (no null check per value): only the two columns a
    message may lack are declared nullable, and the refusal of a user schema knows them."""
    assert {f.name for f in SPARK_SCHEMA.fields if f.nullable} == {"tags", "uniq_key"}
    assert set(NULLABLE_COLUMNS) == {"tags", "uniq_key"}


def test_columns_declared_non_nullable_hold_no_nulls(
    spark: SparkSession, s3_cold: tuple[str, dict[str, Any], Produced]
) -> None:
    """What the schema promises, the rows keep: no null in any non-nullable column (Spark would
    not check), while tags and uniq_key are null where a message has none."""
    url, so, _ = s3_cold
    df = _read(spark, url, so)
    assert [f.name for f in df.schema.fields if f.nullable] == ["tags", "uniq_key"]
    counts = df.select(
        F.count(F.lit(1)).alias("rows"),
        *[F.count(F.when(F.col(f.name).isNull(), 1)).alias(f.name) for f in SPARK_SCHEMA.fields],
    ).first()
    assert counts is not None
    assert counts.rows > counts.tags > 0  # messages without tags: null there
    assert {f.name: counts[f.name] for f in SPARK_SCHEMA.fields if not f.nullable} == dict.fromkeys(
        (f.name for f in SPARK_SCHEMA.fields if not f.nullable), 0
    )


def test_s3_every_message_and_body_comes_back(
    spark: SparkSession, s3_cold: tuple[str, dict[str, Any], Produced]
) -> None:
    url, so, produced = s3_cold
    # one job: Spark is slow to start
    rows = _read(spark, url, so, max_partition_bytes=str(12000 * SCALE)).collect()
    assert sorted((r.topic, r.queue_id, r.queue_offset, bytes(r.body)) for r in rows) == produced.bodies()
    for r in rows:
        body, keys, tags = produced.messages[(r.topic, r.queue_id, r.queue_offset)]
        assert tuple(r["keys"]) == keys
        assert r.tags == tags
        assert r.properties["seq"] == str(int(body[:8]))
        assert r.store_host == "127.0.0.1:10911"
        assert r.msg_id == f"7F00000100002A9F{r.physical_offset:016X}"
    # physical_offset is the record's offset in its queue's flat commitlog: dense per queue
    per_queue: dict[tuple[str, int], list[Any]] = {}
    for r in sorted(rows, key=lambda r: (r.topic, r.queue_id, r.queue_offset)):
        per_queue.setdefault((r.topic, r.queue_id), []).append(r)
    for qrows in per_queue.values():
        assert qrows[0].physical_offset == 0
        for a, b in itertools.pairwise(qrows):
            assert b.physical_offset > a.physical_offset


def test_s3_open_segment_chunks_are_read_only_when_asked(
    spark: SparkSession, s3_cold: tuple[str, dict[str, Any], Produced]
) -> None:
    url, so, produced = s3_cold
    sealed_only = _read(spark, url, so, include_open_segments="false").count()
    assert 0 < sealed_only < len(produced.messages)
    assert _read(spark, url, so, include_open_segments="true").count() == len(produced.messages)


def test_file_url_rows_and_columns(spark: SparkSession, file_cold: tuple[str, Produced]) -> None:
    url, produced = file_cold
    hits = _read(spark, url).where(F.array_contains("keys", "g3")).collect()
    expected = sorted(k for k, v in produced.messages.items() if "g3" in v[1])
    assert len(expected) == 80
    assert sorted((r.topic, r.queue_id, r.queue_offset) for r in hits) == expected
    assert all(bytes(r.body) == produced.messages[(r.topic, r.queue_id, r.queue_offset)][0] for r in hits)


def test_filters_same_rows_with_and_without_pushdown_fewer_partitions_with(
    spark: SparkSession, file_cold: tuple[str, Produced], pushdown: Callable[[bool], None]
) -> None:
    url, produced = file_cold
    ts = spark.range(1).select(F.lit("2001-01-01 00:00:00").cast("timestamp").alias("t")).first()
    assert ts is not None

    def query() -> tuple[list[tuple[str, int, int, bytes]], int]:
        df = _read(spark, url, max_partition_bytes=str(6000 * SCALE)).where(
            (F.col("topic") == "orders")
            & F.col("queue_id").isin(1)
            & (F.col("queue_offset") >= 40)
            & (F.col("queue_offset") < 60)
            & (F.col("store_timestamp") > ts.t)
        )
        rdd = df.select("topic", "queue_id", "queue_offset", "body").rdd  # planned once
        return sorted((r[0], r[1], r[2], bytes(r[3])) for r in rdd.collect()), rdd.getNumPartitions()

    expected = [b for b in produced.bodies("orders") if b[1] == 1 and 40 <= b[2] < 60]
    assert len(expected) == 20
    pushdown(False)
    rows_off, parts_off = query()
    pushdown(True)
    rows_on, parts_on = query()
    assert rows_off == expected
    assert rows_on == expected
    assert parts_on < parts_off
    assert parts_on <= 3


def test_v2_topics_and_ipv6_hosts_in_spark(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("crafted")
    long_topic = "v" * 150
    craft_queue(
        f"file://{root}",
        {},
        long_topic,
        0,
        [
            Rec(
                b"one",
                born_host="[2001:db8::1]:7000",
                store_host="[2001:db8::2]:10911",
                properties={"KEYS": "a b"},
            ),
            Rec(b"two", properties={"TAGS": "x", "k": "v"}),
        ],
    )
    rows = _read(spark, f"file://{root}").orderBy("queue_offset").collect()
    assert [r.topic for r in rows] == [long_topic, long_topic]
    assert [bytes(r.body) for r in rows] == [b"one", b"two"]
    assert [r.born_host for r in rows] == ["[2001:db8::1]:7000", "10.0.0.1:4000"]
    assert [r.store_host for r in rows] == ["[2001:db8::2]:10911", "10.0.0.2:10911"]
    assert [r["keys"] for r in rows] == [["a", "b"], []]
    assert [r.tags for r in rows] == [None, "x"]
    assert rows[1].properties == {"TAGS": "x", "k": "v"}
    assert rows[0].store_timestamp.year == 2023  # 1_700_000_000_000 ms, a Spark timestamp
    assert rows[0].born_timestamp < rows[0].store_timestamp


def test_corrupt_s3_object_fails_the_task_with_object_and_offset(
    spark: SparkSession, moto_server: S3Server
) -> None:
    bucket = create_bucket(moto_server)
    url = f"s3://{bucket}/c"
    so = moto_server.storage_options
    path, data = craft_queue(url, so, "bad", 0, [Rec(b"z" * 64) for _ in range(4)])
    size = len(data) // 4
    raw = bytearray(data)
    raw[2 * size + 100] ^= 0x01  # a body byte of the third record
    client = moto_server.boto3_client()
    try:
        client.put_object(Bucket=bucket, Key=f"c/{path}", Body=bytes(raw))
    finally:
        client.close()
    with pytest.raises(PySparkException) as e:
        _read(spark, url, so).collect()
    msg = str(e.value)
    assert f"{url}/{path}" in msg
    assert f"position {2 * size}" in msg
    assert "CRC mismatch" in msg


def test_bad_option_fails_at_load(spark: SparkSession) -> None:
    with pytest.raises(PySparkException, match="option queue_ids must be a comma-separated list"):
        spark.read.format("tierd").option("path", "/nowhere").option("queue_ids", "one").load()


def test_a_user_schema_selects_columns(spark: SparkSession, file_cold: tuple[str, Produced]) -> None:
    url, produced = file_cold
    df = (
        spark.read.format("tierd")
        .schema("BODY binary, topic string, queue_id int not null, queue_offset bigint, tags string")
        .option("path", url)
        .load()
    )
    assert df.columns == ["BODY", "topic", "queue_id", "queue_offset", "tags"]
    rows = sorted((r.topic, r.queue_id, r.queue_offset, bytes(r.BODY)) for r in df.collect())
    assert rows == produced.bodies()
    tags = {
        (r.topic, r.queue_id, r.queue_offset): r.tags
        for r in df.select("topic", "queue_id", "queue_offset", "tags").collect()
    }
    assert tags == {k: v[2] for k, v in produced.messages.items()}
    ddl = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in SPARK_SCHEMA.fields)
    same = spark.read.format("tierd").schema(ddl).option("path", url).load()
    assert same.count() == len(produced.messages)  # the whole schema spelled out


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        (
            "body binary, size int",
            r"column 'size' of the given schema is not a tierd column; the columns are struct<topic",
        ),
        ("body string", r"column 'body' is binary in tierd, the given schema says string"),
        ("body binary, Body binary", r"column 'Body' appears twice"),
        ("tags string not null", r"column 'tags' is null for messages without tags"),
        ("uniq_key string not null", r"column 'uniq_key' is null for messages without a UNIQ_KEY"),
    ],
)
def test_a_user_schema_that_is_no_selection_is_refused_clearly(
    spark: SparkSession, file_cold: tuple[str, Produced], ddl: str, message: str
) -> None:
    url, _ = file_cold
    with pytest.raises(PySparkException, match=message):
        spark.read.format("tierd").schema(ddl).option("path", url).load().count()
