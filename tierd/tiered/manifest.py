"""Bucket manifests (FORMATS §2.5): make the cold tier self-describing.

* Queue manifest ``{cluster_dir}/{broker}/{topic}/{queueId}/MANIFEST.json``: every segment of
  the queue with base offset, size, sealed flag, min/max store timestamp, first/last queue offset,
  message count and (sealed) CRC32C.
* Broker manifest ``{cluster_dir}/{broker}/MANIFEST.json``: topics with ids, reserve hours and
  queue ids; index segments.
* Index manifest ``{cluster_dir}/{broker}/INDEX_MANIFEST.json`` (:class:`IndexManifest`, written
  by :class:`~tierd.tiered.index.ColdIndexService`): the uploaded INDEX segments and the queue
  offsets whose keys they hold.

Both are JSON with kebab-case keys and ``"format-version": 1``, replaced atomically with one
whole-object write. Spark and ``restore`` read the bucket through them alone; the sizes of open
segments are "at least" values (the backend may have grown since), and readers trust only what
a manifest lists.

This module is the reading side (models, paths, readers): it imports nothing of the daemon, so
a Spark job loads neither flat files nor local metadata. The daemon builds and writes manifests
with :mod:`tierd.tiered.manifestwriter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import ConfigDict, Field, ValidationError

from tierd.drivers.paths import cluster_dir
from tierd.errors import CorruptionError, NotFoundError, SegmentNotFoundError
from tierd.tiered.records import JsonDocument, validation_summary
from tierd.tiered.records import ManifestSegment as ManifestSegment  # the manifests' segment record

if TYPE_CHECKING:
    from tierd.drivers.segment import DriverRoot

MANIFEST_NAME = "MANIFEST.json"
INDEX_MANIFEST_NAME = "INDEX_MANIFEST.json"
M = TypeVar("M", bound=JsonDocument)
#: The manifests are read and written by tiering rounds, restore and verify, never on the open +
#: put path: their validators are built on first use, not at import (issue 31's start-up budget).
#: Merged with :class:`JsonDocument`'s configuration, which still says how they are checked.
_DEFERRED = ConfigDict(defer_build=True)


class QueueManifest(JsonDocument):
    model_config = _DEFERRED
    format_version: Literal[1] = 1
    cluster: str
    broker: str
    topic: str
    queue_id: int = Field(ge=0)
    #: Readable queue offsets [min_offset, max_offset) when the manifest was written.
    min_offset: int
    max_offset: int
    segments: tuple[ManifestSegment, ...]
    written_at: int


class TopicEntry(JsonDocument):
    model_config = _DEFERRED
    name: str
    id: int = Field(ge=0)
    reserve_hours: float | None = None
    queues: tuple[int, ...]


class BrokerManifest(JsonDocument):
    model_config = _DEFERRED
    format_version: Literal[1] = 1
    cluster: str
    broker: str
    topics: tuple[TopicEntry, ...]
    index_segments: tuple[ManifestSegment, ...] = ()
    written_at: int


class IndexCoverage(JsonDocument):
    """Queue offsets ``[first_offset, end_offset)`` of one queue whose keys are all in the
    index segments of an :class:`IndexManifest` (unless their store timestamp is at or before
    its ``expired_through``)."""

    model_config = _DEFERRED

    topic_id: int = Field(ge=0)
    queue_id: int = Field(ge=0)
    first_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)


class IndexManifest(JsonDocument):
    """``{cluster_dir}/{broker}/INDEX_MANIFEST.json``: the uploaded (sealed) INDEX segments of a
    broker and what they cover, written by the cold index service after every upload and before
    every expiry. A reader of the bucket alone (Spark) needs both: index items are uploaded an
    index file at a time (up to ``max_file_age`` after the messages), so the index covers a
    prefix of each queue, not all of it — and after a restart or an expiry, not even that."""

    model_config = _DEFERRED

    format_version: Literal[1] = 1
    cluster: str
    broker: str
    #: type INDEX; base offset = begin timestamp, message count = item count, min/max store
    #: timestamp = smallest item time / end timestamp.
    segments: tuple[ManifestSegment, ...] = ()
    coverage: tuple[IndexCoverage, ...] = ()
    #: Index files ending at or before this store timestamp (ms) were deleted: messages stored
    #: then may have no items left even inside a covered range.
    expired_through: int | None = None
    written_at: int


def broker_manifest_path(cluster: str, broker: str) -> str:
    return f"{cluster_dir(cluster)}/{broker}/{MANIFEST_NAME}"


def index_manifest_path(cluster: str, broker: str) -> str:
    return f"{cluster_dir(cluster)}/{broker}/{INDEX_MANIFEST_NAME}"


def queue_manifest_path(cluster: str, broker: str, topic: str, queue_id: int) -> str:
    return f"{cluster_dir(cluster)}/{broker}/{topic}/{queue_id}/{MANIFEST_NAME}"


def dump_manifest(manifest: JsonDocument) -> bytes:
    """A manifest as the bucket holds it (kebab-case keys, one key per line)."""
    return manifest.model_dump_json(by_alias=True, indent=1).encode()


async def read_broker_manifest(root: DriverRoot, cluster: str, broker: str) -> BrokerManifest:
    path = broker_manifest_path(cluster, broker)
    try:
        raw = await root.get_object(path)
    except SegmentNotFoundError as e:
        raise NotFoundError(
            f"no tierd manifest at {root.url}/{path}: is this the bucket tierd wrote, and are "
            f"tiered.cluster ({cluster!r}) and tiered.broker ({broker!r}) the ones it used?",
            path=path,
        ) from e
    return _parse(BrokerManifest, raw, path)


async def read_queue_manifest(
    root: DriverRoot, cluster: str, broker: str, topic: str, queue_id: int
) -> QueueManifest:
    path = queue_manifest_path(cluster, broker, topic, queue_id)
    try:
        raw = await root.get_object(path)
    except SegmentNotFoundError as e:
        raise NotFoundError(
            f"the broker manifest lists {topic}/{queue_id} but {path} is missing", path=path
        ) from e
    return _parse(QueueManifest, raw, path)


def _parse(cls: type[M], raw: bytes, path: str) -> M:
    try:
        return cls.model_validate_json(raw)
    except ValidationError as e:
        raise CorruptionError(f"manifest {path} is not valid: {validation_summary(e)}", path=path) from e
