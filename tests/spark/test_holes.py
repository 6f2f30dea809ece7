"""Cold holes: queue offsets whose messages were lost to damage before they were tiered.

    hot commitlog ──damage──▶ quarantined records ──tier_now──▶ size-0 consume-queue units
                                                               (no commitlog bytes)

The cold tier records such an offset as a consume-queue unit of size 0 pointing at where the
next record starts. Every Spark read path must step over them: plan splits cut at record
starts, the stream's offsets, startingOffsets by time and maxBytesPerTrigger, key lookups
through the cold index and tag pruning through the consume queue — never a crash, never a row
for a lost offset, never a surviving message missing.
"""

from __future__ import annotations

import functools
import itertools
import json
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

from tierd import BlockingMessageStore
from tierd.format.cq_unit import tags_code
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.plan import load_queues
from tierd.spark.source import SPARK_SCHEMA, plan_partitions, read_partition, select_columns
from tierd.spark.storage import open_storage
from tierd.spark.stream import TierdStreamReader, offsets_for_time

from ..tiered.conftest import cold_config, upload_index
from .conftest import SCALE, SEGMENT, Produced, messages

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

Key = tuple[str, int, int]
#: Store time of the first round's messages; round ``r`` stores at ``ROUND_MS + 75 * r``.
ROUND_MS = 1_700_000_000_000
TOPIC = "orders"
#: Offsets of queue 0 of "orders" lost before tiering: a run, single ones, one at the very end of
#: a tiering round, and the queue's last offset (the tail is a hole).
LOST = frozenset({0, 1, 7, 19, 20, 21, 22, 40, 41, 55, *range(60, 75), 99, 149})


def _lose(store: BlockingMessageStore, results: list[tuple[Any, Any]], lost: set[int]) -> None:
    """Quarantine the records of ``lost`` queue offsets, as recovery does with damaged bytes."""
    assert store.hot.wait_dispatched(60)
    ends = {r.commitlog_offset: nxt.commitlog_offset for (_, r), (_, nxt) in itertools.pairwise(results)}
    for m, r in results:
        if m.topic == TOPIC and r.queue_id == 0 and r.queue_offset in lost:
            end = ends.get(r.commitlog_offset, store.hot.commitlog.max_offset)
            store.hot.quarantine.add(r.commitlog_offset, end, b"", [(TOPIC, 0, r.queue_offset)])


@pytest.fixture(scope="module")
def holed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Produced]:
    """file://: 450 messages over two topics and queues tiered in rounds of 75 (small segments:
    20 units per consume-queue segment), the LOST offsets of orders/0 quarantined before their
    round; the cold index uploaded. Returns the URL and the survivors."""
    root = tmp_path_factory.mktemp("holes")
    backend = {"name": "posix", "url": str(root / "cold"), "storage_options": {"fsync": False}}
    cfg = cold_config(root, backend, **SEGMENT, consumequeue_segment_size=400)
    out: dict[Key, tuple[bytes, tuple[str, ...], str | None]] = {}
    with BlockingMessageStore.open(cfg) as store:
        for start in range(0, 450, 75):
            store.hot.commitlog.clock = functools.partial(int, ROUND_MS + start)  # a time per round
            batch = messages(start, 75)
            results = list(zip(batch, store.put_batch(batch), strict=True))
            _lose(store, results, set(LOST))
            for m, r in results:
                if not (m.topic == TOPIC and r.queue_id == 0 and r.queue_offset in LOST):
                    out[(m.topic, r.queue_id, r.queue_offset)] = (m.body, tuple(m.keys), m.tags)
            store.tier_now()
        upload_index(store)
        assert max(LOST) == store.hot.cqs[(TOPIC, 0)].max_offset - 1  # the tail is a hole
        assert {(TOPIC, 0, o) for o in LOST}.isdisjoint(out)
    return f"file://{root / 'cold'}", Produced(out)


def _keys_of(batch: Any) -> list[Key]:
    return list(
        zip(*(batch.column(n).to_pylist() for n in ("topic", "queue_id", "queue_offset")), strict=True)
    )


def test_plans_split_at_holes_without_failing(holed: tuple[str, Produced]) -> None:
    """Every partition size, down to cuts every few records: cuts landing on holes are skipped."""
    url, produced = holed
    for size in (600, 1024, 2048, 5 * 1024, 20 * 1024):
        opts = ReadOptions.parse({"path": url, "max_partition_bytes": str(size * SCALE)})
        storage = open_storage(url, {})
        c = Constraints.from_options(opts)
        got: list[Key] = []
        for p in plan_partitions(storage, opts, c):
            got += [k for b in read_partition(opts, c, select_columns(SPARK_SCHEMA), p) for k in _keys_of(b)]
        assert sorted(got) == sorted(produced.messages), size


def test_tag_pruning_skips_holes(holed: tuple[str, Produced]) -> None:
    """A hole's unit has tag code 0 — the code of no tag, and of a tag whose hash is 0: pruning
    must not take it for a record."""
    url, produced = holed
    assert tags_code("f5a5a608") == 0
    for tags in (["f5a5a608"], ["even", "rare"]):
        opts = ReadOptions.parse({"path": url})
        storage = open_storage(url, {})
        c = Constraints.from_options(opts)
        assert c.push("tags", "in", tags)
        got = [
            k
            for p in plan_partitions(storage, opts, c)
            for b in read_partition(opts, c, select_columns(SPARK_SCHEMA), p)
            for k in _keys_of(b)
        ]
        assert sorted(got) == sorted(k for k, v in produced.messages.items() if v[2] in tags), tags


def test_spark_reads_keys_and_tags_skip_holes(spark: SparkSession, holed: tuple[str, Produced]) -> None:
    url, produced = holed
    df = spark.read.format("tierd").option("max_partition_bytes", str(1024 * SCALE)).load(url)
    rows = {
        (r[0], r[1], r[2]): bytes(r[3])
        for r in df.select("topic", "queue_id", "queue_offset", "body").collect()
    }
    assert rows == {k: v[0] for k, v in produced.messages.items()}
    # Key lookups through the cold index: a key shared by many, a survivor right after the run
    # 19..22, a lost message (k2 was orders/0@0).
    survivor = int(produced.messages[(TOPIC, 0, 23)][0][:8])
    shared = {k for k, v in produced.messages.items() if "g2" in v[1]}
    for key, expected in (("g2", shared), (f"k{survivor}", {(TOPIC, 0, 23)}), ("k2", set())):
        got = (
            spark.read.format("tierd")
            .option("key", key)
            .load(url)
            .select("topic", "queue_id", "queue_offset")
        )
        assert {(r[0], r[1], r[2]) for r in got.collect()} == expected, key
    # Tag pruning reads consume-queue units, holes among them.
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        tagged = spark.read.format("tierd").load(url).where(F.col("tags").isin("even", "rare"))
        got_tags = {(r[0], r[1], r[2]) for r in tagged.select("topic", "queue_id", "queue_offset").collect()}
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    assert got_tags == {k for k, v in produced.messages.items() if v[2] in ("even", "rare")}


def _reader(url: str, **options: str) -> TierdStreamReader:
    return TierdStreamReader(ReadOptions.parse({"path": url, **options}), select_columns(SPARK_SCHEMA))


def _batch(r: TierdStreamReader, start: dict[str, int], end: dict[str, int]) -> list[Key]:
    return [k for p in r.partitions(start, end) for b in r.read(p) for k in _keys_of(b)]


def test_the_stream_steps_over_holes(holed: tuple[str, Produced]) -> None:
    url, produced = holed
    r = _reader(url, startingOffsets="earliest")
    start = r.initialOffset()
    # Small budgets: batch ends (and starts) land on holes, including the tail.
    seen: list[Key] = []
    at = start
    for _ in range(1000):
        end = r.latestOffset(at, ReadMaxBytes(700 * SCALE))
        if end == at:
            break
        seen += _batch(r, at, end)
        at = end
    assert sorted(seen) == sorted(produced.messages)
    assert r.latestOffset(at, ReadAllAvailable()) == at
    # Starting at a hole (json offsets), and by time: offsets for every time are valid starts.
    key = next(k for k in start if k.endswith(f"/{TOPIC}/0"))
    for first in (0, 19, 60, 99):
        begin = {**start, key: first}
        end = r.latestOffset(begin, ReadAllAvailable())
        got = _batch(r, begin, end)
        assert sorted(got) == sorted(k for k in produced.messages if k[:2] != (TOPIC, 0) or k[2] >= first)
    # startingOffsets by time: from the offset found, exactly the messages stored at/after it.
    storage = open_storage(url, {})
    (queue,) = [
        q for q in load_queues(storage, r.options, Constraints()) if (q.topic, q.queue_id) == (TOPIC, 0)
    ]
    ours = {k[2] for k in produced.messages if k[:2] == (TOPIC, 0)}
    for ts in (0, *(ROUND_MS + 75 * n + d for n in range(6) for d in (0, 1)), 2**62):
        (off,) = offsets_for_time(storage, [queue], ts).values()
        assert {o for o in ours if o >= off} == {o for o in ours if _stored_at(o) >= ts}, ts


def _stored_at(offset: int) -> int:
    """Store time of orders/0's message at ``offset``: the messages() index i of queue offset o
    is the o-th even i not divisible by 3; rounds hold i in [75 r, 75 r + 75)."""
    i = [i for i in range(450) if i % 2 == 0 and i % 3][offset]
    return ROUND_MS + 75 * (i // 75)


def test_a_streaming_query_over_holes(
    spark: SparkSession, holed: tuple[str, Produced], tmp_path: Path
) -> None:
    url, produced = holed
    seen: list[Key] = []

    def collect(df: Any, _batch_id: int) -> None:
        seen.extend((r[0], r[1], r[2]) for r in df.select("topic", "queue_id", "queue_offset").collect())

    q = (
        spark.readStream.format("tierd")
        .option("startingOffsets", json.dumps({TOPIC: {"0": 20, "1": -2}, "audit": {"0": -2, "1": -2}}))
        .option("maxBytesPerTrigger", str(2048 * SCALE))
        .load(url)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(300)
    assert q.exception() is None
    assert sorted(seen) == sorted(k for k in produced.messages if k[:2] != (TOPIC, 0) or k[2] >= 20)
