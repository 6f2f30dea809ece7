"""A scan reads the next parts while it hands out the batches of one (``read_parts``):

* the next part's read starts while the first part's batch is still held by the caller — what
  a scan that read parts one after another never did;
* how far ahead is bounded — by bytes, at least one part, at most ``READ_AHEAD_PARTS``;
* a damaged part fails the scan where it is: every row of the parts before it comes out first,
  the same rows as a scan without read-ahead, then the same typed error;
* a scan stopped early leaves no read running behind it.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

import tierd.arrow
from tierd.errors import CorruptRecordError
from tierd.spark import parts as parts_module
from tierd.spark.decode import ARROW_SCHEMA
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.parts import ReadPart, plan_parts, read_parts
from tierd.spark.storage import ColdStorage, SegmentSource

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    import pyarrow as pa

    from .conftest import Tier

#: Threads that read for a scan: parts read ahead, and each range's own next-piece read.
_READERS = ("tierd-read-ahead", "tierd-spark-read")


def _until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def _readers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(_READERS)]


@pytest.fixture
def segments_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The segment of every commitlog read, in the order the reads were sent."""
    got: list[str] = []
    real = SegmentSource.read

    def spy(self: SegmentSource, start: int, end: int, *, records: bool = False) -> bytes:
        got.append(self.path)
        return real(self, start, end, records=records)

    monkeypatch.setattr(SegmentSource, "read", spy)
    return got


def _plan(url: str) -> tuple[ColdStorage, list[ReadPart], Constraints]:
    opts = ReadOptions.parse({"path": url}).require_path()
    storage = ColdStorage(opts.url, opts.storage_options)
    c = Constraints.from_options(opts)
    return storage, plan_parts(storage, opts, c), c


def test_the_next_part_is_read_while_one_is_consumed(posix_tier: Tier, segments_read: list[str]) -> None:
    storage, parts, c = _plan(posix_tier.url)
    assert len(parts) > 3
    first, second = (storage.full(p.ranges[0].path) for p in parts[:2])
    batches = read_parts(storage, parts, c, ARROW_SCHEMA)
    try:
        next(batches)  # held: nothing more is asked of the scan
        _until(lambda: second in segments_read, "the second part read while the first one's batch is held")
        assert first in segments_read
    finally:
        batches.close()


@pytest.mark.parametrize(("ahead_bytes", "ahead"), [(1, 1), (None, parts_module.READ_AHEAD_PARTS)])
def test_how_far_ahead_is_bounded(
    posix_tier: Tier, monkeypatch: pytest.MonkeyPatch, ahead_bytes: int | None, ahead: int
) -> None:
    """One byte of budget still reads one part ahead; the default budget (two 16 MiB pieces)
    covers every part of this small tier, and the part count caps it."""
    started: list[ReadPart] = []

    class Counted(parts_module._Ahead):
        def __init__(self, *args: Any) -> None:
            started.append(args[1])
            super().__init__(*args)

    monkeypatch.setattr(parts_module, "_Ahead", Counted)
    storage, parts, c = _plan(posix_tier.url)
    assert len(parts) > parts_module.READ_AHEAD_PARTS + 1
    batches = read_parts(storage, parts, c, ARROW_SCHEMA, ahead_bytes=ahead_bytes)
    try:
        next(batches)
        assert started == parts[: 1 + ahead]
    finally:
        batches.close()


@pytest.mark.parametrize("fragment_readahead", [0, 2])
def test_fragment_readahead_caps_the_parts_read_ahead(
    posix_tier: Tier, monkeypatch: pytest.MonkeyPatch, fragment_readahead: int
) -> None:
    """pyarrow's "files to read ahead", as Polars or a caller of ``pyarrow.dataset`` passes it:
    the parts read ahead at most; 0 reads one part at a time, and the rows are the same."""
    started: list[ReadPart] = []

    class Counted(parts_module._Ahead):
        def __init__(self, *args: Any) -> None:
            started.append(args[1])
            super().__init__(*args)

    monkeypatch.setattr(parts_module, "_Ahead", Counted)
    ds = tierd.arrow.dataset(posix_tier.url)
    batches = ds.to_batches(fragment_readahead=fragment_readahead)
    assert isinstance(batches, Generator)
    try:
        next(batches)
        assert len(started) == (1 + fragment_readahead if fragment_readahead else 0)
    finally:
        batches.close()
    assert ds.to_table(fragment_readahead=fragment_readahead).equals(ds.to_table())


def _rows_until_error(batches: Iterator[pa.RecordBatch]) -> tuple[list[Any], CorruptRecordError]:
    """The (topic, queue, offset) of every row handed out before the scan failed, and the error."""
    rows: list[Any] = []

    def drain() -> None:
        for b in batches:
            rows.extend(
                zip(*(b.column(n).to_pylist() for n in ("topic", "queue_id", "queue_offset")), strict=True)
            )

    with pytest.raises(CorruptRecordError) as e:
        drain()
    return rows, e.value


def test_a_damaged_part_fails_where_it_is(posix_tier: Tier, tmp_path: Path) -> None:
    cold = tmp_path / "cold"
    shutil.copytree(posix_tier.url.removeprefix("file://"), cold)
    storage, parts, c = _plan(f"file://{cold}")
    bad = parts[3].ranges[0]
    with open(cold / bad.path, "r+b") as f:  # the first record's MAGICCODE
        f.seek(bad.start + 4)
        magic = f.read(1)
        f.seek(bad.start + 4)
        f.write(bytes([magic[0] ^ 0xFF]))

    one_by_one = _rows_until_error(read_parts(storage, parts, c, ARROW_SCHEMA, ahead_bytes=0))
    ahead = _rows_until_error(read_parts(storage, parts, c, ARROW_SCHEMA))
    before = sum(1 for m in posix_tier.messages for p in parts[:3] if _in(m, p))
    assert len(one_by_one[0]) == before > 0
    assert ahead[0] == one_by_one[0]
    assert ahead[1].detail["path"] == one_by_one[1].detail["path"] == storage.display(storage.full(bad.path))
    assert ahead[1].detail["position"] == bad.start
    _until(lambda: not _readers(), "no read left running after the failed scan")


def _in(m: Any, part: ReadPart) -> bool:
    r = part.ranges[0]
    return bool(
        m.topic == r.topic
        and m.queue_id == r.queue_id
        and r.first_queue_offset is not None
        and r.last_queue_offset is not None
        and r.first_queue_offset <= m.queue_offset <= r.last_queue_offset
    )


def test_a_scan_stopped_early_leaves_no_read_running(posix_tier: Tier, segments_read: list[str]) -> None:
    ds = tierd.arrow.dataset(posix_tier.url)
    batches = ds.to_batches()
    assert isinstance(batches, Generator)
    next(batches)
    _until(lambda: len(set(segments_read)) > 1, "parts read ahead")
    batches.close()
    assert _readers() == []
    sent = len(segments_read)
    assert ds.head(1).num_rows == 1
    assert _readers() == []
    assert len(segments_read) > sent
