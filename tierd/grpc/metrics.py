"""gRPC metrics (docs/metrics.md, "gRPC"), in the daemon's registry
(:class:`tierd.service.metrics.ServiceMetrics`).

* **Per RPC** — :class:`MetricsInterceptor`, the outermost server interceptor, counts every call
  by the protocol code its response carries (RPCs answer failures in the response's status, so
  gRPC's own status says nothing) and times it. An unauthenticated call is counted with its
  ``UNAUTHORIZED``. Calls the client abandoned (cancelled long polls) count as ``CANCELLED``.
* **Consumption** — :class:`ConsumptionCollector` reads the receive / ack state
  (:class:`~tierd.consumption.inflight.Inflight`) at scrape time: messages in flight per group,
  redeliveries, dead-letter moves. No consumption path grows a metrics call.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rocketmq.grpc_protocol import definition_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from prometheus_client import CollectorRegistry

    from tierd.consumption.inflight import Inflight

#: Latency buckets (s): sends take a millisecond or so, long polls up to their timeout (20 s).
GRPC_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0)
#: Label of calls that ended without a response status (the client went away, a deadline).
CANCELLED = "CANCELLED"
#: Streams that last as long as the client session: counted, not timed.
_SESSIONS = frozenset({"Telemetry"})


def code_name(status: Any) -> str:
    try:
        return str(pb.Code.Name(status.code))
    except ValueError:
        return str(status.code)


class GrpcMetrics:
    """The per-RPC families, and the collector of consumption state once the servicer runs."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "tierd_grpc_requests",
            "gRPC calls by RPC and the protocol code of the answer (OK, MESSAGE_NOT_FOUND, …).",
            ["rpc", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "tierd_grpc_request_duration_seconds",
            "gRPC call latency by RPC (long polls included; Telemetry sessions are not timed).",
            ["rpc"],
            buckets=GRPC_LATENCY_BUCKETS,
            registry=registry,
        )

    def observe(self, rpc: str, code: str, seconds: float) -> None:
        self.requests.labels(rpc, code).inc()
        if rpc not in _SESSIONS:
            self.latency.labels(rpc).observe(seconds)

    def watch(self, inflight: Inflight) -> None:
        """Export ``inflight``'s state at scrape time."""
        self.registry.register(ConsumptionCollector(inflight))


class ConsumptionCollector(Collector):
    def __init__(self, inflight: Inflight) -> None:
        self.inflight = inflight

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "tierd_grpc_messages_in_flight",
            "Messages delivered to a receive / ack consumer group and not yet acked.",
            labels=["group"],
        )
        for group, n in sorted(self.inflight.in_flight().items()):
            g.add_metric([group], n)
        yield g
        yield CounterMetricFamily(
            "tierd_grpc_redeliveries",
            "Messages delivered again after their invisible time ran out.",
            value=self.inflight.redeliveries,
        )
        yield CounterMetricFamily(
            "tierd_grpc_dead_letters",
            "Messages moved to a %DLQ%<group> topic after the maximum delivery attempts.",
            value=self.inflight.dead_letters,
        )


class MetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts and times every call of the MessagingService (see the module docstring)."""

    def __init__(self, metrics: GrpcMetrics) -> None:
        self.metrics = metrics

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        return self._wrap(details.method.rsplit("/", 1)[-1], handler)

    def _wrap(self, rpc: str, handler: Any) -> Any:
        observe = self.metrics.observe
        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                start, code = time.perf_counter(), CANCELLED
                try:
                    response = await inner(request, context)
                    code = code_name(response.status)
                    return response
                finally:
                    observe(rpc, code, time.perf_counter() - start)

            return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)

        async def counted(responses: AsyncIterator[Any]) -> AsyncIterator[Any]:
            start, code = time.perf_counter(), CANCELLED
            try:
                async for response in responses:
                    if code == CANCELLED and response.HasField("status"):
                        code = code_name(response.status)
                    yield response
            finally:
                observe(rpc, code, time.perf_counter() - start)

        if handler.unary_stream is not None:
            unary_inner = handler.unary_stream

            async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                async for response in counted(unary_inner(request, context)):
                    yield response

            return grpc.unary_stream_rpc_method_handler(unary_stream, **codec)
        if handler.stream_stream is not None:
            stream_inner = handler.stream_stream

            async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for response in counted(stream_inner(requests, context)):
                    yield response

            return grpc.stream_stream_rpc_method_handler(stream_stream, **codec)
        return handler  # client streaming: the MessagingService has none
