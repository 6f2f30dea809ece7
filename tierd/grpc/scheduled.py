"""Scheduled (delay / timer) messages over gRPC (docs/scheduled.md): a ``SendMessage`` of type
``DELAY`` or with a ``delivery_timestamp`` is a scheduled put, answered with its ``recall_handle``;
``RecallMessage`` cancels it by that handle (RocketMQ 5.3).

The store owns the time rules (past, beyond ``scheduled.max_delay``) and the handles; this module
only translates. Two refusals get the protocol's own codes rather than the generic mapping in
:mod:`tierd.grpc.codes`: a refused delivery time is ``ILLEGAL_DELIVERY_TIME`` (what RocketMQ
answers, so clients that branch on it work), and a recall that came too late is ``BAD_REQUEST``
naming the handle — not an internal error, the client asked for something no longer possible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tierd.errors import AlreadyDeliveredError, DeliveryTimeError, InvalidArgumentError
from tierd.grpc.codes import ok, status_of
from tierd.grpc.convert import to_message

if TYPE_CHECKING:
    from tierd.store import MessageStore


def is_scheduled(m: Any) -> bool:
    """A message the producer asked to be delivered later: type DELAY, or a delivery time set
    (the official clients set both; either one is honoured rather than silently ignored)."""
    sp = m.system_properties
    return bool(sp.message_type == pb.DELAY or sp.HasField("delivery_timestamp"))


def _status(e: BaseException, rpc: str) -> Any:
    """:func:`status_of` (which logs), with the scheduled-message codes above."""
    status = status_of(e, rpc)
    if isinstance(e, DeliveryTimeError):
        status.code = pb.ILLEGAL_DELIVERY_TIME
    elif isinstance(e, AlreadyDeliveredError):
        status.code = pb.BAD_REQUEST
    return status


def _scheduled_put(request: Any) -> tuple[Any, int]:
    """The one message of ``request`` as a plain protocol message, and its delivery time (ms);
    a typed error for a batch, a missing time or a message group."""
    if len(request.messages) != 1:
        raise InvalidArgumentError(
            f"a scheduled (DELAY) message is sent alone, got a batch of {len(request.messages)}",
            count=len(request.messages),
        )
    m = request.messages[0]
    sp = m.system_properties
    if not sp.HasField("delivery_timestamp"):
        raise DeliveryTimeError(
            "a DELAY message needs a delivery_timestamp (when it becomes visible)", message_id=sp.message_id
        )
    if sp.HasField("message_group") and sp.message_group:
        raise InvalidArgumentError(
            "a scheduled message cannot have a message group (FIFO)", message_group=sp.message_group
        )
    plain = pb.Message()
    plain.CopyFrom(m)
    plain.system_properties.message_type = pb.NORMAL
    plain.system_properties.ClearField("delivery_timestamp")
    try:
        deliver_at = int(sp.delivery_timestamp.ToMilliseconds())
    except ValueError as e:  # seconds out of Timestamp's range (e.g. milliseconds put there)
        raise DeliveryTimeError(
            f"delivery_timestamp is not a valid time: {e}", seconds=sp.delivery_timestamp.seconds
        ) from e
    return plain, deliver_at


async def send_scheduled(store: MessageStore, request: Any) -> Any:
    """Schedule the one message of ``request``: durable when answered, visible in its topic at
    its ``delivery_timestamp``. A batch is refused whole, as over HTTP: scheduling part of it
    would leave the producer unsure which ones will arrive."""
    try:
        plain, deliver_at = _scheduled_put(request)
        r = await store.schedule(to_message(plain, None), deliver_at=deliver_at)
        message_id = plain.system_properties.message_id or r.msg_id
        entry = svc.SendResultEntry(status=ok(), message_id=message_id, recall_handle=r.handle)
        return svc.SendMessageResponse(status=ok(), entries=[entry])
    except Exception as e:
        status = _status(e, "SendMessage")
        entries = [
            svc.SendResultEntry(status=status, message_id=x.system_properties.message_id)
            for x in request.messages
        ]
        return svc.SendMessageResponse(status=status, entries=entries)


async def recall(store: MessageStore, request: Any) -> Any:
    """Cancel the scheduled message ``recall_handle`` names. A second recall of the same handle
    is OK too (its message says so): a client that lost the first answer can retry."""
    try:
        recalled = await store.recall(request.recall_handle)  # "" or garbage: UnknownHandleError
        status = ok() if recalled else pb.Status(code=pb.OK, message="already recalled")
        return svc.RecallMessageResponse(status=status)
    except Exception as e:
        return svc.RecallMessageResponse(status=_status(e, "RecallMessage"))
