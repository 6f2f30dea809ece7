"""What a store holds: queues and cold segments, as plain rows for the CLI and the HTTP API.

Two sources give the same rows: a live store (its in-memory flat files — always current) and a
bucket alone (its manifests — what ``tierd segments ls --backend-url`` and a fresh machine see).
Both go through the manifest models, so an operator comparing the two compares like with like;
a row is the manifest's segment record (:class:`~tierd.tiered.records.ManifestSegment`, same
field names) plus where it lives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import ConfigDict, Field

from tierd.drivers.paths import index_segment_path, segment_path
from tierd.drivers.segment import FileType
from tierd.errors import CorruptionError, InvalidArgumentError, NotFoundError, SegmentNotFoundError
from tierd.queue_info import QueueInfo as QueueInfo  # its home; re-exported for callers
from tierd.tiered.manifest import (
    BrokerManifest,
    IndexManifest,
    index_manifest_path,
    read_broker_manifest,
    read_queue_manifest,
)
from tierd.tiered.records import ManifestSegment, SegmentRecord

if TYPE_CHECKING:
    from tierd.drivers.segment import DriverRoot
    from tierd.local.store import HotStore
    from tierd.tiered.service import TieringService

SegmentKind = Literal["COMMIT_LOG", "CONSUME_QUEUE", "INDEX"]
SEGMENT_KINDS: tuple[str, ...] = get_args(SegmentKind)
_FILE_TYPE: dict[str, FileType] = {
    "COMMIT_LOG": FileType.COMMIT_LOG,
    "CONSUME_QUEUE": FileType.CONSUME_QUEUE,
}


def _same(name: str) -> str:
    return name


class SegmentRow(ManifestSegment):
    """One cold segment (commitlog, consume queue or index): its manifest record plus where it
    lives. Keys are the field names (snake_case) — it is the shape of the CLI's and the HTTP
    API's output, not a document on disk."""

    # defer_build: built on the first listing, not at import — the open + put path lists no
    # segment (issue 31's start-up budget).
    model_config = ConfigDict(alias_generator=_same, defer_build=True)

    topic: str | None = Field(description="None for INDEX segments (they mix topics).")
    queue_id: int | None
    path: str = Field(description="Path relative to the backend root.")

    @classmethod
    def at(cls, segment: ManifestSegment, topic: str | None, queue_id: int | None, path: str) -> SegmentRow:
        """The row of a manifest's ``segment`` of ``topic``/``queue_id``, stored at ``path``."""
        return cls(**segment.model_dump(), topic=topic, queue_id=queue_id, path=path)

    def as_dict(self) -> dict[str, Any]:
        """The row as the CLI prints it (``--json``), in :data:`SEGMENT_COLUMNS` order."""
        return {name: getattr(self, name) for name in SEGMENT_COLUMNS}


#: The fields of a :class:`SegmentRow` in the order ``tierd segments ls --json`` prints them.
SEGMENT_COLUMNS = (
    "topic",
    "queue_id",
    "type",
    "base_offset",
    "size",
    "sealed",
    "message_count",
    "first_queue_offset",
    "last_queue_offset",
    "min_store_timestamp",
    "max_store_timestamp",
    "crc32c",
    "path",
)


def check_kind(kind: str | None) -> SegmentKind | None:
    """Validate a ``--type``/``type=`` filter (case-insensitive; ``CL``/``CQ`` accepted)."""
    if kind is None:
        return None
    norm = {"CL": "COMMIT_LOG", "CQ": "CONSUME_QUEUE"}.get(kind.upper(), kind.upper())
    if norm not in SEGMENT_KINDS:
        raise InvalidArgumentError(
            f"segment type must be one of {', '.join(SEGMENT_KINDS)} (or CL, CQ), got {kind!r}", type=kind
        )
    return norm  # type: ignore[return-value]


def queue_infos(hot: HotStore, tiering: TieringService | None, topic: str) -> list[QueueInfo]:
    """Every queue of ``topic`` known to either tier, by queue id."""
    hot_queues = set(hot.topics().get(topic, []))
    cold = tiering.flat if tiering is not None else None
    cold_queues = {q for (t, q) in cold.files if t == topic} if cold is not None else set()
    if not hot_queues and not cold_queues:
        raise NotFoundError(f"topic {topic!r} does not exist", topic=topic)
    rows = []
    for qid in sorted(hot_queues | cold_queues):
        rng = hot.acknowledged_range(topic, qid)  # never waits: the facade may be on a loop
        hmin, hmax = (rng.min_offset, rng.max_offset) if rng is not None else (0, 0)
        ff = cold.get(topic, qid) if cold is not None else None
        cmin = ff.min_offset if ff is not None else None
        cmax = ff.max_offset if ff is not None else None
        lo = min(hmin, cmin) if cmin is not None and cmax != cmin else hmin
        hi = max(hmax, cmax or 0)
        pending = max(0, hmax - max(cmax or 0, hmin)) if tiering is not None else 0
        rows.append(QueueInfo(topic, qid, lo, hi, hmin, hmax, cmin, cmax, pending))
    return rows


def _rows(
    segments: tuple[ManifestSegment, ...],
    cluster: str,
    broker: str,
    topic: str,
    queue_id: int,
    kind: SegmentKind | None,
) -> list[SegmentRow]:
    out = []
    for s in segments:
        if kind is not None and s.type != kind:
            continue
        path = segment_path("", cluster, broker, topic, queue_id, _FILE_TYPE[s.type], s.base_offset)
        out.append(SegmentRow.at(s, topic, queue_id, path.lstrip("/")))
    return out


async def live_segments(
    tiering: TieringService,
    topic: str | None = None,
    queue_id: int | None = None,
    kind: SegmentKind | None = None,
) -> list[SegmentRow]:
    """Segments of a running store's cold tier, from its flat files (current to the last commit)."""
    # Here, not at the top: the writer brings numpy, which a CLI command that only asks the
    # daemon for its queues (this module's QueueInfo) must not pay for at start-up.
    from tierd.tiered.manifestwriter import build_queue_manifest

    cfg = tiering.cfg.tiered
    rows: list[SegmentRow] = []
    for (t, q), ff in sorted(tiering.flat.files.items()):
        if (topic is not None and t != topic) or (queue_id is not None and q != queue_id):
            continue
        if kind == "INDEX":
            continue
        m = await build_queue_manifest(ff, cfg.cluster, cfg.broker)
        rows += _rows(m.segments, cfg.cluster, cfg.broker, t, q, kind)
    if topic is None and queue_id is None and kind in (None, "INDEX"):
        rows += [_index_row(cfg.cluster, cfg.broker, info) for info in tiering.index.uploaded_infos()]
    return rows


def _index_row(cluster: str, broker: str, s: SegmentRecord) -> SegmentRow:
    """An INDEX segment's row, listed as it always was: sealed, without message count, queue
    offsets or checksum."""
    path = index_segment_path("", cluster, broker, s.base_offset).lstrip("/")
    return SegmentRow(
        type="INDEX",
        base_offset=s.base_offset,
        size=s.size,
        sealed=True,
        min_store_timestamp=s.min_store_timestamp,
        max_store_timestamp=s.max_store_timestamp,
        message_count=0,
        topic=None,
        queue_id=None,
        path=path,
    )


async def bucket_segments(
    root: DriverRoot,
    cluster: str,
    broker: str,
    topic: str | None = None,
    queue_id: int | None = None,
    kind: SegmentKind | None = None,
) -> list[SegmentRow]:
    """Segments a bucket holds, read from its manifests alone (no daemon, no local metadata)."""
    bm = await read_broker_manifest(root, cluster, broker)
    names = {t.name for t in bm.topics}
    if topic is not None and topic not in names:
        raise NotFoundError(f"topic {topic!r} is not in the bucket's manifest", topic=topic)
    rows: list[SegmentRow] = []
    if kind != "INDEX":
        for entry in bm.topics:
            if topic is not None and entry.name != topic:
                continue
            for q in entry.queues:
                if queue_id is not None and q != queue_id:
                    continue
                qm = await read_queue_manifest(root, cluster, broker, entry.name, q)
                rows += _rows(qm.segments, cluster, broker, entry.name, q, kind)
    if topic is None and queue_id is None and kind in (None, "INDEX"):
        rows += [_index_row(cluster, broker, s) for s in await _index_segments(root, cluster, broker, bm)]
    return rows


async def _index_segments(
    root: DriverRoot, cluster: str, broker: str, bm: BrokerManifest
) -> tuple[ManifestSegment, ...]:
    """The uploaded INDEX segments: the index manifest lists them (the broker manifest's
    ``index_segments`` is kept for readers of older buckets)."""
    try:
        raw = await root.get_object(index_manifest_path(cluster, broker))
    except SegmentNotFoundError:
        return bm.index_segments
    try:
        return IndexManifest.model_validate_json(raw).segments
    except ValueError as e:
        raise CorruptionError(
            f"index manifest {index_manifest_path(cluster, broker)} is not valid: {e}",
            path=index_manifest_path(cluster, broker),
        ) from e
