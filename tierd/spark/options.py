"""The options of ``spark.read.format("tierd")`` / ``spark.readStream`` / ``CREATE TABLE ... USING
tierd``: validated once, on the driver, into plain picklable data.

Spark hands a Python data source its options as strings in a case-insensitive map. Three shapes
arrive here:

* **DataFrame reads**: exactly what the user set (``.option(...)``, ``.load(path)`` as ``path``).
* **Catalog tables** (``CREATE TABLE t USING tierd OPTIONS (...) [LOCATION '...']``): Spark's
  session catalog adds its own properties — ``provider``, ``owner``, ``location``, ``path``,
  ``comment``, ``external``, every ``TBLPROPERTIES`` entry — and repeats each user option under
  ``option.<name>`` (a ``TBLPROPERTIES`` entry of the same name overwrites the plain copy, never
  the prefixed one). So when ``provider`` is present, the options are the ``option.*`` entries
  plus the table's location, and nothing else is looked at: typos in ``OPTIONS`` are still
  refused, table properties never are.
* **Reads of such a table** (``SELECT ... FROM t``): PySpark 4.3 creates the data source with the
  *query's* options only (``WITH (...)``; usually none) — the table's are dropped on the way
  (``PythonDataSourceV2.getTable`` ignores them). The source therefore stores a table's options in
  the metadata of its schema when the table is created (Spark keeps the schema, metadata
  included, in the catalog) and reads them back from the schema it is given; see
  :func:`table_options` and :mod:`tierd.spark.source`.

Every error names the option and the value received.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from tierd.errors import InvalidArgumentError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql.types import StructType

__all__ = [
    "BATCH_OPTIONS",
    "DEFAULT_MAX_PARTITION_BYTES",
    "OPTION_NAMES",
    "STREAM_OPTIONS",
    "ReadOptions",
    "is_catalog",
    "normalize",
    "parse_size",
    "table_options",
]

MiB: Final = 1024 * 1024
#: Default upper bound of one partition's commitlog bytes (like ``spark.sql.files.maxPartitionBytes``).
DEFAULT_MAX_PARTITION_BYTES: Final = 128 * MiB
#: Options of every read (Spark passes ``path`` for ``.load(path)``).
BATCH_OPTIONS: Final = frozenset(
    {
        "path",
        "cluster",
        "broker",
        "topic",
        "queue_ids",
        "storage_options",
        "include_open_segments",
        "max_partition_bytes",
        "key",
    }
)
#: Options of ``spark.readStream`` only (lower-cased; documented in Kafka's spelling, e.g.
#: ``startingOffsets``). A batch read of a table that sets them ignores them.
STREAM_OPTIONS: Final = frozenset({"startingoffsets", "maxbytespertrigger", "failondataloss"})
OPTION_NAMES: Final = BATCH_OPTIONS | STREAM_OPTIONS
#: Where a table's options travel from CREATE TABLE to its reads (field metadata of the schema).
TABLE_OPTIONS_METADATA: Final = "tierd.table.options"
#: storage_options entries that are secrets: refused in a table's options, which Spark stores in
#: the metastore and copies with the schema (``CREATE TABLE ... AS SELECT``).
SECRET_STORAGE_OPTIONS: Final = frozenset({"key", "secret", "token", "password", "aws_secret_access_key"})

_SIZE = re.compile(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB, "t": 1024 * 1024 * MiB}
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})
_OPTION_PREFIX = "option."
#: Hadoop-style ``file:/abs/dir`` (how Spark's catalog qualifies a local LOCATION).
_HADOOP_FILE = re.compile(r"file:/(?!/)")


# ----------------------------------------------------------------------------- catalog shapes
def is_catalog(options: Mapping[str, str]) -> bool:
    """Did Spark's catalog build these options (``CREATE TABLE``)? It always adds ``provider``."""
    return any(k.lower() == "provider" for k in options)


def normalize(options: Mapping[str, str]) -> dict[str, str]:
    """The user's options, lower-cased names: for a catalog table, its ``option.*`` entries and
    location (see the module docstring); otherwise the options as given."""
    opts = {k.lower(): v for k, v in options.items()}
    if not is_catalog(options):
        return opts
    user = {k[len(_OPTION_PREFIX) :]: v for k, v in opts.items() if k.startswith(_OPTION_PREFIX)}
    location = opts.get("path") or opts.get("location")
    if location:
        user["path"] = location
    return user


def table_options(schema: StructType) -> dict[str, str]:
    """The options stored in a table's schema at ``CREATE TABLE`` ({} for any other schema)."""
    for f in schema.fields:
        raw = (f.metadata or {}).get(TABLE_OPTIONS_METADATA)
        if raw is not None:
            stored = json.loads(raw)
            if isinstance(stored, dict):
                return {str(k): str(v) for k, v in stored.items()}
    return {}


# ----------------------------------------------------------------------------- value parsers
def _names(option: str, raw: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in raw.split(","))
    if not raw.strip() or any(not n or "/" in n for n in names):
        raise InvalidArgumentError(
            f"option {option} must be a name or a comma-separated list of names, got {raw!r}",
            option=option,
            value=raw,
        )
    return tuple(dict.fromkeys(names))


def parse_size(option: str, raw: str) -> int:
    """``"134217728"``, ``"128m"``, ``"128MiB"``, ``"1g"`` → bytes (binary units)."""
    m = _SIZE.fullmatch(raw)
    if not m:
        raise InvalidArgumentError(
            f"option {option} must be a size such as 134217728, 128m or 1GiB, got {raw!r}",
            option=option,
            value=raw,
        )
    value = int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if value < 1:
        raise InvalidArgumentError(f"option {option} must be at least 1 byte, got {raw!r}", option=option)
    return value


def _bool(option: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v not in _TRUE | _FALSE:
        raise InvalidArgumentError(
            f"option {option} must be true or false, got {raw!r}", option=option, value=raw
        )
    return v in _TRUE


def _url(raw: str) -> str:
    url = raw.strip()
    if not url:
        return ""
    if _HADOOP_FILE.match(url):
        url = "file:///" + url[len("file:/") :]
    if "://" not in url:
        if not url.startswith("/"):
            raise InvalidArgumentError(
                f"option path must be a URL (s3://bucket/prefix, file:///abs/dir) or an absolute "
                f"directory, got {url!r}",
                option="path",
                value=url,
            )
        url = "file://" + url
    return url


def _storage_options(raw: str | None) -> dict[str, Any]:
    if raw is None or not raw.strip():
        return {}
    try:
        storage = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(
            f"option storage_options must be a JSON object, got invalid JSON ({e.msg} at character {e.pos})",
            option="storage_options",
        ) from e
    if not isinstance(storage, dict):
        raise InvalidArgumentError(
            f"option storage_options must be a JSON object, got a {type(storage).__name__}",
            option="storage_options",
        )
    return storage


def _queue_ids(raw: str) -> tuple[int, ...]:
    try:
        ids = tuple(sorted({int(p) for p in raw.split(",")}))
    except ValueError:
        ids = None
    if ids is None or any(q < 0 for q in ids):
        raise InvalidArgumentError(
            f"option queue_ids must be a comma-separated list of integers >= 0, got {raw!r}",
            option="queue_ids",
            value=raw,
        )
    return ids


@dataclass(frozen=True, slots=True)
class StartingOffsets:
    """``startingOffsets``: ``earliest``, ``latest``, a timestamp, or per-queue offsets.

    ``per_queue`` maps a topic name — or ``broker/topic``, or ``cluster/broker/topic`` — to
    ``{queue id: offset}`` where offset -2 means earliest and -1 latest (Kafka's convention)."""

    kind: str  # "earliest" | "latest" | "timestamp" | "offsets"
    timestamp_ms: int | None = None
    per_queue: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: str) -> StartingOffsets:
        text = raw.strip()
        low = text.lower()
        if low in ("earliest", "latest"):
            return cls(low)
        if text.startswith("{"):
            return cls("offsets", per_queue=_per_queue_offsets(text))
        if text.isdigit():
            return cls("timestamp", timestamp_ms=int(text))
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            raise InvalidArgumentError(
                "option startingOffsets must be earliest, latest, a JSON object of per-queue offsets "
                '({"orders": {"0": 42, "1": -2}}), a timestamp with a time zone '
                f"(2025-01-31T12:00:00Z) or epoch milliseconds, got {raw!r}",
                option="startingOffsets",
                value=raw,
            )
        ms = (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)
        return cls("timestamp", timestamp_ms=ms)


def _per_queue_offsets(text: str) -> dict[str, dict[int, int]]:
    def bad(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f'option startingOffsets: {why}; expected {{"<topic>": {{"<queue id>": <offset>, ...}}}} with '
            "offsets >= 0, or -2 (earliest) / -1 (latest)",
            option="startingOffsets",
            value=text,
        )

    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad(f"invalid JSON ({e.msg} at character {e.pos})") from e
    if not isinstance(raw, dict) or not raw:
        raise bad("not a non-empty JSON object")
    out: dict[str, dict[int, int]] = {}
    for topic, queues in raw.items():
        if not isinstance(queues, dict) or not queues:
            raise bad(f"{topic!r} must map queue ids to offsets")
        parsed: dict[int, int] = {}
        for qid, off in queues.items():
            if not str(qid).isdigit() or not isinstance(off, int) or isinstance(off, bool) or off < -2:
                raise bad(f"{topic!r}: queue {qid!r} -> {off!r} is not a queue id and an offset")
            parsed[int(qid)] = off
        out[str(topic)] = parsed
    return out


# ----------------------------------------------------------------------------- the options
@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The validated options of one read — plain, picklable data."""

    #: Root URL of the cold tier; "" when not given (a table read learns it from the schema).
    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    clusters: tuple[str, ...] | None = None
    brokers: tuple[str, ...] | None = None
    topics: tuple[str, ...] | None = None
    queue_ids: tuple[int, ...] | None = None
    include_open_segments: bool = True
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    #: Only messages with this key (a KEYS token or the UNIQ_KEY), found through the cold index.
    key: str | None = None
    starting_offsets: StartingOffsets = field(default_factory=lambda: StartingOffsets("latest"))
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Validate Spark's options (case-insensitive names, string values; a catalog table's
        properties are narrowed to its options first, see :func:`normalize`). A missing path
        is not an error here (:meth:`require_path`)."""
        opts = normalize(options)
        unknown = sorted(set(opts) - OPTION_NAMES)
        if unknown:
            raise InvalidArgumentError(
                f"unknown option(s) {unknown} for format 'tierd'; valid options: "
                f"{sorted(BATCH_OPTIONS)} and, for spark.readStream, startingOffsets, "
                "maxBytesPerTrigger, failOnDataLoss",
                options=unknown,
            )
        key = opts.get("key")
        if key is not None and (not key or key != key.strip() or " " in key):
            raise InvalidArgumentError(
                f"option key must be one key (a KEYS token or a UNIQ_KEY: no spaces), got {key!r}",
                option="key",
                value=key,
            )
        mbt = opts.get("maxbytespertrigger")
        return cls(
            url=_url(opts.get("path") or ""),
            storage_options=_storage_options(opts.get("storage_options")),
            clusters=_names("cluster", opts["cluster"]) if opts.get("cluster") is not None else None,
            brokers=_names("broker", opts["broker"]) if opts.get("broker") is not None else None,
            topics=_names("topic", opts["topic"]) if opts.get("topic") is not None else None,
            queue_ids=_queue_ids(opts["queue_ids"]) if opts.get("queue_ids") is not None else None,
            include_open_segments=_bool("include_open_segments", opts["include_open_segments"])
            if opts.get("include_open_segments") is not None
            else True,
            max_partition_bytes=parse_size("max_partition_bytes", opts["max_partition_bytes"])
            if opts.get("max_partition_bytes") is not None
            else DEFAULT_MAX_PARTITION_BYTES,
            key=key,
            starting_offsets=StartingOffsets.parse(opts["startingoffsets"])
            if opts.get("startingoffsets") is not None
            else StartingOffsets("latest"),
            max_bytes_per_trigger=parse_size("maxBytesPerTrigger", mbt) if mbt is not None else None,
            fail_on_data_loss=_bool("failOnDataLoss", opts["failondataloss"])
            if opts.get("failondataloss") is not None
            else True,
        )

    def require_path(self) -> ReadOptions:
        """Self, if the cold tier's location is known; else the error that says how to give it."""
        if not self.url:
            raise InvalidArgumentError(
                "option path is required: .option('path', 's3://bucket/prefix') or .load('file:///dir'); "
                "in SQL: CREATE TABLE t USING tierd OPTIONS (path 's3://bucket/prefix') or "
                "... LOCATION 's3://bucket/prefix'",
                option="path",
            )
        return self


def check_table_options(options: Mapping[str, str]) -> None:
    """A table's options end up in the metastore and in its schema: no secrets there."""
    raw = normalize(options).get("storage_options")
    secrets = sorted(set(_storage_options(raw)) & SECRET_STORAGE_OPTIONS)
    if secrets:
        raise InvalidArgumentError(
            f"option storage_options of a table must not hold credentials ({secrets}): Spark stores "
            "table options in the metastore and copies them with the schema. Give credentials "
            "through the environment of the driver and executors (AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE), an instance profile or IRSA instead",
            options=secrets,
        )
