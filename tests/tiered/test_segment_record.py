"""One segment record: local metadata, bucket manifests, inventory rows and HTTP shapes share
field names, and local metadata written in format version 1 (the one spelling is version 2's)
is still read."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from tierd.errors import CorruptionError
from tierd.inventory import SEGMENT_COLUMNS, SegmentRow
from tierd.service.schemas import SegmentOut
from tierd.tiered.manifest import QueueManifest
from tierd.tiered.metadata import FILE_NAME, MetadataStore, TieredMetadata
from tierd.tiered.records import LocalSegment, ManifestSegment, SegmentRecord, local_segment_data

if TYPE_CHECKING:
    from pathlib import Path

#: A metadata file as tierd wrote it in format version 1, verbatim (one queue, one index segment).
V1_METADATA = """{
 "format-version": 1, "cluster": "c1", "broker": "b1",
 "topics": [{"name": "orders", "id": 0, "reserve-hours": null}],
 "queues": [{
  "topic": "orders", "queue-id": 3, "min-offset": 10, "max-offset": 25,
  "commitlog": [
   {"type": "COMMIT_LOG", "base-offset": 0, "size": 4096, "sealed": true,
    "create-timestamp": 1700000000000, "seal-timestamp": 1700000100000,
    "min-timestamp": 1700000000500, "max-timestamp": 1700000099000,
    "first-queue-offset": 10, "crc32c": "0a1b2c3d"},
   {"type": "COMMIT_LOG", "base-offset": 4096, "size": 700, "sealed": false,
    "create-timestamp": 1700000100000, "seal-timestamp": null,
    "min-timestamp": 1700000100001, "max-timestamp": 1700000200000,
    "first-queue-offset": 20, "crc32c": null}],
  "consumequeue": [
   {"type": "CONSUME_QUEUE", "base-offset": 200, "size": 300, "sealed": false,
    "create-timestamp": 1700000000000, "seal-timestamp": null,
    "min-timestamp": 1700000000500, "max-timestamp": 1700000200000,
    "first-queue-offset": 10, "crc32c": null}]}],
 "index": [
  {"type": "INDEX", "base-offset": 1700000000000, "size": 999, "sealed": true,
   "create-timestamp": 1700000000000, "seal-timestamp": 1700000300000,
   "min-timestamp": 1699999997000, "max-timestamp": 1700000061999,
   "first-queue-offset": null, "crc32c": "deadbeef"}]
}"""


def _write(tmp_path: Path, text: str) -> MetadataStore:
    store = MetadataStore(tmp_path)
    store.dir.mkdir(parents=True)
    (store.dir / FILE_NAME).write_text(text)
    return store


def test_version_1_metadata_is_read_with_its_timestamps(tmp_path: Path) -> None:
    meta = _write(tmp_path, V1_METADATA).load()
    assert meta is not None
    [q] = meta.queues
    sealed, open_ = q.commitlog
    assert (sealed.min_store_timestamp, sealed.max_store_timestamp) == (1700000000500, 1700000099000)
    assert (sealed.create_timestamp, sealed.seal_timestamp) == (1700000000000, 1700000100000)
    assert (sealed.first_queue_offset, sealed.crc32c, sealed.size, sealed.sealed) == (
        10,
        "0a1b2c3d",
        4096,
        True,
    )
    assert (open_.min_store_timestamp, open_.max_store_timestamp, open_.seal_timestamp) == (
        1700000100001,
        1700000200000,
        None,
    )
    assert q.consumequeue[0].max_store_timestamp == 1700000200000
    [index] = meta.index
    assert (index.type, index.min_store_timestamp, index.max_store_timestamp) == (
        "INDEX",
        1699999997000,
        1700000061999,
    )


def test_version_1_metadata_is_saved_as_version_2_with_the_same_content(tmp_path: Path) -> None:
    store = _write(tmp_path, V1_METADATA)
    meta = store.load()
    assert meta is not None
    store.save(meta)
    written = json.loads(store.path.read_text())
    assert written["format-version"] == 2
    segment = written["queues"][0]["commitlog"][0]
    assert (segment["min-store-timestamp"], segment["max-store-timestamp"]) == (1700000000500, 1700000099000)
    assert "min-timestamp" not in segment
    assert MetadataStore(tmp_path).load() == meta
    # The version 1 file is the backup now, and still reads as the same metadata.
    assert TieredMetadata.model_validate_json(store.backup.read_bytes()) == meta


@pytest.mark.parametrize(
    "change",
    [
        # version 2 spells the timestamps as the manifests do: the old keys are unknown there
        lambda doc: doc.replace('"format-version": 1', '"format-version": 2'),
        lambda doc: doc.replace('"format-version": 1', '"format-version": 3'),
        # a version 1 file never had the new keys
        lambda doc: doc.replace(
            '"min-timestamp": 1700000000500, ', '"min-store-timestamp": 1, "min-timestamp": 2, ', 1
        ),
    ],
)
def test_a_document_mixing_the_versions_is_refused(tmp_path: Path, change: object) -> None:
    assert callable(change)
    with pytest.raises(CorruptionError, match="no readable tiering metadata"):
        _write(tmp_path, change(V1_METADATA)).load()


def test_the_fast_metadata_dump_matches_the_model() -> None:
    fields = {
        "type": "COMMIT_LOG",
        "base_offset": 4096,
        "size": 10,
        "sealed": False,
        "min_store_timestamp": 5,
        "max_store_timestamp": 6,
        "first_queue_offset": 7,
        "crc32c": None,
        "create_timestamp": 8,
        "seal_timestamp": None,
    }
    model = LocalSegment(**fields)
    assert local_segment_data(fields) == model.model_dump(mode="json", by_alias=True)
    assert LocalSegment.model_validate(local_segment_data(fields)) == model


def test_every_shape_spells_the_record_s_fields_alike() -> None:
    record = set(SegmentRecord.model_fields)
    for shape in (LocalSegment, ManifestSegment, SegmentRow, SegmentOut):
        assert record <= set(shape.model_fields), shape
    assert set(SEGMENT_COLUMNS) == set(SegmentRow.model_fields) == set(SegmentOut.model_fields)
    # Manifests on disk keep their version 1 keys (no bump): what older readers know.
    on_disk = ManifestSegment(type="CONSUME_QUEUE", base_offset=0, size=20, sealed=False, message_count=1)
    assert set(on_disk.model_dump(by_alias=True)) == {
        "type",
        "base-offset",
        "size",
        "sealed",
        "min-store-timestamp",
        "max-store-timestamp",
        "first-queue-offset",
        "last-queue-offset",
        "message-count",
        "crc32c",
    }
    # Rows and HTTP bodies use the field names themselves.
    row = SegmentRow.at(on_disk, "t", 0, "p")
    assert list(row.as_dict()) == list(SEGMENT_COLUMNS)
    assert SegmentOut.of(row).model_dump() == row.model_dump()
    assert QueueManifest.model_fields["segments"].annotation == tuple[ManifestSegment, ...]
