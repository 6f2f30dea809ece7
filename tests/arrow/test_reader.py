"""The Arrow reader against cold tiers a real store wrote (posix, and S3 on a moto server):

* every row and column is what the store's own ``get`` returns for that message;
* each restriction — keyword or pushed filter — returns exactly the matching rows and reads
  fewer bytes than a full scan; a filter that cannot be pruned by is still exact;
* a projection is those columns, and the others are not decoded;
* a scan streams: its first batch arrives before the topic has been read.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import tierd.arrow
from tierd.errors import InvalidArgumentError, NotFoundError
from tierd.spark import decode

from .conftest import BATCHES, Tier

if TYPE_CHECKING:
    from collections.abc import Callable

    from tierd.format.message_ext import MessageExt

Key = tuple[str, int, int]


def _row(m: MessageExt) -> dict[str, Any]:
    props = m.properties
    return {
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "physical_offset": m.commitlog_offset,
        "store_timestamp": dt.datetime.fromtimestamp(m.store_timestamp / 1000, dt.UTC),
        "born_timestamp": dt.datetime.fromtimestamp(m.born_timestamp / 1000, dt.UTC),
        "tags": props.get("TAGS"),
        "keys": props["KEYS"].split(" "),
        "msg_id": m.msg_id,
        "properties": list(props.items()),
        "body": m.body,
        "sys_flag": m.sys_flag,
        "reconsume_times": m.reconsume_times,
        "born_host": m.born_host,
        "store_host": m.store_host,
        "uniq_key": props.get("UNIQ_KEY"),
    }


def _keys(table: pa.Table) -> list[Key]:
    cols = [table.column(c).to_pylist() for c in ("topic", "queue_id", "queue_offset")]
    return list(zip(*cols, strict=True))


def _open(tier: Tier, **kw: Any) -> tierd.arrow.TierdDataset:
    return tierd.arrow.dataset(tier.url, storage_options=tier.storage_options, **kw)


@pytest.fixture(params=["posix", "s3"])
def tier(request: pytest.FixtureRequest) -> Tier:
    got: Tier = request.getfixturevalue(f"{request.param}_tier")
    return got


@pytest.fixture(scope="session")
def full_scan_bytes(s3_tier: Tier) -> int:
    ds = _open(s3_tier)
    assert ds.count_rows() == len(s3_tier.messages)
    return ds.bytes_read


def test_rows_are_what_the_store_returns(tier: Tier) -> None:
    table = _open(tier).to_table()
    assert table.schema.equals(tierd.arrow.SCHEMA)
    assert table.num_rows == sum(BATCHES)
    assert table.to_pylist() == [_row(m) for m in tier.messages]


def test_a_projection_is_those_columns_and_decodes_no_other(
    posix_tier: Tier, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _open(posix_tier).to_table()
    built: list[str] = []

    def spy(name: str) -> Callable[..., Any]:
        real = getattr(decode, name)

        def counted(*args: Any, **kw: Any) -> Any:
            built.append(name)
            return real(*args, **kw)

        return counted

    for name in ("_properties", "_hosts"):  # properties, tags, keys, uniq_key; hosts and msg_id
        monkeypatch.setattr(decode, name, spy(name))
    got = _open(posix_tier).to_table(columns=["body", "queue_offset", "store_timestamp"])
    assert got.equals(full.select(["body", "queue_offset", "store_timestamp"]))
    assert built == []
    assert _open(posix_tier).to_table(columns=["msg_id"]).equals(full.select(["msg_id"]))
    assert set(built) == {"_hosts"}


def _cases(
    tier: Tier,
) -> dict[str, tuple[dict[str, Any], pc.Expression | None, Callable[[MessageExt], bool]]]:
    """name → (keyword restrictions, filter, which stored messages match)."""
    last_batch = [m for m in tier.messages if int(m.properties["seq"]) >= 240]
    since = min(m.store_timestamp for m in last_batch)
    return {
        "topic": ({"topic": "audit"}, None, lambda m: m.topic == "audit"),
        "queues": ({"queues": [1]}, None, lambda m: m.queue_id == 1),
        "offsets": (
            {"topic": "orders", "offsets": (20, 30)},
            None,
            lambda m: m.topic == "orders" and 20 <= m.queue_offset < 30,
        ),
        "store_time": ({"store_time": (since, None)}, None, lambda m: m.store_timestamp >= since),
        "tags": ({"tags": ["rare"]}, None, lambda m: m.properties.get("TAGS") == "rare"),
        "key (indexed)": ({"keys": "k17"}, None, lambda m: "k17" in m.properties["KEYS"].split(" ")),
        "key (not yet indexed)": ({"keys": "k250"}, None, lambda m: m.properties["UNIQ_KEY"] == "u250"),
        "filter queue_id": ({}, pc.field("queue_id") == 2, lambda m: m.queue_id == 2),
        "filter uniq_key": ({}, pc.field("uniq_key") == "u33", lambda m: m.properties["UNIQ_KEY"] == "u33"),
        "filter tags in": ({}, pc.field("tags").isin(["rare"]), lambda m: m.properties.get("TAGS") == "rare"),
        "filter conjunction": (
            {},
            (pc.field("topic") == "orders") & (pc.field("queue_id") == 1) & (pc.field("queue_offset") >= 50),
            lambda m: m.topic == "orders" and m.queue_id == 1 and m.queue_offset >= 50,
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "topic",
        "queues",
        "offsets",
        "store_time",
        "tags",
        "key (indexed)",
        "key (not yet indexed)",
        "filter queue_id",
        "filter uniq_key",
        "filter tags in",
        "filter conjunction",
    ],
)
def test_each_restriction_is_exact_and_reads_less(s3_tier: Tier, full_scan_bytes: int, case: str) -> None:
    kw, expr, match = _cases(s3_tier)[case]
    expected = [(m.topic, m.queue_id, m.queue_offset) for m in s3_tier.messages if match(m)]
    assert expected  # the case selects something
    ds = _open(s3_tier, **kw)
    got = ds.to_table(columns=["topic", "queue_id", "queue_offset"], filter=expr)
    assert _keys(got) == expected
    assert ds.bytes_read < full_scan_bytes


def test_a_single_key_reads_a_sliver(posix_tier: Tier) -> None:
    # Every message is in an uploaded index file here: nothing is scanned, whatever its age.
    full = _open(posix_tier)
    assert full.count_rows() == len(posix_tier.messages)
    ds = _open(posix_tier, keys="u17")
    assert ds.to_table(columns=["uniq_key"]).column("uniq_key").to_pylist() == ["u17"]
    assert ds.bytes_read * 10 < full.bytes_read


def test_a_filter_it_cannot_prune_by_is_still_exact(s3_tier: Tier, full_scan_bytes: int) -> None:
    expr = (pc.field("queue_id") == 1) | (pc.field("tags") == "rare")
    ds = _open(s3_tier)
    got = ds.to_table(columns=["queue_offset", "topic", "queue_id"], filter=expr)
    expected = [m for m in s3_tier.messages if m.queue_id == 1 or m.properties.get("TAGS") == "rare"]
    assert _keys(got) == [(m.topic, m.queue_id, m.queue_offset) for m in expected]
    assert got.column_names == ["queue_offset", "topic", "queue_id"]  # the order asked for
    assert ds.bytes_read == full_scan_bytes


def test_polars_pushes_its_filter_and_projection(s3_tier: Tier, full_scan_bytes: int) -> None:
    ds = _open(s3_tier)
    got = (
        pl.scan_pyarrow_dataset(ds)
        .filter(
            (pl.col("topic") == "orders")
            & (pl.col("queue_id") == 1)
            & pl.col("queue_offset").is_between(5, 9)
        )
        .select("queue_offset", "body")
        .collect()
    )
    expected = [
        m for m in s3_tier.messages if m.topic == "orders" and m.queue_id == 1 and 5 <= m.queue_offset <= 9
    ]
    assert got.rows() == [(m.queue_offset, m.body) for m in expected]
    assert ds.bytes_read < full_scan_bytes


def test_a_scan_streams(s3_tier: Tier, full_scan_bytes: int) -> None:
    """Its first batch comes before the topic is read. One part read ahead here: by default
    up to 8 are, which is most of this small topic (test_readahead checks that bound)."""
    ds = _open(s3_tier)
    batches = ds.to_batches(batch_size=7, fragment_readahead=1)
    first = next(batches)
    assert first.num_rows == 7
    assert ds.bytes_read < full_scan_bytes / 2  # two segments, not the topic
    assert first.num_rows + sum(b.num_rows for b in batches) == len(s3_tier.messages)


def test_head_count_and_the_c_stream(posix_tier: Tier) -> None:
    ds = _open(posix_tier, topic="orders")
    n = sum(1 for m in posix_tier.messages if m.topic == "orders")
    assert ds.count_rows() == n
    assert ds.count_rows(filter=pc.field("queue_id") == 0) == sum(
        1 for m in posix_tier.messages if m.topic == "orders" and m.queue_id == 0
    )
    assert ds.head(3, columns=["queue_offset"]).column(0).to_pylist() == [0, 1, 2]
    assert pa.RecordBatchReader.from_stream(ds).read_all().num_rows == n
    assert ds.filter(pc.field("tags") == "rare").count_rows() == sum(
        1 for m in posix_tier.messages if m.topic == "orders" and m.properties.get("TAGS") == "rare"
    )


@pytest.mark.parametrize(
    ("kw", "scan", "says"),
    [
        ({}, {"columns": ["body", "nope"]}, "['nope'] are not tierd columns"),
        ({"store_time": (dt.datetime(2024, 1, 1), None)}, {}, "datetimes with a time zone"),
        ({"queues": [-1]}, {}, "queues must be an integer >= 0"),
        ({"offsets": (1,)}, {}, "offsets must be a pair"),
        ({}, {"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({}, {"use_threads": True, "exclude_rows": 1}, "unknown scan option(s) ['exclude_rows']"),
        ({}, {"fragment_readahead": -1}, "fragment_readahead must be an integer >= 0, got -1"),
    ],
)
def test_bad_arguments_are_named(
    posix_tier: Tier, kw: dict[str, Any], scan: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        _open(posix_tier, **kw).to_table(**scan)
    assert says in str(e.value)


def test_a_topic_that_is_not_there_names_those_that_are(posix_tier: Tier) -> None:
    with pytest.raises(NotFoundError) as e:
        _open(posix_tier, topic="ordres").count_rows()
    assert "'ordres'" in str(e.value)
    assert "['audit', 'orders']" in str(e.value)
