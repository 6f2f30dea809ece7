"""The reput (dispatch) thread: the only writer of consume queues and the key index.

Appends hand their batch over in commitlog order (:class:`DispatchBatch`, built from the columns
the put path computed anyway, so nothing is parsed twice). After a restart the same batches are
rebuilt from the commitlog bytes (:meth:`DispatchBatch.from_records`) — both paths feed one
:meth:`ReputService.dispatch`, and a test checks they produce identical files.
"""

from __future__ import annotations

import itertools
import logging
import operator
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tierd.format.cq_unit import encode_units, tags_code
from tierd.format.key_hash import key_hashes
from tierd.format.properties import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    decode_properties,
)
from tierd.format.record import (
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    RecordView,
)
from tierd.local.prepare import EncodedBatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from tierd.local.consumequeue import ConsumeQueue
    from tierd.local.index import IndexService
    from tierd.local.prepare import GroupKey, PreparedBatch

log = logging.getLogger(__name__)
#: After a small round the reput thread pauses this long so puts accumulate into one merged
#: batch instead of fighting the producers for the GIL once per message.
IDLE_PAUSE = 0.005
SMALL_ROUND = 1024
RETRY_MIN = 0.05
RETRY_MAX = 2.0


#: One record from the single-put path, as a plain tuple (no allocation beyond it):
#: (queue key, queue offset, physical offset, size, tags code, store timestamp, index hashes,
#: end). Index hashes: one ``int`` for a message with exactly one key, else a tuple (see
#: :data:`~tierd.local.prepare.PreparedOne`).
SingleRecord = tuple[tuple[str, int], int, int, int, int, int, "int | tuple[int, ...]", int]
#: A :data:`SingleRecord`'s columns.
_KEY, _QUEUE_OFFSET, _PHYSICAL_OFFSET, _SIZE, _TAGS_CODE, _STORE_TIMESTAMP, _HASHES, _END = map(
    operator.itemgetter, range(8)
)


@dataclass(slots=True)
class DispatchBatch:
    """Consume-queue units and index entries for a contiguous run of commitlog records."""

    end: int
    groups: list[tuple[GroupKey, npt.NDArray[np.intp]]]
    queue_offsets: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    tags_codes: npt.NDArray[np.int64]
    store_timestamps: npt.NDArray[np.int64]
    index_keys: list[str]
    index_messages: list[int]
    #: The key index's hashes of the entries, when the put path computed them (the C batch
    #: encoder: ``index_keys`` is then empty); else None and the index hashes ``index_keys``.
    index_hashes: npt.NDArray[np.uint32] | None = None

    @property
    def last_timestamp(self) -> int:
        return int(self.store_timestamps[-1]) if len(self.store_timestamps) else 0

    @classmethod
    def from_prepared(
        cls,
        b: PreparedBatch | EncodedBatch,
        qoffs: npt.NDArray[np.int64],
        phys: npt.NDArray[np.int64],
        store_ts: int,
        end: int,
    ) -> DispatchBatch:
        return cls(
            end=end,
            groups=b.groups,
            queue_offsets=qoffs,
            offsets=phys,
            sizes=b.sizes,
            tags_codes=b.tags_codes,
            store_timestamps=np.full(len(phys), store_ts, np.int64),
            index_keys=[] if isinstance(b, EncodedBatch) else b.index_keys,
            index_messages=b.index_messages,
            index_hashes=b.index_hashes if isinstance(b, EncodedBatch) else None,
        )

    @classmethod
    def merge(cls, items: list[DispatchBatch | SingleRecord]) -> DispatchBatch:
        """Concatenate consecutive batches and single records so the reput thread pays its fixed
        costs once per wake-up, not once per put. Records of one queue stay in commitlog order,
        so each queue's units remain one contiguous run."""
        if len(items) == 1 and isinstance(items[0], DispatchBatch):
            return items[0]
        batches: list[DispatchBatch] = []
        run: list[SingleRecord] = []
        for item in items:
            if isinstance(item, DispatchBatch):
                if run:
                    batches.append(cls._from_singles(run))
                    run = []
                batches.append(item)
            else:
                run.append(item)
        if run:
            batches.append(cls._from_singles(run))
        if len(batches) == 1:
            return batches[0]
        group_parts: dict[GroupKey, list[npt.NDArray[np.intp]]] = {}
        keys: list[str] = []
        key_msgs: list[int] = []
        # Batches whose hashes the put path computed keep them; if any did, the others' keys
        # are hashed here (the index would hash them anyway) so one column covers all.
        hashed = any(b.index_hashes is not None for b in batches)
        hash_parts: list[npt.NDArray[np.uint32]] = []
        base = 0
        for b in batches:
            for key, idx in b.groups:
                group_parts.setdefault(key, []).append(idx + base if base else idx)
            if b.index_messages:
                if not hashed:
                    keys.extend(b.index_keys)
                else:
                    hash_parts.append(
                        b.index_hashes if b.index_hashes is not None else key_hashes(b.index_keys)
                    )
                key_msgs.extend(m + base for m in b.index_messages)
            base += len(b.offsets)
        return cls(
            end=batches[-1].end,
            groups=[(k, np.concatenate(v) if len(v) > 1 else v[0]) for k, v in group_parts.items()],
            queue_offsets=np.concatenate([b.queue_offsets for b in batches]),
            offsets=np.concatenate([b.offsets for b in batches]),
            sizes=np.concatenate([b.sizes for b in batches]),
            tags_codes=np.concatenate([b.tags_codes for b in batches]),
            store_timestamps=np.concatenate([b.store_timestamps for b in batches]),
            index_keys=keys,
            index_messages=key_msgs,
            index_hashes=(np.concatenate(hash_parts) if hash_parts else np.empty(0, np.uint32))
            if hashed
            else None,
        )

    @classmethod
    def _from_singles(cls, run: list[SingleRecord]) -> DispatchBatch:
        # Runs once per single put: everything here is a C-level pass (map, chain, numpy), not
        # a Python loop per record. Columns by ``itemgetter``, not ``zip(*run)``: that makes an
        # iterator per record, thousands alive at once, and a young collection that starts
        # meanwhile promotes them all — what then starts the collector's full pass over the
        # application's whole heap (docs/performance.md, "Single put and the collector").
        n = len(run)
        keys_col = list(map(_KEY, run))
        hash_lists = list(map(_HASHES, run))
        ids = {k: i for i, k in enumerate(dict.fromkeys(keys_col))}
        if len(ids) == 1:
            groups = [(keys_col[0], np.arange(n, dtype=np.intp))]
        else:
            gids = np.fromiter(map(ids.__getitem__, keys_col), np.intp, n)
            groups = [(k, np.flatnonzero(gids == i)) for k, i in ids.items()]
        if set(map(type, hash_lists)) == {int}:  # one key each: the usual message
            hashes = np.fromiter(hash_lists, np.uint32, n)
            index_messages = list(range(n))
        else:
            lists = [(h,) if type(h) is int else h for h in hash_lists]
            counts = np.fromiter(map(len, lists), np.intp, n)
            hashes = np.fromiter(itertools.chain.from_iterable(lists), np.uint32, int(counts.sum()))
            index_messages = np.repeat(np.arange(n, dtype=np.intp), counts).tolist()
        return cls(
            end=_END(run[-1]),
            groups=groups,
            queue_offsets=np.fromiter(map(_QUEUE_OFFSET, run), np.int64, n),
            offsets=np.fromiter(map(_PHYSICAL_OFFSET, run), np.int64, n),
            sizes=np.fromiter(map(_SIZE, run), np.int64, n),
            tags_codes=np.fromiter(map(_TAGS_CODE, run), np.int64, n),
            store_timestamps=np.fromiter(map(_STORE_TIMESTAMP, run), np.int64, n),
            index_keys=[],
            index_messages=index_messages,
            index_hashes=hashes,
        )

    @classmethod
    def from_records(cls, records: list[tuple[int, RecordView]], end: int) -> DispatchBatch:
        """Rebuild from commitlog records (recovery). Prepared and rolled-back transactional
        records get no consume-queue unit; rolled-back ones are not indexed either. A queue's
        records are grouped in runs of consecutive queue offsets: :meth:`ReputService.dispatch`
        writes a group's units from its first offset on, so a gap (messages lost to damage
        between the records) must start a new group — else every later unit lands one slot
        early and points at the next record."""
        n = len(records)
        qoffs = np.empty(n, np.int64)
        phys = np.empty(n, np.int64)
        sizes = np.empty(n, np.int64)
        tags = np.zeros(n, np.int64)
        ts = np.empty(n, np.int64)
        runs: dict[GroupKey, list[list[int]]] = {}
        keys: list[str] = []
        key_msgs: list[int] = []
        for j, (pos, v) in enumerate(records):
            qoffs[j], phys[j], sizes[j], ts[j] = v.queue_offset, pos, v.size, v.store_timestamp
            props = decode_properties(v.properties) if v.properties else {}
            tag = props.get(PROPERTY_TAGS)
            if tag:
                tags[j] = tags_code(tag)
            tx = v.sys_flag & SYSFLAG_TRANSACTION_MASK
            if tx not in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK):
                queue_runs = runs.setdefault((v.topic, v.queue_id), [])
                if queue_runs and int(qoffs[queue_runs[-1][-1]]) + 1 == v.queue_offset:
                    queue_runs[-1].append(j)
                else:
                    queue_runs.append([j])
            if tx != SYSFLAG_TRANSACTION_ROLLBACK:  # RocketMQ's order: UNIQ_KEY, then each key
                uniq = props.get(PROPERTY_UNIQ_KEY)
                if uniq:
                    keys.append(f"{v.topic}#{uniq}")
                    key_msgs.append(j)
                for k in props.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR):
                    if k:
                        keys.append(f"{v.topic}#{k}")
                        key_msgs.append(j)
        groups = [(k, np.asarray(idx, np.intp)) for k, queue_runs in runs.items() for idx in queue_runs]
        return cls(
            end=end,
            groups=groups,
            queue_offsets=qoffs,
            offsets=phys,
            sizes=sizes,
            tags_codes=tags,
            store_timestamps=ts,
            index_keys=keys,
            index_messages=key_msgs,
        )


class ReputService:
    """Applies dispatch batches in commitlog order on a background thread."""

    def __init__(
        self, queue_for: Callable[[str, int], ConsumeQueue], index: IndexService, start_offset: int
    ) -> None:
        self.queue_for = queue_for
        self.index = index
        #: Commitlog offset up to which consume queues and index are built.
        self.dispatched_offset = start_offset
        #: Store timestamp of the last dispatched record (checkpoint's logics timestamp).
        self.dispatched_timestamp = 0
        self._pending: deque[DispatchBatch | SingleRecord] = deque()
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._stopping = False
        #: The error of the last failed dispatch attempt (None when healthy).
        self.last_error: Exception | None = None
        #: Called with the (topic, queue) keys of each batch once its units are readable.
        self.listener: Callable[[list[tuple[str, int]]], None] | None = None
        self._thread = threading.Thread(target=self._run, name="tierd-reput", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: DispatchBatch | SingleRecord) -> None:
        """Queue a batch (called under the commitlog lock, so batches arrive in order)."""
        self._pending.append(batch)
        if not self._wake.is_set():
            self._wake.set()

    def dispatch(self, batch: DispatchBatch) -> None:
        """Write units and index entries of ``batch``. Rewriting units already present is
        harmless (same bytes at the same positions) — recovery relies on that."""
        for (topic, queue_id), idx in batch.groups:
            cq = self.queue_for(topic, queue_id)
            if len(idx) == len(batch.offsets):
                units = encode_units(batch.offsets, batch.sizes, batch.tags_codes)
                first = int(batch.queue_offsets[0])
            else:
                units = encode_units(batch.offsets[idx], batch.sizes[idx], batch.tags_codes[idx])
                first = int(batch.queue_offsets[idx[0]])
            cq.put_units(first, units)
        if batch.index_messages:
            msgs = np.asarray(batch.index_messages, np.intp)
            if batch.index_hashes is not None:
                self.index.put_hashes(batch.index_hashes, batch.offsets[msgs], batch.store_timestamps[msgs])
            else:
                self.index.put_batch(batch.index_keys, batch.offsets[msgs], batch.store_timestamps[msgs])
        if len(batch.offsets):
            self.dispatched_timestamp = batch.last_timestamp
        self.dispatched_offset = batch.end

    def _run(self) -> None:
        pending = self._pending
        retry: DispatchBatch | None = None
        backoff = RETRY_MIN
        while True:
            if not self._stopping and retry is None:
                self._wake.wait()
            self._wake.clear()
            taken = [pending.popleft() for _ in range(len(pending))]
            if retry is None and not taken:
                if self._stopping:
                    return
                continue
            if retry is not None and taken:
                # Keep order: the failed batch first, then everything that queued up behind it.
                batch = DispatchBatch.merge([retry, *taken])
            else:
                batch = retry if retry is not None else DispatchBatch.merge(taken)
            try:
                self.dispatch(batch)
            except Exception as e:
                # Never give up (that would silently stop queues from growing): keep the batch,
                # report, back off, retry. Dispatch is idempotent, so a partial attempt is harmless.
                if self.last_error is None:
                    log.exception(
                        "dispatch after commitlog offset %d failed; retrying", self.dispatched_offset
                    )
                self.last_error = e
                retry = batch
                if self._stopping:
                    log.warning("closing while dispatch fails; the next open rebuilds it from the commitlog")
                    return
                time.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX)
                continue
            if self.last_error is not None:
                log.warning("dispatch recovered after an error: %s", self.last_error)
                self.last_error = None
            retry, backoff = None, RETRY_MIN
            with self._done:
                self._done.notify_all()
            if self.listener is not None:
                try:
                    self.listener([key for key, _ in batch.groups])
                except Exception:
                    log.exception("dispatch listener failed")
            if len(taken) < SMALL_ROUND and not self._stopping:
                time.sleep(IDLE_PAUSE)
                if pending:
                    self._wake.set()

    def wait_dispatched(self, offset: int, timeout: float | None = None) -> bool:
        """Block until everything before commitlog ``offset`` is dispatched (read-your-writes);
        False on timeout (e.g. while dispatch keeps failing — see :attr:`last_error`)."""
        with self._done:
            return self._done.wait_for(lambda: self.dispatched_offset >= offset, timeout)

    @property
    def behind(self) -> int:
        return len(self._pending)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
