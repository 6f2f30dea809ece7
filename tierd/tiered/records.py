"""The one segment record, and the conventions of every JSON document tierd writes.

A cold segment is described in four places — the local metadata (what the daemon trusts on
restart), the bucket manifests (what Spark and ``tierd restore`` read), the inventory rows of
``tierd segments ls`` and the HTTP API. All of them derive from :class:`SegmentRecord`, so a
field has one name everywhere:

* :class:`SegmentRecord`: what any reader knows of a segment (type, base offset, size, seal
  state, store-timestamp range, first queue offset, checksum);
* :class:`LocalSegment` adds the segment's lifecycle times, which only the daemon needs
  (local metadata; what :meth:`~tierd.tiered.flatfile.FlatAppendFile.infos` returns);
* :class:`ManifestSegment` adds the last queue offset and message count a reader of the bucket
  alone cannot work out (bucket manifests).

Every document is a :class:`JsonDocument`: frozen, strict about unknown keys, kebab-case keys on
disk. This module imports nothing of the daemon (Spark reads manifests through it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SegmentType = Literal["COMMIT_LOG", "CONSUME_QUEUE", "INDEX"]


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def validation_summary(e: ValidationError) -> str:
    """The first problem of a failed validation, with its location (pydantic's first line only
    says how many errors there were)."""
    first = e.errors(include_url=False)[0]
    where = ".".join(str(x) for x in first["loc"])
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return (f"{where}: {first['msg']}" if where else str(first["msg"])) + more


class JsonDocument(BaseModel):
    """Base of tierd's JSON documents: frozen, unknown keys rejected (a file from a newer
    version is reported, not half-read), kebab-case keys on disk, field names in Python."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=_kebab, populate_by_name=True)


class SegmentRecord(JsonDocument):
    """One cold segment (commitlog, consume queue or index), as any reader knows it."""

    type: SegmentType
    #: Byte offset of the segment's first byte in its flat file (INDEX: the file's begin time).
    base_offset: int = Field(ge=0)
    #: Committed bytes (of an open segment: at least this many; the backend may hold more).
    size: int = Field(ge=0)
    sealed: bool = False
    #: Store timestamps (ms) of the oldest and newest message (INDEX: item times).
    min_store_timestamp: int | None = None
    max_store_timestamp: int | None = None
    #: Queue offset of the segment's first message (None: not known, or the segment is empty).
    first_queue_offset: int | None = None
    crc32c: str | None = Field(
        default=None, description="CRC32C (8 hex digits) of a sealed segment's content."
    )

    def record_fields(self) -> dict[str, Any]:
        """The :class:`SegmentRecord` fields of this record (to build another kind from it)."""
        return {name: getattr(self, name) for name in SegmentRecord.model_fields}


class LocalSegment(SegmentRecord):
    """A segment as the local metadata records it: the record plus its lifecycle times."""

    #: When the segment was created (ms; 0: not known, e.g. restored from the bucket).
    create_timestamp: int = 0
    #: When it was sealed (ms; None: open or rolled but not sealed yet).
    seal_timestamp: int | None = None


#: Field name → JSON key of :class:`LocalSegment` (see :func:`local_segment_data`).
_LOCAL_KEYS = {name: _kebab(name) for name in LocalSegment.model_fields}


def local_segment_data(fields: dict[str, Any]) -> dict[str, Any]:
    """The JSON object a :class:`LocalSegment` of ``fields`` dumps to, without building the
    model: a metadata write at 10,000 queues describes 20,000 segments on the event loop, and a
    model validation each would double its cost. :meth:`FlatFileStore.snapshot` validates the
    result against the model, so the two cannot drift apart unseen."""
    return {_LOCAL_KEYS[name]: value for name, value in fields.items()}


class ManifestSegment(SegmentRecord):
    """A segment as a bucket manifest lists it: the record plus what a reader of the bucket
    alone cannot work out (the queue offsets a segment ends at are in its successor)."""

    sealed: bool
    #: Queue offset of the segment's last message (None: empty).
    last_queue_offset: int | None = None
    #: Messages in the segment (INDEX: items).
    message_count: int = Field(ge=0)
