"""How a range is read: read sizes, record boundaries, chunked open segments, the tail, the
requests sent, segments that change under a read, and column selection.

Reads start on record boundaries and open segments are read in whole chunk objects (see
``decode._read_pieces``); whatever the read size and however the stored objects cut the records,
the rows must be exactly the records, and a range that ends inside a record must fail — unless it
is the tail of an open segment past what the manifest promised (a commit still being written).
Sealed segments are read on their manifest's word, so a missing or short object must still be
reported as such; a segment sealed during a read is read on from the sealed object.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import logging
import random
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from tierd.errors import CorruptionError, CorruptRecordError, SegmentNotFoundError
from tierd.format.record import decode_record
from tierd.spark.decode import ARROW_SCHEMA, READ_PIECE, read_range
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.plan import SegmentRange, plan_ranges
from tierd.spark.storage import ColdStorage
from tierd.testing.s3server import create_bucket

from .conftest import Rec, craft_queue

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tierd.testing.s3server import S3Server


def _recs(n: int, seed: int) -> list[Rec]:
    rnd = random.Random(seed)
    return [Rec(rnd.randbytes(rnd.choice([0, 1, 40, 300, 2000])), properties={"i": str(i)}) for i in range(n)]


def _plan(url: str, so: dict[str, Any] | None = None) -> tuple[ColdStorage, list[SegmentRange]]:
    opts = ReadOptions.parse({"path": url} | ({"storage_options": json.dumps(so)} if so else {}))
    storage = ColdStorage(opts.url, opts.storage_options)
    return storage, plan_ranges(storage, opts, Constraints.from_options(opts))


def _read(
    storage: ColdStorage,
    ranges: list[SegmentRange],
    piece: int = READ_PIECE,
    schema: pa.Schema = ARROW_SCHEMA,
) -> pa.Table:
    batches = [b for r in ranges for b in read_range(storage, r, piece=piece, schema=schema)]
    return pa.Table.from_batches(batches, schema=schema)


def _fresh(scheme: str, tmp_path: Path, moto_server: S3Server) -> tuple[str, dict[str, Any]]:
    if scheme == "file":
        return f"file://{tmp_path}", {}
    return f"s3://{create_bucket(moto_server)}/cold", moto_server.storage_options


@contextlib.contextmanager
def _s3_calls() -> Iterator[list[str]]:
    """The S3 API calls s3fs makes inside the block, sorted (s3fs logs each at DEBUG)."""
    calls: list[str] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if msg.startswith("CALL: "):
                calls.append(msg.split()[1])

    log = logging.getLogger("s3fs")
    handler, level = Count(), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield calls
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        calls.sort()


def _bodies(t: pa.Table) -> list[tuple[int, bytes]]:
    return list(zip(t.column("queue_offset").to_pylist(), t.column("body").to_pylist(), strict=True))


@pytest.mark.parametrize("piece", [1, 5, 97, 1000, 4096, 1 << 20])
def test_any_read_size_gives_every_record_once(tmp_path: Path, piece: int) -> None:
    recs = _recs(60, seed=piece)
    craft_queue(f"file://{tmp_path}", {}, "t", 0, recs)
    storage, ranges = _plan(f"file://{tmp_path}")
    got = _read(storage, ranges, piece)
    assert _bodies(got) == [(i, r.body) for i, r in enumerate(recs)]
    assert got.column("properties").to_pylist() == [[("i", str(i))] for i in range(60)]


def test_a_range_ending_inside_a_record_fails(tmp_path: Path) -> None:
    path, data = craft_queue(f"file://{tmp_path}", {}, "t", 0, _recs(5, seed=1))
    # The manifest says the sealed segment is 10 bytes shorter: its last record is cut.
    craft_queue(f"file://{tmp_path}", {}, "t", 0, _recs(5, seed=1), manifest_size=len(data) - 10)
    storage, ranges = _plan(f"file://{tmp_path}")
    for piece in (64, 1 << 20):
        with pytest.raises(CorruptRecordError, match=f"{path}.*record cut off"):
            _read(storage, ranges, piece)


def test_an_open_segments_commit_in_flight_past_the_manifest_is_not_read(tmp_path: Path) -> None:
    recs = _recs(8, seed=2)
    _, whole = craft_queue(f"file://{tmp_path}", {}, "t", 0, recs)
    half = whole[: len(whole) // 2]  # not on a record boundary: a record half appended
    craft_queue(f"file://{tmp_path}", {}, "t", 0, recs, tail=half[:37], open_segment=True)
    storage, ranges = _plan(f"file://{tmp_path}")
    assert [r.end for r in ranges] == [None]
    for piece in (50, 1 << 20):
        assert _bodies(_read(storage, ranges, piece)) == [(i, r.body) for i, r in enumerate(recs)]


def test_open_segment_chunks_cut_inside_records_read_back_exactly(moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    url, so = f"s3://{bucket}/cold", moto_server.storage_options
    recs = _recs(40, seed=3)
    _, data = craft_queue(f"s3://{bucket}/reference", so, "t", 0, recs)
    cuts = sorted(random.Random(4).sample(range(1, len(data)), 9))  # anywhere, records split
    craft_queue(url, so, "t", 0, recs, chunks=cuts)
    storage, ranges = _plan(url, so)
    assert [r.sealed for r in ranges] == [False]
    for piece in (3, 100, 5000, 1 << 20):
        assert _bodies(_read(storage, ranges, piece)) == [(i, r.body) for i, r in enumerate(recs)]


def test_open_segments_are_read_in_whole_chunk_objects(moto_server: S3Server, monkeypatch: Any) -> None:
    bucket = create_bucket(moto_server)
    url, so = f"s3://{bucket}/cold", moto_server.storage_options
    recs = _recs(30, seed=5)
    _, data = craft_queue(f"s3://{bucket}/reference", so, "t", 0, recs)
    starts = [0]  # record boundaries, from the TOTALSIZE chain
    while starts[-1] < len(data):
        starts.append(starts[-1] + int.from_bytes(data[starts[-1] : starts[-1] + 4], "big"))
    bounds = starts[7:-1:7]  # chunks = commits of whole records, 7 per chunk
    path, _ = craft_queue(url, so, "t", 0, recs, chunks=bounds)
    storage, ranges = _plan(url, so)
    spans: list[tuple[str, int, int]] = []
    finds: list[str] = []
    real_cat, real_spans, real_find = storage.cat, storage.cat_spans, storage.fs.find

    def cat(path: str, start: int, end: int, **kw: Any) -> bytes:
        spans.append((path, start, end))
        return real_cat(path, start, end, **kw)

    def cat_spans(many: list[tuple[str, int, int]], **kw: Any) -> list[bytes]:
        spans.extend(many)
        return real_spans(many, **kw)

    def find(path: str, **kw: Any) -> Any:
        finds.append(path)
        return real_find(path, **kw)

    monkeypatch.setattr(storage, "cat", cat)
    monkeypatch.setattr(storage, "cat_spans", cat_spans)
    monkeypatch.setattr(storage.fs, "find", find)
    cuts = [0, *bounds, len(data)]
    got = _read(storage, ranges, piece=max(b - a for a, b in itertools.pairwise(cuts)))
    assert _bodies(got) == [(i, r.body) for i, r in enumerate(recs)]
    whole = {(f"{storage.full(path)}.chunks/{a:020d}", 0, b - a) for a, b in itertools.pairwise(cuts)}
    assert sorted(spans) == sorted(whole)  # every chunk read once, whole
    assert len(finds) == 1  # one listing finds the segment's chunks (no stat, no second list)


def test_a_sealed_object_wins_over_leftover_chunks(moto_server: S3Server) -> None:
    """Sealing composes the chunks into the object, then deletes them: in between, both exist."""
    bucket = create_bucket(moto_server)
    url, so = f"s3://{bucket}/cold", moto_server.storage_options
    recs = _recs(12, seed=6)
    path, data = craft_queue(url, so, "t", 0, recs)
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(url, **so)
    fs.pipe_file(f"{root}/{path}.chunks/{0:020d}", b"garbage that is not read")
    storage, ranges = _plan(url, so)
    src = storage.segment(path)
    assert src.size == len(data)
    assert _bodies(_read(storage, ranges)) == [(i, r.body) for i, r in enumerate(recs)]


def test_s3_requests_planning_and_reading_an_open_segment(moto_server: S3Server) -> None:
    """Round trips are what a Spark job over a real bucket waits for: planning lists the root
    and the cluster and GETs each manifest once (no HEADs); a read lists its segment once and
    GETs each chunk once."""
    bucket = create_bucket(moto_server)
    url, so = f"s3://{bucket}/cold", moto_server.storage_options
    recs = _recs(20, seed=7)
    craft_queue(url, so, "t", 0, recs, chunks=[])  # an open segment of one chunk
    with _s3_calls() as planning:
        storage, ranges = _plan(url, so)
    with _s3_calls() as reading:
        assert _bodies(_read(storage, ranges)) == [(i, r.body) for i, r in enumerate(recs)]
    assert planning == ["get_object"] * 2 + ["list_objects_v2"] * 2  # broker + queue manifest
    assert reading == ["get_object", "list_objects_v2"]


def test_records_are_read_without_botocores_response_checksum(
    moto_server: S3Server, monkeypatch: Any
) -> None:
    """Commitlog records go through a second client that does not ask for (nor check) response
    checksums — the decoder checks every record — while manifests, listings and consume queue
    units keep the regular client's validation; a user's own setting wins."""
    bucket = create_bucket(moto_server)
    url, so = f"s3://{bucket}/cold", moto_server.storage_options
    recs = _recs(20, seed=10)
    craft_queue(url, so, "t", 0, recs)
    storage, ranges = _plan(url, so)

    def refused(*args: Any, **kw: Any) -> bytes:
        raise AssertionError("records read through the regular client")

    monkeypatch.setattr(storage.fs, "cat_file", refused)
    assert _bodies(_read(storage, ranges)) == [(i, r.body) for i, r in enumerate(recs)]
    assert storage.records_fs is not storage.fs
    assert storage.records_fs.s3.meta.config.response_checksum_validation == "when_required"
    assert storage.fs.s3.meta.config.response_checksum_validation == "when_supported"
    assert storage.records_fs.session is storage.fs.session  # one session: models loaded once
    own = {**so, "config_kwargs": {"response_checksum_validation": "when_supported"}}
    storage, ranges = _plan(url, own)
    assert _bodies(_read(storage, ranges)) == [(i, r.body) for i, r in enumerate(recs)]
    assert storage.records_fs.s3.meta.config.response_checksum_validation == "when_supported"
    file_storage = ColdStorage("file:///tmp")
    assert file_storage.records_fs is file_storage.fs


def test_a_sealed_segment_is_read_without_listing_it(moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    url, so = f"s3://{bucket}/cold", moto_server.storage_options
    recs = _recs(20, seed=8)
    craft_queue(url, so, "t", 0, recs)
    storage, ranges = _plan(url, so)
    assert [r.sealed for r in ranges] == [True]
    with _s3_calls() as calls:
        assert _bodies(_read(storage, ranges)) == [(i, r.body) for i, r in enumerate(recs)]
    assert calls == ["get_object"]


@pytest.mark.parametrize("scheme", ["file", "s3"])
def test_a_segment_deleted_after_planning_is_named(
    scheme: str, tmp_path: Path, moto_server: S3Server
) -> None:
    url, so = _fresh(scheme, tmp_path, moto_server)
    path, _ = craft_queue(url, so, "t", 0, _recs(5, seed=9))
    storage, ranges = _plan(url, so)
    storage.fs.rm_file(storage.full(path))  # cold retention ran since planning
    with pytest.raises(SegmentNotFoundError, match=f"{path} does not exist.*retention"):
        _read(storage, ranges)


@pytest.mark.parametrize("scheme", ["file", "s3"])
def test_a_sealed_object_shorter_than_its_manifest_is_corruption(
    scheme: str, tmp_path: Path, moto_server: S3Server
) -> None:
    url, so = _fresh(scheme, tmp_path, moto_server)
    path, data = craft_queue(url, so, "t", 0, _recs(30, seed=10))
    storage, ranges = _plan(url, so)
    storage.fs.pipe_file(storage.full(path), data[: len(data) // 2])  # lost its second half
    with pytest.raises(CorruptionError, match=f"{path}: the manifest promises at least {len(data)} bytes"):
        _read(storage, ranges, piece=len(data) // 3 + 1)


def test_an_open_segment_sealed_while_it_is_read(moto_server: S3Server) -> None:
    """The daemon seals a segment while a task reads its chunks: the chunks vanish once the
    sealed object is written, and the read goes on from the sealed object."""
    bucket = create_bucket(moto_server)
    url, so = f"s3://{bucket}/cold", moto_server.storage_options
    recs = _recs(30, seed=11)
    _, data = craft_queue(f"s3://{bucket}/reference", so, "t", 0, recs)
    path, _ = craft_queue(url, so, "t", 0, recs, chunks=[len(data) // 2])  # not on a record boundary
    storage, ranges = _plan(url, so)
    src = storage.segment(path)
    first = src.read(0, 100)
    storage.fs.pipe_file(storage.full(path), data)  # sealed: the object, then the chunks go
    storage.fs.rm(storage.full(path) + ".chunks", recursive=True)
    assert first + src.read(100, len(data)) == data
    assert _bodies(_read(storage, ranges)) == [(i, r.body) for i, r in enumerate(recs)]


def test_selected_columns_decode_as_in_the_full_schema(tmp_path: Path) -> None:
    recs = [
        Rec(b"x" * i, store_host="[::1]:10911" if i % 3 == 0 else "10.0.0.2:10911", properties=p)
        for i, p in enumerate([{"TAGS": "a", "KEYS": "k1 k2"}, {}, {"KEYS": "z"}, {"TAGS": "b"}] * 5)
    ]
    craft_queue(f"file://{tmp_path}", {}, "t", 3, recs)
    storage, ranges = _plan(f"file://{tmp_path}")
    full = _read(storage, ranges)
    for name in ARROW_SCHEMA.names:
        one = pa.schema([ARROW_SCHEMA.field(name)])
        got = pa.Table.from_batches(
            [b for r in ranges for b in read_range(storage, r, schema=one)], schema=one
        )
        assert got.column(name).equals(full.column(name)), name
    pair = pa.schema([ARROW_SCHEMA.field("msg_id"), ARROW_SCHEMA.field("tags")])
    got = pa.Table.from_batches([b for r in ranges for b in read_range(storage, r, schema=pair)], schema=pair)
    assert got.equals(full.select(["msg_id", "tags"]))


@pytest.mark.parametrize("pushed", [False, True])
def test_every_column_of_ipv4_records_is_the_codecs(tmp_path: Path, pushed: bool) -> None:
    """Where both hosts are IPv4 the decoder takes every fixed field from one gather of the
    record header; each row must still be what the codec decodes, also after pushed filters
    drop rows (before and after the properties are split)."""
    rnd = random.Random(17)
    hosts = ["10.0.0.1:4000", "10.0.0.9:4001", "192.168.1.1:80", "127.0.0.1:10911"]
    recs = [
        Rec(
            rnd.randbytes(rnd.choice([0, 3, 100, 900])),
            store_ts=1_700_000_000_000 + rnd.randrange(10**6),
            born_host=rnd.choice(hosts),
            store_host=rnd.choice(hosts),
            properties={"TAGS": f"t{i % 3}", "KEYS": f"k{i} j{i}" if i % 4 else f"k{i}", "x": "y"},
            reconsume_times=rnd.randrange(17),
        )
        for i in range(60)
    ]
    _, data = craft_queue(f"file://{tmp_path}", {}, "t", 5, recs)
    codec, pos = [], 0
    while pos < len(data):
        codec.append(decode_record(data, pos))
        pos += codec[-1].size
    storage, ranges = _plan(f"file://{tmp_path}")
    c = Constraints()
    if pushed:
        assert c.push("queue_offset", ">=", 7)
        assert c.push("tags", "in", ["t0", "t2"])
        codec = [m for m in codec if m.queue_offset >= 7 and m.properties["TAGS"] != "t1"]
    got = pa.Table.from_batches([b for r in ranges for b in read_range(storage, r, c)], schema=ARROW_SCHEMA)
    assert got.num_rows == len(codec)
    for row, m in zip(got.to_pylist(), codec, strict=True):
        assert row == {
            "topic": m.topic,
            "queue_id": m.queue_id,
            "queue_offset": m.queue_offset,
            "physical_offset": m.commitlog_offset,
            "store_timestamp": dt.datetime.fromtimestamp(m.store_timestamp / 1000, dt.UTC),
            "born_timestamp": dt.datetime.fromtimestamp(m.born_timestamp / 1000, dt.UTC),
            "tags": m.properties.get("TAGS"),
            "keys": m.properties["KEYS"].split(" "),
            "msg_id": m.msg_id,
            "properties": list(m.properties.items()),
            "body": m.body,
            "sys_flag": m.sys_flag,
            "reconsume_times": m.reconsume_times,
            "born_host": m.born_host,
            "store_host": m.store_host,
            "uniq_key": None,
        }


@pytest.mark.parametrize("hosts", [["10.0.0.1:4000"], ["10.0.0.1:4000", "10.0.0.9:4001", "192.168.1.1:80"]])
def test_ipv4_hosts_decode_per_row(tmp_path: Path, hosts: list[str]) -> None:
    k = len(hosts)
    recs = [Rec(b"x", born_host=hosts[i % k], store_host=hosts[-1 - i % k]) for i in range(9)]
    craft_queue(f"file://{tmp_path}", {}, "t", 0, recs)
    storage, ranges = _plan(f"file://{tmp_path}")
    got = _read(storage, ranges)
    assert got.column("born_host").to_pylist() == [r.born_host for r in recs]
    assert got.column("store_host").to_pylist() == [r.store_host for r in recs]


def test_small_reads_batched_across_chunks(moto_server: S3Server) -> None:
    """``read_units`` (planning's consume-queue reads): ranges inside one chunk, straddling two,
    and of a sealed object come back exact from one batch of GETs."""
    bucket = create_bucket(moto_server)
    url, so = f"s3://{bucket}/cold", moto_server.storage_options
    recs = _recs(20, seed=12)
    sealed, data = craft_queue(f"s3://{bucket}/reference", so, "t", 0, recs)
    cut = len(data) // 2
    path, _ = craft_queue(url, so, "t", 0, recs, chunks=[cut])
    storage = ColdStorage(url, so)
    ranges = [(0, 20), (cut - 7, cut + 13), (cut, cut + 20), (len(data) - 20, len(data))]
    got = storage.read_units([(path, a, b) for a, b in ranges])
    assert got == [data[a:b] for a, b in ranges]
    other = ColdStorage(f"s3://{bucket}/reference", so)
    assert other.read_units([(sealed, a, b) for a, b in ranges]) == [data[a:b] for a, b in ranges]
