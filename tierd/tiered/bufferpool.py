"""Receive buffers for cold batch loads, reused instead of allocated per load.

A cold batch is one ranged read of a few MiB. Received into new memory each time, every page of
it is mapped afresh — a page fault per 4 KiB, most of a GET's CPU on this path (system time,
docs/performance.md, P3). The fetcher receives each batch into a buffer from this pool instead
(:meth:`~tierd.drivers.segment.SegmentDriver.read_into`) and offers it back when the batch
leaves the read-ahead cache; the next load that fits reuses it, its pages already mapped.

Safety does not rest on bookkeeping: a buffer is handed out again only when nothing views it
any more. A batch decodes from a ``memoryview`` of its buffer and ``bytearray`` refuses to
change size while any view of it exists (``BufferError``), so :func:`unviewed` asks the buffer
itself — a batch dropped from the cache while a reader still decodes it, or a view kept alive
by a traceback, keeps its buffer out of use. Memory stays bounded: the pool keeps at most
``max_bytes`` of idle buffers (the oldest go first, and any idle longer than ``expire``
seconds); buffers in use are the cache's, counted against ``cache_max_bytes`` like before.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

__all__ = ["BufferPool", "PoolStats", "capacity_for", "unviewed"]

#: Smallest allocation step (a page); larger buffers round up to a step of 1/16-1/8 of their
#: size, so a buffer also serves loads a little larger than the one it was made for, wasting
#: at most an eighth.
GRAIN = 4096


def capacity_for(size: int) -> int:
    """Bytes allocated for a load of ``size``: rounded up to a step of 1/16-1/8 of it (at
    least :data:`GRAIN`)."""
    step = max(GRAIN, 1 << max(0, size.bit_length() - 4))
    return -(-size // step) * step


def unviewed(buf: bytearray) -> bool:
    """Whether nothing (a ``memoryview``, a numpy array, a slice of either) exports ``buf``:
    a ``bytearray`` cannot change size while exported. Checked by dropping its last byte and
    putting it back — neither reallocates (CPython keeps the allocation for a one-byte change;
    ``bytearray(n)`` holds ``n + 1``); the byte's value is lost, which a free buffer does not
    mind."""
    if not buf:
        return True
    try:
        del buf[-1]
    except BufferError:
        return False
    buf.append(0)
    return True


@dataclass(slots=True)
class PoolStats:
    #: Buffers handed out that had been used before (their pages already mapped).
    reused: int = 0
    #: Buffers newly allocated because none idle fitted.
    allocated: int = 0
    #: Idle buffers skipped because something still viewed them.
    busy: int = 0


class BufferPool:
    """Idle receive buffers, at most ``max_bytes`` of them, none older than ``expire`` s."""

    def __init__(self, max_bytes: int, expire: float) -> None:
        self.max_bytes = max_bytes
        self.expire = expire
        #: Idle buffers, oldest first, with when they were given back.
        self._idle: deque[tuple[float, bytearray]] = deque()
        self.bytes = 0
        self.stats = PoolStats()

    def acquire(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes that nothing views: the smallest idle one that
        fits without wasting more than a step (see :func:`capacity_for`), else a new one."""
        self._expire()
        limit = capacity_for(size)
        best = -1
        for i, (_, buf) in enumerate(self._idle):
            if size <= len(buf) <= limit and (best < 0 or len(buf) < len(self._idle[best][1])):
                if unviewed(buf):
                    best = i
                else:
                    self.stats.busy += 1
        if best < 0:
            self.stats.allocated += 1
            return bytearray(limit)
        _, buf = self._idle[best]
        del self._idle[best]
        self.bytes -= len(buf)
        self.stats.reused += 1
        return buf

    def release(self, buf: bytearray) -> None:
        """Offer ``buf`` back; it is reused only once nothing views it. Kept within
        ``max_bytes`` (oldest idle buffers dropped first)."""
        if len(buf) > self.max_bytes or any(b is buf for _, b in self._idle):
            return
        self._idle.append((time.monotonic(), buf))
        self.bytes += len(buf)
        while self.bytes > self.max_bytes:
            self._drop_oldest()
        self._expire()

    def clear(self) -> None:
        """Drop every idle buffer (the fetcher is closing)."""
        self._idle.clear()
        self.bytes = 0

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.expire
        while self._idle and self._idle[0][0] < cutoff:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, buf = self._idle.popleft()
        self.bytes -= len(buf)

    def _idle_buffers(self) -> list[bytearray]:
        """The idle buffers, oldest first (for tests and metrics)."""
        return [buf for _, buf in self._idle]
