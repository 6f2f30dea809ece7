"""The ops listener (``server.ops_host``/``ops_port``): health, readiness and metrics only.

Why a second listener: in Kubernetes the kubelet probes and Prometheus scrapes from outside the
pod, so they need an address other than loopback — but the data API should stay on loopback,
reachable only by the containers of its own pod. This app serves the same ``/healthz``,
``/readyz`` and ``/metrics`` handlers as the main API (one definition, no drift) and nothing
else: no produce, no reads, no OpenAPI document. It needs no token — it exposes no messages;
metrics do carry topic names as labels, so restrict who reaches the port (NetworkPolicy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from tierd.service.app import healthz, metrics, readyz
from tierd.service.errors import CatchAllMiddleware, install_error_handlers

if TYPE_CHECKING:
    from collections.abc import Callable

    from tierd.service.app import Service

#: What the ops listener serves (GET and HEAD each).
OPS_ROUTES: dict[str, Callable[..., Any]] = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}


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
