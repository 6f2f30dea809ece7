"""``spark.readStream.format("tierd")``: offsets from the bucket manifests, micro-batches that
read exactly what was committed since the previous one.

    live store ──put/tier_now──▶ bucket ──latestOffset (manifests)──▶ [start, end) per queue
                                        ──partitions (consume-queue units)──▶ only those bytes

The reader is driven directly first (what Spark's streaming worker calls, without Spark's
seconds per batch): no record twice, none missing, only new bytes read, every kind of
startingOffsets, maxBytesPerTrigger, data lost to retention. Then real queries on a local
session: one running while a store tiers (segments sealing under it), restarted from its
checkpoint; one in Trigger.AvailableNow with maxBytesPerTrigger.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

from tierd import BlockingMessageStore
from tierd.errors import InvalidArgumentError, NotFoundError
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.plan import load_queues, record_positions
from tierd.spark.source import SPARK_SCHEMA, TierdPartition, select_columns
from tierd.spark.storage import open_storage
from tierd.spark.stream import TierdStreamReader
from tierd.testing.s3server import create_bucket
from tierd.tiered.manifest import QueueManifest, queue_manifest_path

from ..tiered.conftest import cold_config
from .conftest import SCALE, SEGMENT, messages

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from pathlib import Path

    from pyspark.sql import SparkSession

    from tierd.config import TierdConfig
    from tierd.testing.s3server import S3Server

Key = tuple[str, int, int]
Offsets = dict[str, int]


def _cfg(root: Path, backend: dict[str, Any] | None = None) -> TierdConfig:
    backend = backend or {"name": "posix", "url": str(root / "cold"), "storage_options": {"fsync": False}}
    return cold_config(root, backend, **SEGMENT, consumequeue_segment_size=400)


def _reader(url: str, so: dict[str, Any] | None = None, **options: str) -> TierdStreamReader:
    opts = {"path": url, **options} | ({"storage_options": json.dumps(so)} if so else {})
    return TierdStreamReader(ReadOptions.parse(opts), select_columns(SPARK_SCHEMA))


def _span(positions: list[int | None]) -> int:
    """Bytes between (start, end) position pairs of each queue."""
    pairs = zip(positions[::2], positions[1::2], strict=True)
    return sum(b - a for a, b in pairs if a is not None and b is not None)


def _keys_of(batch: Any) -> list[Key]:
    return list(
        zip(*(batch.column(n).to_pylist() for n in ("topic", "queue_id", "queue_offset")), strict=True)
    )


def _batch(r: TierdStreamReader, start: Offsets, end: Offsets) -> list[Key]:
    return [k for p in r.partitions(start, end) for b in r.read(p) for k in _keys_of(b)]


def _keys(store: BlockingMessageStore, start: int, n: int) -> set[Key]:
    """Put messages ``start...`` and return their (topic, queue id, queue offset)."""
    ms = messages(start, n)
    return {(m.topic, r.queue_id, r.queue_offset) for m, r in zip(ms, store.put_batch(ms), strict=True)}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, BlockingMessageStore]]:
    """An open store tiering to file:// (small segments: they seal as batches go by)."""
    with BlockingMessageStore.open(_cfg(tmp_path)) as store:
        yield f"file://{tmp_path / 'cold'}", store


def test_each_batch_reads_what_was_committed_since_the_last_one_and_only_that(
    live: tuple[str, BlockingMessageStore],
) -> None:
    url, store = live
    first = _keys(store, 0, 100)
    store.tier_now()
    r = _reader(url, startingOffsets="earliest")
    start = r.initialOffset()
    assert set(start.values()) == {0}
    end = r.latestOffset(start, ReadAllAvailable())
    assert sorted(_batch(r, start, end)) == sorted(first)
    assert r.latestOffset(end, ReadAllAvailable()) == end  # nothing new: the same offsets
    seen = set(first)
    storage = open_storage(url, {})
    for round_ in range(1, 4):
        new = _keys(store, round_ * 100, 100)
        store.tier_now()
        nxt = r.latestOffset(end, ReadAllAvailable())
        queues = load_queues(storage, r.options, Constraints())
        pos = record_positions(storage, [(q, o[q.key]) for q in queues for o in (end, nxt)])
        expected_bytes = _span(pos)
        parts = r.partitions(end, nxt)
        before = storage.bytes_read
        got = [k for p in parts for b in r.read(p) for k in _keys_of(b)]
        assert sorted(got) == sorted(new)  # each once, nothing from an earlier batch
        assert not seen & set(got)
        # Exactly the new records' bytes: open segments are never read again from their start.
        assert storage.bytes_read - before == expected_bytes
        seen |= set(got)
        end = nxt
    # Replaying a batch (a restart from the checkpoint) reads the same records again.
    assert sorted(_batch(r, start, end)) == sorted(seen)


def test_starting_offsets_earliest_latest_json_and_timestamp(live: tuple[str, BlockingMessageStore]) -> None:
    url, store = live
    _keys(store, 0, 60)
    store.tier_now()
    later = _keys(store, 60, 60)
    store.tier_now()
    everything = _reader(url, startingOffsets="earliest")
    start = everything.initialOffset()
    end = everything.latestOffset(start, ReadAllAvailable())
    assert _reader(url).initialOffset() == end  # latest is the default

    given = _reader(url, startingOffsets='{"orders": {"0": 5, "1": -2}, "audit": {"0": -1, "1": 3}}')
    assert given.initialOffset() == {
        "DefaultCluster/broker-a/orders/0": 5,
        "DefaultCluster/broker-a/orders/1": 0,
        "DefaultCluster/broker-a/audit/0": end["DefaultCluster/broker-a/audit/0"],
        "DefaultCluster/broker-a/audit/1": 3,
    }

    # A timestamp: per queue, the first message stored at or after it.
    rows: list[tuple[Key, int]] = []
    for p in everything.partitions(start, end):
        for b in everything.read(p):
            cols = (b.column(n).to_pylist() for n in ("topic", "queue_id", "queue_offset", "store_timestamp"))
            rows += [((t, q, o), int(ts.timestamp() * 1000)) for t, q, o, ts in zip(*cols, strict=True)]
    t = min(ts for k, ts in rows if k in later)
    want = {
        key: min(
            (o for (tp, q, o), ts in rows if f"DefaultCluster/broker-a/{tp}/{q}" == key and ts >= t),
            default=end[key],
        )
        for key in end
    }
    for spelling in (
        str(t),
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t // 1000)) + f".{t % 1000:03d}+00:00",
    ):
        assert _reader(url, startingOffsets=spelling).initialOffset() == want


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"nope": {"0": 1}}', "names 'nope', which is not a selected topic"),
        ('{"orders": {"0": 1, "7": 1}}', r"'orders' has no queue\(s\) \[7\]"),
        ('{"orders": {"0": 1, "1": 1}}', "gives no offset for"),
    ],
)
def test_per_queue_starting_offsets_that_do_not_fit_are_refused(
    live: tuple[str, BlockingMessageStore], value: str, message: str
) -> None:
    url, store = live
    _keys(store, 0, 20)
    store.tier_now()
    with pytest.raises(NotFoundError, match=message):
        _reader(url, startingOffsets=value).initialOffset()


@pytest.mark.parametrize("value", ["soon", "2025-01-01T00:00:00", '{"orders": {"0": "x"}}', "{nope"])
def test_bad_starting_offsets_fail_at_parse(value: str) -> None:
    with pytest.raises(InvalidArgumentError, match="option startingOffsets"):
        ReadOptions.parse({"path": "/x", "startingOffsets": value})


def test_max_bytes_per_trigger_splits_fairly_at_record_boundaries(
    live: tuple[str, BlockingMessageStore],
) -> None:
    url, store = live
    produced = _keys(store, 0, 400)
    store.tier_now()
    r = _reader(url, startingOffsets="earliest", maxBytesPerTrigger=f"{8 * SCALE}k")
    assert r.getDefaultReadLimit() == ReadMaxBytes(8192 * SCALE)
    storage = open_storage(url, {})
    start = r.initialOffset()
    got: list[Key] = []
    batches = 0
    while (end := r.latestOffset(start, r.getDefaultReadLimit())) != start:
        queues = load_queues(storage, r.options, Constraints())
        pos = record_positions(storage, [(q, o[q.key]) for q in queues for o in (start, end)])
        size = _span(pos)
        assert size <= 8192 * SCALE
        # Every queue with data moves: shares, not first come first served.
        waiting = {q.key for q in queues if q.manifest.max_offset > start[q.key]}
        assert {k for k in end if end[k] > start[k]} == waiting
        got += _batch(r, start, end)
        start = end
        batches += 1
    assert batches >= 10
    assert sorted(got) == sorted(produced)
    # Trigger.AvailableNow: data arriving afterwards is left for the next run.
    _keys(store, 400, 40)
    store.tier_now()
    r.prepareForTriggerAvailableNow()
    target = r.latestOffset(start, ReadAllAvailable())
    _keys(store, 440, 40)
    store.tier_now()
    assert r.latestOffset(start, ReadAllAvailable()) == target


def test_offsets_deleted_by_retention_fail_the_query_unless_skipping_is_asked(
    live: tuple[str, BlockingMessageStore], tmp_path: Path
) -> None:
    url, store = live
    _keys(store, 0, 120)
    store.tier_now()
    root = tmp_path / "cold"
    r = _reader(url, startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    # Retention moved orders/0's earliest offset past what the query has not read yet.
    path = root / queue_manifest_path("DefaultCluster", "broker-a", "orders", 0)
    qm = QueueManifest.model_validate_json(path.read_bytes())
    path.write_text(qm.model_copy(update={"min_offset": 7}).model_dump_json(by_alias=True))
    with pytest.raises(
        NotFoundError,
        match=r"queue offsets \[0, 7\) of DefaultCluster/broker-a/orders/0.*failOnDataLoss=false",
    ):
        r.partitions(start, end)
    lenient = _reader(url, startingOffsets="earliest", failOnDataLoss="false")
    got = _batch(lenient, start, end)
    assert sorted(k[2] for k in got if k[:2] == ("orders", 0)) == list(
        range(7, end["DefaultCluster/broker-a/orders/0"])
    )
    # A segment deleted between planning and reading: named, or skipped.
    parts = r.partitions({**start, "DefaultCluster/broker-a/orders/0": 7}, end)
    assert isinstance(parts[0], TierdPartition)
    gone = parts[0].ranges[0]
    (root / gone.path).unlink()
    with pytest.raises(NotFoundError, match="failOnDataLoss=false"):
        list(r.read(parts[0]))
    assert list(lenient.read(parts[0])) == []


# ----------------------------------------------------------------------------- with Spark
def test_a_query_running_while_the_store_tiers_sees_every_message_once_and_resumes(
    spark: SparkSession, moto_server: S3Server, tmp_path: Path
) -> None:
    url = f"s3://{create_bucket(moto_server)}/cold"
    so = moto_server.storage_options
    cfg = _cfg(tmp_path, {"name": "s3", "url": url, "storage_options": so})
    # foreachBatch is at-least-once: a batch whose commit Spark had not written when the query
    # stopped runs again, under the same id and offsets, when it resumes. An idempotent sink keyed
    # by batch id is exactly-once, and that is what this test holds the source to.
    batches: dict[int, list[Key]] = {}
    lock = threading.Lock()

    def collect(df: Any, batch_id: int) -> None:
        rows = [(r[0], r[1], r[2]) for r in df.select("topic", "queue_id", "queue_offset").collect()]
        with lock:
            assert batch_id not in batches or sorted(batches[batch_id]) == sorted(rows), batch_id
            batches[batch_id] = rows

    def seen(ids: Iterable[int]) -> list[Key]:
        with lock:
            return [k for i in ids for k in batches.get(i, [])]

    def query(trigger: dict[str, Any]) -> Any:
        return (
            spark.readStream.format("tierd")
            .option("path", url)
            .option("storage_options", json.dumps(so))
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(**trigger)
            .start()
        )

    produced: set[Key] = set()
    with BlockingMessageStore.open(cfg) as store:
        produced |= _keys(store, 0, 50)
        store.tier_now()
        q = query({"processingTime": "1 second"})
        try:
            for i in range(1, 6):  # the store keeps tiering while the query runs
                produced |= _keys(store, i * 50, 50)
                store.tier_now()
            deadline = time.monotonic() + 120
            while len(seen(list(batches))) < len(produced):
                assert q.exception() is None, q.exception()
                assert time.monotonic() < deadline, (
                    f"{len(seen(list(batches)))} of {len(produced)} rows after 120 s"
                )
                q.awaitTermination(0.5)
        finally:
            q.stop()
        first = seen(sorted(batches))
        assert len(first) == len(set(first))
        assert set(first) == produced
        first_ids = set(batches)
        # Stopped; more messages; the same checkpoint resumes exactly after what was read.
        more = _keys(store, 300, 80)
        store.tier_now()
    q = query({"availableNow": True})
    assert q.awaitTermination(120)
    assert q.exception() is None
    assert sorted(seen(sorted(set(batches) - first_ids))) == sorted(more)


def test_max_bytes_per_trigger_in_spark_gives_several_batches(spark: SparkSession, tmp_path: Path) -> None:
    with BlockingMessageStore.open(_cfg(tmp_path)) as store:
        produced = _keys(store, 0, 300)
        store.tier_now()
    batches: list[int] = []

    def collect(df: Any, _batch_id: int) -> None:
        batches.append(df.count())

    q = (
        spark.readStream.format("tierd")
        .option("startingOffsets", "earliest")
        .option("maxBytesPerTrigger", f"{32 * SCALE}k")
        .load(f"file://{tmp_path / 'cold'}")
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    assert q.exception() is None
    assert sum(batches) == len(produced)
    assert len([b for b in batches if b]) >= 3


def test_a_bad_streaming_option_fails_at_load(spark: SparkSession) -> None:
    with pytest.raises(PySparkException, match="option maxBytesPerTrigger"):
        spark.readStream.format("tierd").option("maxBytesPerTrigger", "lots").load("/nowhere")
