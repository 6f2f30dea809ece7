"""Reads that do not scan: key lookups through the cold key index, tag filters through the
consume queue's tag codes.

    store ──tier_now──▶ bucket ──upload index──▶ INDEX segments + INDEX_MANIFEST.json
    key 'k17' ──▶ index manifest ──▶ slot (8 B) + items, per index file ──▶ only those records
                 └─ offsets the manifest does not vouch for ──▶ scanned, key checked per row

The rows must be exactly the messages with the key — also those tiered after the last index
upload, those of an index file that expired, and when there is no index at all — while a
covered single-key lookup reads a tiny fraction of what a scan reads.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import functions as F

from tierd.drivers.paths import index_segment_path
from tierd.spark import sparse
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.source import SPARK_SCHEMA, plan_partitions, read_partition, select_columns
from tierd.spark.storage import ColdStorage, open_storage
from tierd.testing.s3server import create_bucket
from tierd.tiered.manifest import IndexManifest, index_manifest_path

from ..tiered.conftest import cold_config
from .conftest import SEGMENT, Produced, messages, produce

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pyspark.sql import SparkSession

    from tierd.testing.s3server import S3Server

Key = tuple[str, int, int]
CLUSTER, BROKER = "DefaultCluster", "broker-a"


#: Bytes that one record of messages() takes at most: its body, its header and properties.
RECORD = len(messages(0, 1)[0].body) + 300


def _cfg(root: Any, backend: dict[str, Any]) -> Any:
    return cold_config(root, backend, **SEGMENT, consumequeue_segment_size=400)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], Produced]:
    """file://: 300 messages covered by an uploaded index file, then 100 that are not (still in
    the writer's local index file, as the last hour's messages are)."""
    root = tmp_path_factory.mktemp("lookup")
    cfg = _cfg(root, {"name": "posix", "url": str(root / "cold"), "storage_options": {"fsync": False}})
    produced = produce(cfg, [messages(0, 150), messages(150, 150), messages(300, 100)], index_after=2)
    return f"file://{root / 'cold'}", {}, produced


@pytest.fixture(scope="module")
def indexed_s3(
    moto_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any], Produced]:
    """The same on moto (open segments are chunk objects there); every message covered."""
    url = f"s3://{create_bucket(moto_server)}/cold"
    so = moto_server.storage_options
    cfg = _cfg(tmp_path_factory.mktemp("lookups3"), {"name": "s3", "url": url, "storage_options": so})
    return url, so, produce(cfg, [messages(0, 200), messages(200, 200)], index_after=2)


class Recording(ColdStorage):
    """Counts the ranged reads of each object kind."""

    def __init__(self, url: str, so: Mapping[str, Any]) -> None:
        super().__init__(url, so)
        self.paths: list[str] = []

    def cat(self, path: str, start: int, end: int, *, records: bool = False) -> bytes:
        self.paths.append(path)
        return super().cat(path, start, end, records=records)

    def cat_spans(self, spans: Any, *, records: bool = False) -> list[bytes]:
        self.paths += [p for p, _, _ in spans]
        return super().cat_spans(spans, records=records)


def _run(
    url: str, so: dict[str, Any], c_setup: Callable[[Constraints], None] | None = None, **options: str
) -> tuple[set[Key], Recording, int, int]:
    """(rows' keys, planning's storage, bytes read by planning, bytes read by the tasks) — a
    read planned and executed without Spark, through the same functions its workers call."""
    opts = ReadOptions.parse({"path": url, "storage_options": json.dumps(so), **options})
    storage = Recording(opts.url, opts.storage_options)
    c = Constraints.from_options(opts)
    if c_setup is not None:
        c_setup(c)
    parts = plan_partitions(storage, opts, c)
    planned = storage.bytes_read
    tasks = open_storage(opts.url, opts.storage_options)  # what read_partition reads through
    before = tasks.bytes_read
    rows: set[Key] = set()
    for p in parts:
        for b in read_partition(opts, c, select_columns(SPARK_SCHEMA), p):
            got = zip(*(b.column(n).to_pylist() for n in ("topic", "queue_id", "queue_offset")), strict=True)
            for key in got:
                assert key not in rows  # read once
                rows.add(key)
    return rows, storage, planned, tasks.bytes_read - before


def _with_key(produced: Produced, key: str) -> set[Key]:
    return {k for k, v in produced.messages.items() if key in v[1]}


@pytest.mark.parametrize("key", ["k17", "k350", "g3", "nope"])
def test_key_lookup_finds_exactly_the_messages_with_the_key(
    indexed: tuple[str, dict[str, Any], Produced], key: str
) -> None:
    url, so, produced = indexed
    rows, storage, _, _ = _run(url, so, key=key)
    assert rows == _with_key(produced, key)
    # The indexed string is topic#key: per topic, the slot and its items of the one index file.
    assert sum("/rmq_sys_INDEX/" in p for p in storage.paths) == 2 * 2
    one_topic, storage, _, _ = _run(url, so, key=key, topic="orders")
    assert one_topic == {k for k in rows if k[0] == "orders"}
    assert sum("/rmq_sys_INDEX/" in p for p in storage.paths) == 2


def test_a_lookup_in_sealed_segments_only(indexed: tuple[str, dict[str, Any], Produced]) -> None:
    url, so, produced = indexed
    sealed, _, _, _ = _run(url, so, include_open_segments="false")
    assert 0 < len(sealed) < len(produced.messages)
    rows, _, _, _ = _run(url, so, key="g3", include_open_segments="false")
    assert rows == _with_key(produced, "g3") & sealed


def test_uniq_key_lookups_go_through_the_index_too(indexed: tuple[str, dict[str, Any], Produced]) -> None:
    url, so, produced = indexed

    def uniq(c: Constraints) -> None:
        assert c.push("uniq_key", "in", ["u5", "u320", "u7"])

    rows, _, _, _ = _run(url, so, uniq)
    by_seq = {int(v[0][:8]): k for k, v in produced.messages.items()}
    assert rows == {by_seq[5], by_seq[320], by_seq[7]}


def test_a_covered_single_key_reads_a_tiny_fraction_of_a_scan(
    indexed_s3: tuple[str, dict[str, Any], Produced],
) -> None:
    url, so, produced = indexed_s3
    everything, _, _, scanned = _run(url, so)
    assert len(everything) == len(produced.messages)
    rows, storage, _, read = _run(url, so, key="k124", topic="orders")
    assert rows == _with_key(produced, "k124")
    assert len(rows) == 1
    record = RECORD  # one record, with its header and properties
    assert read <= record < scanned / 100
    index_reads = [p for p in storage.paths if "/rmq_sys_INDEX/" in p]
    assert len(index_reads) == 2


def test_messages_of_an_expired_index_file_are_scanned(
    indexed: tuple[str, dict[str, Any], Produced], tmp_path: Any
) -> None:
    url, so, produced = indexed
    import shutil

    root = url.removeprefix("file://")
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    manifest_file = copy / index_manifest_path(CLUSTER, BROKER)
    m = IndexManifest.model_validate_json(manifest_file.read_bytes())
    # Retention deleted an index file whose items reached the newest message: nothing left is
    # certain; the segment that file held is gone too.
    newest = max(s.max_store_timestamp or 0 for s in m.segments)
    manifest_file.write_text(
        m.model_copy(update={"expired_through": newest + 10_000}).model_dump_json(by_alias=True)
    )
    rows, _, _, _ = _run(f"file://{copy}", so, key="g3")
    assert rows == _with_key(produced, "g3")

    (copy / index_segment_path("", CLUSTER, BROKER, m.segments[0].base_offset)).unlink()
    manifest_file.write_text(m.model_dump_json(by_alias=True))
    rows, _, _, _ = _run(f"file://{copy}", so, key="g3")
    assert rows == _with_key(produced, "g3")

    manifest_file.unlink()  # no index manifest at all: a scan with the key checked
    rows, _, _, _ = _run(f"file://{copy}", so, key="k17")
    assert rows == _with_key(produced, "k17")


def test_tag_filters_read_only_the_records_whose_tag_code_matches(
    indexed_s3: tuple[str, dict[str, Any], Produced], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, so, produced = indexed_s3
    monkeypatch.setattr(sparse, "COALESCE_GAP", 0)  # else records 15 kB apart are read as one run
    _, _, _, scanned = _run(url, so)

    def tags(*values: str) -> Callable[[Constraints], None]:
        def push(c: Constraints) -> None:
            assert c.push(
                "tags", "in" if len(values) > 1 else "==", list(values) if len(values) > 1 else values[0]
            )

        return push

    rows, _, _, read = _run(url, so, tags("rare"))
    assert rows == {k for k, v in produced.messages.items() if v[2] == "rare"}
    assert len(rows) == 8
    # The consume queue (20 bytes a message) and the 8 records, not the commitlog.
    assert read <= 20 * len(produced.messages) + 8 * RECORD < scanned / 8
    rows, _, _, _ = _run(url, so, tags("rare", "even"))
    assert rows == {k for k, v in produced.messages.items() if v[2] in ("rare", "even")}
    rows, _, _, _ = _run(url, so, tags("none-such"))
    assert rows == set()


def test_spark_key_option_uniq_key_and_tags_pushdown(
    spark: SparkSession,
    indexed: tuple[str, dict[str, Any], Produced],
    pushdown: Callable[[bool], None],
) -> None:
    url, _, produced = indexed

    def rows(df: Any) -> tuple[set[Key], int]:
        rdd = df.select("topic", "queue_id", "queue_offset").rdd
        return {(r[0], r[1], r[2]) for r in rdd.collect()}, rdd.getNumPartitions()

    def load(**options: str) -> Any:
        reader = spark.read.format("tierd").option("path", url)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    pushdown(False)
    got, _ = rows(load(key="g3"))  # the option needs no pushdown
    assert got == _with_key(produced, "g3")
    by_seq = {int(v[0][:8]): k for k, v in produced.messages.items()}
    off = rows(load().where(F.col("uniq_key") == "u5"))
    tagged_off = rows(load().where(F.col("tags") == "rare"))
    pushdown(True)
    on = rows(load().where(F.col("uniq_key") == "u5"))
    tagged_on = rows(load().where(F.col("tags") == "rare"))
    assert off[0] == on[0] == {by_seq[5]}
    assert on[1] < off[1]  # one span partition instead of every range
    assert tagged_off[0] == tagged_on[0] == {k for k, v in produced.messages.items() if v[2] == "rare"}
