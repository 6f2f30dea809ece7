"""``MessagingService`` for tierd: translate the request, call the facade (and the receive / ack
state of :mod:`tierd.consumption.inflight`), translate back. No RPC raises: every failure is a
status in the response (:mod:`tierd.grpc.codes`), so no traceback reaches a client."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from google.protobuf import duration_pb2, timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from tierd.consumption.inflight import Inflight, unknown_topic, valid_topic
from tierd.consumption.offsets import check_group
from tierd.consumption.pull import (
    OffsetPolicy,
    PulledOffsetError,
    check_queue_of,
    get_offset,
    pull,
    query_offset,
    update_offset,
)
from tierd.errors import InvalidArgumentError
from tierd.format.properties import PROPERTY_UNIQ_KEY
from tierd.grpc.codes import UnsupportedFeatureError, ok, set_ok, status_of
from tierd.grpc.context import bind_names
from tierd.grpc.convert import to_message, to_protocol
from tierd.grpc.scheduled import is_scheduled, recall, send_scheduled
from tierd.topics import queue_for_group
from tierd.transactions.names import HALF_ONLY, Resolution

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from tierd.config import TierdConfig
    from tierd.message import Message, PutResult
    from tierd.store import MessageStore
    from tierd.transactions.coordinator import PendingTransaction

log = logging.getLogger("tierd.grpc")

#: What the telemetry settings tell clients (the proxy's defaults).
RECEIVE_BATCH_SIZE = 32
MAX_SEND_ATTEMPTS = 3
#: Long polling when the client names none (s); the proxy's default.
DEFAULT_LONG_POLL = 20.0
#: Invisible duration when the client names none (s).
DEFAULT_INVISIBLE = 30.0
#: A receive answers this much before the client's own deadline (its long-polling timeout plus
#: its request timeout), so an empty result is an answer and not a client-side timeout.
ANSWER_MARGIN = 0.5
#: How EndTransaction's resolutions read in tierd.
_RESOLUTIONS: dict[int, Resolution] = {pb.COMMIT: Resolution.COMMIT, pb.ROLLBACK: Resolution.ROLLBACK}
#: Ends a Telemetry stream's outgoing queue (the client closed its side).
_END = object()
_OFFSET_POLICIES: dict[int, OffsetPolicy] = {
    pb.BEGINNING: "beginning",
    pb.END: "end",
    pb.TIMESTAMP: "timestamp",
}


def _check_not_empty(request: Any) -> None:
    if not request.messages:
        raise UnsupportedFeatureError("SendMessage without messages")


def _check_filter(expr: Any) -> None:
    if expr.type == pb.SQL:
        raise UnsupportedFeatureError(
            f"SQL92 filter expressions are not supported by tierd yet ({expr.expression!r}); "
            "use a TAG expression",
            expression=expr.expression,
        )


def _duration(seconds: float) -> Any:
    return duration_pb2.Duration(seconds=int(seconds), nanos=int(seconds % 1 * 1e9))


def _seconds(d: Any) -> float:
    return float(d.seconds) + float(d.nanos) / 1e9


def _sent(batch: list[Message], offsets: list[int], results: Sequence[PutResult]) -> Any:
    """The answer to a send of ``batch``, stored at queue ``offsets``: each entry carries the
    client's message id, else the offset message id (``results[i].msg_id``, built only then)."""
    response = svc.SendMessageResponse(status=ok())
    add = response.entries.add
    for i, (message, offset) in enumerate(zip(batch, offsets, strict=True)):
        entry = add(message_id=message.properties.get(PROPERTY_UNIQ_KEY) or results[i].msg_id, offset=offset)
        set_ok(entry.status)
    return response


def _resolution(code: int) -> Resolution:
    how = _RESOLUTIONS.get(code)
    if how is None:
        name = pb.TransactionResolution.Name(code)
        raise InvalidArgumentError(
            f"transaction resolution must be COMMIT or ROLLBACK, got {name}", resolution=name
        )
    return how


class Servicer(svc_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(self, cfg: TierdConfig, store: MessageStore, bound: tuple[str, int]) -> None:
        self.cfg = cfg
        self.store = store
        self.bound = bound
        self.inflight = Inflight(store, cfg.grpc.max_delivery_attempts)

    # ------------------------------------------------------------------ helpers
    async def _queue_count(self, topic: str) -> int:
        """Queues of ``topic`` (existing, created, declared, or about to be created), or
        TopicNotFoundError: the store's own count (a created topic's, docs/topics.md), so the
        route a client gets spreads it over the queues HTTP producers use. Waits (bounded:
        ``tiered.ready_timeout``) for the cold tier, which knows topics too."""
        await self.store.wait_ready()
        name = valid_topic(topic)
        if not self.cfg.grpc.auto_create_topics and not self.store.has_topic(name):
            raise unknown_topic(topic)
        return self.store.queue_count(name)

    def _endpoints(self, asked: Any) -> Any:
        """The sidecar itself: the address the client used when it said, else the bound one."""
        if asked is not None and len(asked.addresses):
            return asked
        host, port = self.bound
        scheme = pb.IPv6 if ":" in host else pb.IPv4
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])

    # ------------------------------------------------------------------ routing and session
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        bind_names(topic=request.topic.name)
        try:
            topic = request.topic.name
            n = await self._queue_count(topic)
            broker = pb.Broker(
                name=self.cfg.tiered.broker, id=0, endpoints=self._endpoints(request.endpoints)
            )
            queues = [
                pb.MessageQueue(
                    topic=request.topic,
                    id=i,
                    permission=pb.READ_WRITE,
                    broker=broker,
                    accept_message_types=[pb.NORMAL, pb.FIFO, pb.TRANSACTION],
                )
                for i in range(n)
            ]
            return svc.QueryRouteResponse(status=ok(), message_queues=queues)
        except Exception as e:
            return svc.QueryRouteResponse(status=status_of(e, "QueryRoute"))

    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        bind_names(topic=request.topic.name, group=request.group.name)
        try:
            await self._queue_count(request.topic.name)
            broker = pb.Broker(
                name=self.cfg.tiered.broker, id=0, endpoints=self._endpoints(request.endpoints)
            )
            # One assignment for the whole topic: receives pop from every queue of it.
            queue = pb.MessageQueue(
                topic=request.topic,
                id=-1,
                permission=pb.READ_WRITE,
                broker=broker,
                accept_message_types=[pb.NORMAL, pb.FIFO, pb.TRANSACTION],
            )
            return svc.QueryAssignmentResponse(status=ok(), assignments=[pb.Assignment(message_queue=queue)])
        except Exception as e:
            return svc.QueryAssignmentResponse(status=status_of(e, "QueryAssignment"))

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        bind_names(group=request.group.name)
        return svc.HeartbeatResponse(status=ok())

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        # Leases of the client's deliveries simply expire: those messages come back then.
        return svc.NotifyClientTerminationResponse(status=ok())

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """The settings exchange: every Settings the client sends is answered with the server's
        (the clients wait for the first before they start). A producer's stream also carries the
        transaction check-backs (docs/grpc.md): a half message of a topic it publishes, left
        unresolved past ``transactions.transaction_timeout``, is sent to it as a
        RecoverOrphanedTransactionCommand; its checker answers with EndTransaction. The
        producer group of a gRPC transaction is its topic, as in RocketMQ 5's proxy, so any
        producer of the topic -- also one started after the one that sent the half -- is asked."""
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[Any] = asyncio.Queue()
        topics: set[str] = set()

        def on_check(pending: PendingTransaction) -> None:
            if pending.producer_group in topics:
                loop.call_soon_threadsafe(out.put_nowait, pending)

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if command.WhichOneof("command") != "settings":
                        continue  # the client's answers to check-backs come as EndTransaction
                    client = command.settings
                    # Per command: what a line logged while handling it concerns.
                    publishes = {t.name for t in client.publishing.topics}
                    bind_names(
                        topic=next(iter(publishes)) if len(publishes) == 1 else None,
                        group=client.subscription.group.name if client.HasField("subscription") else None,
                    )
                    if client.HasField("publishing"):
                        topics.update(t.name for t in client.publishing.topics)
                    out.put_nowait(self._settings(client))
            finally:
                out.put_nowait(_END)

        unsubscribe = self.store.transactions.subscribe(on_check)
        reader = loop.create_task(read(), name="tierd-grpc-telemetry")
        try:
            while (item := await out.get()) is not _END:
                if isinstance(item, pb.Settings):
                    yield svc.TelemetryCommand(status=ok(), settings=item)
                    continue
                command = await self._recover_command(item)
                if command is not None:
                    yield command
        finally:
            unsubscribe()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _recover_command(self, pending: PendingTransaction) -> Any:
        """The check-back for ``pending``: its half message as its producer sent it (its real
        topic, without the store's half-only properties). None when it was resolved meanwhile."""
        bind_names(topic=pending.topic)
        try:
            half = await self.store.transactions.half(pending.transaction_id)
            message = to_protocol(half, "", 1, 0.0)
            message.topic.name = pending.topic
            for name in HALF_ONLY:
                if name in message.user_properties:
                    del message.user_properties[name]
            message.system_properties.message_type = pb.TRANSACTION
            command = svc.RecoverOrphanedTransactionCommand(
                message=message, transaction_id=pending.transaction_id
            )
        except Exception as e:  # never ends the stream: the next round asks again
            status_of(e, "Telemetry")  # one log line, rate-limited
            return None
        return svc.TelemetryCommand(recover_orphaned_transaction_command=command)

    def _settings(self, client: Any) -> Any:
        settings = pb.Settings()
        settings.CopyFrom(client)
        if client.HasField("subscription"):
            # A consumer's retries: push consumers wait these delays before a failed message is
            # retried, FIFO push consumers give up (forward to the DLQ) after max_attempts.
            g = self.cfg.grpc
            settings.backoff_policy.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=g.max_delivery_attempts,
                    customized_backoff=pb.CustomizedBackoff(next=[_duration(d) for d in g.retry_delays]),
                )
            )
        else:
            settings.backoff_policy.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=MAX_SEND_ATTEMPTS,
                    exponential_backoff=pb.ExponentialBackoff(
                        initial={"nanos": 10_000_000}, max={"seconds": 1}, multiplier=2.0
                    ),
                )
            )
        if client.HasField("publishing"):
            settings.publishing.max_body_size = self.cfg.store.max_message_size
            settings.publishing.validate_message_type = False  # the server names unsupported types
        if client.HasField("subscription"):
            settings.subscription.fifo = False
            settings.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
            if not client.subscription.HasField("long_polling_timeout"):
                settings.subscription.long_polling_timeout.seconds = int(DEFAULT_LONG_POLL)
        return settings

    # ------------------------------------------------------------------ producing
    async def SendMessage(self, request: Any, context: Any) -> Any:
        """A batch of plain messages is one ``put_batch`` (durable as the store's flush policy
        says, as for any producer). This runs per call at thousands of calls a second, so each
        message's fields are read once and the answer's entries are filled in place
        (docs/performance.md, "gRPC")."""
        messages = request.messages
        topics = {m.topic.name for m in messages}
        bind_names(topic=next(iter(topics)) if len(topics) == 1 else None)  # a batch names one, usually
        try:
            _check_not_empty(request)
            transactional = False
            for m in messages:
                if is_scheduled(m):
                    return await send_scheduled(self.store, request)
                transactional = transactional or m.system_properties.message_type == pb.TRANSACTION
            if transactional:
                return await self._send_half(request)
            batch = []
            counts: dict[str, int] = {}  # once per topic: a request usually names one
            for m in messages:
                topic = m.topic.name
                n = counts.get(topic)
                if n is None:
                    n = counts[topic] = await self._queue_count(topic)
                # FIFO: one message group always lands in the same queue, so it stays in order.
                group = m.system_properties.message_group  # "" when unset
                batch.append(to_message(m, queue_for_group(group, n) if group else None))
            if len(batch) == 1:
                one = await self.store.put(batch[0])
                return _sent(batch, [one.queue_offset], [one])
            results = await self.store.put_batch(batch)
            return _sent(batch, results.queue_offsets.tolist(), results)
        except Exception as e:
            status = status_of(e, "SendMessage")
            entries = [
                svc.SendResultEntry(status=status, message_id=m.system_properties.message_id)
                for m in messages
            ]
            return svc.SendMessageResponse(status=status, entries=entries)

    async def _send_half(self, request: Any) -> Any:
        """A transactional message: stored as a half message (docs/transactions.md), its
        producer group its topic; the entry carries the transaction id to end it with."""
        if len(request.messages) != 1:
            raise InvalidArgumentError(
                f"a transactional message is sent alone, got a batch of {len(request.messages)}",
                count=len(request.messages),
            )
        m = request.messages[0]
        topic = m.topic.name
        await self._queue_count(topic)
        if m.system_properties.HasField("message_group") and m.system_properties.message_group:
            raise InvalidArgumentError(
                "a transactional message cannot have a message group (FIFO)",
                message_group=m.system_properties.message_group,
            )
        res = await self.store.put_half(to_message(m, None), producer_group=topic)
        entry = svc.SendResultEntry(
            status=ok(),
            message_id=m.system_properties.message_id or res.uniq_key,
            transaction_id=res.transaction_id,
        )
        return svc.SendMessageResponse(status=ok(), entries=[entry])

    # ------------------------------------------------------------------ consuming
    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        mq = request.message_queue
        bind_names(topic=mq.topic.name, group=request.group.name, queue=mq.id)
        try:
            topic = request.message_queue.topic.name
            await self._queue_count(topic)
            expr = request.filter_expression
            _check_filter(expr)
            invisible = (
                _seconds(request.invisible_duration)
                if request.HasField("invisible_duration")
                else DEFAULT_INVISIBLE
            )
            wait = (
                _seconds(request.long_polling_timeout)
                if request.HasField("long_polling_timeout")
                else DEFAULT_LONG_POLL
            )
            wait = min(max(0.0, wait - ANSWER_MARGIN), self.cfg.server.long_poll_max_ms / 1000)
            deliveries = await self.inflight.receive(
                request.group.name,
                topic,
                expr.expression or None,
                request.batch_size or RECEIVE_BATCH_SIZE,
                invisible,
                wait,
            )
        except Exception as e:
            yield svc.ReceiveMessageResponse(status=status_of(e, "ReceiveMessage"))
            return
        if not deliveries:
            yield svc.ReceiveMessageResponse(
                status=pb.Status(code=pb.MESSAGE_NOT_FOUND, message="no new message")
            )
            return
        yield svc.ReceiveMessageResponse(status=ok())
        # When the answer left the server, as the proxy sends it: push consumers measure their
        # delivery latency from it (and fail a batch that lacks it).
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        yield svc.ReceiveMessageResponse(delivery_timestamp=now)
        self.store.traffic.consumed(topic, [d.message for d in deliveries])
        for d in deliveries:
            yield svc.ReceiveMessageResponse(message=to_protocol(d.message, d.handle, d.attempt, d.invisible))

    async def AckMessage(self, request: Any, context: Any) -> Any:
        bind_names(topic=request.topic.name, group=request.group.name)
        try:
            results = await self.inflight.ack(
                request.group.name, request.topic.name, [e.receipt_handle for e in request.entries]
            )
        except Exception as e:
            return svc.AckMessageResponse(status=status_of(e, "AckMessage"))
        entries = []
        for entry, error in zip(request.entries, results, strict=True):
            status = ok() if error is None else status_of(error, "AckMessage")
            entries.append(
                svc.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status
                )
            )
        failed = [e.status for e in entries if e.status.code != pb.OK]
        if not failed:
            top = ok()
        elif len(failed) == len(entries):
            top = failed[0]
        else:
            top = pb.Status(code=pb.MULTIPLE_RESULTS, message="some entries failed")
        return svc.AckMessageResponse(status=top, entries=entries)

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        bind_names(topic=request.topic.name, group=request.group.name)
        try:
            handle = await self.inflight.change_invisible(
                request.group.name,
                request.topic.name,
                request.receipt_handle,
                _seconds(request.invisible_duration),
            )
            return svc.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)
        except Exception as e:
            return svc.ChangeInvisibleDurationResponse(status=status_of(e, "ChangeInvisibleDuration"))

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        """A push consumer whose own retries are spent (FIFO) hands the message back: it moves
        to ``%DLQ%<group>`` and is acked in its topic."""
        bind_names(topic=request.topic.name, group=request.group.name)
        try:
            await self.inflight.forward_to_dead_letter(
                request.group.name, request.topic.name, request.receipt_handle, request.delivery_attempt
            )
            return svc.ForwardMessageToDeadLetterQueueResponse(status=ok())
        except Exception as e:
            return svc.ForwardMessageToDeadLetterQueueResponse(
                status=status_of(e, "ForwardMessageToDeadLetterQueue")
            )

    # ------------------------------------------------------------------ pull-style offsets
    async def _queue_of(self, mq: Any) -> tuple[str, int]:
        """The (topic, queue id) a request names, both checked."""
        topic = mq.topic.name
        bind_names(topic=topic, queue=mq.id)
        check_queue_of(topic, mq.id, await self._queue_count(topic))
        return topic, mq.id

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        try:
            topic, queue_id = await self._queue_of(request.message_queue)
            policy = _OFFSET_POLICIES[request.query_offset_policy]
            ts = request.timestamp if request.HasField("timestamp") else None
            ms = ts.seconds * 1000 + ts.nanos // 1_000_000 if ts is not None else None
            offset = await query_offset(self.store, topic, queue_id, policy, ms)
            return svc.QueryOffsetResponse(status=ok(), offset=offset)
        except Exception as e:
            return svc.QueryOffsetResponse(status=status_of(e, "QueryOffset"))

    async def GetOffset(self, request: Any, context: Any) -> Any:
        bind_names(group=request.group.name)
        try:
            topic, queue_id = await self._queue_of(request.message_queue)
            await self.inflight.flush()  # what receive / ack consumers of the group acked
            offset = get_offset(self.store, request.group.name, topic, queue_id)
            return svc.GetOffsetResponse(status=ok(), offset=offset)
        except Exception as e:
            return svc.GetOffsetResponse(status=status_of(e, "GetOffset"))

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        bind_names(group=request.group.name)
        try:
            topic, queue_id = await self._queue_of(request.message_queue)
            await self.inflight.flush()  # so a pending write of acks does not undo this
            await update_offset(self.store, request.group.name, topic, queue_id, request.offset)
            return svc.UpdateOffsetResponse(status=ok())
        except Exception as e:
            return svc.UpdateOffsetResponse(status=status_of(e, "UpdateOffset"))

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """The proxy's stream: a status, the messages, then ``next_offset`` (also after an
        unreadable offset, so the client can continue)."""
        bind_names(group=request.group.name)
        try:
            check_group(request.group.name)
            topic, queue_id = await self._queue_of(request.message_queue)
            expr = request.filter_expression
            _check_filter(expr)
            wait = (
                _seconds(request.long_polling_timeout)
                if request.HasField("long_polling_timeout")
                else DEFAULT_LONG_POLL
            )
            pulled = await pull(
                self.store,
                topic,
                queue_id,
                request.offset,
                request.batch_size or RECEIVE_BATCH_SIZE,
                expr.expression or None,
                max(0.0, wait - ANSWER_MARGIN),
            )
        except PulledOffsetError as e:
            yield svc.PullMessageResponse(status=status_of(e, "PullMessage"))
            yield svc.PullMessageResponse(next_offset=e.next_offset)
            return
        except Exception as e:
            yield svc.PullMessageResponse(status=status_of(e, "PullMessage"))
            return
        found = pb.Status(code=pb.MESSAGE_NOT_FOUND, message="no new message")
        self.store.traffic.consumed(topic, pulled.messages)
        yield svc.PullMessageResponse(status=ok() if pulled.messages else found)
        for m in pulled.messages:
            yield svc.PullMessageResponse(message=to_protocol(m, "", 1, 0.0))
        yield svc.PullMessageResponse(next_offset=pulled.next_offset)

    # ------------------------------------------------------------------ not yet implemented
    def _not_implemented(self, rpc: str) -> Any:
        return status_of(UnsupportedFeatureError(f"{rpc} is not supported by tierd yet", rpc=rpc), rpc)

    async def EndTransaction(self, request: Any, context: Any) -> Any:
        """Commit or roll back (the producer, or its checker answering a check-back): durable
        before the answer. An unknown id answers INVALID_TRANSACTION_ID, one already resolved
        BAD_REQUEST saying how it ended."""
        bind_names(topic=request.topic.name)
        try:
            if (
                request.resolution == pb.TRANSACTION_RESOLUTION_UNSPECIFIED
                and request.source == pb.SOURCE_SERVER_CHECK
            ):
                # A checker that does not know yet (RocketMQ's UNKNOWN): asked again later.
                return svc.EndTransactionResponse(
                    status=pb.Status(code=pb.OK, message="left pending: asked again at the next check")
                )
            await self.store.end_transaction(request.transaction_id, _resolution(request.resolution))
            return svc.EndTransactionResponse(status=ok())
        except Exception as e:
            return svc.EndTransactionResponse(status=status_of(e, "EndTransaction"))

    async def RecallMessage(self, request: Any, context: Any) -> Any:
        return await recall(self.store, request)

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return svc.SyncLiteSubscriptionResponse(status=self._not_implemented("SyncLiteSubscription"))
