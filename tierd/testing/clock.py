"""A clock that moves only when a test says so.

Services that stamp files or decide by age (the cold key index seals a file an hour after it
began) take a ``clock`` callable returning epoch milliseconds; tests and benchmarks pass this one
and set :attr:`ManualClock.now` to move time, so no test waits for real time to pass.
"""

from __future__ import annotations


class ManualClock:
    """``clock()`` returns :attr:`now` (epoch milliseconds), which only the caller changes."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now
