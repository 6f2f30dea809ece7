"""A fault-injecting wrapper around any :class:`~tierd.drivers.segment.SegmentDriver` and the
whole-object API of its :class:`~tierd.drivers.segment.DriverRoot`.

Tests use it to prove what the layers above do when a backend misbehaves — and, because it
records every call with its outcome, to assert *what happened* (how many writes, at which
positions, which failed) rather than only the final state.

Faults (:class:`Fault`):

* ``BEFORE`` — raise without touching the backend (a request that never left).
* ``AFTER`` — perform the call, then raise (the acknowledgement was lost).
* ``HALF`` — for ``write`` only: write the first half of the bytes, then raise (a partial write;
  on a chunked backend, a short chunk). Never for ``put_object``: object puts are atomic, so a
  failed put leaves the old object (``BEFORE``) or the new one (``AFTER``), nothing in between.

Method names for plans and the call log: the driver methods (``size``, ``write``, ...) and the
root's object methods ``put_object``, ``create_object``, ``get_object``, ``delete_object``,
``list_objects``.

Triggers: the Nth call of a method (:meth:`FaultPlan.fail_nth`), or every call of the chosen
methods with probability ``p`` drawn from a seeded RNG (reproducible), plus optional delays.
Injected errors are :class:`InjectedFault`, a :class:`~tierd.errors.BackendError`, so callers
treat them exactly like a real backend failure.
"""

from __future__ import annotations

import asyncio
import enum
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from tierd.drivers.segment import (
    ByteRange,
    DriverRoot,
    SegmentDriver,
    validate_object_prefix,
    validate_segment_path,
)
from tierd.errors import BackendError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

__all__ = ["Call", "Fault", "FaultPlan", "FaultyDriver", "FaultyRoot", "InjectedFault"]

_T = TypeVar("_T")


class InjectedFault(BackendError):
    """A failure injected by :class:`FaultyDriver` (never raised by a real backend)."""

    code = "injected_fault"


class Fault(enum.Enum):
    """How an injected failure behaves (see module doc)."""

    BEFORE = "before"
    AFTER = "after"
    HALF = "half"


class Call(NamedTuple):
    """One recorded call: method name, short argument summary, outcome (``"ok"``,
    ``"fault:before"``, ``"fault:after"``, ``"fault:half"`` or ``"error:<ExceptionType>"``)."""

    method: str
    args: str
    outcome: str


@dataclass
class FaultPlan:
    """What to inject. Shared by every driver of a :class:`FaultyRoot`, so counters are global
    to the root (the 3rd ``write`` anywhere, not per segment)."""

    #: Probability of a random fault per call of a method in ``methods``.
    probability: float = 0.0
    #: Methods eligible for random faults.
    methods: frozenset[str] = frozenset({"write"})
    #: Fault kinds drawn at random (uniformly) for random faults.
    modes: tuple[Fault, ...] = (Fault.BEFORE, Fault.AFTER, Fault.HALF)
    #: Seed of the RNG deciding random faults.
    seed: int = 0
    #: Seconds of delay added before each call of a method.
    delays: Mapping[str, float] = field(default_factory=dict)
    _nth: dict[tuple[str, int], Fault] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def fail_nth(self, method: str, n: int, fault: Fault = Fault.BEFORE) -> FaultPlan:
        """Make the ``n``-th call (1-based) of ``method`` fail with ``fault``; returns self."""
        if fault is Fault.HALF and method != "write":
            raise ValueError("Fault.HALF applies to write only")
        self._nth[(method, n)] = fault
        return self

    def decide(self, method: str) -> Fault | None:
        """Count a call of ``method`` and return the fault to inject, if any."""
        n = self._counts.get(method, 0) + 1
        self._counts[method] = n
        fault = self._nth.pop((method, n), None)
        if fault is not None:
            return fault
        if self.probability and method in self.methods and self._rng.random() < self.probability:
            modes = self.modes if method == "write" else tuple(m for m in self.modes if m is not Fault.HALF)
            return self._rng.choice(modes) if modes else None
        return None

    def count(self, method: str) -> int:
        """How many calls of ``method`` were made so far."""
        return self._counts.get(method, 0)


async def _guarded(
    plan: FaultPlan, calls: list[Call], method: str, summary: str, op: Callable[[], Awaitable[_T]]
) -> _T:
    """Run ``op`` under ``plan`` (delay, then a BEFORE or AFTER fault or none), logging the call."""
    delay = plan.delays.get(method, 0.0)
    if delay:
        await asyncio.sleep(delay)
    fault = plan.decide(method)
    if fault is Fault.BEFORE:
        calls.append(Call(method, summary, "fault:before"))
        raise InjectedFault(f"injected fault before {method} {summary}", method=method)
    try:
        result = await op()
    except Exception as e:
        calls.append(Call(method, summary, f"error:{type(e).__name__}"))
        raise
    if fault is Fault.AFTER:
        calls.append(Call(method, summary, "fault:after"))
        raise InjectedFault(f"injected fault after {method} {summary} (it did happen)", method=method)
    calls.append(Call(method, summary, "ok"))
    return result


class FaultyRoot(DriverRoot):
    """Wraps another root; its drivers are :class:`FaultyDriver` sharing one plan and one call log.

    The object methods pass through to the wrapped root under the same plan and log, with the
    argument summaries ``"{path}:{len(data)}"`` (``put_object``, ``create_object``), ``"{path}"``
    (``get_object``, ``delete_object``) and ``"{prefix}"`` (``list_objects``). Paths are validated before any
    fault is drawn, so a bad path is always :class:`~tierd.errors.InvalidArgumentError`.
    """

    def __init__(self, inner: DriverRoot, plan: FaultPlan | None = None) -> None:
        super().__init__(inner.url, {})
        self.inner = inner
        self.plan = plan if plan is not None else FaultPlan()
        #: Every call made through drivers of this root, in order.
        self.calls: list[Call] = []

    def driver(self, path: str) -> FaultyDriver:
        # docstring inherited
        return FaultyDriver(self.inner.driver(path), self.plan, self.calls, root=self)

    async def put_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        validate_segment_path(path)
        await _guarded(
            self.plan,
            self.calls,
            "put_object",
            f"{path}:{len(data)}",
            lambda: self.inner.put_object(path, data),
        )

    @property
    def supports_create_object(self) -> bool:
        # docstring inherited
        return self.inner.supports_create_object

    async def create_object(self, path: str, data: bytes) -> None:
        # docstring inherited
        validate_segment_path(path)
        await _guarded(
            self.plan,
            self.calls,
            "create_object",
            f"{path}:{len(data)}",
            lambda: self.inner.create_object(path, data),
        )

    async def get_object(self, path: str) -> bytes:
        # docstring inherited
        validate_segment_path(path)
        return await _guarded(self.plan, self.calls, "get_object", path, lambda: self.inner.get_object(path))

    async def delete_object(self, path: str) -> None:
        # docstring inherited
        validate_segment_path(path)
        await _guarded(self.plan, self.calls, "delete_object", path, lambda: self.inner.delete_object(path))

    async def list_objects(self, prefix: str) -> list[str]:
        # docstring inherited
        validate_object_prefix(prefix)
        return await _guarded(
            self.plan, self.calls, "list_objects", prefix, lambda: self.inner.list_objects(prefix)
        )

    async def aclose(self) -> None:
        # docstring inherited
        await self.inner.aclose()

    async def check_capabilities(self) -> Mapping[str, Any] | None:
        # docstring inherited — never faulted: the verdict is the wrapped backend's
        return await self.inner.check_capabilities()

    def capability_report(self) -> Mapping[str, Any] | None:
        # docstring inherited
        return self.inner.capability_report()

    def calls_of(self, method: str) -> list[Call]:
        """The recorded calls of one method."""
        return [c for c in self.calls if c.method == method]


class FaultyDriver(SegmentDriver):
    """Delegates to ``inner`` and injects the faults of ``plan``; records calls in ``calls``."""

    def __init__(
        self,
        inner: SegmentDriver,
        plan: FaultPlan | None = None,
        calls: list[Call] | None = None,
        *,
        root: DriverRoot | None = None,
    ) -> None:
        super().__init__(root if root is not None else inner.root, inner.path)
        self.inner = inner
        self.plan = plan if plan is not None else FaultPlan()
        self.calls: list[Call] = calls if calls is not None else []
        # Capabilities are the wrapped driver's.
        self.supports_append = inner.supports_append
        self.needs_seal = inner.needs_seal

    async def _do(self, method: str, summary: str, op: Callable[[], Awaitable[_T]]) -> _T:
        return await _guarded(self.plan, self.calls, method, summary, op)

    async def size(self) -> int:
        # docstring inherited
        return await self._do("size", "", self.inner.size)

    async def exists(self) -> bool:
        # docstring inherited
        return await self._do("exists", "", self.inner.exists)

    async def create(self) -> None:
        # docstring inherited
        await self._do("create", "", self.inner.create)

    async def delete(self) -> None:
        # docstring inherited
        await self._do("delete", "", self.inner.delete)

    async def read(self, byte_range: ByteRange) -> bytes:
        # docstring inherited
        return await self._do(
            "read", f"{byte_range.start}+{byte_range.length}", lambda: self.inner.read(byte_range)
        )

    async def write(self, position: int, data: bytes) -> None:
        # docstring inherited
        summary = f"{position}+{len(data)}"
        delay = self.plan.delays.get("write", 0.0)
        if delay:
            await asyncio.sleep(delay)
        fault = self.plan.decide("write")
        if fault is Fault.BEFORE:
            self.calls.append(Call("write", summary, "fault:before"))
            raise InjectedFault(f"injected fault before write {summary}", method="write")
        if fault is Fault.HALF:
            half = len(data) // 2
            if half:
                await self.inner.write(position, data[:half])
            self.calls.append(Call("write", summary, "fault:half"))
            raise InjectedFault(f"injected fault after writing {half} of {summary}", method="write")
        try:
            await self.inner.write(position, data)
        except Exception as e:
            self.calls.append(Call("write", summary, f"error:{type(e).__name__}"))
            raise
        if fault is Fault.AFTER:
            self.calls.append(Call("write", summary, "fault:after"))
            raise InjectedFault(f"injected fault after write {summary} (it did happen)", method="write")
        self.calls.append(Call("write", summary, "ok"))

    async def seal(self) -> None:
        # docstring inherited
        await self._do("seal", "", self.inner.seal)

    async def is_sealed(self) -> bool:
        # docstring inherited
        return await self._do("is_sealed", "", self.inner.is_sealed)

    def object_bounds(self, start: int, end: int) -> list[int]:
        # docstring inherited (a hint without I/O: no faults to inject)
        return self.inner.object_bounds(start, end)

    def calls_of(self, method: str) -> list[Call]:
        """The recorded calls of one method."""
        return [c for c in self.calls if c.method == method]
