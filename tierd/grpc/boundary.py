"""The gRPC call boundary: one wrapper around each RPC of the MessagingService, made once when
the service is registered. Per call it binds the request id (:mod:`tierd.grpc.context`), checks
the credentials (:mod:`tierd.grpc.auth`) and counts and times the call (:mod:`tierd.grpc.metrics`).

Why not ``grpc.aio`` server interceptors (what this replaced): an interceptor runs before the
method's handler is known, so with any installed gRPC finds every call's handler through the
interceptor chain — a coroutine per interceptor — and each interceptor then builds a new handler
around the one below it, per call. With three of them that was about a tenth of the server's
time per ``SendMessage`` (docs/performance.md, "gRPC"). Wrapped once here, a call pays one
extra coroutine frame, and the order the interceptors had is kept in one place: the request id
is bound first (a credentials refusal is logged with it), the refusal is counted too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import message_factory
from rocketmq.grpc_protocol import service_pb2 as svc

from tierd.grpc.auth import UnauthenticatedError, check_signature, refused
from tierd.grpc.context import asked_id, unbind_quietly
from tierd.grpc.metrics import CANCELLED, code_name
from tierd.logs import bind, request_id

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from tierd.grpc.metrics import GrpcMetrics

#: The service's full name, as clients address it.
SERVICE = "apache.rocketmq.v2.MessagingService"
_SERVICE = svc.DESCRIPTOR.services_by_name["MessagingService"]


def add_service(server: Any, servicer: Any, metrics: GrpcMetrics | None, keys: dict[str, str]) -> None:
    """Register every RPC of ``servicer`` on ``server``, each wrapped (see the module docstring).
    ``metrics``: where calls are counted (none: not measured); ``keys``: the credentials every
    call must be signed with (empty: none required)."""
    handlers = {
        method.name: _handler(method, getattr(servicer, method.name), metrics, keys)
        for method in _SERVICE.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def _handler(method: Any, inner: Any, metrics: GrpcMetrics | None, keys: dict[str, str]) -> Any:
    rpc: str = method.name
    request_type = message_factory.GetMessageClass(method.input_type)
    response_type = message_factory.GetMessageClass(method.output_type)
    codec = {
        "request_deserializer": request_type.FromString,
        "response_serializer": response_type.SerializeToString,
    }
    observe: Callable[[str, str, float], None] | None = None if metrics is None else metrics.observe

    def refusal(metadata: Any) -> Any:
        """The RPC's own response carrying ``UNAUTHORIZED`` when the call is not signed with
        one of ``keys``, else None."""
        try:
            check_signature(keys, metadata)
        except UnauthenticatedError as e:
            return response_type(status=refused(e))
        return None

    if not method.server_streaming and not method.client_streaming:

        async def unary_unary(request: Any, context: Any) -> Any:
            metadata = context.invocation_metadata()
            token = bind(request_id=request_id(asked_id(metadata)))
            start, code = time.perf_counter(), CANCELLED
            try:
                response = refusal(metadata) if keys else None
                if response is None:
                    response = await inner(request, context)
                code = code_name(response.status)
                return response
            finally:
                if observe is not None:
                    observe(rpc, code, time.perf_counter() - start)
                unbind_quietly(token)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)

    async def streamed(request: Any, context: Any) -> AsyncIterator[Any]:
        # The binding lasts until the stream ends: the generator runs in the call's task.
        metadata = context.invocation_metadata()
        token = bind(request_id=request_id(asked_id(metadata)))
        start, code = time.perf_counter(), CANCELLED
        try:
            response = refusal(metadata) if keys else None
            responses = inner(request, context) if response is None else _one(response)
            async for response in responses:
                if code == CANCELLED and response.HasField("status"):
                    code = code_name(response.status)
                yield response
        finally:
            if observe is not None:
                observe(rpc, code, time.perf_counter() - start)
            unbind_quietly(token)

    if method.client_streaming:
        return grpc.stream_stream_rpc_method_handler(streamed, **codec)
    return grpc.unary_stream_rpc_method_handler(streamed, **codec)


async def _one(response: Any) -> AsyncIterator[Any]:
    yield response
