"""Building and writing the bucket manifests (:mod:`tierd.tiered.manifest`) from the daemon's
flat files — the writing side, kept apart so a reader of the bucket (Spark) imports none of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import TYPE_CHECKING

from tierd.format.cq_unit import UNIT_SIZE
from tierd.tiered.manifest import (
    BrokerManifest,
    QueueManifest,
    TopicEntry,
    broker_manifest_path,
    dump_manifest,
    queue_manifest_path,
)
from tierd.tiered.records import ManifestSegment

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.drivers.segment import DriverRoot
    from tierd.tiered.flatmessage import FlatMessageFile
    from tierd.tiered.flatstore import FlatFileStore

log = logging.getLogger(__name__)
#: The local record of what manifests were written (see :class:`ManifestWriter`).
LEDGER_NAME = "tieredManifests.json"
#: Queue manifests written at once.
MANIFEST_CONCURRENCY = 8


async def build_queue_manifest(ff: FlatMessageFile, cluster: str, broker: str) -> QueueManifest:
    """The manifest of one queue as of its committed state."""
    segments: list[ManifestSegment] = []
    end = ff.max_offset  # one past the last committed message
    firsts = await ff.first_queue_offsets()
    for i, info in enumerate(ff.commitlog.infos()):
        first = firsts[i]
        nxt = next((f for f in firsts[i + 1 :] if f is not None), end)
        count = max(0, min(nxt, end) - first) if first is not None and info.size else 0
        segments.append(
            ManifestSegment(
                **info.record_fields()
                | {
                    "first_queue_offset": first if count else None,
                    "crc32c": info.crc32c if info.sealed else None,
                },
                last_queue_offset=first + count - 1 if count and first is not None else None,
                message_count=count,
            )
        )
    for info in ff.consumequeue.infos():
        first = info.base_offset // UNIT_SIZE
        count = info.size // UNIT_SIZE
        segments.append(
            ManifestSegment(
                **info.record_fields()
                | {
                    "size": count * UNIT_SIZE,
                    "first_queue_offset": first if count else None,
                    "crc32c": info.crc32c if info.sealed else None,
                },
                last_queue_offset=first + count - 1 if count else None,
                message_count=count,
            )
        )
    return QueueManifest(
        cluster=cluster,
        broker=broker,
        topic=ff.topic,
        queue_id=ff.queue_id,
        min_offset=ff.min_offset,
        max_offset=ff.max_offset,
        segments=tuple(segments),
        written_at=int(time.time() * 1000),
    )


def build_broker_manifest(flat: FlatFileStore) -> BrokerManifest:
    queues: dict[str, list[int]] = {}
    for topic, qid in flat.files:
        queues.setdefault(topic, []).append(qid)
    topics = tuple(
        TopicEntry(
            name=t.name, id=t.id, reserve_hours=t.reserve_hours, queues=tuple(sorted(queues.get(t.name, [])))
        )
        for t in sorted(flat.topics.values(), key=lambda t: t.id)
    )
    return BrokerManifest(
        cluster=flat.cfg.cluster, broker=flat.cfg.broker, topics=topics, written_at=int(time.time() * 1000)
    )


class ManifestWriter:
    """Writes queue manifests for queues whose segments changed, and the broker manifest.

    What it wrote is remembered across restarts in a local *ledger*
    (``{store.dir}/config/tieredManifests.json``: per queue the offsets and sealed-segment count
    its manifest shows), written after the PUTs succeeded. Without it every start rewrote every
    queue's manifest — 10,000 PUTs per restart of a store with 10,000 queues. The ledger only
    ever saves writes: a missing or unreadable one, or one written for another bucket or
    broker, means "rewrite them all", as before."""

    def __init__(self, root: DriverRoot, flat: FlatFileStore) -> None:
        self.root = root
        self.flat = flat
        self._written: dict[tuple[str, int], tuple[int, int, int]] = {}
        #: What the broker manifest last written lists: queues, topics with ids and reserve hours.
        self._broker_written: tuple[object, ...] | None = None
        self._ledger_loaded = False
        self.writes = 0

    @property
    def ledger_path(self) -> Path:
        return self.flat.metadata.dir / LEDGER_NAME

    def _ledger_owner(self) -> list[str]:
        return [self.root.url, self.flat.cfg.cluster, self.flat.cfg.broker]

    def _load_ledger(self) -> None:
        self._ledger_loaded = True
        try:
            raw = json.loads(self.ledger_path.read_bytes())
            if raw.get("format-version") != 1 or raw.get("owner") != self._ledger_owner():
                return
            written = {(str(t), int(q)): (int(lo), int(hi), int(n)) for t, q, lo, hi, n in raw["queues"]}
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("ignoring the manifest ledger %s (%s); rewriting every manifest", self.ledger_path, e)
            return
        self._written.update(written)

    def _save_ledger(self) -> None:
        data = {
            "format-version": 1,
            "owner": self._ledger_owner(),
            "queues": [[t, q, *state] for (t, q), state in sorted(self._written.items())],
        }
        tmp = self.ledger_path.with_name(LEDGER_NAME + ".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, self.ledger_path)

    def forget(self) -> None:
        """Make the next :meth:`write_changed` rewrite every manifest, whatever the ledger says
        (``tierd verify --repair``: the bucket's copies are what is wrong)."""
        self._written.clear()
        self._ledger_loaded = True
        self._broker_written = None

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's queues are no longer written: were it made again with the same
        offsets, the ledger must not take its first manifests for written already."""
        for key in [k for k in self._written if k[0] == topic]:
            del self._written[key]

    def _state(self, ff: FlatMessageFile) -> tuple[int, int, int]:
        return (ff.min_offset, ff.max_offset, ff.commitlog.sealed_count + ff.consumequeue.sealed_count)

    async def write_changed(self) -> int:
        """Write the manifest of every queue whose offsets or sealed segments changed since its
        last write, then the broker manifest if the set of queues changed. Returns objects written."""
        cfg = self.flat.cfg
        if not self._ledger_loaded:
            await asyncio.to_thread(self._load_ledger)
        changed = [
            (key, ff, state)
            for key, ff in sorted(self.flat.files.items())
            if self._written.get(key) != (state := self._state(ff))
        ]
        # Manifests are small and independent: write a few at once (a commit round that touched
        # 64 queues would otherwise spend 64 request latencies in a row here).
        gate = asyncio.Semaphore(MANIFEST_CONCURRENCY)
        failures: list[BaseException] = []
        wrote = 0

        async def write(key: tuple[str, int], ff: FlatMessageFile, state: tuple[int, int, int]) -> None:
            async with gate:
                if failures:
                    return  # the backend is failing: the next call retries, not 10,000 doomed PUTs now
                try:
                    manifest = await build_queue_manifest(ff, cfg.cluster, cfg.broker)
                    await self.root.put_object(
                        queue_manifest_path(cfg.cluster, cfg.broker, *key), dump_manifest(manifest)
                    )
                except Exception as e:
                    failures.append(e)
                    return
                self._written[key] = state
                nonlocal wrote
                wrote += 1

        try:
            await asyncio.gather(*(write(*c) for c in changed))
        finally:
            if wrote:
                await asyncio.to_thread(self._save_ledger)
        if failures:
            raise failures[0]
        n = len(changed)
        # Compared as plain tuples: building the manifest (2,500 topic models at 10,000 queues)
        # after every round only to find it unchanged cost ~0.2 s of event loop each time.
        shape = (
            tuple(sorted(self.flat.files)),
            tuple(sorted((t.name, t.id, t.reserve_hours) for t in self.flat.topics.values())),
        )
        if shape != self._broker_written:
            broker = build_broker_manifest(self.flat)
            await self.root.put_object(broker_manifest_path(cfg.cluster, cfg.broker), dump_manifest(broker))
            self._broker_written = shape
            n += 1
        self.writes += n
        return n
