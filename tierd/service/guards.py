"""What keeps web browsers from driving a daemon they can reach (ASGI middleware).

A daemon without a token on ``127.0.0.1`` is reachable by every web page its user opens: a page
cannot *read* a cross-origin response, but it can *send* "simple" requests (forms, ``fetch`` in
no-cors mode) and, through DNS rebinding (a name of the attacker's that now resolves to
127.0.0.1), even read them. Two checks close both doors:

* :class:`JsonOnlyMiddleware` — a POST must say ``Content-Type: application/json``. Browsers
  cannot send that cross-site without a CORS preflight, which tierd never grants (PUT, PATCH and
  DELETE are always preflighted). 415 ``unsupported_media_type`` otherwise.
* :class:`HostGuardMiddleware` — the ``Host`` header must name an address the server is bound
  to (a loopback name when it listens on loopback), never a foreign name. 421 ``invalid_host``
  otherwise. A wildcard bind (``0.0.0.0``, ``::``) accepts every name: it requires a token.

Health probes are exempt from both: they change nothing and reveal nothing.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from starlette.routing import Match

from tierd.service.auth import OPEN_PATHS
from tierd.service.errors import InvalidHostError, UnsupportedMediaTypeError, tierd_error_response

if TYPE_CHECKING:
    from collections.abc import Iterable

    from starlette.routing import Router
    from starlette.types import ASGIApp, Receive, Scope, Send

#: The only method that changes state *and* that a browser sends cross-site without asking
#: first (PUT, PATCH and DELETE always get a CORS preflight, which tierd never grants).
WRITE_METHODS = frozenset({"POST"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class JsonOnlyMiddleware:
    """Checks writes that reach a route (``router``'s routes; a write to an unknown path or with
    an unsupported method keeps its 404/405)."""

    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router

    def _routed(self, scope: Scope) -> bool:
        return any(route.matches(scope)[0] is Match.FULL for route in self.router.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in WRITE_METHODS and scope["path"] not in OPEN_PATHS:
            given = _header(scope, b"content-type")
            media = (given or b"").split(b";", 1)[0].strip().lower()
            # Route matching only for the refusals: JSON writes (the produce hot path) skip it.
            if media != b"application/json" and self._routed(scope):
                shown = given.decode("latin-1") if given else "none"
                err = UnsupportedMediaTypeError(
                    f"{scope['method']} requests need 'Content-Type: application/json' (got {shown}); "
                    "send an empty JSON body where the route takes none",
                    content_type=shown,
                )
                await tierd_error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header, without port or IPv6 brackets, lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


def _is_loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostPolicy:
    """Which ``Host`` names a server bound to ``bind_host`` answers (see the module docstring)."""

    def __init__(self, bind_host: str, allowed: Iterable[str] = ()) -> None:
        extra = {host_name(a) for a in allowed}
        self.any = "*" in extra or host_name(bind_host) in WILDCARD_HOSTS
        self.names = extra | {host_name(bind_host)}
        self.loopback = _is_loopback(host_name(bind_host))

    def allows(self, name: str, local_address: str | None) -> bool:
        if self.any or name in self.names:
            return True
        if local_address is not None and name == host_name(local_address):
            return True
        local_loopback = local_address is not None and _is_loopback(host_name(local_address))
        return (self.loopback or local_loopback) and _is_loopback(name)


class HostGuardMiddleware:
    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.policy.any or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"host")
        server = scope.get("server")
        local = str(server[0]) if server else None
        if given is not None and not self.policy.allows(host_name(given.decode("latin-1")), local):
            shown = given.decode("latin-1")
            err = InvalidHostError(
                f"Host {shown!r} is not an address of this server; to reach it under another name, "
                "add the name to server.allowed_hosts",
                host=shown,
            )
            await tierd_error_response(err)(scope, receive, send)
            return
        await self.app(scope, receive, send)
