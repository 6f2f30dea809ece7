"""Spark fixtures: ONE local SparkSession for the whole test run, and cold tiers to read.

Two ways to get a cold tier:

* ``produce`` — the real thing: a :class:`~tierd.BlockingMessageStore` with a small-file cold
  tier, ``tier_now()``; returns what was acknowledged so tests compare rows to it.
* ``craft_queue`` — records built with the codec and written straight into the layout (segment
  objects + manifests) through fsspec. For what the store will not write (v2 records with
  topics > 127 characters, IPv6 store hosts in one queue with IPv4 ones) and for corruption.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from fsspec.core import url_to_fs

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.drivers.paths import segment_path
from tierd.drivers.segment import FileType
from tierd.format.cq_unit import tags_code
from tierd.format.host import encode_host
from tierd.format.properties import encode_properties
from tierd.format.record import encode_record, topic_field
from tierd.tiered.manifest import (
    BrokerManifest,
    ManifestSegment,
    QueueManifest,
    TopicEntry,
    broker_manifest_path,
    queue_manifest_path,
)

from ..tiered.conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, upload_index

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from pyspark.sql import SparkSession


#: What the Spark tests' Python workers find in their environment: credentials moto accepts, for
#: tables (whose options may not hold any) — the way a cluster's executors get theirs.
MOTO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local[2] session shared by every Spark test (start-up costs ~5 s, the first job ~4 s)."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from tierd.spark import register

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("tierd-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
    )
    for name, value in MOTO_CREDENTIALS.items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def pushdown(spark: SparkSession) -> Iterator[Any]:
    """``set(True/False)`` toggles ``spark.sql.python.filterPushdown.enabled``; restored after."""
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key) or "false"

    def set_(on: bool) -> None:
        spark.conf.set(key, "true" if on else "false")

    yield set_
    spark.conf.set(key, before)


# ----------------------------------------------------------------------------- produced data
@dataclass(frozen=True)
class Produced:
    """What the store acknowledged: (topic, queue_id, queue_offset) → (body, keys, tags)."""

    messages: dict[tuple[str, int, int], tuple[bytes, tuple[str, ...], str | None]]

    def bodies(self, topic: str | None = None) -> list[tuple[str, int, int, bytes]]:
        return sorted((t, q, o, v[0]) for (t, q, o), v in self.messages.items() if topic in (None, t))


def produce(
    cfg: TierdConfig, batches: Sequence[Sequence[Message]], *, index_after: int | None = None
) -> Produced:
    """Put each batch and tier it (``tier_now`` after each, so segments hold several commits).
    ``index_after``: upload the cold key index after that many batches (later ones stay in the
    local index file, as messages of the last ``max_file_age`` do)."""
    out: dict[tuple[str, int, int], tuple[bytes, tuple[str, ...], str | None]] = {}
    with BlockingMessageStore.open(cfg) as store:
        for i, batch in enumerate(batches):
            if index_after is not None and i == index_after:
                upload_index(store)
            for m, r in zip(batch, store.put_batch(list(batch)), strict=True):
                out[(m.topic, r.queue_id, r.queue_offset)] = (m.body, tuple(m.keys), m.tags)
            store.tier_now()
        if index_after is not None and index_after >= len(batches):
            upload_index(store)
    return Produced(out)


#: These tests were sized for 24 kB cold commitlog segments; the smallest allowed is
#: ``MIN_SEGMENT`` (~68 KiB). So segments are SCALE times larger, and so are the records of
#: :func:`messages` (~860 bytes) and the byte budgets the tests set: a read still spans as many
#: segments, partitions and batches as before, from the same number of messages.
SCALE = 3
SEGMENT: dict[str, Any] = {"max_message_size": SMALL_BODY_LIMIT, "commitlog_segment_size": 24_000 * SCALE}
assert SEGMENT["commitlog_segment_size"] >= MIN_SEGMENT


def messages(start: int, n: int, *, size: int = 720) -> list[Message]:
    """Deterministic messages over two topics and two queues; keys ``k{i}`` + a shared one,
    UNIQ_KEY ``u{i}``, tags ``even`` on every other one and ``rare`` on every 50th."""
    return [
        Message(
            topic="orders" if i % 3 else "audit",
            body=(b"%08d|" % i) * (size // 9),
            keys=[f"k{i}", f"g{i % 5}"],
            tags="rare" if i % 50 == 1 else "even" if i % 2 == 0 else None,
            queue_id=i % 2,
            properties={"seq": str(i), "UNIQ_KEY": f"u{i}"},
        )
        for i in range(start, start + n)
    ]


# ----------------------------------------------------------------------------- crafted data
@dataclass(frozen=True)
class Rec:
    body: bytes
    store_ts: int = 1_700_000_000_000
    born_host: str = "10.0.0.1:4000"
    store_host: str = "10.0.0.2:10911"
    properties: dict[str, str] | None = None
    reconsume_times: int = 0


def craft_queue(
    url: str,
    storage_options: dict[str, Any],
    topic: str,
    queue_id: int,
    recs: Sequence[Rec],
    *,
    cluster: str = "DefaultCluster",
    broker: str = "broker-a",
    topics: Sequence[tuple[str, int]] | None = None,
    chunks: Sequence[int] | None = None,
    tail: bytes = b"",
    manifest_size: int | None = None,
    open_segment: bool = False,
) -> tuple[str, bytes]:
    """Write one queue (one sealed commitlog + consume-queue segment, queue manifest) and the
    broker manifest listing ``topics`` (default: this queue only). Returns the commitlog
    segment's path (relative to ``url``) and its bytes.

    ``chunks``: positions to cut the commitlog at; it is then an *open* segment stored as chunk
    objects (FORMATS §2.3), cut wherever asked — inside records too; ``open_segment`` makes it
    open without chunks (a posix-written file still growing). ``tail``: bytes stored after
    the records (a commit in flight, or garbage). ``manifest_size``: the commitlog size the
    manifest claims (default: the records' bytes)."""
    fs, root = url_to_fs(url, **storage_options)

    def put(rel: str, data: bytes) -> None:
        fs.makedirs(f"{root}/{rel.rsplit('/', 1)[0]}", exist_ok=True)  # a no-op on S3
        fs.pipe_file(f"{root}/{rel}", data)

    magic, topic_part = topic_field(topic.encode())
    cl = bytearray()
    cq = bytearray()
    for i, r in enumerate(recs):
        props = dict(r.properties or {})
        rec = encode_record(
            r.body,
            topic_part,
            magic,
            encode_properties(props),
            queue_id,
            0,
            i,
            len(cl),
            0,
            r.store_ts - 5,
            encode_host(r.born_host),
            r.store_ts,
            encode_host(r.store_host),
            r.reconsume_times,
        )
        cq += len(cl).to_bytes(8, "big") + len(rec).to_bytes(4, "big")
        cq += tags_code(props.get("TAGS")).to_bytes(8, "big", signed=True)
        cl += rec
    cl_path = segment_path("", cluster, broker, topic, queue_id, FileType.COMMIT_LOG, 0)
    cq_path = segment_path("", cluster, broker, topic, queue_id, FileType.CONSUME_QUEUE, 0)
    stored = bytes(cl) + tail
    if chunks is None:
        put(cl_path, stored)
    else:
        cuts = [0, *sorted(chunks), len(stored)]
        for a, b in itertools.pairwise(cuts):
            put(f"{cl_path}.chunks/{a:020d}", stored[a:b])
    put(cq_path, bytes(cq))
    n = len(recs)
    ts = [r.store_ts for r in recs]
    seg = {"base_offset": 0, "sealed": True, "message_count": n, "first_queue_offset": 0}
    qm = QueueManifest(
        cluster=cluster,
        broker=broker,
        topic=topic,
        queue_id=queue_id,
        min_offset=0,
        max_offset=n,
        segments=(
            ManifestSegment(
                type="COMMIT_LOG",
                size=len(cl) if manifest_size is None else manifest_size,
                min_store_timestamp=min(ts),
                max_store_timestamp=max(ts),
                last_queue_offset=n - 1,
                **{**seg, "sealed": chunks is None and not open_segment},
            ),
            ManifestSegment(type="CONSUME_QUEUE", size=len(cq), last_queue_offset=n - 1, **seg),
        ),
        written_at=int(time.time() * 1000),
    )
    put(queue_manifest_path(cluster, broker, topic, queue_id), qm.model_dump_json(by_alias=True).encode())
    listed = topics if topics is not None else [(topic, queue_id)]
    by_topic: dict[str, list[int]] = {}
    for t, q in listed:
        by_topic.setdefault(t, []).append(q)
    bm = BrokerManifest(
        cluster=cluster,
        broker=broker,
        topics=tuple(
            TopicEntry(name=t, id=i, queues=tuple(sorted(qs))) for i, (t, qs) in enumerate(by_topic.items())
        ),
        written_at=int(time.time() * 1000),
    )
    put(broker_manifest_path(cluster, broker), bm.model_dump_json(by_alias=True).encode())
    return cl_path, bytes(cl)
