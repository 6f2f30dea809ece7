"""Request ids and log context at the HTTP boundary (the fields of :mod:`tierd.logs`).

Every HTTP response carries ``X-Request-Id``: the caller's own, when it sent a well-formed one
(so a client, a proxy and tierd's JSON log lines share one id), else one generated here. A
caller's id that is too long or holds other characters is replaced, not echoed: it ends up in
log lines and a response header, and must not be able to forge either.

The route's ``topic``, ``queue`` and ``group`` are bound by :func:`bind_route`, a dependency of
every route: middleware runs before routing and cannot see path parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request  # noqa: TC002 (FastAPI reads the annotation at runtime)

from tierd.logs import bind, request_id, unbind
from tierd.store import TOPIC_MAX_LENGTH

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "X-Request-Id"
_HEADER = REQUEST_ID_HEADER.lower().encode()
#: Longest topic or group name (the store's limit); longer values are cut to it.
MAX_FIELD = TOPIC_MAX_LENGTH


class RequestContextMiddleware:
    """Binds the request id for everything the request logs and echoes it in the response.
    Outermost, so that refusals by the other middleware (401, 413, 421) carry it too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        asked = next((v.decode("latin-1") for k, v in scope["headers"] if k == _HEADER), None)
        rid = request_id(asked)
        header = (_HEADER, rid.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != _HEADER]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        token = bind(request_id=rid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            unbind(token)


async def bind_route(request: Request) -> None:
    """Bind the route's topic, queue and group (path parameters; a ``group`` query parameter)
    for the rest of the request. Async on purpose: a sync dependency runs in a worker thread,
    whose binding would not reach the route."""
    params = request.path_params
    queue = _field(params.get("queue"))
    bind(
        topic=_field(params.get("topic")),
        queue=int(queue) if queue is not None and queue.isdigit() and len(queue) < 10 else queue,
        group=_field(params.get("group") or request.query_params.get("group")),
    )


def _field(value: object) -> str | None:
    """A path or query value as a log field: a string, cut to the longest valid name (an
    invalid one is logged too: it is what the request's error is about)."""
    return None if value is None else str(value)[:MAX_FIELD]
