"""Configuration: code defaults → TOML file → ``TIERD_<SECTION>__<KEY>`` environment overrides.

Every key is a field of a frozen pydantic model with a description (the reference docs are
generated from these models, so docs cannot drift) and, where RocketMQ has the same knob, its
RocketMQ name in ``json_schema_extra["rocketmq"]``. Unknown keys are errors, not silently
ignored: a typo in a config file must not quietly fall back to a default.

Secrets (S3 credentials) are never config keys: they come from the environment or the provider
chain of the backend.
"""

from __future__ import annotations

import os
import tomllib
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from tierd.errors import ConfigError
from tierd.format.layout import RECORD_OVERHEAD_LIMIT, max_record_size
from tierd.scheduled.timing import DEFAULT_DELAY_LEVELS, parse_delay_levels

if TYPE_CHECKING:
    from collections.abc import Mapping

ENV_PREFIX = "TIERD_"
KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def _rmq(name: str) -> dict[str, Any]:
    return {"rocketmq": name}


class _Section(BaseModel):
    """``defer_build``: a model's validator is built when it first validates, not when the
    class is defined — importing this module builds none, so a CLI command that only asks the
    daemon (:func:`load_client`) builds only the sections it validates, not all of them
    (docs/performance.md, "CLI start-up")."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, defer_build=True)


class StoreConfig(_Section):
    """``[store]`` — the hot store on local disk."""

    dir: Path = Field(
        Path("data/hot"), description="Hot store root directory.", json_schema_extra=_rmq("storePathRootDir")
    )
    commitlog_file_size: int = Field(
        GiB,
        ge=64 * KiB,
        le=2**31 - 1,
        description="Size of one commitlog file in bytes.",
        json_schema_extra=_rmq("mappedFileSizeCommitLog"),
    )
    consumequeue_file_units: int = Field(
        300_000,
        ge=16,
        description="20-byte units per consume-queue file.",
        json_schema_extra=_rmq("mappedFileSizeConsumeQueue"),
    )
    max_open_queue_files: int = Field(
        256,
        ge=1,
        description="Consume-queue files kept open at once (each holds a file descriptor); the least "
        "recently used are closed beyond it, so thousands of queues fit a small `ulimit -n`. Never "
        "more than a quarter of the process's open-files limit (RLIMIT_NOFILE).",
    )
    flush: Literal["async", "sync"] = Field(
        "async",
        description="`async`: a flusher fsyncs every flush_interval_ms; `sync`: put returns "
        "after its bytes are durable (group commit shares one fsync among concurrent producers).",
        json_schema_extra=_rmq("flushDiskType"),
    )
    flush_interval_ms: int = Field(
        500,
        ge=1,
        description="Async flush period in milliseconds.",
        json_schema_extra=_rmq("flushIntervalCommitLog"),
    )
    max_message_size: int = Field(
        4 * MiB,
        ge=1,
        le=64 * MiB,
        description="Largest accepted message body in bytes.",
        json_schema_extra=_rmq("maxMessageSize"),
    )
    default_queues: int = Field(
        4,
        ge=1,
        le=1024,
        description="Queues per topic when the topic is first written.",
        json_schema_extra=_rmq("defaultTopicQueueNums"),
    )
    max_queues: int = Field(1024, ge=1, le=65535, description="Upper bound for a queue id + 1.")
    file_reserved_time: float = Field(
        72.0, gt=0, description="Hot retention in hours.", json_schema_extra=_rmq("fileReservedTime")
    )
    disk_max_used_ratio: float = Field(
        0.90,
        gt=0,
        le=1.0,
        description="Disk usage above which writes are refused when nothing can be deleted.",
        json_schema_extra=_rmq("diskMaxUsedSpaceRatio"),
    )
    retention_interval: float = Field(
        60.0,
        gt=0,
        description="Seconds between local retention runs.",
        json_schema_extra=_rmq("cleanResourceInterval"),
    )
    index_slots: int = Field(
        5_000_000,
        ge=1,
        description="Hash slots per local index file.",
        json_schema_extra=_rmq("maxHashSlotNum"),
    )
    index_items: int = Field(
        20_000_000, ge=2, description="Items per local index file.", json_schema_extra=_rmq("maxIndexNum")
    )
    store_host: str = Field(
        "127.0.0.1:10911", description="STOREHOST written into records (`ip:port`, IPv6 as `[ip]:port`)."
    )
    check_crc_on_recover: bool = Field(
        True, description="Verify BODYCRC while recovering.", json_schema_extra=_rmq("checkCRCOnRecover")
    )
    recovery_check_bytes: int = Field(
        64 * MiB,
        ge=0,
        description="After an abnormal exit, recovery also checks at least this many commitlog bytes "
        "before the checkpoint (from a file start), so bit rot in the newest data is found and "
        "quarantined at start-up (docs/hot-store.md); 0: only what is re-dispatched.",
    )

    @property
    def max_record_size(self) -> int:
        """The largest record :attr:`max_message_size` admits (body plus headers, topic and
        properties): what a commitlog file or cold segment must be able to hold."""
        return max_record_size(self.max_message_size)


class TieredConfig(_Section):
    """``[tiered]`` — the tiering daemon and cold reads."""

    enabled: bool = Field(True, description="Move data to the cold tier.")
    cluster: str = Field(
        "DefaultCluster",
        description="Cluster name (first path element).",
        json_schema_extra=_rmq("brokerClusterName"),
    )
    broker: str = Field(
        "broker-a", description="Broker name (second path element).", json_schema_extra=_rmq("brokerName")
    )
    storage_level: Literal["DISABLE", "NOT_IN_DISK", "NOT_IN_MEM", "FORCE"] = Field(
        "NOT_IN_DISK", description="Default read policy.", json_schema_extra=_rmq("tieredStorageLevel")
    )
    dispatch_interval: float = Field(20.0, gt=0, description="Seconds between dispatcher rounds.")
    group_commit_count: int = Field(
        4096,
        ge=1,
        description="Commit a queue at this many pending messages.",
        json_schema_extra=_rmq("tieredStoreGroupCommitCount"),
    )
    group_commit_size: int = Field(
        4 * MiB,
        ge=1,
        description="Commit a queue at this many pending bytes.",
        json_schema_extra=_rmq("tieredStoreGroupCommitSize"),
    )
    group_commit_timeout: float = Field(
        30.0,
        ge=0,
        description="Commit when the oldest pending message is this old (s).",
        json_schema_extra=_rmq("tieredStoreGroupCommitTimeout"),
    )
    max_concurrent_queues: int = Field(16, ge=1, description="Queues committed concurrently.")
    upload_rate_limit: int | None = Field(None, ge=1, description="Upload cap in bytes/s (none = unlimited).")
    rolling_interval: float = Field(
        24.0,
        gt=0,
        description="Roll a commitlog segment after this many hours…",
        json_schema_extra=_rmq("commitLogRollingInterval"),
    )
    rolling_min_size: int = Field(
        16 * MiB,
        ge=0,
        description="…if it holds at least this many bytes.",
        json_schema_extra=_rmq("commitLogRollingMinimumSize"),
    )
    commitlog_segment_size: int = Field(
        GiB,
        ge=1,
        description="Flat commitlog segment size; at least the largest record, "
        f"`store.max_message_size` + {RECORD_OVERHEAD_LIMIT // KiB} KiB (a record never spans two "
        "segments: docs/limits.md).",
        json_schema_extra=_rmq("tieredStoreCommitLogMaxSize"),
    )
    consumequeue_segment_size: int = Field(
        100 * MiB,
        ge=20,
        description="Flat consume-queue segment size.",
        json_schema_extra=_rmq("tieredStoreConsumeQueueMaxSize"),
    )
    read_ahead_count: int = Field(
        4096,
        ge=1,
        description="Messages prefetched on a cache miss.",
        json_schema_extra=_rmq("readAheadMessageCountThreshold"),
    )
    read_ahead_size: int = Field(
        16 * MiB,
        ge=1,
        description="Bytes prefetched on a cache miss.",
        json_schema_extra=_rmq("readAheadMessageSizeThreshold"),
    )
    memory_ratio: float = Field(
        0.4,
        gt=0,
        le=1,
        description="NOT_IN_MEM policy: the share of physical "
        "memory assumed to cache the newest hot commitlog bytes; older offsets "
        "are read from the cold tier.",
        json_schema_extra=_rmq("accessMessageInMemoryMaxRatio"),
    )
    cache_max_bytes: int = Field(256 * MiB, ge=0, description="Read-ahead cache bound in bytes.")
    cache_expire: float = Field(
        15.0,
        gt=0,
        description="Idle expiry of cached batches (s).",
        json_schema_extra=_rmq("readAheadCacheExpireDuration"),
    )
    filter_read_gap: int = Field(
        8 * KiB,
        ge=0,
        description="Tag-filtered cold reads fetch only matching records; two matching records "
        "at most this many bytes apart are fetched with one ranged read (the bytes between are "
        "read through) instead of one read each.",
    )
    file_reserved_time: float = Field(
        72.0,
        gt=0,
        description="Cold retention in hours (per-topic override).",
        json_schema_extra=_rmq("tieredStoreFileReservedTime"),
    )
    index_slots: int = Field(
        5_000_000,
        ge=1,
        description="Hash slots per cold index file.",
        json_schema_extra=_rmq("tieredStoreIndexFileMaxHashSlotNum"),
    )
    index_items: int = Field(
        20_000_000,
        ge=2,
        description="Items per cold index file.",
        json_schema_extra=_rmq("tieredStoreIndexFileMaxIndexNum"),
    )
    manifest_interval: float = Field(60.0, gt=0, description="Max seconds between manifest writes.")
    ready_timeout: float = Field(
        30.0,
        ge=0,
        description="At start-up, how long (s) a read or listing waits for the cold tier to load "
        "before failing with `NotReadyError` (HTTP 503 `not_ready`); answers never come from the "
        "hot tier alone meanwhile (docs/reading.md).",
    )
    backend_timeout: float = Field(
        30.0,
        gt=0,
        description="Longest one cold-tier backend call may take (s) before it fails as a backend "
        "error; seals, which compose a whole segment, get 10 times this. A tiering round still "
        "running after this long is logged as stuck.",
    )


class BackendConfig(_Section):
    """``[backend]`` — where the cold tier lives."""

    name: str = Field("posix", description="Segment driver: posix, memory, s3, fsspec or a plugin.")
    url: str = Field("data/cold", description="Root: a directory, `s3://bucket/prefix`, or an fsspec URL.")
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="Passed to fsspec/s3fs (endpoint_url, region_name, …)."
    )
    conditional_writes: bool | None = Field(
        None,
        description="s3: send `If-None-Match`/`If-Match` on chunk writes, so no writer can overwrite a "
        "committed chunk. Unset: what the capability probe found; `true` refuses a server that ignores "
        "them; `false` needs `single_writer`. See docs/drivers.md.",
    )
    server_side_copy: bool | None = Field(
        None,
        description="s3: seal segments with `UploadPartCopy` on the server. Unset: what the capability "
        "probe found; `false`: download and re-upload.",
    )
    single_writer: bool = Field(
        False,
        description="s3: accept a server that ignores preconditions (or `conditional_writes = false`): "
        "you promise that exactly one tierd process ever writes under `url`.",
    )


class ServerConfig(_Section):
    """``[server]`` — the HTTP API."""

    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8080, ge=0, le=65535, description="Bind port (0 = any free port).")
    token: str | None = Field(
        None,
        description="Bearer token required by every route but health. Must not be empty; a "
        "non-loopback `host` needs one (or `allow_unauthenticated`).",
        json_schema_extra={"secret": True},
    )
    shutdown_grace: float = Field(30.0, ge=0, description="Seconds to finish tiering on SIGTERM.")
    long_poll_max_ms: int = Field(
        30_000,
        ge=0,
        le=3_600_000,
        description="Longest long poll a read may ask for (`wait_ms`, ms); longer is a 400. "
        "0 turns long polling off.",
    )
    token_file: Path | None = Field(
        None,
        description="Read the bearer token from this file (a mounted secret; surrounding whitespace "
        "is stripped). Not together with `token`.",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Allow binding a non-loopback `host` without a token (only behind something "
        "else that authenticates).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Extra names accepted in the `Host` header (DNS-rebinding guard). Always "
        "accepted: the bound address, and loopback names when bound to loopback; any name when "
        'bound to a wildcard address (0.0.0.0, ::). `"*"` accepts every name.',
    )
    ops_host: str | None = Field(
        None,
        description="Bind address of a second listener serving only /healthz, /readyz and "
        "/metrics, without a token (e.g. the pod IP or 0.0.0.0 for kubelet probes and Prometheus) "
        "while the data API stays on `host`. None: no second listener.",
    )
    ops_port: int = Field(
        8082,
        ge=0,
        le=65535,
        description="Port of the ops listener (0 = any free port). Not 8081: that is the RocketMQ "
        "gRPC port (`grpc.port`) the application's client expects.",
    )
    max_connections: int = Field(
        256, ge=1, description="Concurrent connections (or requests) before new requests get 503."
    )
    max_header_bytes: int = Field(
        64 * KiB,
        ge=16 * KiB,
        description="Largest request line + headers; larger requests get 431. The default fits "
        "the longest key lookup (4096 characters, percent-encoded UTF-8: up to 48 KiB of URL).",
    )
    header_timeout: float = Field(
        10.0, gt=0, description="Seconds a client has to send a request's line and headers."
    )
    body_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds a client has, after its headers, to send the whole request body; "
        "then 408 and the connection closes.",
    )
    max_read_bytes: int = Field(
        4 * MiB,
        ge=1,
        description="Byte bound of one queue read over HTTP (message bytes before base64): the "
        "read stops before the message that would cross it; the first message always comes.",
        json_schema_extra=_rmq("maxTransferBytesOnMessageInDisk"),
    )
    api_docs: bool = Field(
        False,
        description="Serve the interactive API page at /docs. It loads its scripts from a CDN, so it "
        "needs internet access in the browser; the OpenAPI document (/openapi.json) is always served.",
    )
    metrics_max_topics: int = Field(
        500,
        ge=0,
        description="Topics with per-topic traffic series of their own in /metrics (the first seen "
        'since start); traffic of further topics is summed under `topic="(other)"` (docs/metrics.md).',
    )

    @field_validator("token")
    @classmethod
    def _token_not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(
                "an empty token is not 'no token' (an unset variable or a missing secret?); remove the "
                "key to run without one"
            )
        return value

    @model_validator(mode="after")
    def _one_token_source(self) -> ServerConfig:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set server.token or server.token_file, not both")
        if self.token_file is not None:
            self.bearer_token()  # a missing or empty file is a configuration error now, not at bind
        return self

    def bearer_token(self) -> str | None:
        """The token in force: ``token``, or the contents of ``token_file`` (read on each call,
        so a restarted daemon picks up a rotated secret)."""
        if self.token_file is None:
            return self.token
        try:
            text = self.token_file.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(
                f"server.token_file {self.token_file}: {e.strerror or e}", path=str(self.token_file)
            ) from e
        if not text:
            raise ConfigError(
                f"server.token_file {self.token_file} is empty (a missing secret?)", path=str(self.token_file)
            )
        return text


#: RocketMQ's message delay levels from "1s" on ("1s 5s 10s 30s 1m 2m … 2h"): its retry backoff.
_RETRY_DELAY_LEVELS = "1 5 10 30 60 120 180 240 300 360 420 480 540 600 1200 1800 3600 7200"
ROCKETMQ_RETRY_DELAYS = tuple(float(s) for s in _RETRY_DELAY_LEVELS.split())


class GrpcConfig(_Section):
    """``[grpc]`` — the RocketMQ 5 gRPC API (``apache.rocketmq.v2.MessagingService``) that
    unmodified RocketMQ clients speak (docs/grpc.md)."""

    enabled: bool = Field(
        True,
        description="Serve the RocketMQ 5 gRPC API (needs the `grpc` extra, which the container "
        "image has): an unmodified RocketMQ client in the pod reaches it at `localhost:8081`.",
    )
    host: str = Field("127.0.0.1", description="Bind address (loopback: the pod's own containers).")
    port: int = Field(
        8081,
        ge=0,
        le=65535,
        description="Bind port (0 = any free port); the RocketMQ proxy's gRPC port is 8081.",
        json_schema_extra=_rmq("grpcServerPort"),
    )
    tls_cert_file: Path | None = Field(
        None,
        description="PEM certificate chain: serve TLS (what clients built with `tls_enable=True` "
        "expect). Together with `tls_key_file`.",
    )
    tls_key_file: Path | None = Field(None, description="PEM private key of `tls_cert_file`.")
    auto_create_topics: bool = Field(
        True,
        description="A topic first named by a client exists at once with `store.default_queues` "
        "queues; `false`: unknown topics answer `TOPIC_NOT_FOUND`, as the RocketMQ proxy does.",
        json_schema_extra=_rmq("autoCreateTopicEnable"),
    )

    credentials: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="RocketMQ access key -> secret key: when any are set (here or in "
        "`credentials_file`), every call must carry the client's valid signature, else "
        "`UNAUTHORIZED`; a non-loopback `host` needs them (or `server.allow_unauthenticated`).",
    )
    credentials_file: Path | None = Field(
        None,
        description="File of `ACCESS_KEY:SECRET_KEY` lines (a mounted secret; `#` comments), "
        "added to `credentials`.",
    )
    max_delivery_attempts: int = Field(
        17,
        ge=1,
        le=1000,
        description="Deliveries of a message to a consumer group before it moves to the group's "
        "dead-letter topic `%DLQ%<group>` (RocketMQ: a group's `retryMaxTimes` 16, plus the "
        "first delivery).",
    )
    retry_delays: list[float] = Field(
        default_factory=lambda: list(ROCKETMQ_RETRY_DELAYS),
        min_length=1,
        description="Seconds a push consumer waits before its Nth retry of a failed message (the "
        "last value repeats); RocketMQ's delay levels from 1 s.",
    )
    max_connections: int = Field(
        256,
        ge=1,
        description="Client connections served at once (at most an eighth of the open-files limit); "
        "one more is closed as it opens and the client retries (UNAVAILABLE). Calls in flight, "
        "long polls included, are bounded at 8 per connection: beyond, RESOURCE_EXHAUSTED.",
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> GrpcConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set grpc.tls_cert_file and grpc.tls_key_file together (or neither)")
        return self


class LogConfig(_Section):
    """``[log]`` — logging."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    format: Literal["text", "json"] = Field(
        "text",
        description="Log line format. `json`: one object per line, with `request_id`, `topic`, "
        "`queue` and `group` where they apply (docs/metrics.md#logs).",
    )


class TableConfig(_Section):
    """``[table]`` — the Iceberg table view of the topics that opt in with
    ``[topics.<name>] table = "iceberg"`` (docs/table.md): the catalog, where Parquet goes, how
    often the writer runs and what maintenance keeps."""

    catalog: Literal["sql", "rest", "glue"] = Field(
        "sql",
        description="Iceberg catalog: `sql` (SQLite under `store.dir` unless `catalog_uri` names "
        "another database), `rest` (`catalog_uri` is its URL) or `glue` (AWS Glue).",
    )
    catalog_uri: str | None = Field(
        None,
        description="The catalog's URI: a SQLAlchemy URL for `sql` (default "
        "`sqlite:///<store.dir>/table/catalog.db`), the endpoint for `rest`; unused for `glue`.",
    )
    warehouse: str | None = Field(
        None,
        description="Where tables' Parquet and metadata files go (`s3://bucket/prefix` or a "
        "directory; default `<store.dir>/table/warehouse`).",
    )
    catalog_properties: dict[str, str] = Field(
        default_factory=dict,
        description="Further pyiceberg catalog properties (e.g. `s3.endpoint`, `glue.region`, "
        "`token`); never put secrets here, use the environment.",
    )
    namespace: str = Field("tierd", min_length=1, description="Iceberg namespace of the tables.")
    interval: float = Field(
        60.0, gt=0, description="Seconds between the daemon's table writer passes (each a commit per topic)."
    )
    max_rows_per_commit: int = Field(
        1_000_000, ge=1, description="Rows one commit adds at most; a larger backlog takes several commits."
    )
    snapshot_retention: float = Field(
        7 * 86400.0,
        gt=0,
        description="Seconds a table snapshot is kept for time travel before maintenance expires it.",
    )
    min_snapshots: int = Field(5, ge=1, description="Snapshots maintenance always keeps, however old.")
    compact_below: int = Field(
        32 * MiB,
        ge=0,
        description="Maintenance rewrites a day's Parquet files into one when it has several smaller "
        "than this many bytes (0: never compact).",
    )
    orphan_age: float = Field(
        86400.0,
        gt=0,
        description="Seconds after which a Parquet file no snapshot references (left by a crashed "
        "pass) is deleted by maintenance.",
    )


class TopicConfig(_Section):
    """``[topics.<name>]`` — one topic's settings; a declared topic exists from the start (docs/topics.md)."""

    # Applied at every start: created when missing, the queue count grown, the cold retention set.

    queues: int | None = Field(
        None,
        ge=1,
        description="Queues the topic spreads over (default `store.default_queues`, at most "
        "`store.max_queues`); only grows.",
    )
    cold_retention_hours: float | None = Field(
        None, gt=0, description="The topic's cold retention (default `tiered.file_reserved_time`)."
    )

    table: Literal["none", "iceberg"] = Field(
        "none", description="`iceberg`: keep an Iceberg table of the topic's sealed cold messages."
    )
    body_format: Literal["binary", "json"] = Field(
        "binary",
        description="`json`: also decode each body as a JSON object into `body_columns` "
        "(bodies that do not decode go to the `<topic>_dead_letter` table).",
    )
    body_columns: dict[str, Literal["string", "long", "double", "boolean"]] = Field(
        default_factory=dict,
        description="Declared body fields and their types, added as table columns (a new one is "
        "added to the table's schema; old rows read it as null).",
    )
    table_retention_days: int = Field(
        0, ge=0, description="Days of store time the table keeps (0: forever, beyond cold retention)."
    )


class ScheduledConfig(_Section):
    """``[scheduled]`` — delayed and timer messages (docs/scheduled.md): what a producer may ask
    for, and how the scheduler delivers."""

    enabled: bool = Field(
        True,
        description="Run the scheduler (off: scheduled messages are still accepted and kept, and "
        "delivered once it runs again).",
    )
    max_delay: float = Field(
        3 * 24 * 3600.0,
        gt=0,
        description="Longest delay accepted, in seconds from the put; a later delivery time is "
        "refused (`invalid_delivery_time`).",
        json_schema_extra=_rmq("timerMaxDelaySec"),
    )
    delay_levels: str = Field(
        DEFAULT_DELAY_LEVELS,
        description="The delays of levels 1, 2, … (RocketMQ 4's delay levels; units s, m, h, d).",
        json_schema_extra=_rmq("messageDelayLevel"),
    )
    batch: int = Field(
        256,
        ge=1,
        le=4096,
        description="Messages delivered per store append; the scheduler yields between batches, "
        "so a backlog of due messages never holds producers up.",
    )
    checkpoint_interval: float = Field(
        1.0,
        gt=0,
        description="Most seconds between two progress records; what was delivered since the last "
        "one is checked against the key index after a crash, never delivered twice.",
    )

    @field_validator("delay_levels")
    @classmethod
    def _levels_parse(cls, value: str) -> str:
        parse_delay_levels(value)  # raises with the offending token
        return value


class TransactionsConfig(_Section):
    """``[transactions]`` — transactional messages (docs/transactions.md): when a producer that
    neither commits nor rolls back is asked, how often, and for how long."""

    transaction_timeout: float = Field(
        6.0,
        gt=0,
        description="Seconds a half message waits for its commit or rollback before the producer "
        "is first asked (check-back).",
        json_schema_extra=_rmq("transactionTimeOut"),
    )
    check_interval: float = Field(
        30.0,
        gt=0,
        description="Seconds between two check-backs of one transaction (and between the checker's rounds).",
        json_schema_extra=_rmq("transactionCheckInterval"),
    )
    check_max: int = Field(
        15,
        ge=0,
        le=10_000,
        description="Check-backs asked before an unanswered transaction is rolled back.",
        json_schema_extra=_rmq("transactionCheckMax"),
    )


SECTIONS: dict[str, type[_Section]] = {
    "store": StoreConfig,
    "tiered": TieredConfig,
    "backend": BackendConfig,
    "server": ServerConfig,
    "grpc": GrpcConfig,
    "log": LogConfig,
    "table": TableConfig,
    "scheduled": ScheduledConfig,
    "transactions": TransactionsConfig,
}
#: Sections holding one table per name (``[topics.<name>]``), with the model of each.
NAMED_SECTIONS: dict[str, type[_Section]] = {"topics": TopicConfig}


class TierdConfig(_Section):
    """The whole configuration. Build in code with ``TierdConfig(store=StoreConfig(...))`` or load
    a file with :meth:`load`."""

    store: StoreConfig = Field(default_factory=lambda: StoreConfig())
    tiered: TieredConfig = Field(default_factory=lambda: TieredConfig())
    backend: BackendConfig = Field(default_factory=lambda: BackendConfig())
    server: ServerConfig = Field(default_factory=lambda: ServerConfig())
    grpc: GrpcConfig = Field(default_factory=lambda: GrpcConfig())
    log: LogConfig = Field(default_factory=lambda: LogConfig())
    table: TableConfig = Field(default_factory=lambda: TableConfig())
    scheduled: ScheduledConfig = Field(default_factory=lambda: ScheduledConfig())
    transactions: TransactionsConfig = Field(default_factory=lambda: TransactionsConfig())
    topics: dict[str, TopicConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cold_segment_holds_the_largest_record(self) -> TierdConfig:
        """A flat commitlog segment has no header or footer, and a record never spans two
        segments: a record that does not fit the room left rolls to a fresh segment, and one that
        does not fit a fresh segment can never be tiered. Its queue would stop tiering for good —
        and hot retention, which frees only what is cold, could then never free it. So a segment
        size below the largest record is refused up front, whatever the record sizes written."""
        minimum = self.store.max_record_size
        size = self.tiered.commitlog_segment_size
        if size < minimum:
            raise ConfigError(
                f"tiered.commitlog_segment_size {size} is smaller than the largest record "
                f"({minimum} bytes: store.max_message_size {self.store.max_message_size} + "
                f"{RECORD_OVERHEAD_LIMIT} bytes of headers, topic and properties); such a record "
                "could never be tiered. Raise tiered.commitlog_segment_size to at least "
                f"{minimum} or lower store.max_message_size",
                commitlog_segment_size=size,
                minimum=minimum,
                max_message_size=self.store.max_message_size,
            )
        return self

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
    ) -> TierdConfig:
        """Read ``path`` (TOML; optional) and apply ``TIERD_<SECTION>__<KEY>`` overrides from ``env``
        (default ``os.environ``). Relative ``store.dir`` / posix ``backend.url`` stay relative to the
        working directory, as a user typing them would expect."""
        return cls.from_dict(_read(path, env))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierdConfig:
        return _validated(cls, data)

    def with_overrides(self, **sections: Mapping[str, Any]) -> TierdConfig:
        """A copy with some keys replaced, e.g. ``cfg.with_overrides(store={"dir": tmp})``."""
        data = self.model_dump()
        for section, values in sections.items():
            data[section].update(values)
        return TierdConfig.from_dict(data)


class ClientConfig(_Section):
    """What a command needs to find a running daemon and ask it: ``[store]`` (a daemon holds its
    directory's lock), ``[server]`` (address, token, long-poll bound) and ``[log]``. The same
    section models as :class:`TierdConfig`, so the same keys, defaults and errors."""

    store: StoreConfig = Field(default_factory=lambda: StoreConfig())
    server: ServerConfig = Field(default_factory=lambda: ServerConfig())
    log: LogConfig = Field(default_factory=lambda: LogConfig())


def load_client(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> ClientConfig:
    """The sections of :class:`ClientConfig` from the file and ``TIERD_*`` environment that
    :meth:`TierdConfig.load` reads, checked as it checks them. The other sections' names and
    keys are checked (a typo is still an error) but their values are not validated: the daemon
    that uses them validated them when it started, and a command that opens the store itself
    loads the whole :class:`TierdConfig`."""
    data = _read(path, env)
    return _validated(ClientConfig, {k: v for k, v in data.items() if k in ClientConfig.model_fields})


def _read(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None) -> dict[str, dict[str, Any]]:
    """The raw sections of ``path`` with the environment's overrides applied (see
    :meth:`TierdConfig.load`); section and key names are checked, values are not."""
    data: dict[str, dict[str, Any]] = {}
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"config file not found: {p}", path=str(p)) from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}", path=str(p)) from e
        for section, values in raw.items():
            if section in NAMED_SECTIONS and isinstance(values, dict):
                data[section] = dict(values)
                continue
            if section not in SECTIONS:
                raise ConfigError(
                    f"unknown config section [{section}] in {p}; "
                    f"known: {', '.join([*SECTIONS, *NAMED_SECTIONS])}",
                    section=section,
                )
            if not isinstance(values, dict):
                raise ConfigError(f"[{section}] in {p} must be a table", section=section)
            data[section] = dict(values)
    for key, value in (os.environ if env is None else env).items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        section, _, name = key[len(ENV_PREFIX) :].lower().partition("__")
        if section not in SECTIONS:
            raise ConfigError(f"environment variable {key}: unknown section {section!r}", variable=key)
        if name not in SECTIONS[section].model_fields:
            raise ConfigError(
                f"environment variable {key}: unknown key {name!r} in [{section}]", variable=key
            )
        text = _is_text(SECTIONS[section].model_fields[name].annotation)
        data.setdefault(section, {})[name] = value if text else _parse_env_value(value)
    return data


_Model = typing.TypeVar("_Model", bound=BaseModel)


def _validated(model: type[_Model], data: Mapping[str, Any]) -> _Model:
    """``data`` validated as ``model``; a failure is one :class:`ConfigError` naming every bad
    key (``section.key: problem (got value)``), secrets masked."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        for err in e.errors():
            # A rule across sections (a model validator) raises its own typed error, with
            # the values it names; re-raised as it is, not flattened with the whole input.
            cause = err.get("ctx", {}).get("error")
            if isinstance(cause, ConfigError):
                raise cause from None
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}{_shown_input(err)}" for err in e.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from e


def _shown_input(err: Any) -> str:
    """`` (got VALUE)`` for a validation error, with secret fields masked: a token never reaches
    an error message or a log (a section-level error's input is the whole section)."""
    loc = err["loc"]
    section = SECTIONS.get(str(loc[0])) if loc else None
    value = err.get("input")
    if section is not None and len(loc) >= 2:
        if _is_secret(section, str(loc[1])):
            return ""
    elif section is not None and isinstance(value, dict):
        value = {k: "***" if _is_secret(section, str(k)) else v for k, v in value.items()}
    return f" (got {value!r})"


def _is_secret(section: type[_Section], key: str) -> bool:
    field = section.model_fields.get(key)
    extra = field.json_schema_extra if field is not None else None
    return isinstance(extra, dict) and bool(extra.get("secret"))


def _is_text(annotation: Any) -> bool:
    """Fields whose value is text (``str``, ``Path``, optionally ``None``) take an environment
    value as it is: ``TIERD_SERVER__TOKEN=123456`` is the token "123456", not the integer."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    args = typing.get_args(annotation) if union else ()
    kinds = [a for a in args if a is not type(None)] if args else [annotation]
    return len(kinds) == 1 and kinds[0] in (str, Path)


def _parse_env_value(value: str) -> Any:
    """Env values are TOML scalars when they parse as such (``true``, ``42``, ``"x"``, ``{a=1}``),
    otherwise plain strings — so ``TIERD_STORE__DIR=/data`` needs no quoting."""
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def reference_markdown() -> str:
    """The configuration reference (docs/configuration.md), generated from the models above so it
    cannot drift from the code; ``tests/test_config.py`` fails when the file is stale."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `tierd/config.py` by `python -m tierd.docgen > docs/configuration.md`; do not edit.",
        "",
        "Precedence: code defaults, then the TOML file (`--config FILE`), then environment variables",
        "`TIERD_<SECTION>__<KEY>` (values parse as TOML scalars, so `TIERD_STORE__FLUSH=sync` and",
        "`TIERD_STORE__DEFAULT_QUEUES=8` both work). Unknown sections and keys are errors.",
        "Secrets (S3 credentials) are never configuration keys: use the environment or the provider chain.",
        "",
    ]
    named = {f"{k}.<name>": v for k, v in NAMED_SECTIONS.items()}
    for name, section in {**SECTIONS, **named}.items():
        lines += [
            f"## [{name}]",
            "",
            (section.__doc__ or "").strip(),
            "",
            "| key | default | meaning | RocketMQ name | env override |",
            "|---|---|---|---|---|",
        ]
        for key, field in section.model_fields.items():
            default = field.get_default(call_default_factory=True)
            shown = f"`{default}`" if default not in (None, {}) else "(none)"
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            rmq = f"`{extra['rocketmq']}`" if "rocketmq" in extra else ""
            env = f"`TIERD_{name.upper()}__{key.upper()}`" if name in SECTIONS else "(file only)"
            lines.append(f"| `{key}` | {shown} | {field.description} | {rmq} | {env} |")
        lines.append("")
    return "\n".join(lines)
