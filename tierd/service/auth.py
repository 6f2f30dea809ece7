"""Bearer-token authentication (``server.token``) and the request size limit, as ASGI middleware.

Why middleware and not a FastAPI dependency: the token must guard *every* route but the two
health probes — including ``/metrics``, ``/openapi.json``, ``/docs`` and unknown paths (a 404
would otherwise tell an unauthenticated caller which routes exist). A dependency only runs for
matched routes. Health probes stay open because orchestrators (kubelet) probe without secrets
and they reveal nothing.

The token is compared with :func:`hmac.compare_digest` so the time a wrong guess takes does not
depend on how much of it was right.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from fastapi import HTTPException

from tierd.service.errors import RequestTooLargeError, UnauthorizedError, tierd_error_response

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Paths served without a token.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


class BearerAuthMiddleware:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.expected = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        # The scheme is case-insensitive (RFC 9110 §11.1): "bearer x" and "BEARER x" are fine.
        scheme, _, credentials = given.strip().partition(b" ")
        is_bearer = scheme.lower() == b"bearer"
        if not (is_bearer and hmac.compare_digest(credentials.strip(), self.expected)):
            reason = (
                "missing Authorization header"
                if not given
                else "wrong bearer token"
                if is_bearer
                else "the Authorization scheme must be Bearer"
            )
            err = UnauthorizedError(
                f"{reason}: this server requires 'Authorization: Bearer <server.token>'",
                scheme="Bearer",
            )
            await tierd_error_response(err)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse request bodies above ``limit`` bytes before they are buffered: by Content-Length
    up front, and by counting for chunked bodies (which carry no length)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _error(self, size: int | None) -> RequestTooLargeError:
        shown = f"{size} bytes" if size is not None else "more bytes"
        return RequestTooLargeError(
            f"request body is {shown}; the limit is {self.limit} bytes (see docs/http.md)",
            limit=self.limit,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    size = None
                if size is not None and size > self.limit:
                    await tierd_error_response(self._error(size))(scope, receive, send)
                    return
                break
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # FastAPI turns any other exception raised while reading a body into a
                    # generic 400; an HTTPException passes through to the common error shape.
                    raise HTTPException(413, self._error(None).message)
            return message

        await self.app(scope, counting_receive, send)
