"""The guarded root every daemon backend call goes through: bounded, fenced, accounted for."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

import tierd.tiered.guard as guard_module
from tierd.drivers.segment import ByteRange
from tierd.errors import BackendError, PrefixOwnedError, SegmentNotFoundError
from tierd.testing.faults import FaultPlan, FaultyRoot
from tierd.tiered.guard import GuardedRoot

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tierd.drivers.memory import MemoryRoot


def test_a_hung_write_fails_within_the_timeout_and_marks_the_backend_unreachable(mem: MemoryRoot) -> None:
    async def main() -> None:
        root = GuardedRoot(FaultyRoot(mem, FaultPlan(delays={"write": 3600})), timeout=0.2)
        with pytest.raises(BackendError, match=r"backend write of 'a/seg' .* did not finish within 0.2 s"):
            await root.driver("a/seg").write(0, b"x")
        assert (root.health.reachable, root.health.timeouts, root.health.failures) == (False, 1, 1)
        assert root.health.recent[-1].operation == "write"
        with pytest.raises(SegmentNotFoundError):
            await root.driver("a/seg").size()  # an answer: the backend is there again
        assert root.health.reachable is True

    asyncio.run(main())


def test_a_mutation_that_will_not_unwind_is_left_behind_after_a_grace(
    mem: MemoryRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timed-out seal cleans up with more requests (aborting its multipart upload) to the same
    hung server; the caller must not wait for those."""
    monkeypatch.setattr(guard_module, "CANCEL_GRACE", 0.1)
    unwound = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # cleanup against the hung server
            unwound.set()
            raise

    async def main() -> None:
        root = GuardedRoot(mem, timeout=0.1)
        started = time.monotonic()
        with pytest.raises(BackendError, match=r"did not finish within 0\.1 s"):
            await root.call("seal", "a/seg", stubborn, mutating=True)
        assert not unwound.is_set()  # the error came before the cleanup finished...
        await asyncio.wait_for(unwound.wait(), 10)  # ...which still ran to its end
        assert time.monotonic() - started < 10

    asyncio.run(main())


def test_the_fence_refuses_mutations_and_lets_reads_through(mem: MemoryRoot) -> None:
    async def main() -> None:
        root = GuardedRoot(mem, timeout=5)
        await root.driver("a/seg").write(0, b"abc")
        await root.put_object("a/MANIFEST.json", b"{}")
        refused = PrefixOwnedError("owned by someone else")

        async def fence() -> None:
            raise refused

        root.fence = fence
        seg = root.driver("a/seg")
        mutations: list[Callable[[], Awaitable[None]]] = [
            lambda: seg.write(3, b"d"),
            seg.create,
            seg.seal,
            seg.delete,
            lambda: root.put_object("a/MANIFEST.json", b"new"),
            lambda: root.create_object("a/OWNER", b"me"),
            lambda: root.delete_object("a/MANIFEST.json"),
        ]
        for mutation in mutations:
            with pytest.raises(PrefixOwnedError):
                await mutation()
        assert await seg.read(ByteRange(0, 3)) == b"abc"  # reads are never fenced
        assert await root.get_object("a/MANIFEST.json") == b"{}"
        assert await root.list_objects("a") == ["a/MANIFEST.json", "a/seg"]
        assert await seg.is_sealed() is False

    asyncio.run(main())
