"""Every backend call the tiering daemon makes passes here: bounded, fenced and accounted for.

:class:`GuardedRoot` wraps the configured :class:`~tierd.drivers.segment.DriverRoot` (and its
drivers) so that three rules hold for every backend, shipped or third-party, in one place:

* **Bounded.** Each call must finish within ``tiered.backend_timeout`` seconds (seals, whose
  work grows with the segment, :data:`SEAL_TIMEOUT_FACTOR` times that). A call that does not is
  cancelled and fails with a :class:`~tierd.errors.BackendError` naming the operation, the path
  and the setting — a hung S3 endpoint becomes an error in bounded time, never a hang. If the
  cancelled call does not even unwind within :data:`CANCEL_GRACE` seconds (a cleanup request to
  the same hung server), it is left to finish in the background and the error is raised anyway.
* **Fenced.** Before a *mutating* call (segment create/write/seal/delete, object
  put/create/delete) the ``fence`` coroutine runs — the prefix-ownership check
  (:meth:`~tierd.tiered.ownership.Ownership.ensure`), which raises
  :class:`~tierd.errors.PrefixOwnedError` once another store owns the prefix. Reads are never
  fenced: a fenced store still serves what it has.
* **Accounted.** :class:`BackendHealth` records the outcome of every call: the backend is
  *reachable* when the last call got an answer (a missing object is an answer; a
  :class:`~tierd.errors.BackendError` or a timeout is not), with the time of the last success
  and the recent errors — what ``GET /v1/status`` and the metrics report.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tierd.drivers.segment import ByteRange, DriverRoot, SegmentDriver
from tierd.errors import BackendError, TierdError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping

log = logging.getLogger(__name__)
_T = TypeVar("_T")
#: Seals compose a whole segment (O(segment size)): they get this many backend timeouts.
SEAL_TIMEOUT_FACTOR = 10
#: Seconds a timed-out call gets to unwind after cancellation before it is left behind.
CANCEL_GRACE = 2.0
#: Recent errors kept for ``/v1/status`` (identical consecutive ones are counted, not repeated).
RECENT_ERRORS = 10


@dataclass(slots=True)
class ErrorEntry:
    """One error (or a run of identical ones) seen by the cold tier."""

    first_ms: int
    last_ms: int
    operation: str
    code: str
    message: str
    count: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "first": self.first_ms,
            "last": self.last_ms,
            "operation": self.operation,
            "code": self.code,
            "message": self.message,
            "count": self.count,
        }


class BackendHealth:
    """Outcome of backend calls and tiering failures (see module doc); plain counters, so reading
    it at scrape time or for ``/v1/status`` costs nothing on the call path."""

    def __init__(self) -> None:
        self.calls = 0
        self.failures = 0
        self.timeouts = 0
        #: None until a call was made; then whether the last call got an answer.
        self.reachable: bool | None = None
        self.last_ok_ms: int | None = None
        self.last_failure_ms: int | None = None
        self.recent: collections.deque[ErrorEntry] = collections.deque(maxlen=RECENT_ERRORS)

    def ok(self) -> None:
        self.calls += 1
        self.reachable = True
        self.last_ok_ms = int(time.time() * 1000)

    def failed(self, operation: str, err: BaseException) -> None:
        """A call that got no usable answer (a backend fault or a timeout)."""
        self.calls += 1
        self.failures += 1
        self.reachable = False
        self.last_failure_ms = int(time.time() * 1000)
        self.note(operation, err)

    def note(self, operation: str, err: BaseException) -> None:
        """Remember an error for ``/v1/status`` (also tiering failures that are not the
        backend's, such as a conflict or a fenced prefix)."""
        now = int(time.time() * 1000)
        code = err.code if isinstance(err, TierdError) else type(err).__name__
        message = str(err)
        last = self.recent[-1] if self.recent else None
        if last is not None and (last.operation, last.code, last.message) == (operation, code, message):
            last.count += 1
            last.last_ms = now
            return
        self.recent.append(ErrorEntry(now, now, operation, code, message))


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a call left behind after its timeout (no 'never retrieved' noise)."""
    if not task.cancelled():
        task.exception()


class GuardedRoot(DriverRoot):
    """The daemon's view of its backend root (see module doc). ``fence`` is set once ownership
    is known; ``health`` is shared with the status route and the metrics."""

    def __init__(self, inner: DriverRoot, timeout: float, health: BackendHealth | None = None) -> None:
        super().__init__(inner.url, inner.storage_options)
        self.inner = inner
        self.timeout = timeout
        self.health = health if health is not None else BackendHealth()
        #: Awaited before every mutating call; raises to refuse it (prefix ownership).
        self.fence: Callable[[], Awaitable[None]] | None = None
        #: Path prefixes no mutating call may touch, and the error it gets instead: the segments
        #: of a queue whose cold files are damaged (:class:`~tierd.tiered.flatstore.QueueDamage`).
        self._refused: dict[str, TierdError] = {}

    def refuse_writes(self, prefix: str, error: TierdError) -> None:
        """Refuse every mutating call on a path under ``prefix`` with ``error`` from now on."""
        self._refused[prefix] = error

    def refuse_writes_clear(self) -> None:
        """Forget :meth:`refuse_writes` (a new load finds the damage again)."""
        self._refused.clear()

    @property
    def supports_create_object(self) -> bool:
        # docstring inherited
        return self.inner.supports_create_object

    def driver(self, path: str) -> GuardedDriver:
        # docstring inherited
        return GuardedDriver(self, self.inner.driver(path))

    async def call(
        self,
        operation: str,
        path: str,
        make: Callable[[], Coroutine[Any, Any, _T]],
        *,
        mutating: bool,
        timeout: float | None = None,
    ) -> _T:
        """Run one backend call under the rules of the module doc."""
        if mutating and self.fence is not None:
            await self.fence()
        if mutating and self._refused:
            refused = next((e for p, e in self._refused.items() if path.startswith(p)), None)
            if refused is not None:
                raise refused
        limit = self.timeout if timeout is None else timeout
        try:
            if mutating:
                result = await self._bounded_task(make(), limit)
            else:
                # Reads, sizes and listings unwind at once when cancelled (no cleanup requests):
                # a cheap in-task timeout is enough, and cold reads pay no task per call.
                async with asyncio.timeout(limit):
                    result = await make()
        except TimeoutError:
            err = BackendError(
                f"backend {operation} of {path or '/'!r} at {self.url} did not finish within {limit:g} s "
                "(tiered.backend_timeout): the backend is not answering",
                operation=operation,
                path=path,
                timeout=limit,
            )
            self.health.timeouts += 1
            self.health.failed(operation, err)
            raise err from None
        except BackendError as e:
            self.health.failed(operation, e)
            raise
        except TierdError:  # an answer (missing object, conflict...): the backend is there
            self.health.ok()
            raise
        except Exception as e:
            self.health.failed(operation, e)
            raise
        self.health.ok()
        return result

    @staticmethod
    async def _bounded_task(call: Coroutine[Any, Any, _T], limit: float) -> _T:
        """Await ``call`` in its own task for at most ``limit`` seconds, then raise
        ``TimeoutError`` — without waiting more than :data:`CANCEL_GRACE` for it to unwind (a
        mutation may clean up with further requests to the same hung server, e.g. aborting a
        multipart upload; those finish in the background)."""
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=limit)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if done:
            return task.result()
        task.cancel()
        unwound, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE)
        if unwound:
            _consume(task)
        else:
            task.add_done_callback(_consume)
        raise TimeoutError

    async def put_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        await self.call("put_object", path, lambda: self.inner.put_object(path, data), mutating=True)

    async def create_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        await self.call("create_object", path, lambda: self.inner.create_object(path, data), mutating=True)

    async def get_object(self, path: str) -> bytes:
        # docstring inherited
        return await self.call("get_object", path, lambda: self.inner.get_object(path), mutating=False)

    async def delete_object(self, path: str) -> None:
        # docstring inherited
        await self.call("delete_object", path, lambda: self.inner.delete_object(path), mutating=True)

    async def list_objects(self, prefix: str) -> list[str]:
        # docstring inherited
        return await self.call(
            "list_objects", prefix, lambda: self.inner.list_objects(prefix), mutating=False
        )

    async def expect_new_dirs(self, parent: str, names: Collection[str], *, max_requests: int) -> int:
        # docstring inherited — a listing, bounded like every other call
        return await self.call(
            "list_objects",
            parent,
            lambda: self.inner.expect_new_dirs(parent, names, max_requests=max_requests),
            mutating=False,
        )

    def forget_new_dirs(self) -> None:
        # docstring inherited
        self.inner.forget_new_dirs()

    async def check_capabilities(self) -> Mapping[str, Any] | None:
        # docstring inherited — the wrapped root's probe, bounded (never fenced: it decides
        # whether writing is safe at all, in scratch objects of its own)
        return await self.call("check_capabilities", "", self.inner.check_capabilities, mutating=False)

    def capability_report(self) -> Mapping[str, Any] | None:
        # docstring inherited
        return self.inner.capability_report()

    async def aclose(self) -> None:
        # docstring inherited
        await self.inner.aclose()

    def __repr__(self) -> str:
        return repr(self.inner)


class GuardedDriver(SegmentDriver):
    """A driver of a :class:`GuardedRoot`: delegates every call through :meth:`GuardedRoot.call`."""

    root: GuardedRoot

    def __init__(self, root: GuardedRoot, inner: SegmentDriver) -> None:
        super().__init__(root, inner.path)
        self.inner = inner
        self.supports_append = inner.supports_append
        self.needs_seal = inner.needs_seal

    async def size(self) -> int:
        # docstring inherited
        return await self.root.call("size", self.path, self.inner.size, mutating=False)

    async def exists(self) -> bool:
        # docstring inherited
        return await self.root.call("exists", self.path, self.inner.exists, mutating=False)

    async def create(self) -> None:
        # docstring inherited
        await self.root.call("create", self.path, self.inner.create, mutating=True)

    async def delete(self) -> None:
        # docstring inherited
        await self.root.call("delete", self.path, self.inner.delete, mutating=True)

    async def read(self, byte_range: ByteRange) -> bytes:
        # docstring inherited
        return await self.root.call("read", self.path, lambda: self.inner.read(byte_range), mutating=False)

    async def read_into(self, byte_range: ByteRange, out: memoryview) -> None:
        # docstring inherited: the inner driver's own (an S3 body received straight into ``out``)
        await self.root.call("read", self.path, lambda: self.inner.read_into(byte_range, out), mutating=False)

    async def write(self, position: int, data: bytes) -> None:
        # docstring inherited
        await self.root.call("write", self.path, lambda: self.inner.write(position, data), mutating=True)

    async def seal(self) -> None:
        # docstring inherited
        await self.root.call(
            "seal", self.path, self.inner.seal, mutating=True, timeout=self.root.timeout * SEAL_TIMEOUT_FACTOR
        )

    async def is_sealed(self) -> bool:
        # docstring inherited
        return await self.root.call("is_sealed", self.path, self.inner.is_sealed, mutating=False)

    def object_bounds(self, start: int, end: int) -> list[int]:
        # docstring inherited (no backend call: nothing to guard)
        return self.inner.object_bounds(start, end)
