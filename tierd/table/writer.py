"""The table writer: each opted-in topic's sealed cold messages, committed to Iceberg exactly once.

A pass reads, per queue, the messages of **sealed** segments from the table's watermark up to the
sealed end the manifests promise (immutable bytes: a re-read returns the same rows), writes them
as Parquet and commits them with the new watermark — ``{"cluster/broker/queue": next offset}`` —
in the summary of the same snapshot. That single atomic step is what makes it exactly once:

* a crash after the Parquet is written but before the commit leaves files no snapshot
  references (harmless; maintenance deletes them after ``orphan_age``) and the old watermark, so
  the next pass writes those rows again, once;
* the commit carries the watermark the pass started from as a requirement (the branch must still
  be at the snapshot it was read from). pyiceberg would otherwise retry a conflicting append by
  rebasing it onto the other writer's snapshot — the duplicate-rows bug of apache/iceberg
  #17340 — so every table is created (and kept) with ``commit.retry.num-retries = 0``: a conflict
  is an error for this pass and the next one starts from the winner's watermark;
* the watermark lives in the table, not on this machine: a restore elsewhere resumes exactly.

Bodies that do not decode (``body_format = "json"``) go to ``<topic>_dead_letter``, committed
*before* the main table with its own watermark; rows below it are not added again.

``TIERD_TABLE_CRASH_AT=<step>`` kills the process with SIGKILL at that step (:data:`STEPS`): how
the tests prove the above with a real kill -9.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc

import tierd.arrow
from tierd.errors import ConcurrentCommitError, ConfigError, CorruptionError, NotFoundError
from tierd.repeats import FailureLog
from tierd.spark.filters import Constraints
from tierd.spark.options import ReadOptions
from tierd.spark.plan import load_queues
from tierd.spark.storage import open_storage
from tierd.table.body import DEAD_LETTER_SCHEMA, decode_bodies, table_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from tierd.config import TierdConfig, TopicConfig

__all__ = [
    "CRASH_ENV",
    "STEPS",
    "WATERMARK",
    "MaintenanceResult",
    "SyncResult",
    "TableWriter",
    "open_catalog",
]

log = logging.getLogger(__name__)

#: Snapshot summary property holding the watermark: JSON ``{"cluster/broker/queue": next offset}``.
WATERMARK: Final = "tierd.watermark"
#: Environment variable naming the step at which the writer kills itself with SIGKILL (tests).
CRASH_ENV: Final = "TIERD_TABLE_CRASH_AT"
#: The steps of a commit, in order: Parquet written (nothing committed), the dead-letter table
#: committed (the main table not yet), the main table committed (nothing reported yet).
STEPS: Final = ("parquet-written", "dead-letter-committed", "committed")
#: Table properties every tierd table has: no automatic commit retry (see the module docstring).
_PROPERTIES: Final = {"commit.retry.num-retries": "0"}
_PARTITION: Final = "store_day"

Marks = dict[str, int]


def _crash_if_asked(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def open_catalog(config: TierdConfig) -> Catalog:
    """The Iceberg catalog ``[table]`` names: by default a SQL catalog on SQLite under the store
    dir with the warehouse beside it (nothing to run; restore the directory to restore it)."""
    from pyiceberg.catalog import load_catalog

    t = config.table
    props: dict[str, str] = dict(t.catalog_properties)
    props["type"] = t.catalog
    root = Path(config.store.dir).resolve() / "table"
    if t.catalog == "sql":
        if t.catalog_uri is None:
            root.mkdir(parents=True, exist_ok=True)
        props["uri"] = t.catalog_uri or f"sqlite:///{root / 'catalog.db'}"
    elif t.catalog == "rest":
        if t.catalog_uri is None:
            raise ConfigError("table.catalog = 'rest' needs table.catalog_uri (the REST endpoint)")
        props["uri"] = t.catalog_uri
    if t.warehouse is not None:
        props["warehouse"] = t.warehouse
    elif t.catalog == "sql":
        (root / "warehouse").mkdir(parents=True, exist_ok=True)
        props["warehouse"] = (root / "warehouse").as_uri()
    return load_catalog("tierd", **props)


@dataclass
class SyncResult:
    """What one pass over a topic did."""

    topic: str
    #: Rows added to the table (dead letters not included).
    rows: int = 0
    #: Rows added to the dead-letter table.
    dead_letters: int = 0
    #: Snapshots committed to the main table.
    commits: int = 0
    #: Queue offsets below the sealed end that no sealed segment holds (gone before the table
    #: got them: cold retention, or messages lost before tiering).
    skipped: int = 0
    #: Messages sealed but not yet in the table, after the pass.
    lag: int = 0
    watermark: Marks = field(default_factory=dict)


@dataclass
class MaintenanceResult:
    topic: str
    compacted_files: int = 0
    expired_snapshots: int = 0
    deleted_orphans: int = 0
    retention_deleted: bool = False


def _ident(config: TierdConfig, name: str) -> tuple[str, str]:
    return (config.table.namespace, name)


def read_watermark(table: Table) -> Marks:
    """The watermark of the table's current state: that of the newest snapshot of its main line
    carrying one (tierd's commits all do; another engine's compaction may not). A table with
    snapshots but no watermark left is an error, not a start from zero — that would add every
    row again."""
    snap = table.current_snapshot()
    while snap is not None:
        raw = snap.summary[WATERMARK] if snap.summary is not None else None
        if raw is not None:
            try:
                marks = json.loads(raw)
                return {str(k): int(v) for k, v in marks.items()}
            except (ValueError, TypeError, AttributeError) as e:
                raise CorruptionError(
                    f"table {table.name()}: snapshot {snap.snapshot_id} has a bad {WATERMARK} {raw!r}",
                    snapshot_id=snap.snapshot_id,
                ) from e
        parent = snap.parent_snapshot_id
        snap = table.snapshot_by_id(parent) if parent is not None else None
    if table.current_snapshot() is not None:
        raise CorruptionError(
            f"table {'.'.join(table.name())} has snapshots but none of its main line carries a "
            f"{WATERMARK}: where to resume is unknown (see docs/table.md, 'Recovery')",
            table=".".join(table.name()),
        )
    return {}


class TableWriter:
    """Writes the Iceberg tables of the topics ``config.topics`` opts in. One writer per store;
    its passes are not thread-safe (the daemon runs them one after another).

    ``on_step`` is called at each of :data:`STEPS` (default: SIGKILL when :data:`CRASH_ENV`
    names the step)."""

    def __init__(
        self,
        config: TierdConfig,
        catalog: Catalog | None = None,
        on_step: Callable[[str], None] = _crash_if_asked,
    ) -> None:
        self.config = config
        self._catalog = catalog
        self._on_step = on_step
        self._lag: dict[str, int] = {}
        #: Per topic, the watermark the last pass read or committed: what a failing pass
        #: measures the lag against (the table may not be reachable to read it again).
        self._marks: dict[str, Marks] = {}
        self._failures: dict[str, FailureLog] = {}
        backend = config.backend
        self.url = backend.url if "://" in backend.url else str(Path(backend.url).resolve())
        # A posix backend's options are the driver's (fsync, …), not fsspec's.
        self.storage_options: dict[str, Any] = (
            {} if backend.name == "posix" else dict(backend.storage_options)
        )

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = open_catalog(self.config)
        return self._catalog

    def topics(self) -> list[str]:
        """The topics with ``table = "iceberg"``."""
        return sorted(n for n, t in self.config.topics.items() if t.table == "iceberg")

    def last_lag(self) -> dict[str, int]:
        """Per topic, the messages sealed but not in the table at the writer's last look (what
        the ``tierd_table_lag_messages`` gauge shows): measured when a pass starts, after each
        of its commits, and when a pass fails — against the sealed ends read again and the last
        watermark known — so that passes that keep failing show as a lag that grows, not as
        the last good pass's figure. A topic is absent until a watermark was read once (before,
        how far the table is is unknown, and no figure is better than a wrong one)."""
        return dict(self._lag)

    def failed_passes(self) -> dict[str, int]:
        """Per opted-in topic, the passes that failed in a row since the last one that
        succeeded (the ``tierd_table_failed_passes`` gauge; 0 once a pass succeeds)."""
        return {t: self.failure_log(t).failures for t in self.topics()}

    def measure_lag(self, topic: str) -> int | None:
        """Measure the topic's lag again against the last watermark known, without the table
        (for a pass that failed: the catalog or warehouse may be what fails). None when no
        watermark was ever read, or the bucket cannot be read either (the figure stays)."""
        marks = self._marks.get(topic)
        if marks is None:
            return None
        try:
            ends = self.sealed_ends(topic)
        except Exception as e:  # the pass's failure is logged already; this one is its echo
            log.debug("table %s: lag not measured (%s)", topic, e)
            return None
        self._lag[topic] = _lag(ends, marks)
        return self._lag[topic]

    def failure_log(self, topic: str) -> FailureLog:
        """The rate-limited log of the topic's failing passes."""
        if topic not in self._failures:
            self._failures[topic] = FailureLog(log, f"table {topic}: pass")
        return self._failures[topic]

    def _topic(self, topic: str) -> TopicConfig:
        tc = self.config.topics.get(topic)
        if tc is None or tc.table != "iceberg":
            raise NotFoundError(
                f"topic {topic!r} has no table; opted in: {self.topics()} "
                f'(set [topics.{topic}] table = "iceberg")',
                topic=topic,
            )
        return tc

    # ------------------------------------------------------------------------- tables
    def table(self, topic: str) -> Table:
        """The topic's table, created (partitioned by day of store time) or evolved to the
        declared body columns first."""
        from pyiceberg.transforms import DayTransform

        tc = self._topic(topic)
        tbl = self._open(topic, table_schema(tc.body_columns))
        if tbl.spec().is_unpartitioned():
            with tbl.update_spec() as spec:
                spec.add_field("store_timestamp", DayTransform(), _PARTITION)
            tbl = tbl.refresh()
        return self._evolve(tbl, tc)

    def dead_letter_table(self, topic: str) -> Table:
        return self._open(f"{topic}_dead_letter", DEAD_LETTER_SCHEMA)

    def _open(self, name: str, schema: pa.Schema) -> Table:
        cat = self.catalog
        cat.create_namespace_if_not_exists(self.config.table.namespace)
        tbl = cat.create_table_if_not_exists(_ident(self.config, name), schema=schema, properties=_PROPERTIES)
        if any(tbl.properties.get(k) != v for k, v in _PROPERTIES.items()):
            with tbl.transaction() as tx:
                tx.set_properties(_PROPERTIES)
            tbl = tbl.refresh()
        return tbl

    def _evolve(self, tbl: Table, tc: TopicConfig) -> Table:
        """Add declared body columns the table lacks (schema evolution: old rows read null)."""
        from pyiceberg.types import BooleanType, DoubleType, LongType, StringType

        types = {"string": StringType(), "long": LongType(), "double": DoubleType(), "boolean": BooleanType()}
        have = {f.name: f.field_type for f in tbl.schema().fields}
        for name, kind in tc.body_columns.items():
            if name in have and have[name] != types[kind]:
                raise ConfigError(
                    f"table {'.'.join(tbl.name())}: body column {name!r} is {have[name]} in the table, "
                    f"declared {kind}; a column's type cannot change (declare a new column)",
                    column=name,
                )
        missing = [n for n in tc.body_columns if n not in have]
        if missing:
            with tbl.update_schema() as upd:
                for name in missing:
                    upd.add_column(name, types[tc.body_columns[name]])
            log.info("table %s: added body columns %s", ".".join(tbl.name()), missing)
            tbl = tbl.refresh()
        return tbl

    # ------------------------------------------------------------------------- source
    def sealed_ends(self, topic: str) -> Marks:
        """Per queue (``cluster/broker/queue``), the offset after the last one in a sealed
        segment, from the bucket manifests (no segment is read)."""
        base = ReadOptions.parse({"path": self.url}).require_path()
        opts = dataclasses.replace(base, storage_options=self.storage_options, topics=(topic,))
        storage = open_storage(self.url, self.storage_options)
        try:
            queues = load_queues(storage, opts, Constraints.from_options(opts))
        except NotFoundError:
            return {}  # nothing of the topic tiered yet
        ends: Marks = {}
        for q in queues:
            last = [
                s.last_queue_offset for s in q.commitlogs() if s.sealed and s.last_queue_offset is not None
            ]
            if last:
                ends[f"{q.cluster}/{q.broker}/{q.queue_id}"] = max(last) + 1
        return ends

    def lag(self, topic: str) -> int:
        """Messages sealed in the cold tier but not yet in the topic's table."""
        self._topic(topic)
        marks = read_watermark(self.table(topic))
        return _lag(self.sealed_ends(topic), marks)

    def _read(self, topic: str, key: str, start: int, end: int) -> Iterable[pa.RecordBatch]:
        cluster, broker, queue = key.split("/")
        ds = tierd.arrow.dataset(
            self.url,
            storage_options=self.storage_options,
            topic=topic,
            cluster=cluster,
            broker=broker,
            queues=int(queue),
            offsets=(start, end),
            include_open_segments=False,
        )
        return ds.to_batches()

    # ------------------------------------------------------------------------- a pass
    def sync(self, topic: str) -> SyncResult:
        """One pass: everything sealed past the watermark, in commits of at most
        ``table.max_rows_per_commit`` rows. Raises :class:`ConcurrentCommitError` when another
        writer committed meanwhile (nothing of the failed commit is in the table)."""
        tc = self._topic(topic)
        main = self.table(topic)
        dead = self.dead_letter_table(topic) if tc.body_format == "json" else None
        marks = read_watermark(main)
        dead_marks = read_watermark(dead) if dead is not None else {}
        ends = self.sealed_ends(topic)
        self._marks[topic] = dict(marks)
        self._lag[topic] = _lag(ends, marks)
        result = SyncResult(topic)
        schema = table_schema(tc.body_columns)
        limit = self.config.table.max_rows_per_commit
        pending: list[tuple[str, pa.RecordBatch]] = []
        new = dict(marks)

        def flush() -> None:
            nonlocal main, dead, pending
            if not pending and new == marks:
                return
            main, dead = self._commit(topic, main, dead, pending, marks, new, dead_marks, schema, tc, result)
            marks.clear()
            marks.update(new)
            self._marks[topic] = dict(marks)
            self._lag[topic] = _lag(ends, marks)
            pending = []

        for key in sorted(ends):
            start, end = new.get(key, 0), ends[key]
            if start >= end:
                continue
            expected = start
            for batch in self._read(topic, key, start, end):
                offsets = batch.column("queue_offset")
                first, last = offsets[0].as_py(), offsets[-1].as_py()
                if first != expected:
                    self._skipped(topic, key, expected, first, result)
                expected = last + 1
                at = 0
                while at < batch.num_rows:
                    room = limit - sum(b.num_rows for _, b in pending)
                    piece = batch.slice(at, room)
                    pending.append((key, piece))
                    at += piece.num_rows
                    new[key] = piece.column("queue_offset")[-1].as_py() + 1
                    if room == piece.num_rows:
                        flush()
            if expected != end:
                self._skipped(topic, key, expected, end, result)
            new[key] = end
        flush()
        result.watermark = dict(marks)
        result.lag = _lag(ends, marks)
        self._lag[topic] = result.lag
        return result

    def _skipped(self, topic: str, key: str, expected: int, got: int, result: SyncResult) -> None:
        result.skipped += got - expected
        # Once per gap: the watermark moves past it.
        log.warning(
            "table %s: queue %s offsets [%d, %d) are in no sealed segment (deleted by cold retention "
            "or lost before tiering); the table goes on without them",
            topic,
            key,
            expected,
            got,
        )

    def _commit(
        self,
        topic: str,
        main: Table,
        dead: Table | None,
        pending: list[tuple[str, pa.RecordBatch]],
        marks: Marks,
        new: Marks,
        dead_marks: Marks,
        schema: pa.Schema,
        tc: TopicConfig,
        result: SyncResult,
    ) -> tuple[Table, Table | None]:
        from pyiceberg.exceptions import CommitFailedException

        good: list[pa.Table] = []
        bad: list[pa.Table] = []
        for key, batch in pending:
            decoded = decode_bodies(pa.Table.from_batches([batch]), tc.body_columns, schema)
            good.append(decoded.good)
            below = dead_marks.get(key, 0)
            bad.append(decoded.bad.filter(pc.field("queue_offset") >= below))
        rows = pa.concat_tables(good) if good else schema.empty_table()
        dead_rows = pa.concat_tables(bad) if bad else DEAD_LETTER_SCHEMA.empty_table()
        try:
            if dead is not None and dead_rows.num_rows:
                merged = {k: max(v, new.get(k, 0)) for k, v in dead_marks.items()} | {
                    k: max(v, dead_marks.get(k, 0)) for k, v in new.items()
                }
                dtx = dead.transaction()
                dtx.append(dead_rows, snapshot_properties={WATERMARK: json.dumps(merged, sort_keys=True)})
                dead = dtx.commit_transaction()
                dead_marks.clear()
                dead_marks.update(merged)
                result.dead_letters += dead_rows.num_rows
                self._on_step("dead-letter-committed")
            tx = main.transaction()
            props = {WATERMARK: json.dumps(new, sort_keys=True), "tierd.rows": str(rows.num_rows)}
            tx.append(rows, snapshot_properties=props)
            self._on_step("parquet-written")
            main = tx.commit_transaction()
        except CommitFailedException as e:
            raise ConcurrentCommitError(
                f"table {topic}: another writer committed while this pass ran; nothing of this "
                f"commit was added, the next pass resumes from the table's watermark ({e})",
                topic=topic,
            ) from None
        self._on_step("committed")
        result.rows += rows.num_rows
        result.commits += 1
        snap = main.current_snapshot()
        log.info(
            "table %s: committed %d rows (%d dead letters) up to %s in snapshot %s",
            topic,
            rows.num_rows,
            dead_rows.num_rows,
            json.dumps(new, sort_keys=True),
            snap.snapshot_id if snap is not None else None,
        )
        return main, dead

    # ------------------------------------------------------------------------- maintenance
    def maintain(self, topic: str, now: dt.datetime | None = None) -> MaintenanceResult:
        """Retention, compaction of small files, snapshot expiry and orphan cleanup for the
        topic's table; every rewrite carries the watermark forward."""
        tc = self._topic(topic)
        now = now or dt.datetime.now(dt.UTC)
        tbl = self.table(topic)
        result = MaintenanceResult(topic)
        props = {WATERMARK: json.dumps(read_watermark(tbl), sort_keys=True)}
        if tc.table_retention_days and tbl.current_snapshot() is not None:
            day = now.replace(hour=0, minute=0, second=0, microsecond=0)
            cutoff = day - dt.timedelta(days=tc.table_retention_days)
            tbl.delete(f"store_timestamp < '{cutoff.isoformat()}'", snapshot_properties=props)
            result.retention_deleted = True
            tbl = tbl.refresh()
        result.compacted_files = self._compact(tbl, props)
        tbl = tbl.refresh()
        tables = [tbl]
        if tc.body_format == "json":
            tables.append(self.dead_letter_table(topic))
        for t in tables:
            result.expired_snapshots += self._expire(t, now)
            result.deleted_orphans += self._orphans(t.refresh(), now)
        return result

    def _compact(self, tbl: Table, props: dict[str, str]) -> int:
        """Rewrite each day holding several files below ``compact_below`` as one file."""
        limit = self.config.table.compact_below
        if not limit or tbl.current_snapshot() is None:
            return 0
        files = tbl.inspect.data_files()
        small: dict[Any, int] = {}
        for part, size in zip(
            files.column("partition").to_pylist(), files.column("file_size_in_bytes").to_pylist(), strict=True
        ):
            if size < limit:
                day = part.get(_PARTITION) if isinstance(part, dict) else None
                small[day] = small.get(day, 0) + 1
        done = 0
        for day, count in sorted(small.items(), key=lambda kv: str(kv[0])):
            if count < 2 or day is None:
                continue
            start = dt.datetime.combine(_as_date(day), dt.time(), dt.UTC)
            end = start + dt.timedelta(days=1)
            where = f"store_timestamp >= '{start.isoformat()}' AND store_timestamp < '{end.isoformat()}'"
            rows = tbl.scan(row_filter=where).to_arrow()
            tbl.overwrite(rows, overwrite_filter=where, snapshot_properties=props)
            tbl = tbl.refresh()
            done += count
        return done

    def _expire(self, tbl: Table, now: dt.datetime) -> int:
        cfg = self.config.table
        snaps = sorted(tbl.snapshots(), key=lambda s: s.timestamp_ms)
        keep = {s.snapshot_id for s in snaps[-cfg.min_snapshots :]}
        current = tbl.current_snapshot()
        if current is not None:
            keep.add(current.snapshot_id)
        cutoff_ms = (now.timestamp() - cfg.snapshot_retention) * 1000
        old = [s.snapshot_id for s in snaps if s.timestamp_ms < cutoff_ms and s.snapshot_id not in keep]
        if old:
            tbl.maintenance.expire_snapshots().by_ids(old).commit()
        return len(old)

    def _orphans(self, tbl: Table, now: dt.datetime) -> int:
        """Delete data files under the table that no snapshot references and that are older
        than ``orphan_age`` (left by a pass that crashed before committing)."""
        from pyarrow import fs as pafs

        paths = tbl.inspect.all_files().column("file_path").to_pylist() if tbl.snapshots() else []
        referenced = {urlparse(p).path if p.startswith("file:") else p for p in paths}
        data = f"{tbl.location().rstrip('/')}/data"
        parsed = urlparse(data)
        filesystem, root = pafs.FileSystem.from_uri(data) if parsed.scheme in ("file", "") else (None, "")
        if filesystem is None:  # object stores: left to the store's lifecycle rules (docs/table.md)
            return 0
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        except OSError:
            return 0
        cutoff = now.timestamp() - self.config.table.orphan_age
        deleted = 0
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
                continue
            if info.path in referenced:
                continue
            if info.mtime is not None and info.mtime.timestamp() < cutoff:
                filesystem.delete_file(info.path)
                deleted += 1
        if deleted:
            log.info("table %s: deleted %d orphaned Parquet files", ".".join(tbl.name()), deleted)
        return deleted


def _as_date(day: object) -> dt.date:
    """A day partition value as pyiceberg reports it (a date, or days since the epoch)."""
    if isinstance(day, dt.date):
        return day
    if isinstance(day, int):
        return dt.date(1970, 1, 1) + dt.timedelta(days=day)
    raise CorruptionError(f"unexpected day partition value {day!r}", value=repr(day))


def _lag(ends: Mapping[str, int], marks: Mapping[str, int]) -> int:
    return sum(max(0, end - marks.get(key, 0)) for key, end in ends.items())


def run_passes(writer: TableWriter, topics: Iterable[str] | None = None) -> list[SyncResult]:
    """One pass over each topic (all opted-in ones by default); a failing topic is logged and
    the others still run."""
    out: list[SyncResult] = []
    for topic in writer.topics() if topics is None else topics:
        started = time.monotonic()
        failures = writer.failure_log(topic)
        try:
            out.append(writer.sync(topic))
        except Exception as e:
            failures.failed(e, "the next pass retries from the table's watermark")
            writer.measure_lag(topic)
            continue
        failures.succeeded()
        log.debug("table %s: pass took %.2fs", topic, time.monotonic() - started)
    return out
