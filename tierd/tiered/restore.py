"""Rebuild a store directory's tiering metadata from the bucket alone (beyond RocketMQ: history
is not bound to one broker's disk).

Reads the broker manifest, then every queue manifest, **takes ownership of the prefix** (a new
epoch over the previous owner, which is fenced from then on: see :mod:`tierd.tiered.ownership`),
writes ``tieredStoreMetadata.json``, and makes each hot queue continue where the cold tier ends
(so new messages never reuse an offset the bucket already holds).

Manifests may be stale: a writer killed between a commit and its next manifest write leaves
segments (even whole queues) the manifests do not list yet. One listing of the broker's prefix
finds them; they are added unsized and the store's load reconciles every unsealed segment with
the backend and rolls committed records forward — restoring from a stale manifest would
otherwise drop the newest history and then collide with it (the restored store would write
different records into segments that already exist).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tierd.drivers.paths import INDEX_TOPIC, cluster_dir, index_segment_path, parse_segment_name
from tierd.errors import CorruptionError, InvalidArgumentError, NotFoundError, SegmentNotFoundError
from tierd.local.store import HotStore
from tierd.offsets import download as download_offsets
from tierd.offsets import restore_offsets
from tierd.tiered.flatstore import FlatFileStore, QueueDamage
from tierd.tiered.guard import GuardedRoot
from tierd.tiered.manifest import (
    IndexManifest,
    index_manifest_path,
    read_broker_manifest,
    read_queue_manifest,
)
from tierd.tiered.metadata import MetadataStore, QueueMeta, TieredMetadata, TopicMeta
from tierd.tiered.ownership import OwnerRecord, Ownership, store_id
from tierd.tiered.records import LocalSegment, ManifestSegment
from tierd.tiered.roots import open_driver_factory

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.drivers.segment import DriverRoot

log = logging.getLogger(__name__)
#: ``progress(done, total, what)`` — the CLI turns it into a progress bar.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True)
class RestoreReport:
    topics: int
    queues: int
    segments: int
    messages: int
    bytes: int
    #: Consumer groups whose committed offsets came back from the bucket.
    groups: int = 0
    #: Committed offsets lowered to the restored end of their queue (consumed, never tiered).
    offsets_lowered: int = 0
    #: The new store's owner record (its epoch fences the previous owner).
    owner: OwnerRecord | None = None
    #: Queues restored with damage: their lost queue offsets (docs/tiering.md, "Damage in the
    #: bucket"); the rest of the bucket is restored.
    damaged: tuple[QueueDamage, ...] = ()


def _segment(s: ManifestSegment) -> LocalSegment:
    """A manifest's segment as local metadata records it; its lifecycle times are not in the
    bucket (0: unknown, so never rolled by age)."""
    return LocalSegment(**s.record_fields(), create_timestamp=0, seal_timestamp=0 if s.sealed else None)


#: (topic, queue id) → segment type → base offsets the backend holds.
Listing = dict[tuple[str, int], dict[str, set[int]]]


async def _list_segments(root: DriverRoot, cluster: str, broker: str) -> Listing:
    """Every COMMIT_LOG / CONSUME_QUEUE segment under the broker's prefix, by queue; the INDEX
    segments under ``(INDEX_TOPIC, 0)``."""
    prefix = f"{cluster_dir(cluster)}/{broker}"
    found: Listing = {}
    try:
        paths = await root.list_objects(prefix)
    except SegmentNotFoundError:
        return found
    for path in paths:
        parts = path[len(prefix) + 1 :].split("/")
        if len(parts) != 4 or not parts[1].isdigit():
            continue
        topic, qid, kind, name = parts
        if kind not in (("INDEX",) if topic == INDEX_TOPIC else ("COMMIT_LOG", "CONSUME_QUEUE")):
            continue
        try:
            base = parse_segment_name(name)
        except InvalidArgumentError:
            continue  # not a segment of ours
        found.setdefault((topic, int(qid)), {}).setdefault(kind, set()).add(base)
    return found


async def _index_segments(
    root: DriverRoot, cluster: str, broker: str, on_backend: set[int]
) -> tuple[LocalSegment, ...]:
    """The uploaded INDEX segments (the cold key index): those the index manifest lists, plus
    any the bucket holds that it does not (uploaded after its last write; sized from the
    backend). Without them the restored store would find no key tiered before the restore."""
    listed: dict[int, LocalSegment] = {}
    path = index_manifest_path(cluster, broker)
    try:
        manifest = IndexManifest.model_validate_json(await root.get_object(path))
    except SegmentNotFoundError:
        manifest = None
    except ValueError as e:  # the segments themselves are still there: take them from the listing
        log.error("restore: index manifest %s is not valid (%s); using the bucket listing", path, e)
        manifest = None
    if manifest is not None:
        for s in manifest.segments:
            if s.base_offset in on_backend:
                listed[s.base_offset] = _segment(s)
            else:
                log.warning(
                    "restore: index segment %d is in the index manifest but not in the bucket", s.base_offset
                )
    for base in sorted(on_backend - set(listed)):
        size = await root.driver(index_segment_path("", cluster, broker, base)).size()
        log.warning("restore: index segment %d is not in the index manifest yet; adding it", base)
        listed[base] = LocalSegment(type="INDEX", base_offset=base, size=size, sealed=True, seal_timestamp=0)
    return tuple(listed[b] for b in sorted(listed))


def _with_unlisted(
    segments: tuple[LocalSegment, ...], kind: str, on_backend: set[int], where: str
) -> tuple[LocalSegment, ...]:
    """``segments`` plus the backend's segments beyond the last one listed (unsized: the load
    asks the backend)."""
    last = max((s.base_offset for s in segments), default=-1)
    extra = sorted(b for b in on_backend if b > last)
    if extra:
        log.warning(
            "restore: %s %s: the manifest does not list %d newer segment(s) the bucket holds "
            "(written after its last update); adding them",
            where,
            kind,
            len(extra),
        )
    return segments + tuple(LocalSegment(type=kind, base_offset=b, size=0) for b in extra)


def _check_empty(store_dir: Path) -> None:
    meta = MetadataStore(store_dir)
    commitlog = store_dir / "commitlog"
    if meta.path.exists() or meta.backup.exists() or (commitlog.exists() and any(commitlog.iterdir())):
        raise InvalidArgumentError(
            f"restore needs an empty store directory, but {store_dir} already holds a store; "
            "point store.dir at a new directory",
            path=str(store_dir),
        )


async def restore(
    cfg: TierdConfig, *, root: DriverRoot | None = None, progress: Progress | None = None
) -> RestoreReport:
    store_dir = Path(cfg.store.dir)
    _check_empty(store_dir)
    own_root = root is None
    root = GuardedRoot(
        root if root is not None else open_driver_factory(cfg.backend), cfg.tiered.backend_timeout
    )
    try:
        # Who owns the prefix now: the claim below succeeds only if nobody claimed it since (a
        # concurrent restore of the same bucket fails with prefix_owned, as one racing for the
        # same epoch always did). Everything that may fail is read before that claim, so a
        # restore that fails has not fenced the running owner.
        our_id = store_id(store_dir)
        assert our_id is not None
        ownership = Ownership(root, cfg.tiered.cluster, cfg.tiered.broker, our_id, store_dir)
        seen, _ = await ownership.top()
        broker = await read_broker_manifest(root, cfg.tiered.cluster, cfg.tiered.broker)
        listing = await _list_segments(root, cfg.tiered.cluster, cfg.tiered.broker)
        index = await _index_segments(
            root, cfg.tiered.cluster, cfg.tiered.broker, listing.pop((INDEX_TOPIC, 0), {}).get("INDEX", set())
        )
        topics = [TopicMeta(name=t.name, id=t.id, reserve_hours=t.reserve_hours) for t in broker.topics]
        wanted = [(t.name, qid) for t in broker.topics for qid in t.queues]
        for key in sorted(set(listing) - set(wanted)):
            log.warning("restore: %s/%d is in the bucket but not yet in its manifest; adding it", *key)
            wanted.append(key)
            if key[0] not in {t.name for t in topics}:
                topics.append(TopicMeta(name=key[0], id=max((t.id for t in topics), default=-1) + 1))
        total = len(wanted)
        queues: list[QueueMeta] = []
        segments = 0
        for topic, qid in wanted:
            try:
                qm = await read_queue_manifest(root, cfg.tiered.cluster, cfg.tiered.broker, topic, qid)
            except NotFoundError:
                if (topic, qid) not in listing:
                    raise
                listed: tuple[ManifestSegment, ...] = ()  # never had a manifest: all from the listing
            else:
                listed = qm.segments
            on_backend = listing.get((topic, qid), {})
            where = f"{topic}/{qid}"
            cl = _with_unlisted(
                tuple(_segment(s) for s in listed if s.type == "COMMIT_LOG"),
                "COMMIT_LOG",
                on_backend.get("COMMIT_LOG", set()),
                where,
            )
            cq = _with_unlisted(
                tuple(_segment(s) for s in listed if s.type == "CONSUME_QUEUE"),
                "CONSUME_QUEUE",
                on_backend.get("CONSUME_QUEUE", set()),
                where,
            )
            # Offsets are recomputed by the load below; these are the manifest's view.
            queues.append(
                QueueMeta(
                    topic=topic, queue_id=qid, min_offset=0, max_offset=0, commitlog=cl, consumequeue=cq
                )
            )
            segments += len(cl) + len(cq)
            if progress is not None:
                progress(len(queues), total, where)
        meta = TieredMetadata(
            cluster=cfg.tiered.cluster,
            broker=cfg.tiered.broker,
            topics=tuple(topics),
            queues=tuple(queues),
            index=index,
        )
        store_dir.mkdir(parents=True, exist_ok=True)
        # Own the prefix before writing anything (metadata included, so a lost race leaves the
        # directory restorable): the previous owner is fenced from its next check on.
        owner = await ownership.claim(takeover=True, expect=seen)
        root.fence = ownership.ensure
        metadata = MetadataStore(store_dir)
        metadata.save(meta)
        # Reconcile with the backend now: records committed after the last manifest write are
        # rolled forward, so the hot queues below continue after *them*.
        flat = FlatFileStore(root, cfg.tiered, metadata)
        await flat.load()
        ends = {
            key: (ff.min_offset, ff.max_offset, ff.commitlog.commit_offset - max(ff.commitlog.min_offset, 0))
            for key, ff in flat.files.items()
        }
        # A queue too damaged to load still ends where its metadata says: new messages must not
        # reuse offsets its history holds (none of it is counted as restored).
        ends.update({key: (d.end, d.end, 0) for key, d in flat.damaged.items() if key not in ends})
        damaged = tuple(d for _, d in sorted(flat.damaged.items()))
        try:
            committed = await download_offsets(root, cfg.tiered.cluster, cfg.tiered.broker)
        except CorruptionError as e:  # the messages matter more: restore them, say what is lost
            log.error("restore: %s; restoring without them — consumer groups start over", e)
            committed = {}
    finally:
        if own_root:
            await root.aclose()
    hot = HotStore.open(cfg.store)
    try:
        for (topic, qid), (_, end, _) in ends.items():
            hot.seed_queue(topic, qid, end)
    finally:
        hot.close()
    groups, lowered = restore_offsets(store_dir, committed, {k: hi for k, (_, hi, _) in ends.items()})
    report = RestoreReport(
        len(topics),
        len(queues),
        segments,
        sum(hi - lo for lo, hi, _ in ends.values()),
        sum(b for _, _, b in ends.values()),
        groups,
        lowered,
        owner,
        damaged,
    )
    for (topic, qid), (lo, hi, _) in sorted(ends.items()):
        log.info("restore: %s/%d offsets %d..%d", topic, qid, lo, hi)
    log.info(
        "restore: %d topic(s), %d queue(s), %d segment(s), %d message(s), %d bytes, "
        "committed offsets of %d consumer group(s) from %r",
        report.topics,
        report.queues,
        report.segments,
        report.messages,
        report.bytes,
        report.groups,
        root,
    )
    return report
