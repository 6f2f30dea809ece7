"""Request and response bodies of the HTTP API (they are the OpenAPI schema, so describe them well).

Bodies travel as base64 strings because JSON has no bytes type. Request bodies are parsed with
``model_validate_json`` straight from the raw bytes, so pydantic-core decodes JSON *and* base64
in Rust in one pass (``val_json_bytes="base64"``) — for a 64 × 1 KiB batch that is three times
faster than ``json.loads`` + validation + :mod:`binascii`, and the produce path is dominated by
exactly this. Both base64 alphabets (standard and URL-safe) are accepted, padding optional;
anything else is a 400 ``invalid_argument`` naming the message (see :mod:`tierd.service.errors`).

Limits that only the store can know (``store.max_message_size``, ``store.max_queues``) are
enforced by the store; limits of the HTTP layer itself (batch size, ``max``) are constants here
and in docs/http.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from tierd.inventory import SegmentRow
from tierd.message import GetStatus, Message
from tierd.store import MAX_GET_COUNT

if TYPE_CHECKING:
    from tierd.consumption.groups import GroupInfo
    from tierd.format.message_ext import MessageExt
    from tierd.inventory import QueueInfo
    from tierd.lookup import FoundMessage
    from tierd.message import GetResult, PutResult
    from tierd.store import TierReport
    from tierd.topics import TopicInfo

#: Messages per batch request (RocketMQ bounds a batch by bytes; we bound both).
MAX_BATCH_MESSAGES = 1024
#: ``max`` of a queue read (the store's own per-call cap).
MAX_GET = MAX_GET_COUNT
#: ``max`` of a key query.
MAX_QUERY = 1024
#: Largest offset / timestamp accepted (Java's ``Long.MAX_VALUE``, like the store).
MAX_INT64 = 2**63 - 1
#: Topic names as the store accepts them (docs/limits.md).
TOPIC_PATTERN = r"^[A-Za-z0-9_%|-]{1,255}$"

_BASE64_SCHEMA = {"type": "string", "contentEncoding": "base64"}
#: A body as clients send it: decoded to bytes while parsing (see the module docstring).
Base64In = Annotated[
    bytes,
    WithJsonSchema(_BASE64_SCHEMA),
    Field(
        description="Message body in base64 (RFC 4648 standard or URL-safe alphabet, padding "
        "optional). Empty string = empty body."
    ),
]
#: A body as the server returns it: standard base64 with padding.
Base64 = Annotated[str, WithJsonSchema(_BASE64_SCHEMA), Field(description="Message body, standard base64.")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Request(BaseModel):
    """Request bodies are validated strictly: ``false`` is not a flag of 0 and ``"1"`` is not a
    queue id — a client sending the wrong type has a bug worth a 422, not a silent coercion.
    Parse them with ``model_validate_json`` (JSON mode is where bytes fields decode base64)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, val_json_bytes="base64")


class MessageIn(_Request):
    """One message to produce."""

    body: Base64In
    keys: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Keys indexed for `GET /v1/topics/{topic}/keys/{key}`; non-empty, no spaces.",
        examples=[["order-1"]],
    )
    tags: str | None = Field(None, description="RocketMQ tags (used for filtering by consumers).")
    properties: dict[str, str] = Field(
        default_factory=dict, description="User properties; names and values without the bytes 0x01/0x02."
    )
    queue_id: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Target queue; omitted: the store picks one round-robin "
        "(below `store.max_queues`, else 400 `invalid_queue`).",
    )
    flag: int = Field(0, ge=-(2**31), le=2**31 - 1, description="RocketMQ user flag (int32).")
    message_group: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="Message group (RocketMQ FIFO group, a sharding key): every message of a group "
        "goes to one queue, in order (docs/topics.md). Not together with `queue_id`.",
    )
    deliver_at: int | None = Field(
        None,
        ge=0,
        description="Scheduled message (docs/scheduled.md): visible in the topic at this time "
        "(ms since the epoch), not before; in the future, at most `scheduled.max_delay` ahead "
        "(else 400 `invalid_delivery_time`). Single produce only.",
    )
    delay_level: int | None = Field(
        None,
        description="Scheduled message after RocketMQ delay level 1–18 (`scheduled.delay_levels`: "
        "1s 5s 10s 30s 1m … 2h). Not together with `deliver_at`.",
    )

    @model_validator(mode="after")
    def _one_target(self) -> MessageIn:
        if self.message_group is not None and self.queue_id is not None:
            raise ValueError("set queue_id or message_group, not both")
        return self

    def to_message(self, topic: str, queue_id: int | None = None) -> Message:
        """The message; ``queue_id``: the queue its message group maps to."""
        return Message(
            topic=topic,
            body=self.body,
            queue_id=self.queue_id if queue_id is None else queue_id,
            keys=self.keys,
            tags=self.tags,
            properties=self.properties,
            flag=self.flag,
        )


class ScheduledOut(_Model):
    """A scheduled message, stored durably: where it will be, when, and how to recall it."""

    handle: str = Field(description="`DELETE /v1/scheduled/{handle}` recalls it before it is due.")
    deliver_at: int = Field(description="When it becomes visible in its topic (ms since the epoch).")
    msg_id: str = Field(description="Its UNIQ_KEY (client message id), which the delivered copy keeps.")
    topic: str


class RecallOut(_Model):
    """What a recall did."""

    handle: str
    recalled: bool = Field(description="True: this call recalled it; false: it was recalled already.")


class BatchIn(_Request):
    """Messages produced in one store call (one commitlog append; all-or-nothing validation)."""

    messages: list[MessageIn] = Field(
        min_length=1, max_length=MAX_BATCH_MESSAGES, description=f"1 to {MAX_BATCH_MESSAGES} messages."
    )


class PutOut(_Model):
    """Where an acknowledged message landed."""

    queue_id: int
    queue_offset: int = Field(description="Offset of the message in its queue (what consumers read by).")
    commitlog_offset: int = Field(description="Physical offset in the hot commitlog.")
    msg_id: str = Field(description="Offset message id (store host + commitlog offset, hex).")

    @classmethod
    def of(cls, r: PutResult) -> PutOut:
        return cls(
            queue_id=r.queue_id,
            queue_offset=r.queue_offset,
            commitlog_offset=r.commitlog_offset,
            msg_id=r.msg_id,
        )


class BatchOut(_Model):
    count: int = Field(description="Messages stored (all of them: a batch is accepted or refused whole).")
    results: list[PutOut] = Field(description="One entry per message, in request order.")


class MessageOut(_Model):
    """A stored message as read back (RocketMQ's MessageExt)."""

    topic: str
    queue_id: int
    queue_offset: int
    body: Base64
    keys: list[str]
    tags: str | None
    properties: dict[str, str] = Field(description="All properties, including KEYS, TAGS and UNIQ_KEY.")
    msg_id: str
    store_timestamp: int = Field(description="Milliseconds since the epoch, when the store wrote it.")
    born_timestamp: int = Field(description="Milliseconds since the epoch, as the producer stamped it.")
    born_host: str
    store_host: str
    commitlog_offset: int = Field(
        description="PHYSICALOFFSET: hot commitlog offset, or the queue's flat commitlog offset when "
        "served from the cold tier."
    )
    size: int = Field(description="Record size in bytes.")
    flag: int
    sys_flag: int
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int

    @classmethod
    def of(cls, m: MessageExt) -> dict[str, Any]:
        """A plain dict (not a model instance): reads return thousands of these, and the response
        model validates them once anyway."""
        return m.to_json()


class LostRangeOut(_Model):
    """Queue offsets lost to damage in the bucket (docs/tiering.md, "Damage in the bucket")."""

    first: int = Field(description="The first lost queue offset.")
    end: int = Field(description="One past the last lost queue offset: where the queue reads on.")


class GetOut(_Model):
    """Result of a queue read, with RocketMQ's GetMessageStatus semantics."""

    status: GetStatus = Field(
        description="FOUND, or why nothing was returned (see docs/reading.md); always HTTP 200."
    )
    messages: list[MessageOut]
    next_offset: int = Field(description="Where to continue reading.")
    min_offset: int = Field(description="Smallest readable offset across both tiers.")
    max_offset: int = Field(description="One past the largest readable offset across both tiers.")
    source: Literal["hot", "cold"] = Field(description="The tier that served the read.")
    lost: LostRangeOut | None = Field(
        default=None,
        description="With `OFFSET_FOUND_NULL` at an offset lost to damage in the bucket: the whole "
        "lost range (`next_offset` stays at the offset; skipping is the consumer's decision).",
    )

    @classmethod
    def of(cls, r: GetResult) -> dict[str, Any]:
        return {
            "status": r.status,
            "messages": [MessageOut.of(m) for m in r.messages],
            "next_offset": r.next_offset,
            "min_offset": r.min_offset,
            "max_offset": r.max_offset,
            "source": r.source,
            "lost": None if r.lost is None else {"first": r.lost[0], "end": r.lost[1]},
        }


class MessageLookupOut(_Model):
    """`GET /v1/messages/{id}`: the one message the id names, and how it was found."""

    id: str = Field(description="The id looked up.")
    matched: Literal["offset", "client"] = Field(
        description="`offset`: the id is the message's offset id (its hot commitlog position); "
        "`client`: its client id (UNIQ_KEY)."
    )
    tier: Literal["hot", "cold"] = Field(description="The tier the message was read from.")
    message: MessageOut

    @classmethod
    def of(cls, msg_id: str, found: FoundMessage) -> dict[str, Any]:
        return {
            "id": msg_id,
            "matched": found.matched,
            "tier": found.tier,
            "message": MessageOut.of(found.message),
        }


class QueryNextOut(_Model):
    """Where the next page of a key query starts: send these as query parameters."""

    end: int = Field(description="The `end` to ask for (the store time of the last message given).")
    skip: int = Field(description="The `skip` to ask for (messages at that time already given).")


class QueryOut(_Model):
    messages: list[MessageOut] = Field(
        description="Messages whose keys really contain the key, newest first (hash collisions "
        "never produce a wrong result)."
    )
    next: QueryNextOut | None = Field(
        None,
        description="Set when the answer stopped at `server.max_read_bytes` before `max` messages: "
        "the parameters that continue after it (null: nothing left within `max`).",
    )


class TopicOut(_Model):
    name: str
    queues: list[int] = Field(description="Queue ids known to either tier.")


class TopicsOut(_Model):
    topics: list[TopicOut]


class TopicCreateIn(_Request):
    """A topic to create (docs/topics.md)."""

    name: str = Field(pattern=TOPIC_PATTERN, description="Topic name (1-255 of A-Z a-z 0-9 _ % | -).")
    queues: int | None = Field(None, ge=1, description="Queue count (default `store.default_queues`).")
    cold_retention_hours: float | None = Field(
        None, gt=0, description="Cold retention (default `tiered.file_reserved_time`)."
    )


class TopicUpdateIn(_Request):
    """What to change; omitted fields stay as they are."""

    queues: int | None = Field(None, ge=1, description="New queue count: only grows (else 400).")
    cold_retention_hours: float | Literal["default"] | None = Field(
        None, description='Hours, or `"default"`: back to `tiered.file_reserved_time`.'
    )
    hot_retention_hours: float | None = Field(
        None,
        description="Refused (400 `invalid_argument`): hot retention is store-wide "
        "(`store.file_reserved_time`), the commitlog being shared by every topic (docs/topics.md).",
    )
    table: str | None = Field(
        None,
        description="Refused (400 `invalid_argument`): a topic opts in to its Iceberg table in the "
        'configuration (`[topics.<name>] table = "iceberg"`, read at start; docs/table.md).',
    )


class TopicQueueOut(_Model):
    """One queue's readable offsets per tier (null: nothing in that tier)."""

    queue_id: int
    hot_min_offset: int | None
    hot_max_offset: int | None
    cold_min_offset: int | None
    cold_max_offset: int | None


class TopicDetailOut(_Model):
    """`GET /v1/topics/{topic}`: settings, sizes and ranges in both tiers."""

    name: str
    queues: int = Field(description="Queues producers (and message groups) spread over.")
    origin: Literal["created", "config", "auto"]
    hot_retention_hours: float = Field(description="`store.file_reserved_time` (the commitlog is shared).")
    cold_retention_hours: float | None = Field(description="null without a cold tier.")
    cold_retention_own: bool = Field(description="The topic's own cold retention (not the default).")
    hot_messages: int
    cold_messages: int
    cold_bytes: int
    queue_ranges: list[TopicQueueOut]

    @classmethod
    def of(cls, info: TopicInfo) -> TopicDetailOut:
        return cls.model_validate(info.as_dict())


class TopicDeletedOut(_Model):
    topic: str
    deleted: bool


class QueueOut(_Model):
    """One queue across both tiers (readable offsets are [min_offset, max_offset))."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    hot_min_offset: int
    hot_max_offset: int
    cold_min_offset: int | None = Field(description="None when the queue was never tiered.")
    cold_max_offset: int | None
    pending_messages: int = Field(description="Messages in the hot store not yet committed cold.")

    @classmethod
    def of(cls, q: QueueInfo) -> QueueOut:
        return cls(**q.as_dict())


class QueuesOut(_Model):
    topic: str
    queues: list[QueueOut]


class SegmentOut(SegmentRow):
    """One cold segment (commitlog, consume queue or index): the inventory's row, which is the
    bucket manifest's segment record plus its location."""

    @classmethod
    def of(cls, s: SegmentRow) -> SegmentOut:
        return cls(**s.model_dump())


class SegmentsOut(_Model):
    segments: list[SegmentOut]


class QueueTierOut(_Model):
    """One queue of a tiering call: what it committed, what still waits."""

    topic: str
    queue_id: int
    committed: int = Field(description="Messages this call made readable in the cold tier.")
    pending: int = Field(description="Messages still waiting for the cold tier after the call.")


class TierOut(_Model):
    committed: int = Field(description="Messages committed to the cold tier by this call.")
    pending: int = Field(0, description="Messages still waiting for the cold tier (arrived meanwhile).")
    queues: list[QueueTierOut] = Field(
        default_factory=list,
        description="Every queue that committed something or still has pending messages.",
    )

    @classmethod
    def of(cls, report: TierReport) -> TierOut:
        return cls.model_validate(report.as_dict())


class GcOut(_Model):
    """What `POST /v1/admin/gc` deleted."""

    hot_files: int = Field(description="Hot commitlog files deleted (only files already in the cold tier).")
    cold_segments: int = Field(description="Cold segments deleted (older than their topic's reserve time).")


class VerifyProblemOut(_Model):
    area: str = Field(
        description="hot-commitlog, metadata, cold-segment, manifest, … (docs/cli.md, `verify`)."
    )
    where: str = Field(description="A file, a segment or object path, or `topic/queue@offset`.")
    message: str
    fix: str | None = Field(description="What `tierd verify --repair` does about it (stopped store).")
    fixed: bool


class VerifyOut(_Model):
    """`tierd verify`'s report (`VerifyReport.as_dict()`): what was checked and every problem."""

    ok: bool = Field(description="No problem left.")
    records: int
    units: int
    segments: int
    bytes: int
    counts: dict[str, int] = Field(description="Problems left per area.")
    problems: list[VerifyProblemOut]
    repairs: list[str] = Field(description="Always empty here: repairs need the stopped store.")


class ProblemOut(_Model):
    """An error as `/v1/status` reports it (the shape of an error response)."""

    error: str
    message: str
    detail: dict[str, Any]


class OwnerOut(_Model):
    """The store that owns a cold-tier prefix (its owner record; docs/tiering.md)."""

    store_id: str
    host: str
    pid: int
    epoch: int = Field(description="Takeovers bump it; the highest epoch owns the prefix.")
    since: str = Field(description="When it claimed the prefix (ISO 8601, UTC).")
    claimed_at: int = Field(description="The same, in ms since the epoch.")
    store_dir: str
    reason: Literal["claim", "takeover"]
    previous_store_id: str | None


class OwnershipOut(_Model):
    prefix: str = Field(description="The `{cluster}/{broker}` prefix of the cold tier.")
    owner: OwnerOut | None = Field(description="Its owner as last seen (None: not known yet).")
    store_id: str | None = Field(description="This store's id.")
    epoch: int | None = Field(description="This store's epoch (None until it owns the prefix).")
    owned_by_this_store: bool
    error: ProblemOut | None = Field(description="`prefix_owned` when another store owns the prefix.")


class BackendOut(_Model):
    url: str
    reachable: bool | None = Field(
        description="Whether the last backend call got an answer (None: no call made yet)."
    )
    last_success: int | None = Field(description="Time of the last answered call (ms since the epoch).")
    last_failure: int | None = Field(description="Time of the last failed or timed-out call.")
    calls: int
    failures: int
    timeouts: int
    capabilities: dict[str, Any] | None = Field(
        description="The driver's capability check (S3: the probe's verdict per feature and the "
        "write policy it chose, see drivers.md); None before the first check or for drivers "
        "without one."
    )


class LagOut(_Model):
    messages: int = Field(description="Acknowledged messages not yet in the cold tier (all queues).")
    seconds: float = Field(description="Age of the oldest of them (0 when caught up).")


class RecentErrorOut(_Model):
    first: int = Field(description="First occurrence (ms since the epoch).")
    last: int = Field(description="Last occurrence.")
    operation: str
    code: str
    message: str
    count: int = Field(description="Identical consecutive occurrences.")


class DamagedQueueOut(_Model):
    """A queue whose cold files are damaged: fenced, every other queue works (docs/tiering.md)."""

    topic: str
    queue_id: int
    first: int = Field(description="First queue offset lost from the cold tier.")
    end: int = Field(description="Queue offset after the last one lost.")
    messages: int = Field(description="Messages lost from the cold tier (`end - first`).")
    loaded: bool = Field(description="The queue loaded and serves the offsets before `first`.")
    error: str
    message: str


class TieringStatusOut(_Model):
    ready: bool = Field(description="Prefix claimed and flat files loaded: the cold tier serves and tiers.")
    metadata_loaded: bool = Field(description="Local tiering metadata read (what `/readyz` needs).")
    start_error: ProblemOut | None = Field(description="Why the cold tier has not started (None once ready).")
    backend: BackendOut
    ownership: OwnershipOut
    damaged: list[DamagedQueueOut] = Field(
        default_factory=list, description="Fenced queues with damaged cold files (empty: none)."
    )
    last_commit: int | None = Field(description="Last successful commit (ms since the epoch).")
    lag: LagOut
    errors: list[RecentErrorOut] = Field(description="Recent errors, newest last.")


class ServiceStatusOut(_Model):
    """`GET /v1/status`: backend health, ownership and lag — what alerts should watch."""

    status: Literal["ok", "starting", "degraded"] = Field(
        description="`ok`; `starting` while the store or the cold tier opens; `degraded` when the "
        "backend does not answer, another store owns the prefix, or the cold tier cannot start."
    )
    store_open: bool
    draining: bool
    cold_tier_down: ProblemOut | None = Field(
        None,
        description="Why the cold tier cannot start until an operator acts (another store owns the "
        "prefix, missing or corrupt tiering metadata, bad settings): produce is still acknowledged "
        "into the hot store, every read fails and `/readyz` is 503. None otherwise (a backend "
        "outage is retried by itself and shows in `tiering.start_error`).",
    )
    tiering: TieringStatusOut | None = Field(description="None when tiering is disabled.")


class StatusOut(_Model):
    status: Literal["ok", "ready"]


class ErrorOut(_Model):
    """Every error response."""

    error: str = Field(description="Stable machine-readable code, e.g. `invalid_topic`, `draining`.")
    message: str = Field(description="What went wrong, naming the parameter and the value received.")
    detail: dict[str, Any] = Field(description="Structured context (offending value, limits, ...).")


class OffsetForTimeOut(_Model):
    """Seek by time: where a consumer replaying from a point in time starts."""

    topic: str
    queue_id: int
    timestamp: int = Field(description="The time asked for (ms since the epoch).")
    boundary: Literal["lower", "upper"]
    offset: int = Field(
        description="`lower`: first offset stored at or after `timestamp`; `upper`: the last of "
        "those stored exactly then. Before every message: the min offset; after: the max offset."
    )


class EarliestTimeOut(_Model):
    topic: str
    queue_id: int
    earliest_time: int = Field(
        description="Store time (ms) of the first readable message, either tier; -1 when none."
    )


class QueueOffsetOut(_Model):
    topic: str
    queue_id: int
    offset: int


class CommitIn(_Request):
    """A committed offset: the next offset the group will read."""

    offset: int = Field(ge=0, le=MAX_INT64, description="Next offset to read (at most the max offset).")


class ResetIn(_Request):
    """Where to move a group on one topic (every queue, or `queue_id`)."""

    topic: str = Field(pattern=TOPIC_PATTERN)
    to: Literal["earliest", "latest", "timestamp", "offset"] = Field(
        description="`earliest`/`latest` offset of each queue, the first offset stored at or after "
        "`timestamp`, or `offset` (one queue, inside its range)."
    )
    timestamp: int | None = Field(None, ge=0, le=MAX_INT64, description="With `to: timestamp` (ms).")
    offset: int | None = Field(None, ge=0, le=MAX_INT64, description="With `to: offset`.")
    queue_id: int | None = Field(None, ge=0, le=65535, description="Only this queue (needed for `offset`).")


class GroupOffsetsOut(_Model):
    """A group's committed offsets (empty for a group that never committed)."""

    group: str
    offsets: list[QueueOffsetOut]

    @classmethod
    def of(cls, group: str, offsets: dict[tuple[str, int], int]) -> GroupOffsetsOut:
        return cls(
            group=group,
            offsets=[QueueOffsetOut(topic=t, queue_id=q, offset=o) for (t, q), o in sorted(offsets.items())],
        )


class GroupQueueOut(_Model):
    topic: str
    queue_id: int
    committed: int | None = Field(description="None when the group never committed for this queue.")
    min_offset: int
    max_offset: int
    lag: int = Field(description="max_offset − committed (− min_offset when none is committed).")


class GroupOut(_Model):
    group: str
    lag: int = Field(description="Sum over the queues.")
    queues: list[GroupQueueOut] = Field(description="Every queue of each topic the group committed on.")

    @classmethod
    def of(cls, g: GroupInfo) -> GroupOut:
        return cls.model_validate(g.as_dict())


class GroupsOut(_Model):
    groups: list[GroupOut]


class DeletedOut(_Model):
    group: str
    queues: int = Field(description="Committed offsets forgotten.")


#: The ``type`` filter of ``/v1/segments`` (CL/CQ are the CLI's short forms).
SegmentType = Literal["COMMIT_LOG", "CONSUME_QUEUE", "INDEX", "CL", "CQ"]


# --------------------------------------------------------------------------- transactions
class HalfIn(MessageIn):
    """A transaction's half message (docs/transactions.md): a message plus its producer group."""

    producer_group: str = Field(
        min_length=1,
        max_length=255,
        pattern=TOPIC_PATTERN,
        description="The producer group check-backs are addressed to (`GET /v1/transactions`).",
    )

    @model_validator(mode="after")
    def _not_scheduled(self) -> HalfIn:
        if self.deliver_at is not None or self.delay_level is not None:
            raise ValueError("a transactional message cannot be scheduled (deliver_at, delay_level)")
        return self


class HalfOut(_Model):
    """A half message, stored durably and invisible until committed."""

    transaction_id: str = Field(description="What `POST /v1/transactions/{id}/commit` (or rollback) names.")
    msg_id: str = Field(description="Its UNIQ_KEY (client message id), which the committed message keeps.")
    topic: str


class EndOut(_Model):
    """How a transaction ended; a commit says where its message landed."""

    transaction_id: str
    resolution: Literal["COMMIT", "ROLLBACK"]
    message: PutOut | None = Field(None, description="The committed message (null for a rollback).")


class PendingOut(_Model):
    """A transaction waiting for its producer's commit or rollback."""

    transaction_id: str
    producer_group: str
    topic: str
    queue_id: int | None
    msg_id: str = Field(description="Its UNIQ_KEY (client message id).")
    stored_at: int = Field(description="When the half message was stored (ms since the epoch).")
    checks: int = Field(description="Check-backs asked so far (`transactions.check_max` then rolls it back).")


class PendingListOut(_Model):
    transactions: list[PendingOut]


__all__ = [
    "MAX_BATCH_MESSAGES",
    "MAX_GET",
    "MAX_INT64",
    "MAX_QUERY",
    "TOPIC_PATTERN",
    "BatchIn",
    "BatchOut",
    "CommitIn",
    "DeletedOut",
    "EarliestTimeOut",
    "ErrorOut",
    "GetOut",
    "GroupOffsetsOut",
    "GroupOut",
    "GroupQueueOut",
    "GroupsOut",
    "MessageIn",
    "MessageOut",
    "OffsetForTimeOut",
    "PutOut",
    "QueryOut",
    "QueueOffsetOut",
    "QueueOut",
    "QueuesOut",
    "ResetIn",
    "SegmentOut",
    "SegmentType",
    "SegmentsOut",
    "StatusOut",
    "TierOut",
    "TopicOut",
    "TopicsOut",
]
