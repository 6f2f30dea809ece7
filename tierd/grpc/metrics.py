"""gRPC metrics (docs/metrics.md, "gRPC"), in the daemon's registry
(:class:`tierd.service.metrics.ServiceMetrics`).

* **Per RPC** — the call boundary (:mod:`tierd.grpc.boundary`) counts every call
  by the protocol code its response carries (RPCs answer failures in the response's status, so
  gRPC's own status says nothing) and times it. An unauthenticated call is counted with its
  ``UNAUTHORIZED``. Calls the client abandoned (cancelled long polls) count as ``CANCELLED``.
* **Consumption** — :class:`ConsumptionCollector` reads the receive / ack state
  (:class:`~tierd.consumption.inflight.Inflight`) at scrape time: messages in flight per group,
  redeliveries, dead-letter moves. No consumption path grows a metrics call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rocketmq.grpc_protocol import definition_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Iterator

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
