"""Planning and decoding without Spark: options, splitting at record boundaries, pruning,
constraint arithmetic, column decoding, corruption reports.

cold tier (posix, small segments) ──manifests──▶ plan_ranges ──▶ ranges ──read_range──▶ Arrow
"""

from __future__ import annotations

import datetime as dt
import itertools
import shutil
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from tierd.errors import CorruptRecordError, InvalidArgumentError, NotFoundError
from tierd.format.host import encode_host
from tierd.format.message_id import offset_msg_id
from tierd.format.record import HEADER_V4, POS_PHYSICAL_OFFSET, POS_QUEUE_ID
from tierd.spark.decode import ARROW_SCHEMA, read_range
from tierd.spark.filters import Constraints, Interval
from tierd.spark.options import DEFAULT_MAX_PARTITION_BYTES, ReadOptions
from tierd.spark.plan import SegmentRange, plan_ranges
from tierd.spark.storage import ColdStorage
from tierd.tiered.manifest import MANIFEST_NAME

from ..tiered.conftest import cold_config
from .conftest import SCALE, SEGMENT, Produced, Rec, craft_queue, messages, produce

if TYPE_CHECKING:
    from pathlib import Path

UTC = dt.UTC


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Produced]:
    """600 messages in 3 commits over 2 topics × 2 queues; small commitlog segments (several
    sealed, the last one of each queue open)."""
    root = tmp_path_factory.mktemp("plan")
    cfg = cold_config(
        root,
        {"name": "posix", "url": str(root / "cold"), "storage_options": {"fsync": False}},
        **SEGMENT,
        consumequeue_segment_size=400,
    )
    produced = produce(cfg, [messages(0, 250), messages(250, 250), messages(500, 100)])
    return f"file://{root / 'cold'}", produced


def _plan(url: str, **options: str) -> tuple[ColdStorage, ReadOptions, list[SegmentRange]]:
    opts = ReadOptions.parse({"path": url, **options})
    storage = ColdStorage(opts.url, opts.storage_options)
    return storage, opts, plan_ranges(storage, opts, Constraints.from_options(opts))


def _rows(storage: ColdStorage, ranges: list[SegmentRange], c: Constraints | None = None) -> pa.Table:
    batches = [b for r in ranges for b in read_range(storage, r, c)]
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({}, "option path"),
        ({"path": "relative/dir"}, "option path"),
        ({"path": "/x", "queue_id": "1"}, "unknown option"),
        ({"path": "/x", "queue_ids": "1,a"}, "option queue_ids"),
        ({"path": "/x", "queue_ids": "-1"}, "option queue_ids"),
        ({"path": "/x", "include_open_segments": "maybe"}, "option include_open_segments"),
        ({"path": "/x", "storage_options": "{nope"}, "option storage_options"),
        ({"path": "/x", "storage_options": "[1]"}, "option storage_options"),
        ({"path": "/x", "max_partition_bytes": "lots"}, "option max_partition_bytes"),
        ({"path": "/x", "topic": "a,,b"}, "option topic"),
    ],
)
def test_bad_options_fail_naming_option_and_value(options: dict[str, str], names: str) -> None:
    with pytest.raises(InvalidArgumentError, match=names):
        ReadOptions.parse(options).require_path()  # a path may come from a table's schema


def test_options_parse_sizes_lists_and_case() -> None:
    o = ReadOptions.parse(
        {
            "PATH": "/data/cold",
            "Topic": "a, b",
            "queue_ids": "3,1,3",
            "max_partition_bytes": "64MiB",
            "include_open_segments": "False",
            "storage_options": '{"endpoint_url": "http://x"}',
        }
    )
    assert o.url == "file:///data/cold"
    assert o.topics == ("a", "b")
    assert o.queue_ids == (1, 3)
    assert o.max_partition_bytes == 64 * 1024 * 1024
    assert o.include_open_segments is False
    assert o.storage_options == {"endpoint_url": "http://x"}
    assert ReadOptions.parse({"path": "/x"}).max_partition_bytes == DEFAULT_MAX_PARTITION_BYTES == 128 << 20


def test_memory_url_is_refused_because_workers_cannot_see_it() -> None:
    with pytest.raises(InvalidArgumentError, match="memory"):
        ColdStorage("memory://bucket/x")


# ----------------------------------------------------------------------------- constraints
def test_timestamp_bounds_are_exact_in_microseconds() -> None:
    t = dt.datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=UTC)  # x.0015 s: between two milliseconds
    ms = int(t.timestamp() * 1000)  # floor
    cases = {
        ">=": Interval(ms + 1, None),
        ">": Interval(ms + 1, None),
        "<=": Interval(None, ms),
        "<": Interval(None, ms),
    }
    for op, expected in cases.items():
        c = Constraints()
        assert c.push("store_timestamp", op, t)
        assert c.store_ms == expected, op
    c = Constraints()
    assert c.push("store_timestamp", "==", t)
    assert c.store_ms.empty  # no millisecond timestamp equals x.0015 s
    whole = dt.datetime(2024, 1, 1, tzinfo=UTC)
    c = Constraints()
    assert c.push("store_timestamp", "<", whole)
    assert c.store_ms == Interval(None, int(whole.timestamp() * 1000) - 1)


@pytest.mark.parametrize(
    ("column", "op", "value"),
    [
        ("store_timestamp", ">=", dt.datetime(2024, 1, 1)),  # naive: depends on the session zone
        ("queue_offset", ">", 1.5),
        ("queue_offset", ">", True),
        ("topic", ">", "a"),
        ("body", "==", b"x"),
        ("queue_id", "in", (1, None)),
    ],
)
def test_filters_not_applied_exactly_are_left_to_spark(column: str, op: str, value: object) -> None:
    c = Constraints()
    assert not c.push(column, op, value)
    assert not c.row_filters


def test_constraints_intersect() -> None:
    c = Constraints(topics=frozenset({"a", "b"}))
    assert c.push("topic", "in", ("b", "c"))
    assert c.push("queue_id", ">=", 1)
    assert c.push("queue_offset", "in", (5, 9))
    assert c.push("queue_offset", "<", 8)
    assert c.topics == frozenset({"b"})
    assert not c.allows_queue(0)
    assert c.allows_queue(1)
    assert c.offset_bounds() == Interval(5, 7)


# ----------------------------------------------------------------------------- planning
def test_plan_reads_every_acknowledged_message_once(cold: tuple[str, Produced]) -> None:
    url, produced = cold
    storage, _, ranges = _plan(url)
    assert any(not r.sealed for r in ranges)
    assert any(r.sealed for r in ranges)
    t = _rows(storage, ranges)
    got = sorted(zip(*(t[c].to_pylist() for c in ("topic", "queue_id", "queue_offset", "body")), strict=True))
    assert got == produced.bodies()
    # keys and tags come back as produced
    for topic, qid, off, keys, tags in zip(
        *(t[c].to_pylist() for c in ("topic", "queue_id", "queue_offset", "keys", "tags")), strict=True
    ):
        _, want_keys, want_tags = produced.messages[(topic, qid, off)]
        assert tuple(keys) == want_keys
        assert tags == want_tags


def test_large_segments_split_at_record_boundaries_from_the_consume_queue(cold: tuple[str, Produced]) -> None:
    url, produced = cold
    storage, _, whole = _plan(url)
    _, _, split = _plan(url, max_partition_bytes=str(4000 * SCALE))
    assert len(split) > 2 * len(whole)
    by_segment: dict[str, list[SegmentRange]] = {}
    for r in split:
        by_segment.setdefault(r.path, []).append(r)
    for pieces in by_segment.values():
        for a, b in itertools.pairwise(pieces):
            assert a.end == b.start  # contiguous, no byte read twice or skipped
            assert a.last_queue_offset is not None
            assert a.last_queue_offset + 1 == b.first_queue_offset
    for r in split:
        t = _rows(storage, [r])  # every piece decodes on its own: it starts on a record
        assert t.num_rows > 0
        assert t["queue_offset"][0].as_py() == r.first_queue_offset
        if r.end is not None:
            assert r.end - r.start <= (4000 + 2 * 300) * SCALE  # target plus record-size slack
    assert _rows(storage, split).num_rows == len(produced.messages)


@pytest.mark.parametrize("max_bytes", ["1", "100"])
def test_tiny_partitions_plan_an_intact_bucket_one_record_each(
    cold: tuple[str, Produced], max_bytes: str
) -> None:
    """Partitions smaller than a record: every record is a range of its own — including where a
    consume-queue segment's units point into two commitlog segments, once reported as
    corruption of an intact bucket."""
    url, produced = cold
    storage, _, ranges = _plan(url, max_partition_bytes=max_bytes)
    assert all(r.end is None or r.end > r.start for r in ranges)
    t = _rows(storage, ranges)
    got = sorted(zip(*(t[c].to_pylist() for c in ("topic", "queue_id", "queue_offset", "body")), strict=True))
    assert got == produced.bodies()  # every message once, none twice
    sealed = [r for r in ranges if r.end is not None]
    assert len(sealed) > len(produced.messages) // 2  # one record each (the open tails stay whole)


def test_pruning_by_topic_queue_offsets_and_time(cold: tuple[str, Produced]) -> None:
    url, _ = cold
    storage, opts, all_ranges = _plan(url, max_partition_bytes=str(4000 * SCALE))
    c = Constraints.from_options(opts)
    assert c.push("topic", "==", "orders")
    assert c.push("queue_id", "==", 1)
    assert c.push("queue_offset", ">=", 150)
    assert c.push("queue_offset", "<", 170)
    pruned = plan_ranges(storage, opts, c)
    assert 0 < len(pruned) < len(all_ranges) / 4
    t = _rows(storage, pruned, c)
    assert t["queue_offset"].to_pylist() == list(range(150, 170))
    assert set(t["topic"].to_pylist()) == {"orders"}
    assert set(t["queue_id"].to_pylist()) == {1}
    future = Constraints.from_options(opts)
    assert future.push("store_timestamp", ">", dt.datetime(2100, 1, 1, tzinfo=UTC))
    tails = plan_ranges(storage, opts, future)
    # only open tails can still receive newer messages; everything sealed is pruned
    assert tails
    assert all(r.end is None and r.max_store_ms is None for r in tails)
    assert _rows(storage, tails, future).num_rows == 0


def test_include_open_segments_false_reads_sealed_segments_only(cold: tuple[str, Produced]) -> None:
    url, produced = cold
    storage, _, ranges = _plan(url, include_open_segments="false")
    assert ranges
    assert all(r.sealed for r in ranges)
    n = _rows(storage, ranges).num_rows
    assert 0 < n < len(produced.messages)


def test_topic_option_and_missing_topics(cold: tuple[str, Produced]) -> None:
    url, produced = cold
    storage, _, ranges = _plan(url, topic="audit", queue_ids="1")
    assert {(r.topic, r.queue_id) for r in ranges} == {("audit", 1)}
    assert _rows(storage, ranges).num_rows == sum(
        1 for t, q, _ in produced.messages if (t, q) == ("audit", 1)
    )
    with pytest.raises(NotFoundError, match=r"option topic: \['nope'\].*audit"):
        _plan(url, topic="audit,nope")
    with pytest.raises(NotFoundError, match="option cluster='Other'"):
        _plan(url, cluster="Other")


def test_queue_manifests_are_read_together_and_a_missing_one_is_named(
    cold: tuple[str, Produced], tmp_path: Path
) -> None:
    url, produced = cold
    _, _, ranges = _plan(url)
    assert {(r.topic, r.queue_id) for r in ranges} == {(t, q) for t, q, _ in produced.messages}
    copy = tmp_path / "cold"
    shutil.copytree(url.removeprefix("file://"), copy)
    [manifest] = copy.glob(f"*/*/audit/1/{MANIFEST_NAME}")
    manifest.unlink()
    with pytest.raises(NotFoundError, match=r"lists audit/1 but .*/audit/1/MANIFEST.json is missing"):
        _plan(f"file://{copy}")
    assert ColdStorage(f"file://{copy}").read_objects([]) == []


def test_a_directory_without_a_cold_tier_is_reported(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no tierd cold tier"):
        _plan(f"file://{tmp_path}")


# ----------------------------------------------------------------------------- decoding
def test_v2_records_and_ipv6_hosts_decode(tmp_path: Path) -> None:
    long_topic = "t" * 200  # > 127 characters: written with the v2 magic
    recs = [
        Rec(
            b"a" * 10, born_host="[2001:db8::7]:5000", store_host="10.0.0.2:10911", properties={"KEYS": "x y"}
        ),
        Rec(b"", born_host="10.0.0.1:1", store_host="[::1]:10911", properties={"TAGS": "t", "UNIQ_KEY": "u"}),
        Rec(b"c" * 300, born_host="[fe80::1]:2", store_host="[fe80::2]:3", reconsume_times=7),
    ]
    url = f"file://{tmp_path}"
    craft_queue(url, {}, long_topic, 3, recs)
    storage, _, ranges = _plan(url)
    t = _rows(storage, ranges).to_pylist()
    assert [r["topic"] for r in t] == [long_topic] * 3
    assert [r["body"] for r in t] == [b"a" * 10, b"", b"c" * 300]
    assert [r["born_host"] for r in t] == ["[2001:db8::7]:5000", "10.0.0.1:1", "[fe80::1]:2"]
    assert [r["store_host"] for r in t] == ["10.0.0.2:10911", "[::1]:10911", "[fe80::2]:3"]
    assert [r["keys"] for r in t] == [["x", "y"], [], []]
    assert [r["tags"] for r in t] == [None, "t", None]
    assert [r["reconsume_times"] for r in t] == [0, 0, 7]
    assert [r["sys_flag"] for r in t] == [0x10, 0x20, 0x30]
    phys = [r["physical_offset"] for r in t]
    assert phys[0] == 0
    assert phys[1] > 0
    # msg id = STOREHOST hex + 8-byte offset, as MessageExt.msg_id computes it
    assert t[0]["msg_id"] == "0A000002" + "00002A9F" + "0000000000000000"
    assert [r["msg_id"] for r in t] == [
        offset_msg_id(encode_host(r["store_host"]), p) for r, p in zip(t, phys, strict=True)
    ]
    assert len(t[2]["msg_id"]) == 56


def test_corrupt_body_fails_naming_object_and_offset(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    path, data = craft_queue(url, {}, "c", 0, [Rec(b"x" * 100) for _ in range(5)])
    size = len(data) // 5
    target = tmp_path / path
    raw = bytearray(target.read_bytes())
    raw[3 * size + 120] ^= 0xFF  # inside the 4th record's body
    target.write_bytes(bytes(raw))
    storage, _, ranges = _plan(url)
    with pytest.raises(CorruptRecordError) as e:
        _rows(storage, ranges)
    msg = str(e.value)
    assert path in msg
    assert f"position {3 * size}" in msg
    assert "CRC" in msg


@pytest.mark.parametrize(
    ("field", "reason"),
    [
        ("topic_length", "size"),
        ("topic", "does not belong in the flat file of topic 'cq'"),
        ("properties_length", "size"),
        ("physical_offset", "PHYSICALOFFSET"),
        ("queue_id", "does not belong in the flat file of queue 0"),
    ],
)
def test_a_bad_record_tail_or_header_field_is_named(tmp_path: Path, field: str, reason: str) -> None:
    """The decoder checks the tails of a batch (topic length, topic, properties length) with one
    gather when they all match; a record where one does not must still be found and named."""
    url = f"file://{tmp_path}"
    path, data = craft_queue(
        url, {}, "cq", 0, [Rec(b"y" * (40 + i), properties={"i": str(i)}) for i in range(6)]
    )
    pos = 0
    starts = []
    while pos < len(data):
        starts.append(pos)
        pos += int.from_bytes(data[pos : pos + 4], "big")
    at = starts[4]
    body_end = at + HEADER_V4 + 40 + 4
    raw = bytearray(data)
    where = {
        "topic_length": body_end,
        "topic": body_end + 1,
        "properties_length": body_end + 1 + len("cq") + 1,
        "physical_offset": at + POS_PHYSICAL_OFFSET + 7,
        "queue_id": at + POS_QUEUE_ID + 3,
    }[field]
    raw[where] ^= 0x01
    (tmp_path / path).write_bytes(bytes(raw))
    storage, _, ranges = _plan(url)
    with pytest.raises(CorruptRecordError, match=f"{path} at position {at} .*{reason}") as e:
        _rows(storage, ranges)
    assert e.value.detail["position"] == at


def test_corrupt_total_size_fails(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    path, data = craft_queue(url, {}, "c", 0, [Rec(b"x" * 100) for _ in range(3)])
    target = tmp_path / path
    raw = bytearray(data)
    raw[len(data) // 3 : len(data) // 3 + 4] = (7).to_bytes(4, "big")
    target.write_bytes(bytes(raw))
    storage, _, ranges = _plan(url)
    with pytest.raises(CorruptRecordError, match=f"{path} at position {len(data) // 3}.*total size 7"):
        _rows(storage, ranges)


def test_spans_compacts_ordered_ranges_including_empty_and_adjacent_ones() -> None:
    import numpy as np
    import pyarrow as pa

    from tierd.spark.decode import _spans

    data = b"hdrAAAhdrhdrBBBBCChdr"
    starts = np.array([3, 9, 12, 16, 21], np.int64)
    ends = np.array([6, 9, 16, 18, 21], np.int64)
    got = _spans(pa.py_buffer(data), starts, ends, pa.binary())
    assert got.to_pylist() == [b"AAA", b"", b"BBBB", b"CC", b""]
    assert _spans(pa.py_buffer(data), starts[:0], ends[:0], pa.string()).to_pylist() == []
