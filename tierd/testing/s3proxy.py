"""A server double for S3 clones that ignore preconditions: a small HTTP proxy in front of a real
S3 server (moto) that drops ``If-None-Match`` and ``If-Match`` from writes.

Several "S3-compatible" servers (s3rver, older MinIO and SeaweedFS releases, some gateways) accept
``If-None-Match: *`` on an existing key with a 200 and overwrite it. Behind this proxy, moto does
exactly that, so tests can show that the capability probe refuses such a server and that nothing
committed is overwritten — without installing the misbehaving server itself.

``strip_ranges`` also drops ``Range`` from GETs (a server answering ranges with whole objects), and
``not_implemented`` answers ``UploadPartCopy`` / ``ListMultipartUploads`` with 501, as s3rver does.
``answer(method, path, headers)`` may answer a request itself with an S3 error (status, code)
instead of forwarding it — a throttling or failing server, or one that refuses some clients'
requests — and ``requests`` logs every request (method, path, ``User-Agent``) as the server saw
it. ``honour(key)`` makes a *lying* server: preconditions on keys it accepts reach the upstream (the
probe's scratch keys, say) and are stripped everywhere else — a server that passes the probe and
misbehaves later, for the defence-in-depth tests.

The proxy runs in a daemon thread of the test process (it is a double, not a benchmark target),
listens on a free loopback port, and forwards every request unchanged otherwise (moto does not
check signatures, so removing signed headers is invisible to it).
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from tierd.testing.s3server import S3Server

__all__ = ["PreconditionStrippingProxy"]

#: Request headers the proxy removes from PUT/POST requests.
STRIPPED = ("if-none-match", "if-match")
#: Hop-by-hop headers never forwarded (the proxy sets its own framing).
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host", "expect"})


class PreconditionStrippingProxy:
    """Forward to ``upstream`` (an S3 server), dropping write preconditions (see module doc)."""

    def __init__(
        self,
        upstream: S3Server,
        *,
        honour: Callable[[str], bool] | None = None,
        strip_ranges: bool = False,
        not_implemented: frozenset[str] = frozenset(),
        answer: Callable[[str, str, Mapping[str, str]], tuple[int, str] | None] | None = None,
    ) -> None:
        self.upstream = upstream
        self.honour = honour
        #: Operations answered ``501 NotImplemented`` like s3rver does: any of
        #: ``UploadPartCopy``, ``ListMultipartUploads``.
        self.not_implemented = not_implemented
        #: Also drop ``Range`` from GETs: a server that answers every ranged read with the whole
        #: object (s3rver does for ``bytes=0-0``).
        self.strip_ranges = strip_ranges
        #: Decides per request (method, path, headers) whether to answer it with an S3 error
        #: (HTTP status, S3 error code) instead of forwarding it; None forwards everything.
        self.answer = answer
        #: Every request received: (method, path, User-Agent).
        self.requests: list[tuple[str, str, str]] = []
        #: Requests whose preconditions were dropped, by header name.
        self.stripped: dict[str, int] = {name: 0 for name in STRIPPED}
        self._lock = threading.Lock()
        target = urlsplit(upstream.endpoint_url)
        self._target = (target.hostname or "127.0.0.1", target.port or 80)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """The upstream's s3fs options, pointed at the proxy."""
        return self.upstream.storage_options | {"endpoint_url": self.endpoint_url}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> PreconditionStrippingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _strip(self, method: str, path: str) -> bool:
        if method not in ("PUT", "POST"):
            return False
        if self.honour is None:
            return True
        # Path-style addressing: /bucket/key?query
        key = unquote(urlsplit(path).path).lstrip("/").partition("/")[2]
        return not self.honour(key)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: tests read outcomes, not access logs

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _operation(self) -> str:
                query = urlsplit(self.path).query
                if self.command == "PUT" and "uploadId=" in query and "x-amz-copy-source" in self.headers:
                    return "UploadPartCopy"
                if self.command == "GET" and "uploads" in query.split("&") + query.split("="):
                    return "ListMultipartUploads"
                return self.command

            def _refuse(self, operation: str, status: int = 501, code: str = "NotImplemented") -> None:
                data = (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>{operation} refused by the test proxy ({code})</Message></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _forward(self) -> None:
                body = self._body()
                operation = self._operation()
                with proxy._lock:
                    proxy.requests.append((self.command, self.path, self.headers.get("User-Agent", "")))
                if operation in proxy.not_implemented:
                    self._refuse(operation)
                    return
                canned = (
                    proxy.answer(self.command, self.path, dict(self.headers.items()))
                    if proxy.answer
                    else None
                )
                if canned is not None:
                    self._refuse(operation, *canned)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if proxy._strip(self.command, self.path):
                    for name in list(headers):
                        if name.lower() in STRIPPED:
                            del headers[name]
                            with proxy._lock:
                                proxy.stripped[name.lower()] += 1
                if proxy.strip_ranges and self.command == "GET":
                    headers = {k: v for k, v in headers.items() if k.lower() != "range"}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(*proxy._target, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status, resp.reason)
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP:
                            self.send_header(k, v)
                    if self.command == "HEAD":
                        self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
                    else:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        return Handler
