"""A bucket read without taking it: the cold tier of a ``{cluster}/{broker}`` prefix opened
read-only, for DR drills and for looking at a bucket another store owns.

``tierd restore`` into a scratch directory used to be the only way to read a bucket as a store
does, and it *takes ownership*: the live owner was fenced and refused every command from then
on. A read-only open builds the same view without any of that:

* **Plan** (:func:`plan_bucket`, shared with :mod:`tierd.tiered.restore`): the broker manifest,
  every queue manifest and one listing of the prefix (segments written after the last manifest
  update are added, as a restore adds them) — the tiering metadata a restore would write, kept
  in memory.
* **Load**: the flat files are loaded from that plan as the tiering service loads them, through
  a :class:`~tierd.tiered.guard.GuardedRoot` whose fence refuses *every* mutating call with
  :class:`~tierd.errors.ReadOnlyError` — the one rule that makes "never writing" hold for every
  backend and every code path (a load that would repair something, a stray maintenance call).
  No owner record is read as ours, none is written; the S3 capability probe (which writes
  scratch objects) is skipped.
* **Serve**: :class:`ReadOnlyTiering` is a :class:`~tierd.tiered.service.TieringService` that
  never dispatches, writes manifests or applies retention, so the ordinary facade
  (:meth:`tierd.BlockingMessageStore.open_bucket`) answers ``get``/``query``/listings/``verify``
  with the same message objects and statuses as the owner — its hot store is an empty one in a
  temporary directory, removed at close.

**A live owner.** The owner keeps committing while the bucket is read. Its commit order makes
that safe: a consume-queue unit is committed only after the commitlog bytes it references, and
sealed segments never change. A load can still catch a queue between its two commits (the
commitlog holds records its consume queue does not reference yet) or between a segment roll and
its commit; loading such a queue *would* write (the roll-forward). The read-only load retries
that queue until the owner finished (at most :data:`SETTLE_SECONDS`), and then — the owner is
gone, stopped mid-commit — serves the queue without the roll-forward: every offset its consume
queue references, none after (a restore would roll the rest forward). What the owner tiers after
the load is not seen: open again to see it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tierd.consumption.offsets import download as download_offsets
from tierd.consumption.offsets import restore_offsets
from tierd.drivers.paths import INDEX_TOPIC, cluster_dir, index_segment_path, parse_segment_name
from tierd.errors import (
    CorruptionError,
    InvalidArgumentError,
    NotFoundError,
    PrefixOwnedError,
    ReadOnlyError,
    SegmentNotFoundError,
)
from tierd.tiered.flatstore import DAMAGE, FlatFileStore, QueueDamage
from tierd.tiered.manifest import (
    IndexManifest,
    index_manifest_path,
    read_broker_manifest,
    read_queue_manifest,
)
from tierd.tiered.metadata import QueueMeta, TieredMetadata, TopicMeta
from tierd.tiered.ownership import OwnerRecord, Ownership, list_epochs, prefix_url, read_record
from tierd.tiered.records import LocalSegment, ManifestSegment
from tierd.tiered.service import TieringService

if TYPE_CHECKING:
    from collections.abc import Callable

    from tierd.config import TierdConfig, TieredConfig
    from tierd.drivers.segment import DriverRoot
    from tierd.local.store import HotStore
    from tierd.tiered.dispatcher import TierReport
    from tierd.tiered.flatmessage import FlatMessageFile
    from tierd.tiered.guard import GuardedRoot
    from tierd.tiered.metadata import MetadataStore

log = logging.getLogger(__name__)
#: Seconds a queue caught between two commits of a live owner is retried before it is served
#: without the roll-forward (see module doc).
SETTLE_SECONDS = 5.0
#: Pause between those retries.
SETTLE_POLL = 0.1


# ------------------------------------------------------------------------------------ planning
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
        log.error("index manifest %s is not valid (%s); using the bucket listing", path, e)
        manifest = None
    if manifest is not None:
        for s in manifest.segments:
            if s.base_offset in on_backend:
                listed[s.base_offset] = _segment(s)
            else:
                log.warning("index segment %d is in the index manifest but not in the bucket", s.base_offset)
    for base in sorted(on_backend - set(listed)):
        size = await root.driver(index_segment_path("", cluster, broker, base)).size()
        log.warning("index segment %d is not in the index manifest yet; adding it", base)
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
        log.info(
            "%s %s: the manifest does not list %d newer segment(s) the bucket holds "
            "(written after its last update); adding them",
            where,
            kind,
            len(extra),
        )
    return segments + tuple(LocalSegment(type=kind, base_offset=b, size=0) for b in extra)


@dataclass(frozen=True, slots=True)
class BucketPlan:
    """What the bucket says about a broker prefix: the tiering metadata a restore writes (and a
    read-only open keeps in memory), and who owns the prefix."""

    meta: TieredMetadata
    #: Segments listed (commitlog and consume queue, every queue).
    segments: int
    #: The highest owner epoch when the plan was made (0: unowned).
    owner_epoch: int
    #: Its record (None: unowned, or unreadable — then :attr:`owner_unreadable`).
    owner: OwnerRecord | None
    owner_unreadable: bool = False


async def plan_bucket(
    root: DriverRoot, cluster: str, broker: str, progress: Callable[[int, int, str], None] | None = None
) -> BucketPlan:
    """Read the prefix's owner, manifests and listing (never writing): see module doc. Raises
    :class:`~tierd.errors.NotFoundError` naming the path when the bucket holds no broker
    manifest of ``cluster``/``broker``."""
    epochs = await list_epochs(root, cluster, broker)
    owner: OwnerRecord | None = None
    unreadable = False
    if epochs:
        try:
            owner = await read_record(root, cluster, broker, epochs[-1])
        except CorruptionError:
            unreadable = True
    broker_manifest = await read_broker_manifest(root, cluster, broker)
    listing = await _list_segments(root, cluster, broker)
    index = await _index_segments(
        root, cluster, broker, listing.pop((INDEX_TOPIC, 0), {}).get("INDEX", set())
    )
    topics = [TopicMeta(name=t.name, id=t.id, reserve_hours=t.reserve_hours) for t in broker_manifest.topics]
    wanted = [(t.name, qid) for t in broker_manifest.topics for qid in t.queues]
    for key in sorted(set(listing) - set(wanted)):
        log.info("%s/%d is in the bucket but not yet in its manifest; adding it", *key)
        wanted.append(key)
        if key[0] not in {t.name for t in topics}:
            topics.append(TopicMeta(name=key[0], id=max((t.id for t in topics), default=-1) + 1))
    queues: list[QueueMeta] = []
    segments = 0
    for topic, qid in wanted:
        try:
            qm = await read_queue_manifest(root, cluster, broker, topic, qid)
        except NotFoundError:
            if (topic, qid) not in listing:
                raise
            listed: tuple[ManifestSegment, ...] = ()  # never had a manifest: all from the listing
            span = (0, 0)
        else:
            listed, span = qm.segments, (qm.min_offset, qm.max_offset)
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
        # Offsets are recomputed by the load; these are the manifest's view — what a queue too
        # damaged to load is known to have lost, and where its new messages must start.
        queues.append(
            QueueMeta(
                topic=topic,
                queue_id=qid,
                min_offset=span[0],
                max_offset=span[1],
                commitlog=cl,
                consumequeue=cq,
            )
        )
        segments += len(cl) + len(cq)
        if progress is not None:
            progress(len(queues), len(wanted), where)
    meta = TieredMetadata(
        cluster=cluster, broker=broker, topics=tuple(topics), queues=tuple(queues), index=index
    )
    return BucketPlan(meta, segments, epochs[-1] if epochs else 0, owner, unreadable)


# ------------------------------------------------------------------------------------- loading
def refuse_writes(root: GuardedRoot) -> None:
    """Make every mutating call through ``root`` fail with :class:`~tierd.errors.ReadOnlyError`."""
    url = root.url

    async def fence() -> None:
        raise ReadOnlyError(
            f"the bucket {url} is open read-only: nothing is written there (a DR drill, or a "
            "bucket another store owns)",
            backend=url,
        )

    root.fence = fence


class ReadOnlyFlatStore(FlatFileStore):
    """A :class:`~tierd.tiered.flatstore.FlatFileStore` whose load never needs a write: a queue
    whose load would write (see module doc) is retried, then served without the roll-forward.
    Its metadata saves go to the read-only open's temporary directory."""

    def __init__(self, root: DriverRoot, cfg: TieredConfig, metadata: MetadataStore) -> None:
        super().__init__(root, cfg, metadata)
        #: Queues served without their roll-forward: committed commitlog bytes past the last
        #: byte their consume queue references (the owner stopped between its two commits).
        self.unreferenced: dict[tuple[str, int], int] = {}

    async def _load_or_fence(self, q: QueueMeta) -> FlatMessageFile | None:
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            try:
                return await super()._load_or_fence(q)
            except ReadOnlyError:
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(SETTLE_POLL)  # the owner is between two commits of this queue
        return await self._load_without_roll_forward(q)

    async def _load_without_roll_forward(self, q: QueueMeta) -> FlatMessageFile | None:
        ff = self._make(q.topic, q.queue_id)
        try:
            await ff.commitlog.load(list(q.commitlog))
            await ff.consumequeue.load(list(q.consumequeue))
        except (*DAMAGE, ReadOnlyError) as e:  # a roll the owner never committed: not readable here
            self._fence(QueueDamage(q.topic, q.queue_id, q.min_offset, q.max_offset, e, q))
            return None
        if ff.max_offset > ff.min_offset:
            unit = (await ff.read_units(ff.max_offset - 1, 1))[0]
            referenced = int(unit["offset"]) + int(unit["size"])
        else:
            referenced = ff.commitlog.min_offset
        extra = ff.commitlog.commit_offset - referenced
        if extra > 0:
            self.unreferenced[q.topic, q.queue_id] = extra
            log.warning(
                "%s/%d: %d committed commitlog byte(s) after queue offset %d are not in its consume "
                "queue (its owner stopped between two commits); served up to there — a restore "
                "rolls them forward",
                q.topic,
                q.queue_id,
                extra,
                ff.max_offset,
            )
        return ff


class ReadOnlyTiering(TieringService):
    """The cold tier of a bucket opened read-only (see module doc): loads once at :meth:`start`
    (a failure is raised to the opener, not retried in the background), then only serves."""

    flat_class = ReadOnlyFlatStore

    def __init__(self, cfg: TierdConfig, hot: HotStore, root: DriverRoot | None = None) -> None:
        super().__init__(cfg, hot, root)
        refuse_writes(self.root)
        #: The plan the load used (owner, segments): what a restore would bring back.
        self.plan: BucketPlan | None = None

    async def start(self) -> None:
        tiered = self.cfg.tiered
        try:
            self.plan = await plan_bucket(self.root, tiered.cluster, tiered.broker)
            self.metadata_loaded = True
            n = await self.flat.load_from(self.plan.meta)
            await self.index.load(self.flat.loaded_index)
            self.flat.index_infos = self.index.uploaded_infos
            await seed_offsets(self.root, self.cfg, self.flat)  # before the facade reads them
            self._as_owner(self.plan.owner)
        except BaseException:
            await self.root.aclose()
            raise
        self.ready.set()
        log.info(
            "bucket %s open read-only: %d queue(s) (%d damaged), owner %s",
            prefix_url(self.root.url, tiered.cluster, tiered.broker),
            n,
            len(self.flat.damaged),
            self.plan.owner.describe() if self.plan.owner is not None else "none",
        )

    def _as_owner(self, owner: OwnerRecord | None) -> None:
        """Check the bucket as its owner's store (``verify`` then reports the owner's problems,
        not "owned by another store": a read-only view owns nothing by design), fenced from
        writing (``GET /v1/status``: not owned by this store)."""
        if owner is None:
            return
        tiered = self.cfg.tiered
        ownership = Ownership(self.root, tiered.cluster, tiered.broker, owner.store_id, Path(owner.store_dir))
        ownership.owner = owner
        ownership.fenced = PrefixOwnedError(
            f"the bucket is open read-only; its owner is {owner.describe()}",
            owner_store_id=owner.store_id,
            owner_epoch=owner.epoch,
        )
        self.ownership = ownership

    def _refused(self, operation: str) -> ReadOnlyError:
        return ReadOnlyError(
            f"{operation} is refused: the bucket {self.root.url} is open read-only (nothing is "
            "written or claimed there)",
            operation=operation,
            backend=self.root.url,
        )

    async def tier_now(self, timeout: float | None = None) -> TierReport:
        raise self._refused("tiering")

    async def apply_retention(self, now_ms: int | None = None) -> int:
        raise self._refused("retention")

    async def set_reserve_hours(self, topic: str, hours: float | None) -> None:
        raise self._refused("changing retention")

    async def close(self, grace: float = 30.0) -> None:
        if self.ready.is_set():
            await self.index.close()
        await self.root.aclose()


async def seed_offsets(root: DriverRoot, cfg: TierdConfig, flat: FlatFileStore) -> tuple[int, int]:
    """Write the bucket's committed consumer offsets into ``cfg.store.dir`` (the read-only
    open's temporary directory) as a restore would (lowered to each queue's cold end):
    ``groups`` show what a restore would resume at. Returns (groups, offsets lowered)."""
    try:
        committed = await download_offsets(root, cfg.tiered.cluster, cfg.tiered.broker)
    except CorruptionError as e:
        log.error("%s; consumer groups are not shown", e)
        return 0, 0
    ends = {key: ff.max_offset for key, ff in flat.files.items()}
    ends.update({key: d.end for key, d in flat.damaged.items() if key not in ends})
    return await asyncio.to_thread(restore_offsets, cfg.store.dir, committed, ends)


def scratch_dir() -> Path:
    """A new temporary directory for what a read-only open keeps locally (its empty hot store,
    metadata, key-index files); the caller removes it with :func:`remove_scratch`."""
    return Path(tempfile.mkdtemp(prefix="tierd-bucket-"))


def scratch_config(cfg: TierdConfig) -> tuple[TierdConfig, Path]:
    """``cfg`` with ``store.dir`` a :func:`scratch_dir` (the caller removes it)."""
    scratch = scratch_dir()
    store = cfg.store.model_copy(update={"dir": scratch})
    return cfg.model_copy(update={"store": store}), scratch


def remove_scratch(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
