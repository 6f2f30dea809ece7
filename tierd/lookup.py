"""Lookup by message id: ``tierd message ID`` and ``GET /v1/messages/{id}`` (docs/cli.md).

A message id is one of two things, and one string can look like both — RocketMQ's client ids
and IPv4 offset ids are both 32 hex characters — so a lookup tries every reading the id has
and keeps only what it can verify:

* An **offset id** (:mod:`tierd.format.message_id`) names a position in *this store's hot
  commitlog*: STOREHOST + PHYSICALOFFSET. The record there is kept only if it decodes with a
  good CRC, carries that very position in its own PHYSICALOFFSET field and this store's host,
  and its queue's consume-queue unit points back at it — so an arbitrary number, a position
  inside a record, or a record whose bytes merely look like one never yields a message.

  The cold tier cannot answer an offset id: its records carry their offset in the queue's flat
  commitlog instead (FORMATS §2.2, as RocketMQ's tiered store writes them) and nothing maps hot
  positions to them — a manifest's per-segment range of hot positions would not either, as a
  cold record no longer says which hot position it came from. Keeping that mapping would cost
  8 bytes per message in a new cold file type; instead, once the hot file holding a position
  has expired the lookup says so (``message_not_found``, naming where the hot commitlog starts
  now) and points at the client id, which both tiers index.
* A **client id** — the UNIQ_KEY producers and gRPC clients know a message by — is looked up
  in the key index of both tiers (hot index files, cold index files local and uploaded), and
  each hit is read back and kept only if its UNIQ_KEY is exactly the id. The index hashes
  ``topic#key``, so the lookup is per topic: with a topic one lookup, without one lookup per
  topic (an uploaded index file costs up to 2 backend reads each; give the topic when known).

Exactly one message found is the answer. None is :class:`~tierd.errors.MessageNotFoundError`;
more than one (a producer's retry stored the same UNIQ_KEY twice, an id both an offset id and
another message's client id) is :class:`~tierd.errors.AmbiguousMessageIdError` listing them —
never a guess.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from tierd.errors import (
    AmbiguousMessageIdError,
    CorruptRecordError,
    InvalidArgumentError,
    MessageNotFoundError,
)
from tierd.format.host import encode_host
from tierd.format.message_id import parse_offset_msg_id

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tierd.format.message_ext import MessageExt
    from tierd.local.store import HotStore
    from tierd.router import TierRouter

#: Longest message id accepted (the HTTP key route's bound: an id is a key of the index).
MAX_ID_LENGTH: Final = 4096
#: Key-index hits per topic read back for a client id (messages whose KEYS hold the id as well
#: are candidates too; the UNIQ_KEY check drops them).
CLIENT_CANDIDATES: Final = 16
#: Topics whose key index is searched at once (each lookup may read the backend).
CONCURRENT_TOPICS: Final = 8
_NEWEST = 2**63 - 1

Tier = Literal["hot", "cold"]
Matched = Literal["offset", "client"]


@dataclass(frozen=True, slots=True)
class FoundMessage:
    """What :meth:`tierd.store.MessageStore.message` returns."""

    message: MessageExt
    #: The tier the message was read from.
    tier: Tier
    #: How the id matched: ``offset`` (its hot commitlog position) or ``client`` (its UNIQ_KEY).
    matched: Matched


def check_message_id(msg_id: object) -> str:
    """A message id as typed or pasted: 1 to :data:`MAX_ID_LENGTH` printable characters without
    white space (no id has any: a pasted newline or space is refused, not guessed away)."""
    if (
        not isinstance(msg_id, str)
        or not 0 < len(msg_id) <= MAX_ID_LENGTH
        or not msg_id.isprintable()
        or any(c.isspace() for c in msg_id)
    ):
        shown = msg_id if not isinstance(msg_id, str) or len(msg_id) <= 80 else msg_id[:80] + "…"
        raise InvalidArgumentError(
            f"a message id is 1-{MAX_ID_LENGTH} printable characters without spaces "
            f"(an offset id, or a client id / UNIQ_KEY), got {shown!r}",
            msg_id=repr(shown),
        )
    return msg_id


async def find_message(
    hot: HotStore, router: TierRouter, msg_id: str, topics: Sequence[str], topic: str | None
) -> FoundMessage:
    """The one message ``msg_id`` names (see the module docstring), searching ``topics`` for a
    client id; ``topic``: only a message of that topic counts."""
    await router.caught_up()  # an id a producer was just given is found (read-your-writes)
    at, why = _at_position(hot, msg_id, topic)
    found: dict[tuple[str, int, int], FoundMessage] = {}
    if at is not None:
        found[(at.topic, at.queue_id, at.queue_offset)] = FoundMessage(at, "hot", "offset")
    for hit in await _by_client_id(router, msg_id, topics):
        found.setdefault((hit.message.topic, hit.message.queue_id, hit.message.queue_offset), hit)
    if len(found) == 1:
        return next(iter(found.values()))
    where = f"topic {topic}" if topic is not None else f"any of {len(topics)} topic(s)"
    if not found:
        raise MessageNotFoundError(
            f"no message has id {msg_id!r}: no client id (UNIQ_KEY) in {where}" + (f"; {why}" if why else ""),
            msg_id=msg_id,
            **({"topic": topic} if topic is not None else {}),
        )
    places = [f"{t}/{q}@{o}" for t, q, o in sorted(found)]
    narrow = (
        " (or narrow the search with a topic)" if topic is None and len({t for t, _, _ in found}) > 1 else ""
    )
    raise AmbiguousMessageIdError(
        f"{len(found)} messages answer to id {msg_id!r}: {', '.join(places)}; read the one you mean "
        f"by position (`tierd consume TOPIC -q QUEUE --offset OFFSET -n 1`){narrow}",
        msg_id=msg_id,
        candidates=places,
    )


def _at_position(hot: HotStore, msg_id: str, topic: str | None) -> tuple[MessageExt | None, str | None]:
    """The hot record ``msg_id`` names as an offset id, verified, or None and — when the id has
    an offset id's form — why not (for the not-found message)."""
    try:
        host, phys = parse_offset_msg_id(msg_id)
    except InvalidArgumentError:
        return None, None  # not an offset id's form: a client id only
    said = f"as an offset id it names hot commitlog position {phys} of store host {host}"
    if encode_host(host) != hot.store_host:
        return None, f"{said}, and this store is {hot.cfg.store_host}"
    log = hot.commitlog
    if phys < log.min_offset:
        return None, (
            f"{said}, which has left the hot tier (its commitlog now starts at {log.min_offset}); the "
            "cold tier does not keep hot positions: look the message up by its client id (UNIQ_KEY) "
            "or read it by topic, queue and offset"
        )
    if phys >= log.max_offset:
        return None, f"{said}, beyond the end of the hot commitlog ({log.max_offset})"
    if hot.quarantine.ranges and hot.quarantine.covers(phys):
        return None, f"{said}, inside damage found in the hot commitlog (`tierd verify` lists it)"
    try:
        msg = log.read(phys, check_crc=True)
    except CorruptRecordError:
        return None, f"{said}, where no message starts"
    if (
        msg.commitlog_offset != phys
        or encode_host(msg.store_host) != hot.store_host
        or hot.position(msg.topic, msg.queue_id, msg.queue_offset) != phys
        or phys < hot.erased.get(msg.topic, -1)
    ):
        return None, f"{said}, where no message of a live queue starts"
    if topic is not None and msg.topic != topic:
        return None, f"{said}, which holds a message of topic {msg.topic}"
    return msg, None


async def _by_client_id(router: TierRouter, msg_id: str, topics: Sequence[str]) -> list[FoundMessage]:
    """Every message of ``topics`` whose UNIQ_KEY is ``msg_id``, from both tiers."""
    gate = asyncio.Semaphore(CONCURRENT_TOPICS)

    async def one(topic: str) -> list[FoundMessage]:
        sources: dict[tuple[int, int], Tier] = {}
        async with gate:
            hits = await router.query(topic, msg_id, CLIENT_CANDIDATES, 0, _NEWEST, sources=sources)
        return [
            FoundMessage(m, sources[(m.queue_id, m.queue_offset)], "client")
            for m in hits
            if m.uniq_key == msg_id
        ]

    return [hit for hits in await asyncio.gather(*(one(t) for t in topics)) for hit in hits]
