"""The ops listener (``server.ops_host``/``ops_port``): health, readiness and metrics only.

Why a second listener: in Kubernetes the kubelet probes and Prometheus scrapes from outside the
pod, so they need an address other than loopback — but the data API should stay on loopback,
reachable only by the containers of its own pod. This app serves the same ``/healthz``,
``/readyz`` and ``/metrics`` handlers as the main API (one definition, no drift) and nothing
else: no produce, no reads, no OpenAPI document. It needs no token — it exposes no messages;
metrics do carry topic names as labels, so restrict who reaches the port (NetworkPolicy).

It also answers ``/startedz``, for the kubelet's startup probe only: a native sidecar's startup
probe gates the app container, and ``/readyz`` is the wrong gate — a cold tier that cannot start
until an operator acts keeps it 503 for good, so the sidecar would restart in a loop and the app
never start, although the hot store acknowledges produce (docs/deploy.md, "Probes").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from tierd.service.app import Svc, healthz, metrics, readyz
from tierd.service.errors import CatchAllMiddleware, error_response, install_error_handlers
from tierd.service.schemas import StatusOut

if TYPE_CHECKING:
    from collections.abc import Callable

    from tierd.service.app import Service


async def startedz(svc: Svc) -> Any:
    """200 once the store is open — crash recovery finished, produce is acknowledged — whatever
    the cold tier's state; 503 ``not_ready`` while it is still opening. What a startup probe
    asks: may the app beside this sidecar start now?"""
    state = svc.readiness()
    if state["store_open"]:
        return StatusOut(status="ok")
    return error_response(503, "not_ready", "not started: the store is still opening (recovery)", state)


#: What the ops listener serves (GET and HEAD each).
OPS_ROUTES: dict[str, Callable[..., Any]] = {
    "/healthz": healthz,
    "/startedz": startedz,
    "/readyz": readyz,
    "/metrics": metrics,
}


def create_ops_app(svc: Service) -> FastAPI:
    """The ops ASGI app over the main app's :class:`~tierd.service.app.Service` (same store,
    same readiness, same metrics registry)."""
    app = FastAPI(title="tierd ops", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = svc
    install_error_handlers(app)
    for path, endpoint in OPS_ROUTES.items():
        app.add_api_route(path, endpoint, methods=["GET", "HEAD"])
    app.add_middleware(CatchAllMiddleware)
    return app
