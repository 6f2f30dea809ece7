"""The table writer over a cold tier a real store wrote:

* pyiceberg, Polars ``scan_iceberg`` and DuckDB (over the pyiceberg scan) each return exactly the
  messages the raw source (:mod:`tierd.arrow`, sealed segments) returns;
* a kill -9 at every step of a commit, then a re-run: every row exactly once;
* a commit that fails because another writer committed first: the retry adds nothing twice;
* bodies that do not decode go to the dead-letter table, counted; a new declared column evolves
  the schema; maintenance compacts, expires and deletes orphans without changing a row.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import duckdb
import polars as pl
import pytest

from tierd.errors import ConcurrentCommitError
from tierd.table import CRASH_ENV, TableWriter
from tierd.table.writer import STEPS, read_watermark

from .conftest import EVENTS, KEY, Tier, event_body, sealed, writer_config

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([(c, "ascending") for c in KEY])


def _keys(t: pa.Table) -> list[tuple[Any, ...]]:
    return list(zip(*(t.column(c).to_pylist() for c in KEY), strict=True))


def test_every_engine_reads_exactly_the_source(
    writer: TableWriter, tier: Tier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polars plans with pyiceberg (its own planner is a separate package) and says so unless told.
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    result = writer.sync("orders")
    source = sealed(tier.url, "orders")
    assert result.rows == source.num_rows > 0
    assert result.lag == 0
    tbl = writer.table("orders")

    scanned = _sorted(tbl.scan().to_arrow())
    assert scanned.select(source.schema.names).equals(source)  # every column, every value

    polars = pl.scan_iceberg(tbl).select([*KEY, "body"]).collect().sort(list(KEY))
    assert polars.to_arrow().to_pylist() == source.select([*KEY, "body"]).to_pylist()

    con = duckdb.connect()
    con.register("orders", tbl.scan().to_arrow())  # DuckDB over the pyiceberg scan's Arrow table
    rows = con.sql("SELECT topic, queue_id, queue_offset, body FROM orders ORDER BY 1, 2, 3").fetchall()
    assert rows == [
        (t, q, o, b)
        for t, q, o, b in zip(*(source.column(c).to_pylist() for c in (*KEY, "body")), strict=True)
    ]

    assert [f.name for f in tbl.spec().fields] == ["store_day"]  # hidden partitioning by day
    again = writer.sync("orders")  # nothing new sealed: nothing added
    assert (again.rows, again.commits) == (0, 0)
    assert tbl.refresh().scan().to_arrow().num_rows == source.num_rows


def _run_pass(cfg: dict[str, Any], topic: str, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    code = (
        "import json, sys\n"
        "from tierd import TierdConfig\n"
        "from tierd.table import TableWriter\n"
        "TableWriter(TierdConfig.from_dict(json.loads(sys.argv[1]))).sync(sys.argv[2])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(cfg), topic],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_each_step_then_every_row_exactly_once(
    step: str, tier: Tier, events: pa.Table, tmp_path: Path
) -> None:
    # JSON decoding, so a commit has a dead-letter step too; 70 rows per commit: several commits.
    topic_cfg = {"table": "iceberg", "body_format": "json", "body_columns": {"id": "long", "name": "string"}}
    cfg = writer_config(tier, tmp_path / "store").model_dump(mode="json")
    cfg["topics"] = {EVENTS: topic_cfg}
    cfg["table"]["max_rows_per_commit"] = 70
    crashed = _run_pass(cfg, EVENTS, step)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    finished = _run_pass(cfg, EVENTS, None)
    assert finished.returncode == 0, finished.stderr

    writer = TableWriter(writer_config(tier, tmp_path / "store", **{EVENTS: topic_cfg}))
    good = writer.table(EVENTS).scan().to_arrow()
    dead = writer.dead_letter_table(EVENTS).scan().to_arrow()
    got = sorted(_keys(good) + _keys(dead))
    assert got == _keys(events)  # each sealed message once: not twice, none missing
    assert len(set(_keys(dead))) == dead.num_rows
    assert writer.sync(EVENTS).rows == 0

    # What the crash left on disk is referenced by no snapshot: maintenance deletes it once old.
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    done = writer.maintain(EVENTS, now=later)
    if step == "parquet-written":
        assert done.deleted_orphans >= 1
    again = writer.table(EVENTS).scan().to_arrow()
    assert sorted(_keys(again)) == sorted(_keys(good))


def test_a_commit_that_lost_to_another_writer_is_retried_without_duplicates(
    tier: Tier, tmp_path: Path
) -> None:
    cfg = writer_config(tier, tmp_path / "store", orders={})
    first = TableWriter(cfg)

    def other_writer_wins(step: str) -> None:
        if step == "parquet-written":
            first.sync("orders")  # commits the same rows while this pass holds them unwritten

    second = TableWriter(cfg, on_step=other_writer_wins)
    with pytest.raises(ConcurrentCommitError, match="another writer committed"):
        second.sync("orders")
    retried = TableWriter(cfg).sync("orders")
    assert retried.rows == 0
    source = sealed(tier.url, "orders")
    assert _keys(_sorted(first.table("orders").scan().to_arrow())) == _keys(source)


def test_bad_bodies_go_to_the_dead_letter_table_counted(tier: Tier, events: pa.Table, tmp_path: Path) -> None:
    declared = {"table": "iceberg", "body_format": "json", "body_columns": {"id": "long"}}
    writer = TableWriter(writer_config(tier, tmp_path / "store", **{EVENTS: declared}))
    result = writer.sync(EVENTS)
    offsets = events.column("queue_offset").to_pylist()
    bad = [o for o in offsets if o % 10 in (3, 6, 9)]  # queue 0 of a new topic: offset == i
    assert result.dead_letters == len(bad) > 0
    assert result.rows == len(offsets) - len(bad)
    dead = writer.dead_letter_table(EVENTS).scan().to_arrow()
    assert sorted(dead.column("queue_offset").to_pylist()) == bad
    assert all(e for e in dead.column("error").to_pylist())
    good = _sorted(writer.table(EVENTS).scan().to_arrow())
    assert good.column("id").to_pylist() == [o for o in offsets if o not in set(bad)]
    assert good.column("body").to_pylist() == [event_body(o) for o in offsets if o not in set(bad)]

    # The declared schema gains a column: the table's schema evolves, old rows read null.
    declared["body_columns"] = {"id": "long", "name": "string"}
    evolved = TableWriter(writer_config(tier, tmp_path / "store", **{EVENTS: declared}))
    tbl = evolved.table(EVENTS)
    assert "name" in tbl.schema().column_names
    assert set(tbl.scan().to_arrow().column("name").to_pylist()) == {None}
    assert evolved.sync(EVENTS).rows == 0


def test_maintenance_compacts_small_files_and_keeps_the_watermark(tier: Tier, tmp_path: Path) -> None:
    cfg = writer_config(tier, tmp_path / "store", orders={}).model_dump(mode="json")
    cfg["table"]["max_rows_per_commit"] = 40
    from tierd import TierdConfig

    writer = TableWriter(TierdConfig.from_dict(cfg))
    result = writer.sync("orders")
    assert result.commits > 2
    tbl = writer.table("orders")
    before_files = tbl.inspect.data_files().num_rows
    marks = read_watermark(tbl)
    done = writer.maintain("orders", now=dt.datetime.now(dt.UTC) + dt.timedelta(days=30))
    tbl = tbl.refresh()
    assert done.compacted_files == before_files
    assert tbl.inspect.data_files().num_rows < before_files
    assert read_watermark(tbl) == marks
    assert done.expired_snapshots > 0
    assert _keys(_sorted(tbl.scan().to_arrow())) == _keys(sealed(tier.url, "orders"))
    assert writer.sync("orders").rows == 0
