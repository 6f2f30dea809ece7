"""``tierd serve``: the HTTP API and the store in one asyncio process.

Life of the daemon (each step logs one line):

1. **Bind** ``server.host:server.port`` ourselves (port 0 = a free port) and start uvicorn's
   ``Server`` on that socket inside our loop, then log ``listening on http://HOST:PORT`` with the
   real port. Binding first means ``/healthz`` answers during a long recovery, and a port in use
   is a clean one-line error instead of uvicorn's ``sys.exit``.
2. **Open** the store (``MessageStore.open``: hot-store recovery, then the tiering service —
   dispatcher, index service, retention, manifest upkeep — in the background). Log ``ready``.
   ``/readyz`` turns 200 once the store is open and, with tiering, its metadata is loaded (the
   backend need not answer: that is ``/v1/status``).
3. On **SIGTERM/SIGINT**: *drain* — produce routes answer 503 ``draining`` and ``/readyz`` 503,
   while reads keep working; wait for writes in flight (their acknowledgements are promises).
4. **Commit** what is pending to the cold tier, bounded by ``server.shutdown_grace`` — after
   letting a cold tier that is still starting come up within that grace (what does not make it
   is committed at the next start — the hot store keeps it until then).
5. **Stop** HTTP (finish responses in flight), then **close** the store (flushes the hot store,
   saves tiering metadata and manifests), log ``stopped cleanly`` and return: exit code 0.

Why not ``uvicorn.run``: it owns the loop and the signals. Here the store and the server share
one loop, and shutdown must be *ordered* (refuse writes → commit → stop HTTP → close), which
uvicorn's own signal handling (stop serving at once, re-raise the signal) would break.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

import uvicorn

from tierd.descriptors import descriptor_bound
from tierd.errors import ConfigError, TierdError
from tierd.grpc.server import GrpcListener
from tierd.repeats import FailureLog
from tierd.service.app import create_app
from tierd.service.ops import create_ops_app
from tierd.service.protocol import bounded_protocol
from tierd.store import MessageStore

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator

    from fastapi import FastAPI

    from tierd.config import TierdConfig
    from tierd.service.app import Service

log = logging.getLogger("tierd.service")

#: Longest wait for writes in flight when draining (they are single appends: milliseconds).
DRAIN_TIMEOUT = 10.0
#: Longest wait for HTTP responses in flight once the server stops.
HTTP_STOP_TIMEOUT = 5
#: Longest wait for gRPC calls in flight when draining (long polls are cancelled after it).
GRPC_STOP_TIMEOUT = 5.0
#: How often the daemon looks whether the cold tier is down for good (a cheap flag check).
COLD_WATCH_INTERVAL = 1.0
#: Failures of accept() itself (out of descriptors anyway): one line, then once a minute.
_ACCEPT_FAILURES = FailureLog(log, "accepting connections")
#: Set once the accept retries that outlive a closed listener were reported (at shutdown).
_CLOSED_RETRY_LOGGED = threading.Event()


def _on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio reports accept() failing for want of descriptors through the loop's exception
    handler — with a traceback, once per pending connection, every retry (tens of thousands of
    lines a minute). Those become one line per interval with a count; the rest goes on as before."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and str(context.get("message", "")).startswith("socket.accept()"):
        _ACCEPT_FAILURES.failed(exc, "new connections wait; raise the open-files limit (ulimit -n)")
        return
    if isinstance(exc, ValueError) and "_start_serving" in repr(context.get("handle")):
        # After such a failure asyncio retries accepting a second later (once per failed
        # accept); a listener closed in that second (the daemon stopping) makes each retry fail
        # on its closed socket. Nothing is lost: the listener is gone on purpose. One line.
        if not _CLOSED_RETRY_LOGGED.is_set():
            _CLOSED_RETRY_LOGGED.set()
            log.info("a listener closed while accepting was paused for want of descriptors")
        return
    loop.default_exception_handler(context)


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling (ours orders the shutdown) and with an
    event for "listening" (instead of polling ``started``)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.listening.set()


def bind(host: str, port: int, setting: str = "server.") -> socket.socket:
    """A listening TCP socket on ``host:port``, or a :class:`~tierd.errors.ConfigError` naming both.

    The socket is made with an explicit ``IPPROTO_TCP``: asyncio only sets ``TCP_NODELAY`` on
    accepted connections whose socket says so, and without it every small response waits for
    the client's delayed ACK (≈ 40 ms per request on Linux).
    """
    try:
        family, type_, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1024)
        except BaseException:
            sock.close()
            raise
    except OSError as e:
        raise ConfigError(
            f"cannot listen on {host}:{port} ({setting}host, {setting}port): {e.strerror or e}",
            host=host,
            port=port,
        ) from e
    return sock


def check_exposure(cfg: TierdConfig, sock: socket.socket) -> None:
    """Refuse to serve the data API beyond this machine without a token: a non-loopback bind
    (a wildcard ``0.0.0.0`` included) needs ``server.token``/``token_file``, unless
    ``server.allow_unauthenticated`` says something else authenticates."""
    address = sock.getsockname()[0]
    if ipaddress.ip_address(address.split("%", 1)[0]).is_loopback:
        return
    if cfg.server.bearer_token() is not None or cfg.server.allow_unauthenticated:
        return
    raise ConfigError(
        f"server.host = {cfg.server.host!r} is reachable from other machines and no token is set: "
        "set server.token (TIERD_SERVER__TOKEN) or server.token_file, bind 127.0.0.1 (the ops "
        "listener, server.ops_host, serves probes and metrics beyond loopback), or set "
        "server.allow_unauthenticated = true if something in front authenticates",
        host=cfg.server.host,
    )


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Daemon:
    """One serving process. :meth:`run` is the whole life; :meth:`request_stop` (thread-safe via
    the loop) begins the shutdown. Tests drive it in a thread; ``serve`` wires it to signals."""

    def __init__(self, cfg: TierdConfig) -> None:
        self.cfg = cfg
        self.store: MessageStore | None = None
        self.url: str | None = None
        self.app: FastAPI = create_app(cfg, lambda: self.store)
        self.service: Service = self.app.state.service
        #: The ops listener's app (health, readiness, metrics), when ``server.ops_host`` is set.
        self.ops_app: FastAPI | None = None if cfg.server.ops_host is None else create_ops_app(self.service)
        self.ops_url: str | None = None
        self._stop = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        #: The RocketMQ gRPC listener (``[grpc]``), bound in :meth:`run` when enabled.
        self.grpc: GrpcListener | None = None

    def stop(self) -> bool:
        """Begin the shutdown from the daemon's own loop (a signal handler); False when it had
        already begun."""
        if self._stop.is_set():
            return False
        self._stop.set()
        return True

    def request_stop(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)

    async def run(self, on_ready: Callable[[Daemon], None] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        sock = bind(self.cfg.server.host, self.cfg.server.port)
        try:
            check_exposure(self.cfg, sock)
            ops_sock = None
            if self.ops_app is not None:
                ops_sock = bind(self.cfg.server.ops_host or "", self.cfg.server.ops_port, "server.ops_")
            self.grpc = (
                GrpcListener(
                    self.cfg,
                    self.service.metrics.registry,
                    descriptor_bound("grpc", self.cfg.grpc.max_connections, "grpc.max_connections"),
                )
                if self.cfg.grpc.enabled
                else None
            )
        except BaseException:
            sock.close()
            raise
        self.url = url_of(sock)
        if self.loop.get_exception_handler() is None:
            self.loop.set_exception_handler(_on_loop_error)
        server = _Server(
            self._uvicorn_config(
                self.app, descriptor_bound("http", self.cfg.server.max_connections, "server.max_connections")
            )
        )
        http = asyncio.create_task(server.serve(sockets=[sock]), name="tierd-http")
        ops: _Server | None = None
        ops_http: asyncio.Task[None] | None = None
        if self.ops_app is not None and ops_sock is not None:
            self.ops_url = url_of(ops_sock)
            ops = _Server(
                self._uvicorn_config(
                    self.ops_app,
                    descriptor_bound("ops", self.cfg.server.max_connections, "server.max_connections"),
                )
            )
            ops_http = asyncio.create_task(ops.serve(sockets=[ops_sock]), name="tierd-ops-http")
        try:
            await _first(server.listening.wait(), http)
            if ops is not None and ops_http is not None:
                await _first(ops.listening.wait(), ops_http)
                log.info("ops listener (health, readiness, metrics) on %s", self.ops_url)
            log.info("listening on %s", self.url)
            log.info("opening store at %s (recovering if needed)", self.cfg.store.dir)
            # Writes are served at once; reads wait for the cold tier themselves (bounded).
            store = await MessageStore.open(self.cfg, ready_timeout=0)
            self.store = store
            self.service.metrics.attach(store)
            if self.grpc is not None:
                await self.grpc.start(store)
            stats = store.stats
            log.info(
                "ready: %d topic(s), flush=%s, tiering %s; stop with Ctrl-C or SIGTERM",
                stats.hot.topics,
                self.cfg.store.flush,
                f"to {self.cfg.backend.name} {self.cfg.backend.url}" if stats.cold is not None else "off",
            )
            if on_ready is not None:
                on_ready(self)
            watch = asyncio.create_task(_watch_cold_tier(store), name="tierd-cold-watch")
            tables = None
            if any(t.table == "iceberg" for t in self.cfg.topics.values()):  # docs/table.md
                from tierd.table import TableWriter  # the table extra: only when opted in
                from tierd.table.loop import table_loop

                writer = TableWriter(self.cfg)
                self.service.metrics.watch_tables(writer)
                tables = asyncio.create_task(table_loop(self.cfg, writer), name="tierd-table")
            try:
                await _first(self._stop.wait(), http)
            finally:
                watch.cancel()
                if tables is not None:
                    tables.cancel()
            await self._shutdown(store, server, http)
        finally:
            if self.grpc is not None:
                await self.grpc.stop(0)
            server.should_exit = True
            with contextlib.suppress(Exception):
                await http
            if self.store is not None and not self.store.closed:
                await self.store.close()
            if ops is not None and ops_http is not None:  # last: probes see "draining" to the end
                ops.should_exit = True
                with contextlib.suppress(Exception):
                    await ops_http
        log.info("stopped cleanly")

    def _uvicorn_config(self, app: FastAPI, max_connections: int) -> uvicorn.Config:
        server = self.cfg.server
        return uvicorn.Config(
            app,
            lifespan="off",  # the store's lifecycle is ours, not the app's
            log_config=None,  # keep the process's logging as the CLI set it up
            access_log=False,
            timeout_graceful_shutdown=HTTP_STOP_TIMEOUT,
            server_header=False,
            http=bounded_protocol(server.max_header_bytes, server.header_timeout, server.body_timeout),
            limit_concurrency=max_connections,
        )

    async def _shutdown(self, store: MessageStore, server: _Server, http: asyncio.Task[None]) -> None:
        grace = self.cfg.server.shutdown_grace
        started = time.monotonic()
        if self.grpc is not None:  # its producers' writes are in flight too: finish them first
            await self.grpc.stop(GRPC_STOP_TIMEOUT)
        log.info("draining: refusing new writes, waiting for %d in flight", self.service.writes_in_flight)
        if not await self.service.drain(DRAIN_TIMEOUT):
            log.warning("writes still in flight after %.0f s; closing anyway", DRAIN_TIMEOUT)
        # The dispatcher's live counters: still readable after the store has closed.
        dispatch = store.stats.dispatch
        before = dispatch.messages_dispatched if dispatch is not None else 0
        if dispatch is not None and not store.ready:
            # /readyz does not wait for the backend, so a pod may be stopped while its cold tier is
            # still starting: let it come up within the grace, so what it accepted is tiered now.
            log.info("the cold tier is still starting; waiting up to %.0f s to commit before stopping", grace)
            with contextlib.suppress(TierdError):  # fails at once when retrying cannot help
                await store.wait_ready(grace)
        if dispatch is not None and store.ready:
            left = max(1.0, grace - (time.monotonic() - started))
            log.info("committing pending messages to the cold tier (grace %.0f s)", left)
            try:
                await asyncio.wait_for(store.tier_now(), left)
            except TimeoutError:
                log.warning("tiering unfinished after %.0f s; it resumes at the next start", grace)
            except Exception as e:
                log.warning("final tiering round failed (%s); it resumes at the next start", e)
        elif (cold := store.stats.cold) is not None:
            log.warning(
                "cold tier never became ready (%s); pending messages stay in the hot store for next start",
                cold.start_error or "still starting",
            )
        server.should_exit = True
        await http
        # store.close runs its own grace-bounded final commit: give it only what is left, so the
        # whole shutdown stays within server.shutdown_grace (plus the short drain/HTTP waits and
        # one second, so a commit that finished just now is not reported as timed out).
        left = max(1.0, grace - (time.monotonic() - started))
        await store.close(grace=left)
        if dispatch is not None:
            log.info(
                "committed %d message(s) to the cold tier during shutdown",
                dispatch.messages_dispatched - before,
            )
        log.info("hot store flushed and closed")


async def _watch_cold_tier(store: MessageStore) -> None:
    """Say in the log when the cold tier is down until an operator acts, and when it is back.

    Why here: the tiering service logs its start-up failure as a tiering matter ("hot store keeps
    working"), but for the service it means more — produce is still acknowledged while every read
    fails and ``/readyz`` is 503 — and the operator reading the log must learn that, once per
    distinct cause (the service retries slowly; the cause may change or clear)."""
    said: str | None = None
    while not store.closed:
        down = store.cold_failure
        now = None if down is None else str(down)
        if now != said:
            if down is not None:
                log.error(
                    "cold tier down: %s — produce is still acknowledged into the hot store, but reads "
                    "fail until an operator fixes this; /readyz answers 503 (docs/http.md)",
                    down,
                )
            elif said is not None:
                log.warning(
                    "cold tier no longer down: %s",
                    "ready, reads are served again" if store.ready else "starting again",
                )
            said = now
        await asyncio.sleep(COLD_WATCH_INTERVAL)


async def _first(waiting: Coroutine[Any, Any, Any], http: asyncio.Task[None]) -> None:
    """Wait for ``waiting`` unless the HTTP server task ends first — then re-raise its failure
    (or report that it stopped), instead of waiting forever."""
    task = asyncio.ensure_future(waiting)
    try:
        await asyncio.wait({task, http}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        http.result()  # raises what stopped the server
        raise RuntimeError("the HTTP server stopped unexpectedly")


def serve(cfg: TierdConfig) -> None:
    """Run the daemon until SIGTERM/SIGINT (blocking). Tierd errors propagate (the CLI prints
    them as one line, exit 1)."""
    asyncio.run(_serve(cfg))


async def _serve(cfg: TierdConfig) -> None:
    daemon = Daemon(cfg)
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if daemon.stop():
            log.info("%s received: shutting down", sig.name)
        else:
            log.warning("%s again: shutdown already in progress", sig.name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await daemon.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
