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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierd.consumption.offsets import ConsumerOffsets, restore_offsets
from tierd.consumption.offsets import download as download_offsets
from tierd.errors import CorruptionError, InvalidArgumentError
from tierd.local.store import HotStore
from tierd.tiered.flatstore import FlatFileStore, QueueDamage
from tierd.tiered.guard import GuardedRoot
from tierd.tiered.metadata import MetadataStore
from tierd.tiered.ownership import OwnerRecord, Ownership, store_id, take_over_needed_error
from tierd.tiered.readonly import (
    ReadOnlyFlatStore,
    plan_bucket,
    refuse_writes,
    remove_scratch,
    scratch_dir,
)
from tierd.tiered.roots import open_driver_factory

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.drivers.segment import DriverRoot

log = logging.getLogger(__name__)
#: ``progress(done, total, what)`` — the CLI turns it into a progress bar.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True)
class QueueRestore:
    """One queue of a restore: the queue offsets ``[first, end)`` it brings back."""

    topic: str
    queue_id: int
    first: int
    end: int
    #: Commitlog bytes of those messages.
    bytes: int

    @property
    def messages(self) -> int:
        return self.end - self.first

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "queue_id": self.queue_id,
            "first": self.first,
            "end": self.end,
            "messages": self.messages,
            "bytes": self.bytes,
        }


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
    #: The new store's owner record (its epoch fences the previous owner); None for a dry run.
    owner: OwnerRecord | None = None
    #: Queues restored with damage: their lost queue offsets (docs/tiering.md, "Damage in the
    #: bucket"); the rest of the bucket is restored.
    damaged: tuple[QueueDamage, ...] = ()
    #: Nothing was written or claimed: what a restore would bring back (``--dry-run``).
    dry_run: bool = False
    #: The owner the restore fenced (a dry run: would fence); None for an unowned bucket.
    fences: OwnerRecord | None = None
    #: The highest owner record is unreadable: a restore fences whoever wrote it.
    fences_unreadable: bool = False
    #: Every queue with the offsets it brings back.
    ranges: tuple[QueueRestore, ...] = ()
    #: The consumer groups' committed offsets as the restored store resumes them.
    offsets: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """For ``tierd restore -o json``."""
        return {
            "dry_run": self.dry_run,
            "topics": self.topics,
            "queues": self.queues,
            "segments": self.segments,
            "messages": self.messages,
            "bytes": self.bytes,
            "groups": self.groups,
            "offsets_lowered": self.offsets_lowered,
            "owner": self.owner.as_dict() if self.owner is not None else None,
            "fences": self.fences.as_dict() if self.fences is not None else None,
            "fences_unreadable": self.fences_unreadable,
            "damaged": [d.as_dict() for d in self.damaged],
            "ranges": [r.as_dict() for r in self.ranges],
            "offsets": {
                group: [{"topic": t, "queue_id": q, "offset": o} for (t, q), o in sorted(table.items())]
                for group, table in sorted(self.offsets.items())
            },
        }


def _check_empty(store_dir: Path) -> None:
    meta = MetadataStore(store_dir)
    commitlog = store_dir / "commitlog"
    if meta.path.exists() or meta.backup.exists() or (commitlog.exists() and any(commitlog.iterdir())):
        raise InvalidArgumentError(
            f"restore needs an empty store directory, but {store_dir} already holds a store; "
            "point store.dir at a new directory",
            path=str(store_dir),
        )


#: (topic, queue id) → (first offset, end offset, commitlog bytes) of a loaded bucket.
Ends = dict[tuple[str, int], tuple[int, int, int]]


def _ends(flat: FlatFileStore) -> Ends:
    """Each loaded queue's range; a queue too damaged to load still ends where its metadata
    says: new messages must not reuse offsets its history holds (none of it is counted)."""
    ends = {
        key: (ff.min_offset, ff.max_offset, ff.commitlog.commit_offset - max(ff.commitlog.min_offset, 0))
        for key, ff in flat.files.items()
    }
    ends.update({key: (d.end, d.end, 0) for key, d in flat.damaged.items() if key not in ends})
    return ends


async def _committed(root: DriverRoot, cfg: TierdConfig) -> dict[str, dict[tuple[str, int], int]]:
    try:
        return await download_offsets(root, cfg.tiered.cluster, cfg.tiered.broker)
    except CorruptionError as e:  # the messages matter more: restore them, say what is lost
        log.error("restore: %s; restoring without them — consumer groups start over", e)
        return {}


def _report(
    flat: FlatFileStore,
    ends: Ends,
    segments: int,
    groups: tuple[int, int],
    offsets: dict[str, dict[tuple[str, int], int]],
    **more: Any,
) -> RestoreReport:
    return RestoreReport(
        len(flat.topics),
        len(ends),
        segments,
        sum(hi - lo for lo, hi, _ in ends.values()),
        sum(b for _, _, b in ends.values()),
        groups[0],
        groups[1],
        damaged=tuple(d for _, d in sorted(flat.damaged.items())),
        ranges=tuple(QueueRestore(t, q, lo, hi, b) for (t, q), (lo, hi, b) in sorted(ends.items())),
        offsets=offsets,
        **more,
    )


async def dry_run(
    cfg: TierdConfig, *, root: DriverRoot | None = None, progress: Progress | None = None
) -> RestoreReport:
    """What :func:`restore` would bring back, from the bucket alone, writing and claiming
    nothing (the bucket is opened read-only, see :mod:`tierd.tiered.readonly`; store.dir is not
    touched): topics, queues and their offset ranges, messages, bytes, the consumer groups'
    committed offsets, damaged ranges, and the owner a restore would fence."""
    own_root = root is None
    guarded = GuardedRoot(
        root if root is not None else open_driver_factory(cfg.backend), cfg.tiered.backend_timeout
    )
    refuse_writes(guarded)
    scratch = scratch_dir()
    try:
        plan = await plan_bucket(guarded, cfg.tiered.cluster, cfg.tiered.broker, progress)
        flat = ReadOnlyFlatStore(guarded, cfg.tiered, MetadataStore(scratch))
        await flat.load_from(plan.meta)
        ends = _ends(flat)
        committed = await _committed(guarded, cfg)
        groups = restore_offsets(scratch, committed, {k: hi for k, (_, hi, _) in ends.items()})
        offsets = ConsumerOffsets(scratch).snapshot() if groups[0] else {}
    finally:
        if own_root:
            await guarded.aclose()
        remove_scratch(scratch)
    return _report(
        flat,
        ends,
        plan.segments,
        groups,
        offsets,
        dry_run=True,
        fences=plan.owner,
        fences_unreadable=plan.owner_unreadable,
    )


async def restore(
    cfg: TierdConfig,
    *,
    root: DriverRoot | None = None,
    progress: Progress | None = None,
    take_over: bool = False,
) -> RestoreReport:
    """Rebuild ``cfg.store.dir`` (empty) from the bucket and own its prefix (see module doc).
    A bucket another store owns is refused with :class:`~tierd.errors.PrefixOwnedError` naming
    that owner unless ``take_over`` — taking it over fences that store, which may still run (a
    DR drill against a live bucket would stop its owner's tiering: read it with
    :meth:`tierd.BlockingMessageStore.open_bucket` instead)."""
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
        seen, previous = await ownership.top()
        if previous is not None and previous.store_id != our_id and not take_over:
            raise take_over_needed_error(previous, root, our_id)
        plan = await plan_bucket(root, cfg.tiered.cluster, cfg.tiered.broker, progress)
        store_dir.mkdir(parents=True, exist_ok=True)
        # Own the prefix before writing anything (metadata included, so a lost race leaves the
        # directory restorable): the previous owner is fenced from its next check on.
        owner = await ownership.claim(takeover=True, expect=seen)
        root.fence = ownership.ensure
        metadata = MetadataStore(store_dir)
        metadata.save(plan.meta)
        # Reconcile with the backend now: records committed after the last manifest write are
        # rolled forward, so the hot queues below continue after *them*.
        flat = FlatFileStore(root, cfg.tiered, metadata)
        await flat.load()
        ends = _ends(flat)
        committed = await _committed(root, cfg)
    finally:
        if own_root:
            await root.aclose()
    hot = HotStore.open(cfg.store)
    try:
        for (topic, qid), (_, end, _) in ends.items():
            hot.seed_queue(topic, qid, end)
    finally:
        hot.close()
    groups = restore_offsets(store_dir, committed, {k: hi for k, (_, hi, _) in ends.items()})
    offsets = ConsumerOffsets(store_dir).snapshot() if groups[0] else {}
    fenced = previous if previous is not None and previous.store_id != our_id else None
    report = _report(flat, ends, plan.segments, groups, offsets, owner=owner, fences=fenced)
    for r in report.ranges:
        log.info("restore: %s/%d offsets %d..%d", r.topic, r.queue_id, r.first, r.end)
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
