"""Cold-tier path naming (FORMATS §2.1), byte-compatible with RocketMQ's tieredstore.

``{root}/{md5(cluster)[:8]}_{cluster}/{broker}/{topic}/{queueId}/{TYPE}/{segment name}``, where
the segment name is ``md5(str(base_offset))[:8]`` followed by the base offset zero-padded to 20
digits. The hash prefixes spread keys over object-store partitions (S3 shards its index by key
prefix, so sequential names would all land on one partition).

All functions are pure; paths use ``/`` whatever the OS, because they are object keys first.
"""

from __future__ import annotations

import hashlib
import re

from tierd.drivers.segment import FileType
from tierd.errors import InvalidArgumentError

__all__ = [
    "INDEX_QUEUE_ID",
    "INDEX_TOPIC",
    "SEGMENT_NAME_LENGTH",
    "cluster_dir",
    "get_hash",
    "index_segment_path",
    "parse_segment_name",
    "queue_path",
    "segment_dir",
    "segment_name",
    "segment_path",
]

#: Pseudo-topic and queue under which RocketMQ stores index segments.
INDEX_TOPIC = "rmq_sys_INDEX"
INDEX_QUEUE_ID = 0
#: 8 hex characters of hash + 20 decimal digits.
SEGMENT_NAME_LENGTH = 28
_MAX_OFFSET = 10**20 - 1
_NAME_RE = re.compile(r"[0-9a-f]{8}[0-9]{20}")


def get_hash(text: str) -> str:
    """First 8 hex characters of the MD5 of ``text`` (UTF-8) — RocketMQ's ``getHash``."""
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:8]


def cluster_dir(cluster: str) -> str:
    """``{md5(cluster)[:8]}_{cluster}``, e.g. ``212d6b50_DefaultCluster``."""
    _check_component("cluster", cluster)
    return f"{get_hash(cluster)}_{cluster}"


def segment_name(base_offset: int) -> str:
    """28-character name of the segment starting at ``base_offset``
    (``cfcd208400000000000000000000`` for 0)."""
    if not 0 <= base_offset <= _MAX_OFFSET:
        raise InvalidArgumentError(
            f"base_offset must be in [0, {_MAX_OFFSET}] to fit 20 digits, got {base_offset}",
            base_offset=base_offset,
        )
    return f"{get_hash(str(base_offset))}{base_offset:020d}"


def parse_segment_name(name: str) -> int:
    """Base offset encoded in a segment name; the hash prefix must match (a name whose prefix
    does not is not one of ours, and silently accepting it would hide a bug)."""
    if len(name) != SEGMENT_NAME_LENGTH or not _NAME_RE.fullmatch(name):
        raise InvalidArgumentError(
            f"segment name must be 8 lowercase hex + 20 digits ({SEGMENT_NAME_LENGTH} chars), got {name!r}",
            name=name,
        )
    offset = int(name[8:])
    if name[:8] != get_hash(str(offset)):
        raise InvalidArgumentError(
            f"segment name {name!r} has hash prefix {name[:8]!r}, expected {get_hash(str(offset))!r}",
            name=name,
        )
    return offset


def queue_path(broker: str, topic: str, queue_id: int) -> str:
    """``{broker}/{topic}/{queueId}`` — RocketMQ's ``toFilePath``."""
    _check_component("broker", broker)
    _check_component("topic", topic)
    if queue_id < 0:
        raise InvalidArgumentError(f"queue_id must be >= 0, got {queue_id}", queue_id=queue_id)
    return f"{broker}/{topic}/{queue_id}"


def segment_dir(root: str, cluster: str, broker: str, topic: str, queue_id: int, file_type: FileType) -> str:
    """Directory (key prefix, no trailing slash) holding one queue's segments of one type."""
    parts = [cluster_dir(cluster), queue_path(broker, topic, queue_id), FileType(file_type).name]
    root = root.strip("/")
    if root:
        parts.insert(0, root)
    return "/".join(parts)


def topic_dir(root: str, cluster: str, broker: str, topic: str) -> str:
    """Directory (key prefix, no trailing slash) holding a topic's queue directories, each
    named by its queue id (the :func:`segment_dir` of every queue of ``topic`` lies in one)."""
    queue_dir = segment_dir(root, cluster, broker, topic, 0, FileType.COMMIT_LOG).rsplit("/", 1)[0]
    return queue_dir.rsplit("/", 1)[0]


def segment_path(
    root: str, cluster: str, broker: str, topic: str, queue_id: int, file_type: FileType, base_offset: int
) -> str:
    """Full path of a segment. ``root`` is a key prefix inside the backend (``""`` for none);
    drivers take paths relative to their own root, so pass ``""`` when building a driver path."""
    return f"{segment_dir(root, cluster, broker, topic, queue_id, file_type)}/{segment_name(base_offset)}"


def index_segment_path(root: str, cluster: str, broker: str, base_offset: int) -> str:
    """Path of an index segment: ``{broker}/rmq_sys_INDEX/0/INDEX/{name}`` under the cluster dir."""
    return segment_path(root, cluster, broker, INDEX_TOPIC, INDEX_QUEUE_ID, FileType.INDEX, base_offset)


def _check_component(what: str, value: str) -> None:
    if not value or "/" in value or value in (".", ".."):
        raise InvalidArgumentError(
            f"{what} must be a non-empty path component without '/', got {value!r}", **{what: value}
        )
