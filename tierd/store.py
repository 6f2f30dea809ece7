"""The public facade: :class:`MessageStore` (asyncio) and :class:`BlockingMessageStore` (scripts).

Writes go to the hot store; reads are routed by read policy (today the hot store serves every
read — the cold tier plugs in behind the same methods). The facade validates arguments and
owns lifecycle; it holds no data structures of its own.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tierd.errors import InvalidArgumentError, StoreClosedError
from tierd.inventory import QueueInfo, SegmentRow, check_kind, live_segments, queue_infos
from tierd.local.store import HotStore, PutBatchResult
from tierd.message import GetResult, Message, MessageExt, PutResult, ReadPolicy
from tierd.router import TierRouter
from tierd.tiered.restore import Progress, RestoreReport
from tierd.tiered.restore import restore as restore_from_bucket
from tierd.tiered.service import TieringService
from tierd.verify import Progress as VerifyProgress
from tierd.verify import VerifyReport, verify

if TYPE_CHECKING:
    from collections.abc import Coroutine, Generator, Sequence
    from types import TracebackType

    from tierd.config import TierdConfig

MAX_TIMESTAMP = 2**63 - 1
T = TypeVar("T")
Boundary = Literal["lower", "upper"]


def _policy(policy: ReadPolicy | str | None, default: str) -> ReadPolicy:
    if policy is None:
        return ReadPolicy(default)
    if isinstance(policy, ReadPolicy):
        return policy
    try:
        return ReadPolicy(str(policy).upper())
    except ValueError as e:
        raise InvalidArgumentError(
            f"policy must be one of {', '.join(p.value for p in ReadPolicy)}, got {policy!r}", policy=policy
        ) from e


def _boundary(boundary: str) -> Boundary:
    if boundary not in ("lower", "upper"):
        raise InvalidArgumentError(f"boundary must be 'lower' or 'upper', got {boundary!r}")
    return boundary  # type: ignore[return-value]


class _StoreCore:
    """Argument handling shared by both facades (one place, so both behave the same)."""

    def __init__(self, cfg: TierdConfig, hot: HotStore, tiering: TieringService | None = None) -> None:
        self.config = cfg
        self.hot = hot
        #: The cold tier (None when ``tiered.enabled`` is false).
        self.tiering = tiering
        self.router = TierRouter(cfg, hot, tiering)

    def _hot(self) -> HotStore:
        if self.hot.closed:
            raise StoreClosedError("the store is closed")
        return self.hot

    def _get(
        self, topic: str, queue_id: int, offset: int, max_count: int, policy: ReadPolicy | str | None
    ) -> Coroutine[Any, Any, GetResult]:
        self._hot()
        return self.router.get(
            topic, queue_id, offset, max_count, _policy(policy, self.config.tiered.storage_level)
        )

    def _query(
        self, topic: str, key: str, max_count: int, begin: int, end: int
    ) -> Coroutine[Any, Any, list[MessageExt]]:
        if not isinstance(max_count, int) or max_count < 1:
            raise InvalidArgumentError(f"max_count must be a positive integer, got {max_count!r}")
        if begin > end:
            raise InvalidArgumentError(f"begin ({begin}) must not be after end ({end})")
        self._hot()
        return self.router.query(topic, key, max_count, begin, end)

    # Cheap, synchronous reads shared verbatim by both facades (both tiers).
    def min_offset(self, topic: str, queue_id: int) -> int:
        self._hot()
        return self.router.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        self._hot()
        return self.router.max_offset(topic, queue_id)

    def _offset_for_time(
        self, topic: str, queue_id: int, timestamp: int, boundary: str
    ) -> Coroutine[Any, Any, int]:
        self._hot()
        return self.router.offset_for_time(topic, queue_id, timestamp, _boundary(boundary) == "upper")

    def _earliest_time(self, topic: str, queue_id: int) -> Coroutine[Any, Any, int]:
        self._hot()
        return self.router.earliest_time(topic, queue_id)

    def topics(self) -> dict[str, list[int]]:
        """Topic → queue ids, across both tiers (a topic whose hot files expired stays listed)."""
        out = {t: set(q) for t, q in self._hot().topics().items()}
        if self.tiering is not None:
            for t, q in self.tiering.flat.files:
                out.setdefault(t, set()).add(q)
        return {t: sorted(q) for t, q in sorted(out.items())}

    def queues(self, topic: str) -> list[QueueInfo]:
        """Every queue of ``topic`` with its offsets in each tier (NotFoundError if unknown)."""
        return queue_infos(self._hot(), self.tiering, topic)

    async def _segments(self, topic: str | None, queue_id: int | None, type: str | None) -> list[SegmentRow]:
        kind = check_kind(type)
        self._hot()
        if self.tiering is None:
            return []
        await self.tiering.wait_ready()
        return await live_segments(self.tiering, topic, queue_id, kind)

    async def _gc(self) -> GcReport:
        hot = self._hot()
        hot.wait_dispatched(30)
        files = await asyncio.to_thread(hot.apply_retention)
        segments = 0
        if self.tiering is not None:
            await self.tiering.wait_ready()
            segments = await self.tiering.apply_retention()
        return GcReport(hot_files=files, cold_segments=segments)

    async def _verify(self, progress: VerifyProgress | None) -> VerifyReport:
        hot = self._hot()
        hot.wait_dispatched(30)
        if self.tiering is not None:
            await self.tiering.wait_ready()
        return await verify(hot, self.tiering, progress)


@dataclass(frozen=True, slots=True)
class GcReport:
    """What :meth:`MessageStore.gc` deleted."""

    hot_files: int
    cold_segments: int


class MessageStore(_StoreCore):
    """Asyncio facade. Open with ``async with MessageStore.open(cfg) as store`` (or
    ``store = await MessageStore.open(cfg)`` and ``await store.close()``)."""

    @classmethod
    def open(cls, cfg: TierdConfig) -> _Opener:
        return _Opener(cfg)

    async def put(self, message: Message) -> PutResult:
        res, fut = self.hot.put(message)  # the hot store checks it is open
        if fut is not None:
            await asyncio.wrap_future(fut)
        return res

    async def put_batch(self, messages: Sequence[Message]) -> PutBatchResult:
        res, fut = self._hot().put_batch(messages)
        if fut is not None:
            await asyncio.wrap_future(fut)
        return res

    async def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        policy: ReadPolicy | str | None = None,
    ) -> GetResult:
        return await self._get(topic, queue_id, offset, max_count, policy)

    async def offset_for_time(
        self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower"
    ) -> int:
        """First offset stored at/after ``timestamp`` (``upper``: last of those stored exactly then)."""
        return await self._offset_for_time(topic, queue_id, timestamp, boundary)

    async def earliest_time(self, topic: str, queue_id: int) -> int:
        return await self._earliest_time(topic, queue_id)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the cold tier has loaded (no-op without one): until then reads and
        listings see the hot store only. BackendError if it takes longer than ``timeout``."""
        if self.tiering is not None:
            await self.tiering.wait_ready(timeout)

    async def segments(
        self, topic: str | None = None, queue_id: int | None = None, type: str | None = None
    ) -> list[SegmentRow]:
        """Cold segments (filters: topic, queue id, type COMMIT_LOG/CONSUME_QUEUE/INDEX)."""
        return await self._segments(topic, queue_id, type)

    async def gc(self) -> GcReport:
        """Apply retention now in both tiers (what the daemon does on its timers)."""
        return await self._gc()

    async def verify(self, progress: VerifyProgress | None = None) -> VerifyReport:
        """Check CRCs, consume queues, cold sizes/checksums and manifests; lists every problem."""
        return await self._verify(progress)

    async def query(
        self, topic: str, key: str, max_count: int = 32, begin: int = 0, end: int = MAX_TIMESTAMP
    ) -> list[MessageExt]:
        return await self._query(topic, key, max_count, begin, end)

    @staticmethod
    async def restore(cfg: TierdConfig, progress: Progress | None = None) -> RestoreReport:
        """Rebuild an empty store directory's tiering metadata from the bucket's manifests."""
        return await restore_from_bucket(cfg, progress=progress)

    async def tier_now(self) -> int:
        """Commit everything pending to the cold tier now; returns messages committed."""
        if self.tiering is None:
            return 0
        await asyncio.to_thread(self._hot().wait_dispatched, 30)
        return await self.tiering.tier_now()

    async def close(self, grace: float | None = None) -> None:
        """Close both tiers; pending messages get ``grace`` seconds (default
        ``server.shutdown_grace``) to reach the cold tier, the rest goes at the next start."""
        await self.router.fetcher.aclose()
        if self.tiering is not None:
            await self.tiering.close(self.config.server.shutdown_grace if grace is None else grace)
            self.tiering = self.router.tiering = None
        await asyncio.to_thread(self.hot.close)

    async def __aenter__(self) -> MessageStore:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class _Opener:
    """Awaitable *and* async context manager returned by :meth:`MessageStore.open`."""

    def __init__(self, cfg: TierdConfig) -> None:
        self._cfg = cfg
        self._store: MessageStore | None = None

    async def _open(self) -> MessageStore:
        self._store = await _open_async(MessageStore, self._cfg)
        return self._store

    def __await__(self) -> Generator[object, None, MessageStore]:
        return self._open().__await__()

    async def __aenter__(self) -> MessageStore:
        return await self._open()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._store is not None:
            await self._store.close()


class BlockingMessageStore(_StoreCore):
    """The same operations, synchronously, for scripts and threads::

    with BlockingMessageStore.open(cfg) as store:
        store.put(Message(topic="orders", body=b"..."))
    """

    def __init__(
        self,
        cfg: TierdConfig,
        hot: HotStore,
        tiering: TieringService | None = None,
        loop: _LoopThread | None = None,
    ) -> None:
        super().__init__(cfg, hot, tiering)
        self._loop = loop

    @classmethod
    def open(cls, cfg: TierdConfig) -> BlockingMessageStore:
        if not cfg.tiered.enabled:
            return cls(cfg, HotStore.open(cfg.store))
        loop = _LoopThread()
        try:
            inner = loop.run(_open_async(MessageStore, cfg))
        except BaseException:
            loop.stop()
            raise
        return cls(cfg, inner.hot, inner.tiering, loop)

    @staticmethod
    def restore(cfg: TierdConfig, progress: Progress | None = None) -> RestoreReport:
        """Rebuild an empty store directory's tiering metadata from the bucket's manifests."""
        return asyncio.run(restore_from_bucket(cfg, progress=progress))

    def tier_now(self) -> int:
        """Commit everything pending to the cold tier now; returns messages committed."""
        if self.tiering is None or self._loop is None:
            return 0
        self._hot().wait_dispatched(30)
        return self._loop.run(self.tiering.tier_now())

    def put(self, message: Message) -> PutResult:
        res, fut = self.hot.put(message)  # the hot store checks it is open
        if fut is not None:
            fut.result()
        return res

    def put_batch(self, messages: Sequence[Message]) -> PutBatchResult:
        res, fut = self._hot().put_batch(messages)
        if fut is not None:
            fut.result()
        return res

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        policy: ReadPolicy | str | None = None,
    ) -> GetResult:
        return self._run(self._get(topic, queue_id, offset, max_count, policy))

    def offset_for_time(self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower") -> int:
        """First offset stored at/after ``timestamp`` (``upper``: last of those stored exactly then)."""
        return self._run(self._offset_for_time(topic, queue_id, timestamp, boundary))

    def earliest_time(self, topic: str, queue_id: int) -> int:
        return self._run(self._earliest_time(topic, queue_id))

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the cold tier has loaded (no-op without one): until then reads and
        listings see the hot store only. BackendError if it takes longer than ``timeout``."""
        if self.tiering is not None and self._loop is not None:
            self._loop.run(self.tiering.wait_ready(timeout))

    def segments(
        self, topic: str | None = None, queue_id: int | None = None, type: str | None = None
    ) -> list[SegmentRow]:
        """Cold segments (filters: topic, queue id, type COMMIT_LOG/CONSUME_QUEUE/INDEX)."""
        return self._run(self._segments(topic, queue_id, type))

    def gc(self) -> GcReport:
        """Apply retention now in both tiers (what the daemon does on its timers)."""
        return self._run_any(self._gc())

    def verify(self, progress: VerifyProgress | None = None) -> VerifyReport:
        """Check CRCs, consume queues, cold sizes/checksums and manifests; lists every problem."""
        return self._run_any(self._verify(progress))

    def _run_any(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine that may suspend even without a cold tier."""
        if self._loop is not None:
            return self._loop.run(coro)
        return asyncio.run(coro)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a read on the tiering loop; without a cold tier the coroutine never suspends, so
        it is driven to completion right here (no loop round trip on the hot path)."""
        if self._loop is not None:
            return self._loop.run(coro)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        coro.close()
        raise RuntimeError("a read without a cold tier tried to suspend")

    def query(
        self, topic: str, key: str, max_count: int = 32, begin: int = 0, end: int = MAX_TIMESTAMP
    ) -> list[MessageExt]:
        return self._run(self._query(topic, key, max_count, begin, end))

    def close(self, grace: float | None = None) -> None:
        """Close both tiers; pending messages get ``grace`` seconds (default
        ``server.shutdown_grace``) to reach the cold tier, the rest goes at the next start."""
        if self._loop is not None:
            self._loop.run(self.router.fetcher.aclose())
        if self.tiering is not None and self._loop is not None:
            self._loop.run(self.tiering.close(self.config.server.shutdown_grace if grace is None else grace))
            self.tiering = self.router.tiering = None
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
        self.hot.close()

    def __enter__(self) -> BlockingMessageStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def _open_async(cls: type[MessageStore], cfg: TierdConfig) -> MessageStore:
    hot = await asyncio.to_thread(HotStore.open, cfg.store)
    tiering = None
    if cfg.tiered.enabled:
        try:
            tiering = TieringService(cfg, hot)
            await tiering.start()
        except BaseException:
            await asyncio.to_thread(hot.close)
            raise
    return cls(cfg, hot, tiering)


class _LoopThread:
    """An asyncio loop on a daemon thread: the blocking facade runs the (async) cold tier there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tierd-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


__all__ = ["BlockingMessageStore", "MessageStore"]
