"""uvicorn's httptools protocol with the bounds it lacks: header size, header and body read time.

Why: uvicorn (with httptools) accepts request lines and headers of any size and waits for them
and for bodies forever. A client sending a header or body byte every few seconds ("slowloris")
holds a connection — and with ``server.max_connections``, eventually all of them — and one
sending megabytes of headers costs memory before any route runs. Here:

* the request line plus every header name and value may add up to ``max_header_bytes``;
  past that the client gets ``431 Request Header Fields Too Large`` and the connection closes;
* from the moment a connection opens, or a new request on it begins, the whole header block
  must arrive within ``header_timeout`` seconds; otherwise ``408 Request Timeout`` and close;
* once the headers are in, the whole body must arrive within ``body_timeout`` seconds;
  otherwise ``408`` (unless the route has answered already) and close — one log line;
* an error response (≥ 400: a 401, a 413, …) that starts before the request's body has fully
  arrived says ``connection: close`` and closes the connection: the rest of the body would have
  to be read and thrown away, at the client's pace, while the connection still counts against
  ``server.max_connections``. A success that starts before the body is in (a route that does not
  read its body) keeps the connection, as uvicorn does: the rest of the body is read and
  dropped, within the body's time bound. Closing it instead — without having said so — reset
  the client's next request on that keep-alive connection.

Body *size* is bounded elsewhere (the request size limit, :mod:`tierd.service.auth`), and idle
keep-alive connections by uvicorn's ``timeout_keep_alive``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tierd.repeats import FailureLog
from tierd.service.errors import CUT_OFF, TooManyConnectionsError

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)
#: Connections refused above the bound: the first, then once a minute with a count.
_REFUSED = FailureLog(log, "accepting an HTTP connection")

_REASONS = {
    408: b"Request Timeout",
    421: b"Misdirected Request",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


class _HeaderLimitError(Exception):
    """Raised from a parser callback to stop parsing an oversized header block."""


class BoundedHttpProtocol(HttpToolsProtocol):
    """Configure through :func:`bounded_protocol` (uvicorn instantiates the class itself)."""

    max_header_bytes = 64 * 1024
    header_timeout = 10.0
    body_timeout = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._in_headers = False
        self._too_large = False

    # ------------------------------------------------------------- the header read timer
    def _start_header_timer(self) -> None:
        self._in_headers = True
        self._header_bytes = 0
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _stop_header_timer(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            log.info(
                "closing a connection from %s: request headers not complete within %.0f s",
                self._peer(),
                self.header_timeout,
            )
            self._reject(408, f"request headers must arrive within {self.header_timeout:g} s")

    # ------------------------------------------------------------- the body read timer
    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        log.info(
            "closing a connection from %s: request body not complete within %g s (%s %s)",
            self._peer(),
            self.body_timeout,
            cycle.scope.get("method"),
            cycle.scope.get("path"),
        )
        cycle.scope[CUT_OFF] = True  # type: ignore[literal-required]  # an extension key of ours
        if cycle.response_started:
            self.transport.close()
        else:
            cycle.disconnected = True  # the route gets a disconnect; nothing more is written
            self._reject(408, f"request body must arrive within {self.body_timeout:g} s")

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "unknown"

    def _reject(self, status: int, message: str) -> None:
        """A minimal JSON error (the common shape) and close: the request never reached the app."""
        body = json.dumps({"error": _code(status), "message": message, "detail": {}}).encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, _REASONS[status], len(body), body)
        )
        self.transport.close()

    # ------------------------------------------------------------- protocol and parser hooks
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        bound = self.limit_concurrency
        if bound is not None and len(self.connections) > bound:
            # Refused now, not at its first request: an idle connection would hold a descriptor
            # until header_timeout, and enough of them exhaust the process's open-files limit
            # (accept() then fails in a loop and nothing is served, /healthz included).
            err = TooManyConnectionsError(
                f"{len(self.connections) - 1} connections are open, at most {bound} are served "
                "(server.max_connections, bounded below the open-files limit); refused with 503",
                limit=bound,
            )
            _REFUSED.failed(err)
            self._reject(503, err.message)
            return
        _REFUSED.succeeded()
        self._start_header_timer()  # a connection that never sends anything is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        self._stop_body_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # As uvicorn does (tierd serves no websockets, so this only logs a warning).
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            self._stop_header_timer()
            if self._too_large:
                log.info(
                    "refusing a request from %s: headers above %d bytes", self._peer(), self.max_header_bytes
                )
                self._reject(431, f"request line and headers must fit in {self.max_header_bytes} bytes")
            else:
                self.send_400_response("Invalid HTTP request received.")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_header_timer()

    def _count(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > self.max_header_bytes:
            self._too_large = True
            raise _HeaderLimitError

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF, as on the wire
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        super().on_headers_complete()
        if self._body_timer is None:  # cancelled at once by on_message_complete when there is none
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_timed_out)
        cycle = self.cycle
        if cycle is not None:
            send = cycle.send  # the route's ASGI send, looked up when its task starts (after this)

            async def send_closing_early_errors(message: Any) -> None:
                if message["type"] == "http.response.start" and message["status"] >= 400 and cycle.more_body:
                    cycle.keep_alive = False  # uvicorn writes connection: close, then closes
                await send(message)

            cycle.send = send_closing_early_errors  # type: ignore[method-assign]

    def on_message_complete(self) -> None:
        self._stop_body_timer()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.keep_alive:
            self._stop_body_timer()  # an early error: uvicorn closes the connection it announced
        super().on_response_complete()


def _code(status: int) -> str:
    return {408: "request_timeout", 431: "headers_too_large", 503: TooManyConnectionsError.code}.get(
        status, "http_error"
    )


def bounded_protocol(
    max_header_bytes: int, header_timeout: float, body_timeout: float = BoundedHttpProtocol.body_timeout
) -> type[BoundedHttpProtocol]:
    """A :class:`BoundedHttpProtocol` class with these bounds, for ``uvicorn.Config(http=...)``."""
    return type(
        "BoundedHttpProtocol",
        (BoundedHttpProtocol,),
        {
            "max_header_bytes": max_header_bytes,
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
        },
    )
