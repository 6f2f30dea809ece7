"""One owner per cold-tier prefix: which store may write under ``{cluster}/{broker}``.

Two stores configured with the same bucket prefix would otherwise write the same segment paths
and read each other's messages. So a store *claims* its prefix before it writes anything, and
checks the claim before every commit round and before any write that follows a stale check.

**Records.** One small JSON object per *epoch*, created with
:meth:`~tierd.drivers.segment.DriverRoot.create_object` (create-if-absent: of two claimants of
the same epoch exactly one wins, on every backend that passes the conformance suite)::

    {cluster_dir}/{broker}/OWNER.d/{epoch:020d}.json

The highest epoch is the owner. A store claims epoch 1 of an unowned prefix, resumes its own
epoch at restart (its id lives in ``{store.dir}/config/tieredStoreId``), and takes over only
when told to (``tierd restore`` on a new machine): it then creates ``top + 1``. Epochs are
contiguous because a claimant always creates the successor of the highest one it listed, so the
old owner learns of a takeover from one listing. Records are never rewritten or deleted: the
directory is also the history of who owned the prefix. ``OWNER.d`` cannot collide with a topic
(topic names have no dots).

**Unreadable records.** A record that does not parse (a flipped byte) cannot say who owns the
prefix. The highest one unreadable: :meth:`Ownership.claim` refuses to write (the store is
fenced, :attr:`Ownership.unreadable` names the epoch) but the cold tier still loads and serves
reads; the operator's way out is :func:`take_over_unreadable` (``tierd takeover --unreadable
EPOCH``), which names that record and creates the next epoch for this store. A lower record
unreadable costs nothing: only the highest epoch is ever read.

**Fencing.** :meth:`Ownership.verify` lists the records: a higher epoch than ours means another
store took over — this store is *fenced* from then on (:class:`~tierd.errors.PrefixOwnedError`,
sticky until restart); our own record gone means the prefix was wiped or the location is not
the one we claimed (a :class:`~tierd.errors.BackendError`). :meth:`Ownership.ensure` re-verifies
when the last check is older than :data:`RECHECK_SECONDS`; the tiering daemon runs it before
every mutating backend call (:mod:`tierd.tiered.guard`), so a store that lost its prefix writes
nothing there — no commit, seal, chunk deletion, manifest, retention or index upload — at most
:data:`RECHECK_SECONDS` plus one request after the takeover. Data writes within that window
still cannot overwrite anything (drivers refuse to change stored bytes); see docs/tiering.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationError

from tierd.drivers.paths import cluster_dir
from tierd.errors import (
    BackendError,
    CorruptionError,
    InvalidArgumentError,
    ObjectExistsError,
    PrefixOwnedError,
)
from tierd.tiered.guard import GuardedRoot
from tierd.tiered.records import JsonDocument
from tierd.tiered.roots import open_driver_factory

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.drivers.segment import DriverRoot

log = logging.getLogger(__name__)
#: Directory (under the broker prefix) holding one record per epoch.
OWNER_DIR = "OWNER.d"
#: A mutating backend call re-verifies ownership when the last check is older than this.
RECHECK_SECONDS = 5.0
#: Local file holding this store's id (one UUID, written once).
STORE_ID_FILE = "tieredStoreId"
_EPOCH_DIGITS = 20


class OwnerRecord(JsonDocument):
    """Who owns a prefix from ``claimed_at`` on (one object per epoch, never rewritten)."""

    format_version: Literal[1] = 1
    epoch: int = Field(ge=1)
    store_id: str
    host: str
    pid: int
    #: Milliseconds since the epoch.
    claimed_at: int
    cluster: str
    broker: str
    store_dir: str
    #: ``claim`` (an unowned prefix) or ``takeover`` (``tierd restore`` replacing an owner).
    reason: Literal["claim", "takeover"]
    #: Store id of the owner this record replaced (takeover only).
    previous_store_id: str | None = None

    @property
    def since(self) -> str:
        """``claimed_at`` as ISO 8601 UTC (for messages)."""
        return dt.datetime.fromtimestamp(self.claimed_at / 1000, dt.UTC).isoformat(timespec="seconds")

    def describe(self) -> str:
        return f"store {self.store_id} on host {self.host} since {self.since} (epoch {self.epoch})"

    def as_dict(self) -> dict[str, object]:
        return {
            "store_id": self.store_id,
            "host": self.host,
            "pid": self.pid,
            "epoch": self.epoch,
            "since": self.since,
            "claimed_at": self.claimed_at,
            "store_dir": self.store_dir,
            "reason": self.reason,
            "previous_store_id": self.previous_store_id,
        }


def prefix_url(url: str, cluster: str, broker: str) -> str:
    """The broker's prefix under a backend URL, as messages name it."""
    return f"{url.rstrip('/')}/{cluster_dir(cluster)}/{broker}"


def owner_dir(cluster: str, broker: str) -> str:
    """Object prefix of a broker's owner records."""
    return f"{cluster_dir(cluster)}/{broker}/{OWNER_DIR}"


def owner_path(cluster: str, broker: str, epoch: int) -> str:
    return f"{owner_dir(cluster, broker)}/{epoch:0{_EPOCH_DIGITS}d}.json"


def store_id(store_dir: Path, *, create: bool = True) -> str | None:
    """This store's id, read from ``{store_dir}/config/tieredStoreId`` (made once, atomically,
    when ``create``). The id — not the host name, which changes with every pod — is what makes
    a restarted store recognise its own claim."""
    path = Path(store_dir) / "config" / STORE_ID_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = ""
    if text:
        return text
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    new = uuid.uuid4().hex
    tmp = path.with_name(f"{STORE_ID_FILE}.tmp")
    with tmp.open("w", encoding="ascii") as fh:
        fh.write(new + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, path)  # a concurrent creator (another command on the same dir) keeps its id
    except FileExistsError:
        return path.read_text(encoding="ascii").strip()
    finally:
        tmp.unlink(missing_ok=True)
    return new


async def list_epochs(root: DriverRoot, cluster: str, broker: str) -> list[int]:
    """Epochs with a record, ascending (names that are not records are ignored)."""
    prefix = owner_dir(cluster, broker)
    epochs = []
    for path in await root.list_objects(prefix):
        name = path[len(prefix) + 1 :]
        stem = name.removesuffix(".json")
        if name.endswith(".json") and len(stem) == _EPOCH_DIGITS and stem.isdigit():
            epochs.append(int(stem))
    return sorted(epochs)


async def read_record(root: DriverRoot, cluster: str, broker: str, epoch: int) -> OwnerRecord:
    path = owner_path(cluster, broker, epoch)
    raw = await root.get_object(path)
    try:
        record = OwnerRecord.model_validate_json(raw)
    except ValidationError as e:
        raise CorruptionError(f"owner record {path} is not valid: {str(e).splitlines()[0]}", path=path) from e
    if record.epoch != epoch:
        raise CorruptionError(f"owner record {path} says epoch {record.epoch}", path=path)
    return record


async def current_owner(root: DriverRoot, cluster: str, broker: str) -> OwnerRecord | None:
    """The prefix's owner (highest epoch), or None for an unowned prefix."""
    epochs = await list_epochs(root, cluster, broker)
    return await read_record(root, cluster, broker, epochs[-1]) if epochs else None


def owned_error(
    owner: OwnerRecord, root: DriverRoot, our_id: str, ours: OwnerRecord | None = None
) -> PrefixOwnedError:
    """The error that names ``owner`` to a store that must not write under its prefix."""
    prefix = prefix_url(root.url, owner.cluster, owner.broker)
    if ours is not None:
        message = (
            f"cold-tier prefix {prefix} was taken over by {owner.describe()}; this store "
            f"({our_id}, epoch {ours.epoch}) is fenced and writes nothing there any more. Stop it, "
            "or give it a prefix of its own (tiered.cluster / tiered.broker / backend.url)"
        )
    else:
        message = (
            f"cold-tier prefix {prefix} is owned by {owner.describe()}; this store ({our_id}) "
            "must not write there. Give it a prefix of its own (tiered.cluster / tiered.broker / "
            "backend.url) — or, if it replaces that store, build it with `tierd restore --from "
            "URL --take-over`, which takes ownership"
        )
    return PrefixOwnedError(
        message,
        prefix=prefix,
        owner_store_id=owner.store_id,
        owner_host=owner.host,
        owner_since=owner.since,
        owner_epoch=owner.epoch,
        store_id=our_id,
    )


def take_over_needed_error(owner: OwnerRecord, root: DriverRoot, our_id: str) -> PrefixOwnedError:
    """A restore that would fence ``owner`` without being told to. Whether that store still
    runs cannot be known from the bucket (owner records carry no heartbeat), so any owner
    counts as live: a DR drill must not stop production by accident."""
    prefix = prefix_url(root.url, owner.cluster, owner.broker)
    return PrefixOwnedError(
        f"cold-tier prefix {prefix} is owned by {owner.describe()}, pid {owner.pid}, store.dir "
        f"{owner.store_dir}; a restore takes it over and FENCES that store (if it still runs, it "
        "tiers nothing more). Pass --take-over if this store replaces it; for a drill, read the "
        "bucket without taking it (`tierd --bucket URL ...`, `tierd restore --dry-run`)",
        prefix=prefix,
        owner_store_id=owner.store_id,
        owner_host=owner.host,
        owner_pid=owner.pid,
        owner_since=owner.since,
        owner_epoch=owner.epoch,
        store_id=our_id,
    )


def unreadable_error(
    root: DriverRoot, cluster: str, broker: str, epoch: int, err: CorruptionError, our_id: str
) -> PrefixOwnedError:
    """The error for a prefix whose highest owner record does not parse: nobody can tell who
    owns it, so nothing is written until an operator takes it over explicitly."""
    prefix = prefix_url(root.url, cluster, broker)
    return PrefixOwnedError(
        f"cold-tier prefix {prefix}: the owner record of epoch {epoch} (the highest) is unreadable "
        f"({err}), so who owns the prefix is unknown; this store ({our_id}) writes nothing there "
        "(reads still work). If this store should own it, stop the store that wrote that record "
        f"(if any) and run `tierd takeover --unreadable {epoch}` with this store's configuration "
        "(docs/tiering.md, 'One owner per prefix')",
        prefix=prefix,
        unreadable_epoch=epoch,
        path=owner_path(cluster, broker, epoch),
        store_id=our_id,
    )


class Ownership:
    """This store's claim on its prefix (see module doc). One per tiering service or restore.

    ``root`` should be the daemon's guarded root (timeouts, health); the claim's own
    ``create_object`` passes its fence because nothing is claimed yet."""

    def __init__(self, root: DriverRoot, cluster: str, broker: str, store_id: str, store_dir: Path) -> None:
        self.root = root
        self.cluster, self.broker = cluster, broker
        self.store_id = store_id
        self.store_dir = Path(store_dir)
        #: Our record once claimed (None before).
        self.record: OwnerRecord | None = None
        #: Set once another store owns the prefix (refused claim, or a takeover seen later):
        #: every later check raises it, without I/O.
        self.fenced: PrefixOwnedError | None = None
        #: The owner as last seen (ours, or the one that fenced or refused us).
        self.owner: OwnerRecord | None = None
        #: Epoch of the highest owner record when it is unreadable (then :attr:`fenced` is set).
        self.unreadable: int | None = None
        self._verified_at = float("-inf")
        self._lock = asyncio.Lock()

    @property
    def epoch(self) -> int | None:
        return self.record.epoch if self.record is not None else None

    def _new_record(self, epoch: int, previous: OwnerRecord | None, *, takeover: bool = False) -> OwnerRecord:
        return OwnerRecord(
            epoch=epoch,
            store_id=self.store_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            claimed_at=int(time.time() * 1000),
            cluster=self.cluster,
            broker=self.broker,
            store_dir=str(self.store_dir.absolute()),
            reason="takeover" if previous is not None or takeover else "claim",
            previous_store_id=previous.store_id if previous is not None else None,
        )

    async def top(self) -> tuple[int, OwnerRecord | None]:
        """The highest epoch (0: none) and its record. An unreadable one fences this store (see
        module doc): :class:`~tierd.errors.PrefixOwnedError`, :attr:`unreadable` set."""
        epochs = await list_epochs(self.root, self.cluster, self.broker)
        if not epochs:
            return 0, None
        try:
            return epochs[-1], await read_record(self.root, self.cluster, self.broker, epochs[-1])
        except CorruptionError as e:
            self.unreadable = epochs[-1]
            self.fenced = unreadable_error(self.root, self.cluster, self.broker, epochs[-1], e, self.store_id)
            raise self.fenced from e

    async def claim(self, *, takeover: bool = False, expect: int | None = None) -> OwnerRecord:
        """Own the prefix: resume our own epoch, claim an unowned prefix, or (``takeover``) create
        the next epoch over another owner. Raises :class:`~tierd.errors.PrefixOwnedError` when
        another store owns it and ``takeover`` is False, when another claimant won a race
        for the same epoch (a takeover never answers a racing takeover with a third epoch), or
        when the highest epoch is not ``expect`` (the one a restore saw when it began: a record
        created since then is a concurrent claimant's, and answering it with one more epoch
        would let two restores both succeed)."""
        epoch, top = await self.top()
        if top is not None and top.store_id == self.store_id:
            return self._claimed(top)
        if expect is not None and epoch != expect and top is not None:
            self.owner = top
            self.fenced = owned_error(top, self.root, self.store_id)
            log.error("another store claimed the prefix while this one was getting ready: %s", self.fenced)
            raise self.fenced
        if top is not None and not takeover:
            self.owner = top
            self.fenced = owned_error(top, self.root, self.store_id)
            raise self.fenced
        record = self._new_record(top.epoch + 1 if top is not None else 1, top)
        path = owner_path(self.cluster, self.broker, record.epoch)
        try:
            await self.root.create_object(path, record.model_dump_json(by_alias=True, indent=1).encode())
        except ObjectExistsError:
            winner = await read_record(self.root, self.cluster, self.broker, record.epoch)
            if winner.store_id == self.store_id:  # our own create landed, its answer was lost
                return self._claimed(winner)
            self.owner = winner
            self.fenced = owned_error(winner, self.root, self.store_id)
            raise self.fenced from None
        if top is not None:
            log.warning(
                "took ownership of the cold-tier prefix from %s: now %s", top.describe(), record.describe()
            )
        else:
            log.info(
                "claimed the cold-tier prefix %s: %s", owner_dir(self.cluster, self.broker), record.describe()
            )
        return self._claimed(record)

    def _claimed(self, record: OwnerRecord) -> OwnerRecord:
        self.record = self.owner = record
        self.fenced = None  # a refusal from an earlier attempt no longer holds
        self._verified_at = time.monotonic()
        return record

    async def verify(self) -> None:
        """Check the claim against the backend now (one listing; one read more when fenced)."""
        if self.fenced is not None:
            raise self.fenced
        ours = self.record
        if ours is None:
            raise BackendError(
                "the cold-tier prefix is not claimed yet", prefix=owner_dir(self.cluster, self.broker)
            )
        epochs = await list_epochs(self.root, self.cluster, self.broker)
        if epochs and epochs[-1] > ours.epoch:
            try:
                newer = await read_record(self.root, self.cluster, self.broker, epochs[-1])
            except CorruptionError as e:  # a later claim, whoever made it: we are not the owner
                self.unreadable = epochs[-1]
                self.fenced = unreadable_error(
                    self.root, self.cluster, self.broker, epochs[-1], e, self.store_id
                )
                log.error("%s", self.fenced)
                raise self.fenced from e
            self.owner = newer
            self.fenced = owned_error(newer, self.root, self.store_id, ours)
            log.error("%s", self.fenced)
            raise self.fenced
        if ours.epoch not in epochs:
            raise BackendError(
                f"this store's owner record {owner_path(self.cluster, self.broker, ours.epoch)} is gone "
                f"from {self.root.url}: the cold-tier prefix was wiped, or the backend location is "
                "not the one claimed (an unmounted directory, another bucket). Nothing more is "
                "written; check the backend, then run `tierd verify`",
                path=owner_path(self.cluster, self.broker, ours.epoch),
                epochs=epochs,
            )
        self._verified_at = time.monotonic()

    async def ensure(self, max_age: float | None = None) -> None:
        """Raise if fenced; re-verify when the last check is older than ``max_age`` seconds
        (default :data:`RECHECK_SECONDS`; concurrent callers share one check). A no-op before
        the claim (the claim's own write)."""
        if self.fenced is not None:
            raise self.fenced
        if max_age is None:
            max_age = RECHECK_SECONDS
        if self.record is None or time.monotonic() - self._verified_at < max_age:
            return
        async with self._lock:
            if time.monotonic() - self._verified_at < max_age:
                if self.fenced is not None:
                    raise self.fenced
                return
            await self.verify()


async def take_over_unreadable(
    root: DriverRoot, cluster: str, broker: str, our_id: str, store_dir: Path, epoch: int
) -> OwnerRecord:
    """The operator's way out of an unreadable owner record (``tierd takeover --unreadable
    EPOCH``): create epoch ``epoch + 1`` for this store (reason ``takeover``, previous store
    unknown). ``epoch`` must name the highest record, and it must really be unreadable — a
    readable owner is taken over only by ``tierd restore`` (which rebuilds that store's state).
    The unreadable record stays (records are never rewritten or deleted)."""
    ownership = Ownership(root, cluster, broker, our_id, store_dir)
    epochs = await list_epochs(root, cluster, broker)
    if not epochs or epochs[-1] != epoch:
        raise InvalidArgumentError(
            f"epoch {epoch} is not the highest owner record of {prefix_url(root.url, cluster, broker)} "
            f"(the highest is {epochs[-1] if epochs else 'none: the prefix is unowned'}); name the "
            "unreadable record that `tierd verify` or the start-up error reports",
            epoch=epoch,
            highest=epochs[-1] if epochs else None,
        )
    try:
        record = await read_record(root, cluster, broker, epoch)
    except CorruptionError as e:
        log.warning("taking over from the unreadable owner record of epoch %d: %s", epoch, e)
    else:
        raise InvalidArgumentError(
            f"the owner record of epoch {epoch} is readable: the prefix is owned by "
            f"{record.describe()}. A takeover over a readable owner is `tierd restore --from URL` "
            "into an empty store.dir",
            epoch=epoch,
            owner_store_id=record.store_id,
        )
    new = ownership._new_record(epoch + 1, None, takeover=True)
    try:
        await root.create_object(
            owner_path(cluster, broker, new.epoch), new.model_dump_json(by_alias=True, indent=1).encode()
        )
    except ObjectExistsError:
        raise ownership_race(root, cluster, broker, new.epoch, our_id) from None
    log.warning(
        "took over the cold-tier prefix after the unreadable record %d: now %s", epoch, new.describe()
    )
    return new


def ownership_race(root: DriverRoot, cluster: str, broker: str, epoch: int, our_id: str) -> PrefixOwnedError:
    """Another claimant created ``epoch`` first."""
    prefix = prefix_url(root.url, cluster, broker)
    return PrefixOwnedError(
        f"cold-tier prefix {prefix}: another store created owner epoch {epoch} first; this store "
        f"({our_id}) does not own it. Check `tierd verify` before trying again",
        prefix=prefix,
        owner_epoch=epoch,
        store_id=our_id,
    )


async def take_over_unreadable_prefix(cfg: TierdConfig, epoch: int) -> OwnerRecord:
    """:func:`take_over_unreadable` for the store and backend of ``cfg`` (``tierd takeover``)."""
    store_dir = Path(cfg.store.dir)
    our_id = store_id(store_dir)
    assert our_id is not None
    root = GuardedRoot(open_driver_factory(cfg.backend), cfg.tiered.backend_timeout)
    try:
        return await take_over_unreadable(
            root, cfg.tiered.cluster, cfg.tiered.broker, our_id, store_dir, epoch
        )
    finally:
        await root.aclose()
