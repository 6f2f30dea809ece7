"""Prometheus metrics: RocketMQ's tiered-store set, in Prometheus naming (docs/metrics.md).

Three sources, chosen so that no hot path grows a metrics call it did not already have:

* **HTTP latency** — measured by :class:`HttpMetricsMiddleware` around every request.
* **Backend latency and bytes** — :meth:`ServiceMetrics.observe_backend`, installed as the
  :attr:`~tierd.drivers.segment.DriverRoot.observer` of the store's cold-tier root; FileSegment
  reports each driver call there.
* **Everything else** (dispatch lag, dispatched messages, cache hits, storage size, fallbacks,
  index counters) — :class:`StoreCollector` reads the counters the store keeps anyway *at
  scrape time*, through the facade only (:attr:`MessageStore.stats`,
  :meth:`~MessageStore.dispatch_lag`, :meth:`~MessageStore.cold_storage`). Scrapes come every
  15–60 s; the store's own counters are plain integer increments.
* **gRPC** — :mod:`tierd.grpc.metrics` adds its families to this registry when the gRPC
  listener runs (per-RPC counts and latency, consumption state at scrape time).

Each :class:`ServiceMetrics` owns its :class:`~prometheus_client.CollectorRegistry` — never the
process-global one — so two stores in one process (tests, embedding) never collide.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from tierd.errors import TierdError
from tierd.scheduled.scheduler import LATENESS_BUCKETS
from tierd.traffic import OTHER as OTHER_TOPICS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from tierd.store import ColdStats, MessageStore, StoreStats

#: RocketMQ's provider RPC latency buckets (ms), in seconds.
BACKEND_LATENCY_BUCKETS = (0.001, 0.003, 0.005, 0.007, 0.01, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 3.0, 10.0)
#: RocketMQ's upload/download size buckets (1K, 10K, 100K, 1M, 10M, 32M, 50M, 100M).
BYTES_BUCKETS = (1e3, 1e4, 1e5, 1e6, 1e7, 32e6, 50e6, 100e6)
#: Methods labelled as themselves; anything else (client-controlled) is ``other``.
_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})
#: Per-queue consumer-lag series exported at most (groups × queues is user-controlled); the
#: per-group totals are always exported (at most ``tierd.consumption.offsets.MAX_GROUPS`` series).
LAG_SERIES_LIMIT = 1000
HTTP_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class ServiceMetrics:
    def __init__(self, store: Callable[[], MessageStore | None], draining: Callable[[], bool]) -> None:
        self.registry = CollectorRegistry()
        self.http_latency = Histogram(
            "tierd_http_request_duration_seconds",
            "HTTP API latency by route template, method and status.",
            ["route", "method", "status"],
            buckets=HTTP_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.backend_latency = Histogram(
            "tierd_backend_request_duration_seconds",
            "Cold-tier backend call latency by operation (write, read, seal, size, create) and success.",
            ["operation", "success"],
            buckets=BACKEND_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upload_bytes = Histogram(
            "tierd_backend_upload_bytes",
            "Bytes per successful backend write (segment commits and seals' payload).",
            buckets=BYTES_BUCKETS,
            registry=self.registry,
        )
        self.download_bytes = Histogram(
            "tierd_backend_download_bytes",
            "Bytes per successful backend read.",
            buckets=BYTES_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(StoreCollector(store, draining))
        # The standard process_*, python_info and python_gc_* series: a private registry does not
        # get the global one's, and dashboards and alerts expect them (CPU, RSS, open FDs).
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def observe_backend(self, operation: str, seconds: float, nbytes: int, ok: bool) -> None:
        """The :data:`~tierd.drivers.segment.BackendObserver` installed on the cold-tier root."""
        self.backend_latency.labels(operation, "true" if ok else "false").observe(seconds)
        if ok and operation == "write":
            self.upload_bytes.observe(nbytes)
        elif ok and operation == "read":
            self.download_bytes.observe(nbytes)

    def attach(self, store: MessageStore) -> None:
        """Start timing the store's backend calls."""
        store.set_backend_observer(self.observe_backend)

    def watch_tables(self, writer: TableFigures) -> None:
        """Export the Iceberg table writer's per-topic figures (docs/table.md); the daemon calls
        this only when a topic opts in, so the base install exports no table families."""
        self.registry.register(TableCollector(writer))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StoreCollector(Collector):
    """Reads the store's own counters at scrape time (see the module docstring)."""

    def __init__(self, store: Callable[[], MessageStore | None], draining: Callable[[], bool]) -> None:
        self.store = store
        self.draining = draining

    def describe(self) -> list[Metric]:
        # Families depend on whether the store is open: no describe-time registration checks.
        return []

    def collect(self) -> Iterator[Metric]:
        store = self.store()
        yield _gauge(
            "tierd_draining", "1 while the daemon is shutting down (writes refused).", self.draining()
        )
        yield _gauge(
            "tierd_store_open", "1 once the store finished opening (recovery done).", store is not None
        )
        if store is None or store.closed:
            return
        stats = store.stats  # one snapshot per scrape
        hot = stats.hot
        yield _gauge(
            "tierd_hot_writes_refused",
            "1 while the hot store refuses writes (disk nearly full and nothing may be deleted).",
            hot.writes_refused,
        )
        yield from self._disk(store)
        yield from _scheduled(store)
        yield from self._transactions(store)
        yield _gauge(
            "tierd_hot_commitlog_max_offset_bytes", "Hot commitlog write position.", hot.commitlog_end
        )
        yield _gauge(
            "tierd_hot_open_queue_files",
            "Consume-queue files open now (bounded by store.max_open_queue_files).",
            hot.open_queue_files,
        )
        yield _counter(
            "tierd_hot_queue_file_opens",
            "Consume-queue files opened (a steep rate: more queues in use than the bound keeps open).",
            hot.queue_file_opens,
        )
        router = stats.reads
        yield _counter(
            "tierd_get_fallbacks",
            "Cold reads that failed and were served from the hot store instead.",
            router.fallbacks,
        )
        yield _gauge(
            "tierd_hot_quarantined_ranges",
            "Damaged hot commitlog ranges recovery quarantined (docs/hot-store.md).",
            hot.quarantined_ranges,
        )
        yield _gauge(
            "tierd_hot_lost_messages",
            "Messages known lost in quarantined ranges (holes in their queues).",
            hot.lost_messages,
        )
        yield _counter(
            "tierd_hot_corrupt_reads",
            "Reads that met a hot record failing its checks (CRC, framing, consume-queue unit).",
            hot.corrupt_reads,
        )
        yield _counter(
            "tierd_get_corrupt_served_cold",
            "Reads of a corrupt hot record answered with the cold tier's copy.",
            router.corrupt_served_cold,
        )
        reads = CounterMetricFamily(
            "tierd_get_requests", "Queue reads by the tier that served them.", labels=["source"]
        )
        for source, n in sorted(router.reads.items()):
            reads.add_metric([source], n)
        yield reads
        yield from self._consumers(store)
        yield from self._traffic(store)
        cold = stats.cold
        yield _gauge("tierd_tiering_enabled", "1 when the cold tier is configured.", cold is not None)
        if cold is None:
            return
        yield _gauge(
            "tierd_cold_tier_ready",
            "1 once the cold tier is usable: prefix claimed, flat files loaded from metadata and backend.",
            cold.ready,
        )
        yield from self._capabilities(cold)
        yield _gauge(
            "tierd_cold_metadata_loaded",
            "1 once the local tiering metadata was read (what /readyz waits for).",
            cold.metadata_loaded,
        )
        yield from self._backend(stats, cold)
        yield from self._dispatch(store, stats)
        yield from self._cache(stats)
        yield from self._storage(store)
        yield from self._index(cold)

    def _disk(self, store: MessageStore) -> Iterator[Metric]:
        """How full the hot store's volume is, beside the share at which it refuses writes once
        nothing more may be deleted: an alert compares the two and fires before the refusal. The
        limit is the store's own (``store.disk_max_used_ratio`` less the headroom it keeps for
        its metadata), exported so that no alert restates it."""
        hot = store.hot
        try:
            used = hot.disk_usage(hot.dir)
            limit = hot.disk_limit(hot.disk_total(hot.dir))
        except OSError:  # the volume went away: the store's own errors say so
            return
        yield _gauge("tierd_hot_disk_used_ratio", "Share of the hot store's volume in use (0-1).", used)
        yield _gauge(
            "tierd_hot_disk_limit_ratio",
            "Share of the volume above which writes are refused when nothing more may be deleted.",
            limit,
        )

    def _capabilities(self, cold: ColdStats) -> Iterator[Metric]:
        yield _gauge(
            "tierd_backend_writes_refused",
            "1 when tiering is refused because the backend could overwrite committed data.",
            cold.writes_refused,
        )
        report = cold.capabilities
        if report is None:
            return
        family = GaugeMetricFamily(
            "tierd_backend_capability",
            "Backend capability probe verdict per feature (1 = behaves like S3).",
            labels=["capability"],
        )
        for name, value in sorted(report.items()):
            if isinstance(value, bool):
                family.add_metric([name], float(value))
        family.add_metric(["range_reads"], float(report.get("range_reads") == "exact"))
        yield family

    def _consumers(self, store: MessageStore) -> Iterator[Metric]:
        yield _gauge("tierd_long_poll_waiters", "Reads waiting for new messages now.", store.arrivals.waiting)
        yield _counter(
            "tierd_long_poll_wakeups",
            "Waiting reads woken by new messages in their queue.",
            store.arrivals.wakeups,
        )
        per_group = GaugeMetricFamily(
            "tierd_consumer_group_lag_messages",
            "Per consumer group: messages after its committed offsets, summed over its queues.",
            labels=["group"],
        )
        per_queue = GaugeMetricFamily(
            "tierd_consumer_lag_messages",
            f"Per group and queue: max offset - committed offset (the first {LAG_SERIES_LIMIT} "
            "series, by group, topic and queue; see tierd_consumer_lag_series_dropped).",
            labels=["group", "topic", "queue_id"],
        )
        try:
            groups = store.consumer_groups()
        except TierdError:  # lag needs the cold tier's offsets: absent while it cannot answer
            return
        series = dropped = 0
        for g in groups:
            per_group.add_metric([g.group], g.lag)
            for q in g.queues:
                if series < LAG_SERIES_LIMIT:
                    per_queue.add_metric([g.group, q.topic, str(q.queue_id)], q.lag)
                    series += 1
                else:
                    dropped += 1
        yield per_group
        yield per_queue
        yield _gauge(
            "tierd_consumer_lag_series_dropped",
            f"Per-queue lag series left out beyond {LAG_SERIES_LIMIT} (group totals include them).",
            dropped,
        )

    def _traffic(self, store: MessageStore) -> Iterator[Metric]:
        """Per topic, counted per message (a 1,024-message batch is 1,024), not per request
        (:mod:`tierd.traffic` says where and why; its label bound is server.metrics_max_topics)."""
        bound = f'first {store.traffic.max_topics} topics, the rest as topic="{OTHER_TOPICS}"'
        families = [
            CounterMetricFamily(
                f"tierd_{what}_{unit}",
                f"{doc} ({bound}).",
                labels=["topic"],
            )
            for what, unit, doc in (
                ("produced", "messages", "Messages acknowledged to producers"),
                ("produced", "bytes", "Body bytes of messages acknowledged to producers"),
                ("consumed", "messages", "Messages handed to consumers (HTTP reads, gRPC receive and pull)"),
                ("consumed", "bytes", "Body bytes of messages handed to consumers"),
            )
        ]
        for topic, c in store.traffic.snapshot().items():
            values = (c.produced_messages, c.produced_bytes, c.consumed_messages, c.consumed_bytes)
            for family, value in zip(families, values, strict=True):
                family.add_metric([topic], value)
        yield from families

    def _backend(self, stats: StoreStats, cold: ColdStats) -> Iterator[Metric]:
        """Backend health and prefix ownership: the signals alerts belong on (not /readyz)."""
        h = cold.health
        if h.reachable is not None:
            yield _gauge(
                "tierd_backend_reachable",
                "1 when the last cold-tier backend call got an answer.",
                h.reachable,
            )
        if h.last_ok_ms is not None:
            yield _gauge(
                "tierd_backend_last_success_timestamp_seconds",
                "When a cold-tier backend call last got an answer (Unix time).",
                h.last_ok_ms / 1000,
            )
        yield _counter(
            "tierd_backend_failures", "Cold-tier backend calls that failed or timed out.", h.failures
        )
        yield _counter(
            "tierd_backend_timeouts", "Cold-tier backend calls cut off by tiered.backend_timeout.", h.timeouts
        )
        yield _gauge(
            "tierd_prefix_owned",
            "1 when another store owns the cold tier's bucket prefix: this store does not tier.",
            cold.prefix_owned,
        )
        if cold.owner_epoch is not None:
            yield _gauge(
                "tierd_owner_epoch", "This store's ownership epoch of its bucket prefix.", cold.owner_epoch
            )
        dispatch = stats.dispatch
        assert dispatch is not None
        if dispatch.last_commit_ms is not None:
            yield _gauge(
                "tierd_last_commit_timestamp_seconds",
                "When a commit to the cold tier last succeeded (Unix time).",
                dispatch.last_commit_ms / 1000,
            )
        yield _counter(
            "tierd_dispatch_stuck_rounds",
            "Tiering rounds still running after tiered.backend_timeout seconds.",
            dispatch.stuck_rounds,
        )

    def _dispatch(self, store: MessageStore, snapshot: StoreStats) -> Iterator[Metric]:
        stats = snapshot.dispatch
        assert stats is not None
        yield _counter(
            "tierd_messages_dispatched", "Messages committed to the cold tier.", stats.messages_dispatched
        )
        yield _counter(
            "tierd_dispatch_bytes", "Commitlog bytes committed to the cold tier.", stats.bytes_uploaded
        )
        yield _counter("tierd_dispatch_commits", "Queue commits to the cold tier.", stats.commits)
        yield _counter(
            "tierd_dispatch_commit_failures", "Failed queue commits (retried).", stats.commit_failures
        )
        yield _counter("tierd_dispatch_rounds", "Dispatcher rounds.", stats.rounds)
        # Lag is computed here, from the live offsets, rather than read from DispatchStats: the
        # dispatcher records it at the start of a queue's round, so after a round (or tier_now)
        # its value is one round stale.
        behind = GaugeMetricFamily(
            "tierd_dispatch_lag_messages",
            "Per queue: acknowledged messages not yet committed to the cold tier.",
            labels=["topic", "queue_id"],
        )
        lag = GaugeMetricFamily(
            "tierd_dispatch_lag_seconds",
            "Per queue: age of the oldest message not yet committed cold (0 when caught up).",
            labels=["topic", "queue_id"],
        )
        now_ms = time.time() * 1000
        for q in store.dispatch_lag():
            ts = q.oldest_ms
            behind.add_metric([q.topic, str(q.queue_id)], q.messages)
            lag.add_metric(
                [q.topic, str(q.queue_id)], max(0.0, (now_ms - ts) / 1000) if ts is not None else 0.0
            )
        yield behind
        yield lag

    def _cache(self, stats: StoreStats) -> Iterator[Metric]:
        s = stats.cache
        yield _counter("tierd_read_ahead_cache_hits", "Cold reads served from the read-ahead cache.", s.hits)
        yield _counter(
            "tierd_read_ahead_cache_misses", "Cold reads that loaded a batch from the backend.", s.misses
        )
        yield _counter(
            "tierd_read_ahead_cache_evictions", "Batches dropped (budget or idle expiry).", s.evictions
        )
        yield _counter(
            "tierd_read_ahead_prefetches", "Batches loaded ahead of a sequential reader.", s.prefetches
        )
        yield _counter(
            "tierd_cold_read_backend_requests", "Backend reads made by cold fetches.", s.backend_reads
        )
        yield _counter(
            "tierd_cold_filter_skipped_messages",
            "Tag-filtered cold reads: messages skipped on their tags code, never fetched.",
            s.filter_skipped,
        )
        yield _counter(
            "tierd_cold_filter_hash_collisions",
            "Tag-filtered cold reads: messages fetched for a matching tags code whose tag did not match.",
            s.filter_collisions,
        )
        yield _gauge("tierd_read_ahead_cache_bytes", "Bytes held by the read-ahead cache.", stats.cache_bytes)
        yield _gauge(
            "tierd_read_ahead_cache_batches", "Batches held by the read-ahead cache.", stats.cache_batches
        )

    def _storage(self, store: MessageStore) -> Iterator[Metric]:
        storage = store.cold_storage()
        if storage is None:
            return
        size = GaugeMetricFamily(
            "tierd_storage_size_bytes", "Committed cold-tier bytes by file type.", labels=["file_type"]
        )
        segments = GaugeMetricFamily(
            "tierd_storage_segments", "Cold-tier segments by file type.", labels=["file_type"]
        )
        for kind, n in storage.sizes.items():
            size.add_metric([kind], n)
            segments.add_metric([kind], storage.segments[kind])
        yield size
        yield segments
        reserve = GaugeMetricFamily(
            "tierd_storage_message_reserve_seconds",
            "Per topic: age of the oldest message in the cold tier.",
            labels=["topic"],
        )
        now_ms = time.time() * 1000
        for topic, ts in sorted(storage.oldest_ms.items()):
            reserve.add_metric([topic], max(0.0, (now_ms - ts) / 1000))
        yield reserve

    def _index(self, cold: ColdStats) -> Iterator[Metric]:
        s = cold.index
        yield _counter("tierd_cold_index_items_added", "Keys added to the cold index.", s.items_added)
        yield _counter("tierd_cold_index_queries", "Key queries that consulted the cold index.", s.queries)
        yield _counter("tierd_cold_index_hits", "Candidate hits returned by the cold index.", s.hits)
        yield _counter("tierd_cold_index_uploads", "Index files compacted and uploaded.", s.uploads)
        yield _counter("tierd_cold_index_uploaded_bytes", "Bytes of index files uploaded.", s.uploaded_bytes)
        files = GaugeMetricFamily(
            "tierd_cold_index_files", "Cold index files by where they are.", labels=["state"]
        )
        files.add_metric(["local"], s.local_files)
        files.add_metric(["uploaded"], s.uploaded_files)
        yield files

    def _transactions(self, store: MessageStore) -> Iterator[Metric]:
        """Transactional messages (docs/transactions.md)."""
        tx = store.transactions
        st = tx.stats
        yield _gauge(
            "tierd_transaction_half_pending",
            "Half messages waiting for their producer's commit or rollback.",
            tx.pending_count,
        )
        yield _counter("tierd_transaction_checks", "Check-backs asked of producers.", st.checks)
        yield _counter("tierd_transaction_commits", "Transactions committed (made visible).", st.commits)
        yield _counter("tierd_transaction_rollbacks", "Transactions rolled back.", st.rollbacks)
        yield _counter(
            "tierd_transaction_check_max_rollbacks",
            "Rollbacks after transactions.check_max unanswered check-backs (also in rollbacks).",
            st.check_max_rollbacks,
        )


class TableFigures(Protocol):
    """What :class:`TableCollector` reads: :class:`tierd.table.TableWriter` (not imported here:
    it needs the ``table`` extra)."""

    def last_lag(self) -> Mapping[str, int]: ...

    def failed_passes(self) -> Mapping[str, int]: ...


class TableCollector(Collector):
    """The table writer's figures at scrape time: plain dict copies, no catalog or bucket call
    (the writer measures them as its passes run, every ``table.interval``)."""

    def __init__(self, writer: TableFigures) -> None:
        self.writer = writer

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "tierd_table_lag_messages",
            "Per topic with an Iceberg table: messages sealed in the cold tier but not yet in the "
            "table, at the writer's last look (absent until it read the table's watermark once).",
            labels=["topic"],
        )
        for topic, n in sorted(self.writer.last_lag().items()):
            lag.add_metric([topic], n)
        yield lag
        failed = GaugeMetricFamily(
            "tierd_table_failed_passes",
            "Per topic with an Iceberg table: writer passes failed in a row (0 after a success).",
            labels=["topic"],
        )
        for topic, n in sorted(self.writer.failed_passes().items()):
            failed.add_metric([topic], n)
        yield failed


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


class HttpMetricsMiddleware:
    """Times every HTTP request. The ``route`` label is the matched route *template*
    (``/v1/topics/{topic}/messages``), or ``unmatched`` — never the raw path, whose
    cardinality a client (or a fuzzer) controls."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path_format", None) or getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.metrics.http_latency.labels(template, method, str(status)).observe(
                time.perf_counter() - start
            )


def _scheduled(store: MessageStore) -> Iterator[Metric]:
    """Scheduled messages (docs/scheduled.md): pending, delivered, recalled, lost, and how late
    deliveries were (a histogram: the p99 is ``histogram_quantile(0.99, ...)``)."""
    sched = store.scheduler
    st = sched.stats
    yield _gauge(
        "tierd_scheduled_pending",
        "Scheduled messages not yet delivered nor recalled (known to the running scheduler).",
        len(sched.pending),
    )
    yield _counter("tierd_scheduled_delivered", "Scheduled messages delivered to their topic.", st.delivered)
    yield _counter("tierd_scheduled_recalls", "Scheduled messages recalled before they were due.", st.recalls)
    yield _counter(
        "tierd_scheduled_deduplicated",
        "Deliveries found already done after a crash (skipped, not written twice).",
        st.deduplicated,
    )
    yield _counter("tierd_scheduled_lost", "Scheduled messages gone before delivery.", st.lost)
    buckets, total = [], 0
    for bound, n in zip(LATENESS_BUCKETS, st.lateness_buckets, strict=True):
        total += n
        buckets.append((str(bound), float(total)))
    buckets.append(("+Inf", float(st.lateness_count)))
    yield HistogramMetricFamily(
        "tierd_scheduled_lateness_seconds",
        "How long after its delivery time a scheduled message became visible.",
        buckets=buckets,
        sum_value=st.lateness_sum,
    )
