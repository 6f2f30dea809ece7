"""Failures that repeat: logged once, then once per interval with a count — never a flood.

A background activity that retries after a failure (the hot store's housekeeping every second,
a commit round, a manifest write) would otherwise log the same failure every time it tries:
thousands of identical lines while a disk is full or a descriptor limit is reached, burying the
one line that explains it. :class:`FailureLog` keeps one such activity's log readable:

* the first failure is logged (one line for an expected kind — a tierd error, an OS error —
  with a traceback for anything else, which is a bug);
* further failures within ``interval`` seconds are only counted; the first one after it is
  logged with the count, and the interval starts again;
* the first success after failures is logged once ("recovered after N failures").
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from tierd.errors import TierdError

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable

#: Seconds between two log lines about the same repeating failure.
REPEAT_INTERVAL = 60.0
#: Failures reported as one line, without a traceback: they explain themselves.
EXPECTED = (TierdError, OSError, TimeoutError)


class FailureLog:
    """The log of one retrying activity named ``what`` (e.g. "housekeeping"). Thread-safe."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        interval: float = REPEAT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what
        self.interval = interval
        self.clock = clock
        #: Failures since the last success.
        self.failures = 0
        self._held = 0
        self._logged_at = 0.0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException, retry: str = "") -> None:
        """Record a failure; log it if it is the first or the interval has passed. ``retry`` says
        what happens next (e.g. "retrying in 1 s")."""
        now = self.clock()
        with self._lock:
            self.failures += 1
            if self.failures > 1 and now - self._logged_at < self.interval:
                self._held += 1
                return
            held, self._held, self._logged_at = self._held, 0, now
        tail = f"; {retry}" if retry else ""
        if held:
            tail += f" [{held} more failure(s) in the last {self.interval:.0f} s]"
        extra = {"repeats": held} if held else None  # a field of its own in JSON logs
        if isinstance(exc, EXPECTED):
            self.logger.error("%s failed: %s%s", self.what, str(exc) or type(exc).__name__, tail, extra=extra)
        else:
            self.logger.error("%s failed%s", self.what, tail, exc_info=exc, extra=extra)

    def succeeded(self) -> None:
        """Record a success; log the recovery once if there were failures."""
        if not self.failures:
            return
        with self._lock:
            failures, self.failures, self._held = self.failures, 0, 0
        self.logger.warning("%s recovered after %d failure(s)", self.what, failures)
