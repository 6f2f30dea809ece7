"""Request ids and log context at the gRPC boundary (the fields of :mod:`tierd.logs`), as
:mod:`tierd.service.context` does for HTTP.

:class:`LogContextInterceptor`, the outermost server interceptor, binds ``request_id`` for the
whole call: the client's ``x-mq-request-id`` metadata (RocketMQ clients send one per call) when
it is well-formed (:func:`tierd.logs.request_id`), else a generated one. It binds nothing else
from the metadata: ``authorization`` carries a signature and stays out of every log line.

The ``topic``, ``group`` and ``queue`` a request names are bound by the servicer where it reads
the request (:func:`bind_names`): only it knows which field of which message holds them. A
binding made during the call ends with it, as the interceptor restores what was bound before.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import grpc

from tierd.logs import bind, request_id, unbind
from tierd.store import TOPIC_MAX_LENGTH

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
    from contextvars import Token

#: The metadata key RocketMQ clients put their per-call request id in.
REQUEST_ID_METADATA = "x-mq-request-id"


def asked_id(metadata: Any) -> str | None:
    """The client's request id in ``metadata`` (a sequence of key/value pairs), if any."""
    for key, value in metadata or ():
        if key == REQUEST_ID_METADATA:
            return value if isinstance(value, str) else None
    return None


def bind_names(topic: str | None = None, group: str | None = None, queue: int | None = None) -> None:
    """Bind the names a request carries for the rest of the call; an empty name is left unbound
    and a long one is cut to the longest valid name (an invalid name is logged too: it is what
    the call's error is about). A queue id below 0 means "every queue" and is left out."""
    bind(
        topic=topic[:TOPIC_MAX_LENGTH] if topic else None,
        group=group[:TOPIC_MAX_LENGTH] if group else None,
        queue=queue if queue is not None and queue >= 0 else None,
    )


def _unbind(token: Token[Mapping[str, str | int]]) -> None:
    # A stream closed from elsewhere (garbage collection of an abandoned generator) runs its
    # ``finally`` in another context, where this token means nothing: that context never saw
    # the binding, so there is nothing to restore.
    with contextlib.suppress(ValueError):
        unbind(token)


class LogContextInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Binds the call's request id while the interceptors after it and the RPC itself run."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        rid = request_id(asked_id(details.invocation_metadata))
        # Bound around the rest of the chain too: an authentication refusal is logged there.
        token = bind(request_id=rid)
        try:
            handler = await continuation(details)
        finally:
            _unbind(token)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        return _wrap(rid, handler)


def _wrap(rid: str, handler: Any) -> Any:
    """``handler`` with ``request_id`` bound while it runs (for a stream: until it ends)."""
    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        unary_inner = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            token = bind(request_id=rid)
            try:
                return await unary_inner(request, context)
            finally:
                _unbind(token)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)

    async def bound(responses: AsyncIterator[Any]) -> AsyncIterator[Any]:
        token = bind(request_id=rid)
        try:
            async for response in responses:
                yield response
        finally:
            _unbind(token)

    if handler.unary_stream is not None:
        stream_inner = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            async for response in bound(stream_inner(request, context)):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, **codec)
    if handler.stream_stream is not None:
        both_inner = handler.stream_stream

        async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            async for response in bound(both_inner(requests, context)):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, **codec)
    return handler  # client streaming: the MessagingService has none
