"""The HTTP API (FastAPI): thin routes over :class:`~tierd.MessageStore` (docs/http.md).

Every route is a few lines that call the facade; validation beyond the schema, limits and error
codes are the store's, so the HTTP API and the Python API cannot disagree. What lives here is
what only a network service needs: readiness while the store is still opening, refusing writes
while draining, the bearer token, the request size limit, metrics, and one error shape.

The app gets its store through a *provider* (a callable returning the store or ``None``)
because the daemon starts listening before recovery finishes — ``/healthz`` and ``/readyz``
must answer while the store is still opening.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, BeforeValidator, ValidationError

from tierd.consumption.subscription import MAX_EXPRESSION_LENGTH

# FastAPI reads route annotations at runtime: this import must stay a real one.
from tierd.errors import InvalidArgumentError, NotReadyError
from tierd.format.message_id import OFFSET_MASK, offset_msg_id_template
from tierd.message import ReadPolicy  # noqa: TC001
from tierd.service.auth import BearerAuthMiddleware, BodyLimitMiddleware
from tierd.service.context import RequestContextMiddleware, bind_route
from tierd.service.errors import (
    CatchAllMiddleware,
    DrainingError,
    error_response,
    install_error_handlers,
    problem,
)
from tierd.service.guards import HostGuardMiddleware, HostPolicy, JsonOnlyMiddleware
from tierd.service.metrics import HttpMetricsMiddleware, ServiceMetrics
from tierd.service.schemas import (
    MAX_GET,
    MAX_INT64,
    MAX_QUERY,
    TOPIC_PATTERN,
    BatchIn,
    BatchOut,
    CommitIn,
    DeletedOut,
    EarliestTimeOut,
    EndOut,
    ErrorOut,
    GcOut,
    GetOut,
    GroupOffsetsOut,
    GroupOut,
    GroupsOut,
    HalfIn,
    HalfOut,
    MessageIn,
    MessageLookupOut,
    MessageOut,
    OffsetForTimeOut,
    PendingListOut,
    PendingOut,
    ProblemOut,
    PutOut,
    QueryOut,
    QueueOffsetOut,
    QueueOut,
    QueuesOut,
    RecallOut,
    ResetIn,
    ScheduledOut,
    SegmentOut,
    SegmentsOut,
    SegmentType,
    ServiceStatusOut,
    StatusOut,
    TieringStatusOut,
    TierOut,
    TopicCreateIn,
    TopicDeletedOut,
    TopicDetailOut,
    TopicOut,
    TopicsOut,
    TopicUpdateIn,
    VerifyOut,
)
from tierd.store import byte_bounded_count
from tierd.topics import queue_for_group, refuse_table_opt_in

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tierd.config import TierdConfig
    from tierd.store import MessageStore

MiB = 1 << 20


def request_limit(max_message_size: int) -> int:
    """Largest request body accepted: room for one largest message in base64 (4/3) plus JSON,
    and never less than 16 MiB so ordinary batches fit whatever the message limit."""
    return max(16 * MiB, 2 * max_message_size)


class Service:
    """Per-app state the routes share: the store (once open), draining, in-flight writes."""

    def __init__(self, cfg: TierdConfig, store: Callable[[], MessageStore | None]) -> None:
        self.cfg = cfg
        self._provider = store
        self.draining = False
        self.metrics = ServiceMetrics(store, lambda: self.draining)
        self._writes = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def writes_in_flight(self) -> int:
        return self._writes

    def store(self) -> MessageStore:
        """The open store, or a 503 ``not_ready`` while it is still opening (or already closed)."""
        store = self._provider()
        if store is None or store.closed:
            raise NotReadyError("the store is not open (still recovering, or shutting down); retry shortly")
        return store

    @contextlib.contextmanager
    def writing(self) -> Iterator[MessageStore]:
        """Scope of one write request: refused while draining, counted so that draining can wait
        until every write that was accepted has been acknowledged."""
        if self.draining:
            raise DrainingError(
                "the server is shutting down and accepts no new writes; retry on another instance"
            )
        store = self.store()
        self._writes += 1
        self._idle.clear()
        try:
            yield store
        finally:
            self._writes -= 1
            if not self._writes:
                self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Refuse new writes and wait (at most ``timeout`` s) for those in flight; True when idle.
        Long polls end at once (with what they have), and new reads no longer wait."""
        self.draining = True
        store = self._provider()
        if store is not None:
            store.release_waiters()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def readiness(self) -> dict[str, Any]:
        """What ``/readyz`` decides on: can this pod serve its local producers and consumers —
        hot store open, cold metadata loaded, the cold tier not down for good, not draining.
        Deliberately *not* whether the backend answers: an S3 outage must not take every pod out
        of its Service while produce works (backend health is ``GET /v1/status`` and the
        metrics, where alerts belong). A cold tier that cannot start until an operator acts
        (``cold_tier_down``) is different: every read fails, so the pod cannot serve its
        consumers, however long one waits."""
        store = self._provider()
        is_open = store is not None and not store.closed
        cold_stats = store.stats.cold if is_open and store is not None else None
        cold = cold_stats is None or cold_stats.metadata_loaded
        down = store.cold_failure if is_open and store is not None else None
        return {
            "store_open": is_open,
            "cold_metadata_loaded": is_open and cold,
            "cold_tier_down": None if down is None else problem(down),
            "draining": self.draining,
        }

    def status(self) -> ServiceStatusOut:
        """``GET /v1/status``: backend health, ownership and lag (see :class:`ServiceStatusOut`)."""
        store = self._provider()
        is_open = store is not None and not store.closed
        report = store.tiering_status() if store is not None and is_open else None
        tiering = TieringStatusOut.model_validate(report) if report is not None else None
        if not is_open:
            state: Literal["ok", "starting", "degraded"] = "starting"
        elif tiering is None:
            state = "ok"
        elif tiering.ownership.error is not None or tiering.backend.reachable is False or tiering.start_error:
            state = "degraded"
        else:
            state = "ok" if tiering.ready else "starting"
        down = store.cold_failure if store is not None and is_open else None
        return ServiceStatusOut(
            status=state,
            store_open=is_open,
            draining=self.draining,
            cold_tier_down=None if down is None else ProblemOut.model_validate(problem(down)),
            tiering=tiering,
        )


async def _service(request: Request) -> Service:
    # async on purpose: FastAPI runs a sync dependency in a worker thread (a thread hop per request).
    svc: Service = request.app.state.service
    return svc


Svc = Annotated[Service, Depends(_service)]
Topic = Annotated[
    str,
    Path(pattern=TOPIC_PATTERN, description="Topic name: 1–255 characters from A-Z a-z 0-9 _ % | -."),
]
_DECIMAL = re.compile(r"-?[0-9]+")


def _decimal_text(value: object) -> object:
    """Integers in paths and query strings must be written as decimal integers: pydantic's lax
    parsing would also take ``0.0``, `` 1``, ``+1`` or ``1_000``, which the schema (type
    integer) does not allow — accepting them silently reads the wrong thing for a typo."""
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        raise ValueError(f"must be a decimal integer, got {value!r}")
    return value


#: An integer path or query parameter (see :func:`_decimal_text`).
IntText = BeforeValidator(_decimal_text)
QueueId = Annotated[int, IntText, Path(ge=0, le=65535, description="Queue id (below `store.max_queues`).")]


_Body = TypeVar("_Body", bound=BaseModel)


async def _parse(request: Request, model: type[_Body]) -> _Body:
    """Validate the raw request body with ``model_validate_json`` (one pass in pydantic-core:
    JSON, schema and base64 bodies; see :mod:`tierd.service.schemas`). Errors take the same path
    as FastAPI's own validation errors."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        errors = [
            {**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False, include_input=False)
        ]
        raise RequestValidationError(errors) from None


def _request_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a route that parses its body itself (see :func:`_parse`)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can return (all share :class:`ErrorOut`)."""
    meaning = {
        400: "Invalid argument (bad topic, properties, base64 body, queue id...).",
        401: "Missing or wrong bearer token (only when `server.token` is set).",
        404: "Unknown topic (or route).",
        409: "Another store owns the cold tier's bucket prefix (`prefix_owned`).",
        413: "Message or request body too large.",
        422: "Request does not match the schema.",
        415: "A write without `Content-Type: application/json` (browsers cannot send that cross-site).",
        421: "The `Host` header names another server (DNS-rebinding guard; see `server.allowed_hosts`).",
        500: "Unexpected server error (details only in the server log).",
        502: "The cold-tier backend failed (or could not commit what was pending).",
        503: "Not ready (store opening, cold tier unreachable) or draining for shutdown.",
        507: "Hot store full: writes refused until space frees.",
    }
    return {s: {"model": ErrorOut, "description": meaning[s]} for s in sorted({401, 421, 500, *statuses})}


router = APIRouter()
WRITE_ERRORS = _errors(400, 413, 415, 422, 503, 507)
READ_ERRORS = _errors(400, 422, 502, 503)


@router.post(
    "/v1/topics/{topic}/messages",
    response_model=PutOut | ScheduledOut,
    tags=["produce"],
    summary="Produce one message",
    responses=WRITE_ERRORS,
    openapi_extra=_request_body(MessageIn),
)
async def produce(topic: Topic, request: Request, svc: Svc) -> PutOut | ScheduledOut:
    """Append one message to the hot store; returns once it is acknowledged (after fsync when
    `store.flush = "sync"`). Without `queue_id` the store picks a queue round-robin; with
    `message_group`, the group's queue (one queue per group: its messages stay in order). With
    `deliver_at` or `delay_level` the message is scheduled (docs/scheduled.md): stored now,
    visible in the topic at that time, and the answer is its handle."""
    message = await _parse(request, MessageIn)
    with svc.writing() as store:
        group = message.message_group
        qid = store.group_queue(topic, group) if group is not None else None
        if message.deliver_at is not None or message.delay_level is not None:
            r = await store.schedule(
                message.to_message(topic, qid), deliver_at=message.deliver_at, delay_level=message.delay_level
            )
            return ScheduledOut(handle=r.handle, deliver_at=r.deliver_at, msg_id=r.msg_id, topic=r.topic)
        return PutOut.of(await store.put(message.to_message(topic, qid)))


@router.delete(
    "/v1/scheduled/{handle}",
    response_model=RecallOut,
    tags=["produce"],
    summary="Recall a scheduled message before it is due",
    responses=_errors(404, 409, 415, 422, 503),
)
async def recall(handle: Annotated[str, Path(max_length=64)], svc: Svc) -> RecallOut:
    """Cancel the scheduled message `handle` names (RocketMQ 5.3 RecallMessage); durable when
    answered. 404 `unknown_handle` for a handle this store never gave out; 409
    `already_delivered` once it is in its topic."""
    with svc.writing() as store:
        return RecallOut(handle=handle, recalled=await store.recall(handle))


TransactionId = Annotated[
    str, Path(min_length=1, max_length=128, description="The id the half message's answer gave.")
]


@router.post(
    "/v1/topics/{topic}/transactions",
    response_model=HalfOut,
    tags=["produce"],
    summary="Send a transaction's half message",
    responses=WRITE_ERRORS,
    openapi_extra=_request_body(HalfIn),
)
async def put_half(topic: Topic, request: Request, svc: Svc) -> HalfOut:
    """Store a half message (docs/transactions.md): durable when answered, invisible in `topic`
    until `POST /v1/transactions/{id}/commit`. Left unresolved, it is listed by
    `GET /v1/transactions?producer_group=…&due=true` for its producer to answer, and rolled back
    after `transactions.check_max` check-backs."""
    body = await _parse(request, HalfIn)
    with svc.writing() as store:
        group = body.message_group
        qid = store.group_queue(topic, group) if group is not None else None
        r = await store.put_half(body.to_message(topic, qid), producer_group=body.producer_group)
        return HalfOut(transaction_id=r.transaction_id, msg_id=r.uniq_key, topic=r.topic)


async def _end(svc: Service, transaction_id: str, resolution: str) -> EndOut:
    with svc.writing() as store:
        r = await store.end_transaction(transaction_id, resolution)
    put = PutOut.of(r.put) if r.put is not None else None
    return EndOut(transaction_id=r.transaction_id, resolution=r.resolution.value, message=put)


@router.post(
    "/v1/transactions/{transaction_id}/commit",
    response_model=EndOut,
    tags=["produce"],
    summary="Commit a transaction: its message becomes visible, once",
    responses=_errors(404, 409, 415, 422, 503, 507),
)
async def commit_transaction(transaction_id: TransactionId, svc: Svc) -> EndOut:
    """Durable when answered. 404 `unknown_transaction`; 409 `transaction_resolved` when it
    already ended (`detail.resolution` says how: a retried commit learns it did commit)."""
    return await _end(svc, transaction_id, "COMMIT")


@router.post(
    "/v1/transactions/{transaction_id}/rollback",
    response_model=EndOut,
    tags=["produce"],
    summary="Roll a transaction back: its message is never visible",
    responses=_errors(404, 409, 415, 422, 503, 507),
)
async def rollback_transaction(transaction_id: TransactionId, svc: Svc) -> EndOut:
    """Durable when answered; errors as for commit."""
    return await _end(svc, transaction_id, "ROLLBACK")


@router.get(
    "/v1/transactions",
    response_model=PendingListOut,
    tags=["produce"],
    summary="Pending transactions (the check-back poll)",
    responses=_errors(400, 422, 503),
)
async def pending_transactions(
    svc: Svc,
    producer_group: Annotated[str | None, Query(pattern=TOPIC_PATTERN)] = None,
    due: bool = False,
) -> PendingListOut:
    """Transactions waiting for a commit or rollback, oldest first. An HTTP producer polls with
    its `producer_group` and `due=true` (older than `transactions.transaction_timeout`) and
    answers each with commit or rollback: that is its check-back."""
    store = svc.store()
    pending = await store.pending_transactions(producer_group, due=due)
    return PendingListOut(
        transactions=[
            PendingOut(
                transaction_id=p.transaction_id,
                producer_group=p.producer_group,
                topic=p.topic,
                queue_id=p.queue_id,
                msg_id=p.uniq_key,
                stored_at=p.stored_at,
                checks=p.checks,
            )
            for p in pending
        ]
    )


@router.post(
    "/v1/topics/{topic}/messages:batch",
    response_model=BatchOut,
    tags=["produce"],
    summary="Produce a batch of messages",
    responses=WRITE_ERRORS,
    openapi_extra=_request_body(BatchIn),
)
async def produce_batch(topic: Topic, request: Request) -> Response:
    """Append 1–1024 messages in one store call (the fast path: one commitlog append). The batch
    is validated whole: one bad message refuses all of them. Messages without `queue_id` all go
    to one queue picked round-robin; messages with a `message_group` to their group's queue."""
    svc: Service = request.app.state.service  # not a dependency: this is the hot path
    batch = await _parse(request, BatchIn)
    if any(m.deliver_at is not None or m.delay_level is not None for m in batch.messages):
        raise InvalidArgumentError(
            "a batch cannot hold scheduled messages (deliver_at, delay_level): produce each one "
            "with POST /v1/topics/{topic}/messages"
        )
    with svc.writing() as store:
        n = store.queue_count(topic) if any(m.message_group is not None for m in batch.messages) else 0
        messages = [
            m.to_message(topic, None if m.message_group is None else queue_for_group(m.message_group, n))
            for m in batch.messages
        ]
        res = await store.put_batch(messages)
    # JSON text straight from the result's columns: building PutResult objects or dicts and
    # serialising them would cost more than the append itself. Only integers and hex digits go
    # in, so nothing needs escaping (BatchOut documents the shape; a test parses it).
    msg_id = offset_msg_id_template(store.hot.store_host)  # "%016X" % (offset & OFFSET_MASK)
    row = '{"queue_id":%d,"queue_offset":%d,"commitlog_offset":%d,"msg_id":"' + msg_id + '"}'
    body = ",".join(
        [
            row % (q, o, p, p & OFFSET_MASK)
            for q, o, p in zip(
                res.queue_ids.tolist(),
                res.queue_offsets.tolist(),
                res.commitlog_offsets.tolist(),
                strict=True,
            )
        ]
    )
    return Response(f'{{"count":{len(res)},"results":[{body}]}}', media_type="application/json")


@router.get(
    "/v1/topics/{topic}/queues/{queue}/messages",
    response_model=GetOut,
    tags=["consume"],
    summary="Read a queue from an offset",
    responses=READ_ERRORS,
)
async def consume(
    topic: Topic,
    queue: QueueId,
    svc: Svc,
    offset: Annotated[int, IntText, Query(ge=0, le=MAX_INT64, description="First queue offset to read.")] = 0,
    max: Annotated[
        int, IntText, Query(ge=1, le=MAX_GET, description=f"At most this many messages (≤ {MAX_GET}).")
    ] = 32,
    policy: Annotated[
        ReadPolicy | None,
        Query(
            description="Which tier serves the read; default `tiered.storage_level` (see docs/reading.md)."
        ),
    ] = None,
    tags: Annotated[
        str | None,
        Query(
            max_length=MAX_EXPRESSION_LENGTH,
            description="Subscription expression: `paid || refunded`, or `*` (default) for every "
            "message. Other messages are skipped without being read; `next_offset` moves past them "
            "and a read where nothing matched answers `NO_MATCHED_MESSAGE`. A bad expression is a "
            "400 `invalid_subscription`.",
        ),
    ] = None,
    wait_ms: Annotated[
        int,
        IntText,
        Query(
            ge=0,
            le=MAX_INT64,
            description="Long poll: when caught up, wait up to this many ms (≤ `server.long_poll_max_ms`) "
            "and return as soon as a matching message arrives; empty when the wait ends.",
        ),
    ] = 0,
) -> dict[str, Any]:
    """Messages from `offset` on. Nothing found is not an error: `status` says why (RocketMQ's
    GetMessageStatus) and `next_offset` where to continue. `source` is the tier that served it."""
    store = svc.store()
    wait = 0 if svc.draining else wait_ms
    limit = svc.cfg.server.max_read_bytes
    r = await store.get(topic, queue, offset, max, policy, tags=tags, wait_ms=wait, max_bytes=limit)
    store.traffic.consumed(topic, r.messages)
    return GetOut.of(r)


@router.get(
    "/v1/topics/{topic}/queues/{queue}/offset",
    response_model=OffsetForTimeOut,
    tags=["consume"],
    summary="Seek by time: the offset stored at a time",
    responses=READ_ERRORS,
)
async def offset_for_time(
    topic: Topic,
    queue: QueueId,
    svc: Svc,
    timestamp: Annotated[
        int, IntText, Query(ge=0, le=MAX_INT64, description="Store time, ms since the epoch.")
    ],
    boundary: Annotated[
        Literal["lower", "upper"],
        Query(description="`lower`: first offset stored at/after; `upper`: last stored exactly then."),
    ] = "lower",
) -> OffsetForTimeOut:
    """Where to start a replay from a point in time, across both tiers (the cold part through
    the read-ahead cache): read from the returned offset."""
    offset = await svc.store().offset_for_time(topic, queue, timestamp, boundary)
    return OffsetForTimeOut(
        topic=topic, queue_id=queue, timestamp=timestamp, boundary=boundary, offset=offset
    )


@router.get(
    "/v1/topics/{topic}/queues/{queue}/earliest-time",
    response_model=EarliestTimeOut,
    tags=["consume"],
    summary="Store time of the first readable message",
    responses=READ_ERRORS,
)
async def earliest_time(topic: Topic, queue: QueueId, svc: Svc) -> EarliestTimeOut:
    """How far back the queue reaches, over both tiers (-1 when it holds no message)."""
    return EarliestTimeOut(
        topic=topic, queue_id=queue, earliest_time=await svc.store().earliest_time(topic, queue)
    )


Group = Annotated[
    str,
    Path(pattern=TOPIC_PATTERN, description="Consumer group: 1–255 characters from A-Z a-z 0-9 _ % | -."),
]


@router.get("/v1/groups", response_model=GroupsOut, tags=["groups"], summary="List consumer groups with lag")
async def groups(svc: Svc) -> GroupsOut:
    """Every consumer group with, per queue of the topics it committed on, its committed
    offset, the queue's range and its lag (max offset − committed)."""
    return GroupsOut(groups=[GroupOut.of(g) for g in svc.store().consumer_groups()])


@router.get(
    "/v1/groups/{group}",
    response_model=GroupOut,
    tags=["groups"],
    summary="One consumer group with lag",
    responses=_errors(400, 404, 422, 503),
)
async def group(group: Group, svc: Svc) -> GroupOut:
    """404 when the group has no committed offset."""
    return GroupOut.of(svc.store().consumer_groups(group)[0])


@router.get(
    "/v1/groups/{group}/offsets",
    response_model=GroupOffsetsOut,
    tags=["groups"],
    summary="Committed offsets of a group",
    responses=_errors(400, 422, 503),
)
async def group_offsets(group: Group, svc: Svc) -> GroupOffsetsOut:
    """The offsets the group will read next (an empty list for a group that never committed)."""
    return GroupOffsetsOut.of(group, svc.store().committed_offsets(group))


@router.put(
    "/v1/groups/{group}/topics/{topic}/queues/{queue}/offset",
    response_model=QueueOffsetOut,
    tags=["groups"],
    summary="Commit an offset",
    responses=_errors(400, 404, 422, 503),
    openapi_extra=_request_body(CommitIn),
)
async def commit_offset(
    group: Group, topic: Topic, queue: QueueId, request: Request, svc: Svc
) -> QueueOffsetOut:
    """Record that `group` will read `queue` from `offset` on (the `next_offset` of its last
    read); durable when the response arrives. 400 `offset_out_of_range` beyond the max offset."""
    body = await _parse(request, CommitIn)
    await svc.store().commit_offset(group, topic, queue, body.offset)
    return QueueOffsetOut(topic=topic, queue_id=queue, offset=body.offset)


@router.post(
    "/v1/groups/{group}/reset",
    response_model=GroupOffsetsOut,
    tags=["groups"],
    summary="Reset a group on a topic",
    responses=_errors(400, 404, 422, 503),
    openapi_extra=_request_body(ResetIn),
)
async def reset_group(group: Group, request: Request, svc: Svc) -> GroupOffsetsOut:
    """Move the group to the earliest or latest offset, to a time, or to an offset (one queue,
    inside its range: 400 `offset_out_of_range` otherwise, never a silent clamp). Returns the
    offsets set. Stop the group's consumers first, or they commit over the reset."""
    body = await _parse(request, ResetIn)
    plan = await svc.store().reset_offsets(
        group, body.topic, body.to, timestamp=body.timestamp, offset=body.offset, queue_id=body.queue_id
    )
    return GroupOffsetsOut.of(group, plan)


@router.delete(
    "/v1/groups/{group}",
    response_model=DeletedOut,
    tags=["groups"],
    summary="Forget a consumer group",
    responses=_errors(400, 422, 503),
)
async def delete_group(
    group: Group,
    svc: Svc,
    topic: Annotated[
        str | None, Query(pattern=TOPIC_PATTERN, description="Only this topic's offsets.")
    ] = None,
) -> DeletedOut:
    """Drop the group's committed offsets (all, or one topic's): its lag series disappear and
    it no longer counts against the group limit."""
    return DeletedOut(group=group, queues=await svc.store().delete_group(group, topic))


@router.get(
    "/v1/topics/{topic}/keys/{key}",
    response_model=QueryOut,
    tags=["consume"],
    summary="Find messages by key",
    responses=READ_ERRORS,
)
async def query(
    topic: Topic,
    key: Annotated[
        str,
        Path(
            min_length=1, max_length=4096, description="A key given at produce time, or a message's UNIQ_KEY."
        ),
    ],
    svc: Svc,
    max: Annotated[
        int, IntText, Query(ge=1, le=MAX_QUERY, description=f"At most this many messages (≤ {MAX_QUERY}).")
    ] = 32,
    begin: Annotated[
        int, IntText, Query(ge=0, le=MAX_INT64, description="Earliest store timestamp (ms).")
    ] = 0,
    end: Annotated[
        int, IntText, Query(ge=0, le=MAX_INT64, description="Latest store timestamp (ms).")
    ] = MAX_INT64,
    skip: Annotated[
        int,
        IntText,
        Query(
            ge=0,
            le=MAX_QUERY,
            description="Leave out the first `skip` messages stored exactly at `end` (they came in "
            "the previous page): pass on what `next` says.",
        ),
    ] = 0,
) -> dict[str, Any]:
    """Messages of `topic` carrying `key`, from both tiers, newest first. Like a queue read, one
    answer stops before the message that would take it past `server.max_read_bytes` (the first
    always comes); `next` then holds the `end` and `skip` that continue after it, else null."""
    limit = svc.cfg.server.max_read_bytes
    # Bounded reading: the store stops where this page ends (plus the message after it).
    found = await svc.store().query(topic, key, max + skip, begin, end, max_bytes=limit, skip_at_end=skip)
    page = found[skip:] if all(m.store_timestamp == end for m in found[:skip]) else found
    page = page[:max]
    keep = byte_bounded_count([m.size for m in page], limit)
    nxt: dict[str, int] | None = None
    if keep < len(page):
        last = page[keep - 1].store_timestamp
        at_last = sum(1 for m in page[:keep] if m.store_timestamp == last)
        nxt = {"end": last, "skip": at_last + (skip if last == end else 0)}
    return {"messages": [MessageOut.of(m) for m in page[:keep]], "next": nxt}


@router.get(
    "/v1/messages/{msg_id:path}",
    response_model=MessageLookupOut,
    tags=["consume"],
    summary="Find a message by its id",
    responses=_errors(400, 404, 409, 422, 502, 503),
)
async def message(
    msg_id: Annotated[
        str,
        Path(
            description="An offset id (store host + hot commitlog position, hex: what produce "
            "answers as `msg_id`) or a client id (the message's UNIQ_KEY)."
        ),
    ],
    svc: Svc,
    topic: Annotated[
        str | None,
        Query(
            pattern=TOPIC_PATTERN,
            description="Search only this topic (a client id is otherwise looked up in every topic).",
        ),
    ] = None,
) -> dict[str, Any]:
    """The one message the id names, from either tier, verified (docs/cli.md, `tierd message`):
    an offset id is read at its hot commitlog position — once that has left the hot tier it
    cannot be resolved (404 says so; use the client id); a client id is looked up in both tiers'
    key index. 404 `message_not_found` when none, 409 `ambiguous_message_id` listing them when
    several (a producer's retry stored the id twice)."""
    return MessageLookupOut.of(msg_id, await svc.store().message(msg_id, topic=topic))


@router.get(
    "/v1/topics", response_model=TopicsOut, tags=["admin"], summary="List topics", responses=_errors(503)
)
async def topics(svc: Svc) -> TopicsOut:
    """Every topic with its queue ids, across both tiers."""
    store = svc.store()
    await store.wait_ready()  # both tiers or 503 not_ready: never the hot tier's list alone
    with_data = store.topics()
    return TopicsOut(topics=[TopicOut(name=t, queues=with_data.get(t, [])) for t in store.list_topics()])


@router.post(
    "/v1/topics",
    response_model=TopicDetailOut,
    status_code=201,
    tags=["admin"],
    summary="Create a topic",
    responses=_errors(400, 409, 415, 422, 503),
    openapi_extra=_request_body(TopicCreateIn),
)
async def create_topic(request: Request, svc: Svc) -> TopicDetailOut:
    """Create a topic with its queue count and cold retention (409 `topic_exists` if it is there)."""
    body = await _parse(request, TopicCreateIn)
    info = await svc.store().create_topic(
        body.name, body.queues, cold_retention_hours=body.cold_retention_hours
    )
    return TopicDetailOut.of(info)


@router.get(
    "/v1/topics/{topic}",
    response_model=TopicDetailOut,
    tags=["admin"],
    summary="Describe a topic",
    responses=_errors(400, 404, 422, 503),
)
async def describe_topic(topic: Topic, svc: Svc) -> TopicDetailOut:
    """Queue count, retention in both tiers, sizes, and each queue's offsets per tier."""
    store = svc.store()
    await store.wait_ready()
    return TopicDetailOut.of(store.describe_topic(topic))


@router.patch(
    "/v1/topics/{topic}",
    response_model=TopicDetailOut,
    tags=["admin"],
    summary="Update a topic",
    responses=_errors(400, 404, 415, 422, 503),
    openapi_extra=_request_body(TopicUpdateIn),
)
async def update_topic(topic: Topic, request: Request, svc: Svc) -> TopicDetailOut:
    """Grow the queue count (a smaller one: 400 `queue_count_shrink`) and/or set the cold retention."""
    body = await _parse(request, TopicUpdateIn)
    if body.table is not None:
        refuse_table_opt_in(topic, body.table)
    info = await svc.store().update_topic(
        topic,
        queues=body.queues,
        cold_retention_hours=body.cold_retention_hours,
        hot_retention_hours=body.hot_retention_hours,
    )
    return TopicDetailOut.of(info)


@router.delete(
    "/v1/topics/{topic}",
    response_model=TopicDeletedOut,
    tags=["admin"],
    summary="Delete a topic from both tiers",
    responses=_errors(400, 404, 409, 422, 502, 503),
)
async def delete_topic(
    topic: Topic,
    svc: Svc,
    force: Annotated[
        bool, Query(description="Delete even while a group or a tiering round needs it.")
    ] = False,
) -> TopicDeletedOut:
    """Hot and cold data, manifests, key index entries and the groups' offsets of the topic;
    409 `topic_in_use` while a consumer group has offsets on it or messages wait for tiering,
    unless `force=true`."""
    await svc.store().delete_topic(topic, force=force)
    return TopicDeletedOut(topic=topic, deleted=True)


@router.get(
    "/v1/topics/{topic}/queues",
    response_model=QueuesOut,
    tags=["admin"],
    summary="List a topic's queues",
    responses=_errors(400, 404, 422, 503),
)
async def queues(topic: Topic, svc: Svc) -> QueuesOut:
    """Each queue's offsets in both tiers and how many messages wait to be tiered."""
    store = svc.store()
    await store.wait_ready()
    return QueuesOut(topic=topic, queues=[QueueOut.of(q) for q in store.queues(topic)])


@router.get(
    "/v1/segments",
    response_model=SegmentsOut,
    tags=["admin"],
    summary="List cold segments",
    responses=READ_ERRORS,
)
async def segments(
    svc: Svc,
    topic: Annotated[str | None, Query(pattern=TOPIC_PATTERN, description="Only this topic.")] = None,
    queue: Annotated[int | None, IntText, Query(ge=0, le=65535, description="Only this queue id.")] = None,
    type: Annotated[
        SegmentType | None, Query(description="Only this file type (CL/CQ are short forms).")
    ] = None,
) -> SegmentsOut:
    """Segments of the cold tier as the running store knows them (current to the last commit).
    Empty when tiering is disabled."""
    rows = await svc.store().segments(topic, queue, type)
    return SegmentsOut(segments=[SegmentOut.of(r) for r in rows])


@router.post(
    "/v1/admin/tier",
    response_model=TierOut,
    tags=["admin"],
    summary="Commit everything pending to the cold tier now",
    responses=_errors(409, 415, 502, 503),
)
async def tier(svc: Svc) -> TierOut:
    """Dispatch and commit every queue now instead of waiting for `dispatch_interval`; returns
    once the bytes are on the backend and the bucket manifests are current, with what each queue
    committed. Fails — 502 `backend_error` naming each queue and the backend's error — when
    anything pending could not be committed, and 409 `prefix_owned` when another store owns the
    bucket prefix; never a success that left messages behind."""
    with svc.writing() as store:
        return TierOut.of(await store.tier_now())


@router.post(
    "/v1/admin/gc",
    response_model=GcOut,
    tags=["admin"],
    summary="Apply retention now in both tiers",
    responses=_errors(409, 415, 502, 503),
)
async def gc(svc: Svc) -> GcOut:
    """What the daemon does on its timers, now: hot commitlog files past `file_reserved_time`
    (only once they are in the cold tier) and cold segments past their topic's reserve time. What
    `tierd gc` sends while a daemon holds the store."""
    with svc.writing() as store:
        report = await store.gc()
    return GcOut(hot_files=report.hot_files, cold_segments=report.cold_segments)


@router.post(
    "/v1/admin/verify",
    response_model=VerifyOut,
    tags=["admin"],
    summary="Check the running store and its bucket (read-only)",
    responses=_errors(415, 502, 503),
)
async def verify(svc: Svc) -> VerifyOut:
    """`tierd verify` on the running store: record CRCs, consume queues against the commitlog,
    metadata, cold segment sizes and checksums, manifests, unknown objects, the prefix owner.
    Writes nothing; the answer comes when the check is done (no progress; it reads every byte of
    both tiers). A problem found is a 200 with `ok: false`. Repairs need the stopped store
    (`tierd verify --repair`)."""
    store = svc.store()
    await store.wait_ready()
    return VerifyOut.model_validate((await store.verify()).as_dict())


@router.get(
    "/v1/status",
    response_model=ServiceStatusOut,
    tags=["ops"],
    summary="Backend health, prefix ownership and tiering lag",
    responses=_errors(),
)
async def status(svc: Svc) -> ServiceStatusOut:
    """Whether the cold-tier backend answers (and when it last did), who owns the bucket prefix,
    the last successful commit, how far tiering lags and the recent errors. Always 200 while the
    process serves HTTP: `status` says `ok`, `starting` or `degraded`. Needs the token when one
    is configured."""
    return svc.status()


@router.get(
    "/metrics",
    tags=["ops"],
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}, **_errors()},
)
async def metrics(svc: Svc) -> Response:
    """RocketMQ's tiered-store metric set in Prometheus naming (docs/metrics.md). Needs the token
    when one is configured."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.head("/healthz", include_in_schema=False)
@router.get("/healthz", response_model=StatusOut, tags=["ops"], summary="Liveness")
async def healthz() -> StatusOut:
    """200 while the process serves HTTP (even during recovery or draining). Never needs a token."""
    return StatusOut(status="ok")


@router.head("/readyz", include_in_schema=False)
@router.get(
    "/readyz",
    response_model=StatusOut,
    tags=["ops"],
    summary="Readiness",
    responses={503: {"model": ErrorOut, "description": "Opening, tiering metadata not loaded, or draining."}},
)
async def readyz(svc: Svc) -> Any:
    """200 once this pod can serve its local producers and consumers: recovery finished and (with
    tiering) the local tiering metadata is loaded; 503 before that and while draining. A backend
    outage does not make the pod unready (see `/v1/status`). Never needs a token."""
    state = svc.readiness()
    down = state["cold_tier_down"]
    if state["store_open"] and state["cold_metadata_loaded"] and not state["draining"] and down is None:
        return StatusOut(status="ready")
    if state["draining"]:
        reason = "draining"
    elif not state["store_open"]:
        reason = "opening"
    elif down is not None:
        reason = (
            f"the cold tier cannot start: {down['message']} — produce is still acknowledged into the "
            "hot store, every read fails until this is fixed (docs/http.md, a cold tier that cannot start)"
        )
    else:
        reason = "tiering metadata not loaded"
    return error_response(503, "not_ready", f"not ready: {reason}", state)


DESCRIPTION = """\
tierd's HTTP API: produce and consume messages of a RocketMQ-style store with a tiered (cold)
backend. Bodies travel as base64 in JSON. Every error is JSON
`{"error": code, "message": ..., "detail": {...}}` — never a stack trace.

When `server.token` is set, every route except `/healthz` and `/readyz` needs
`Authorization: Bearer <token>` (401 `unauthorized` otherwise). Writes (every POST) need
`Content-Type: application/json` (415 otherwise) and the `Host` header must name this server
(421 otherwise): browsers cannot drive the API. Limits: see docs/http.md.
"""


def create_app(cfg: TierdConfig, store: MessageStore | Callable[[], MessageStore | None]) -> FastAPI:
    """The ASGI app. ``store`` is the open store, or a provider returning it once open (None
    before: data routes answer 503 ``not_ready``, health routes work)."""
    if callable(store):
        provider = store
    else:
        opened = store

        def provider() -> MessageStore | None:
            return opened

    app = FastAPI(
        title="tierd",
        version="0.1.0",
        description=DESCRIPTION,
        redoc_url=None,
        # The interactive page loads its scripts from a CDN: off unless asked for (server.api_docs).
        docs_url="/docs" if cfg.server.api_docs else None,
        openapi_tags=[
            {"name": "produce", "description": "Append messages to the hot store."},
            {"name": "consume", "description": "Read by queue offset or by key, across both tiers."},
            {"name": "groups", "description": "Consumer groups: committed offsets, lag, resets."},
            {"name": "admin", "description": "Topics, queues, cold segments, tiering."},
            {"name": "ops", "description": "Health, readiness and metrics."},
        ],
    )
    svc = Service(cfg, provider)
    app.state.service = svc
    install_error_handlers(app)
    app.include_router(router, dependencies=[Depends(bind_route)])
    # Starlette wraps in reverse order of adding: the last added runs first (outermost).
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(BodyLimitMiddleware, limit=request_limit(cfg.store.max_message_size))
    app.add_middleware(JsonOnlyMiddleware, router=app.router)
    app.add_middleware(BearerAuthMiddleware, token=cfg.server.bearer_token())
    app.add_middleware(HostGuardMiddleware, policy=HostPolicy(cfg.server.host, cfg.server.allowed_hosts))
    app.add_middleware(HttpMetricsMiddleware, metrics=svc.metrics)
    app.add_middleware(RequestContextMiddleware)
    _document_security(app)
    return app


def _document_security(app: FastAPI) -> None:
    """Declare the bearer scheme in the OpenAPI document (enforced by middleware, so FastAPI
    cannot see it by itself): required on every operation but the health probes."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = base()
        # Bodies parsed by _parse are invisible to FastAPI: publish their schemas ourselves.
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (BatchIn, MessageIn, CommitIn, ResetIn, HalfIn):
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(js.pop("$defs", {}))
            components[model.__name__] = js
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearerAuth"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "`server.token`; only enforced when configured.",
        }
        for path, ops in schema.get("paths", {}).items():
            for op in ops.values():
                op["security"] = [] if path in ("/healthz", "/readyz") else [{"bearerAuth": []}, {}]
        # Every POST may be refused for its content type (guards.JsonOnlyMiddleware), new ones too.
        refused = {
            "description": "A write without `Content-Type: application/json`.",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
        }
        for ops in schema.get("paths", {}).values():
            if "post" in ops:
                ops["post"].setdefault("responses", {}).setdefault("415", refused)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
