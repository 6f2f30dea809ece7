"""Every HTTP error leaves as ``{"error": code, "message": ..., "detail": {...}}``.

Why one shape: clients (the CLI, scripts, other services) branch on the stable ``error`` code, not
on prose or on which layer failed — a typed :class:`~tierd.errors.TierdError` from the store, a
request that failed schema validation, an unknown route and an unexpected bug all look alike.
No stack trace ever reaches a client: unexpected exceptions are logged here, server-side, with
their traceback, and the client gets a 500 with a generic message.

The errors the HTTP layer adds itself (authentication, draining, readiness, request size) are
typed errors too, so routes and middleware raise them like any other tierd error.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from tierd.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    NotReadyError,
    StoreClosedError,
    TierdError,
)
from tierd.repeats import FailureLog

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)
#: Server-side failures answered to clients, one failure log per error code: an S3 outage fails
#: every read alike, and the log says so once a minute with a count, not once per request.
_SERVER_ERRORS: dict[str, FailureLog] = {}


class UnauthorizedError(TierdError, PermissionError):
    """Missing or wrong ``Authorization: Bearer`` token (``server.token`` is set)."""

    code = "unauthorized"
    http_status = 401


class DrainingError(StoreClosedError):
    """The daemon is shutting down: it finishes what it has and accepts no new writes."""

    code = "draining"
    http_status = 503


class RequestTooLargeError(MessageTooLargeError):
    """The request body exceeds the service's request size limit (see docs/http.md)."""

    code = "request_too_large"
    http_status = 413


class UnsupportedMediaTypeError(InvalidArgumentError):
    """A request that changes something without ``Content-Type: application/json``. Browsers send
    such requests cross-site without asking (forms, ``fetch`` in no-cors mode); requiring the
    JSON type makes them ask first (CORS preflight), which tierd never grants."""

    code = "unsupported_media_type"
    http_status = 415


class InvalidHostError(InvalidArgumentError):
    """The ``Host`` header names an address this server is not bound to (DNS rebinding: a web
    page whose name now resolves to 127.0.0.1 must not reach a loopback daemon)."""

    code = "invalid_host"
    http_status = 421


class TooManyConnectionsError(TierdError, ConnectionError):
    """More connections are open than the server takes (``server.max_connections``, bounded below
    the open-files limit): a new one is answered 503 and closed at once."""

    code = "too_many_connections"
    http_status = 503


#: Scope key set when the HTTP protocol cut a request off (its body timed out): the route then
#: sees a client disconnect that the server caused and has already logged.
CUT_OFF = "tierd.cut_off"

#: Codes for HTTP statuses Starlette raises itself (routing), so they keep the common shape.
_STATUS_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


def _jsonable(value: Any) -> Any:
    """``value`` if it serialises as JSON, else its ``repr`` (detail values come from deep inside
    the store — numpy integers, paths — and must never turn an error report into a 500)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [_jsonable(v) for v in value]
        return repr(value)
    return value


def error_body(code: str, message: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": code, "message": message, "detail": _jsonable(detail or {})}


def problem(exc: BaseException) -> dict[str, Any]:
    """An exception in the error shape (``/readyz`` and ``/v1/status`` report causes this way)."""
    if isinstance(exc, TierdError):
        return error_body(exc.code, exc.message, exc.detail)
    return error_body("internal", str(exc) or type(exc).__name__)


def error_response(
    status: int, code: str, message: str, detail: dict[str, Any] | None = None
) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="tierd"'} if status == 401 else None
    return JSONResponse(error_body(code, message, detail), status_code=status, headers=headers)


def tierd_error_response(exc: TierdError) -> JSONResponse:
    response = error_response(exc.http_status, exc.code, exc.message, exc.detail)
    if isinstance(exc, NotReadyError):  # retriable: tell clients when (RFC 9110 §10.2.3)
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


async def _on_tierd_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TierdError)
    if exc.http_status >= 500:  # one line per kind, then once a minute with a count
        failures = _SERVER_ERRORS.get(exc.code)
        if failures is None:
            what = f"a request ({exc.http_status} {exc.code})"
            failures = _SERVER_ERRORS.setdefault(exc.code, FailureLog(log, what))
        failures.failed(exc)
    return tierd_error_response(exc)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Only location, message and type: pydantic's ``input``/``ctx`` may hold whole request bodies
    # (a 5 MiB base64 string) or exception objects.
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
        for e in exc.errors()
    ]
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"])
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    if errors and all(e["type"] == "bytes_invalid_encoding" for e in errors):
        # Well-formed JSON, wrong bytes: a bad value (400), like any other the store refuses.
        return error_response(
            400, "invalid_argument", f"{where} is not valid base64: {first['msg']}{more}", {"errors": errors}
        )
    return error_response(
        422,
        "invalid_request",
        f"{where}: {first['msg']}{more}" if where else str(first["msg"]),
        {"errors": errors},
    )


async def _on_http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(TierdError, _on_tierd_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)


class CatchAllMiddleware:
    """Turn any exception nobody handled into a logged traceback and a JSON 500.

    Starlette's own last-resort handler re-raises after answering (so the server logs it again
    and test clients crash); this one answers, logs once, and stops there. If the response had
    already started there is nothing left to say to the client: the connection is cut.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            # The client went away mid-body (or the server cut it off, and said so): nobody is
            # left to answer, and nothing here is a bug — one line, no traceback.
            if not scope.get(CUT_OFF):
                log.info(
                    "%s %s: the client closed the connection before its request body was complete",
                    scope.get("method"),
                    scope.get("path"),
                )
        except TierdError as e:  # raised outside a route (e.g. by a middleware below us)
            if started:
                raise
            await tierd_error_response(e)(scope, receive, send)
        except Exception:
            log.exception("unexpected error serving %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            await error_response(500, "internal", "internal server error; see the server log")(
                scope, receive, send
            )
