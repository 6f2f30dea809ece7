"""Process logging: one line per record, text or JSON, with repeated records rate-limited.

Why a module of its own: the daemon, the CLI and the background services all log through the
standard :mod:`logging` tree, and three properties must hold whoever emits a record:

* ``log.format = "json"`` gives one JSON object per line (log collectors parse it, and a
  traceback stays inside its record instead of spilling over 100 lines);
* an *expected* failure (a backend outage, a refused write) is one line — :func:`log_failure`
  decides between one line and a traceback by the exception's type;
* a failure that repeats (S3 down: every dispatch round, every read fails alike) does not flood
  the log — :class:`RepeatFilter`, installed on the handler by :func:`setup_logging`, lets the
  first record through and then one per interval, carrying the count of those it held back.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Literal, TextIO

from tierd.errors import TierdError

if TYPE_CHECKING:
    from collections.abc import Callable

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Identical records pass once per this many seconds (with the count of the ones held back).
REPEAT_INTERVAL = 60.0
#: Distinct records remembered by :class:`RepeatFilter` (the oldest are forgotten first).
REPEAT_MEMORY = 1024
#: Exceptions that are expected in operation (backends, disks, networks): one line, no traceback.
EXPECTED_FAILURES: tuple[type[BaseException], ...] = (TierdError, OSError, TimeoutError)


class RepeatFilter(logging.Filter):
    """Rate-limit identical records (same logger, level and message text).

    The first occurrence passes. Repeats within ``interval`` seconds are dropped and counted; the
    first repeat after the interval passes with `` [N more like this in the last S s]``
    appended, and the interval starts again. Records below ``min_level`` always pass (debug
    output is wanted whole). Thread-safe: records come from the event loop and from worker
    threads alike.
    """

    def __init__(
        self,
        interval: float = REPEAT_INTERVAL,
        min_level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval = interval
        self.min_level = min_level
        self.clock = clock
        self._seen: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level:
            return True
        key = (record.name, record.levelno, record.getMessage())
        now = self.clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is None:
                self._seen[key] = [now, 0]
                if len(self._seen) > REPEAT_MEMORY:
                    self._seen.popitem(last=False)
                return True
            self._seen.move_to_end(key)
            since, held = entry
            if now - since < self.interval:
                entry[1] = held + 1
                return False
            entry[0], entry[1] = now, 0
        if held:
            record.msg = f"{record.getMessage()} [{held} more like this in the last {now - since:.0f} s]"
            record.args = None
            record.repeats = held
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    ``repeats`` when :class:`RepeatFilter` held some back, ``exception`` as one string."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        repeats = getattr(record, "repeats", None)
        if repeats:
            out["repeats"] = repeats
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def setup_logging(
    level: str,
    fmt: Literal["text", "json"] = "text",
    stream: TextIO | None = None,
    repeat_interval: float = REPEAT_INTERVAL,
) -> None:
    """Send every record of the process to ``stream`` (default stderr) in ``fmt``, at ``level``,
    with :class:`RepeatFilter` on the handler. Calling it again replaces tierd's handler.

    When the process already has handlers of its own (an application embedding tierd, a test
    runner capturing logs) only the level is set: their logging is theirs to shape.
    """
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "tierd", False)]
    root.setLevel(level.upper())
    if len(ours) < len(root.handlers):
        return
    for h in ours:
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.tierd = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RepeatFilter(repeat_interval))
    root.addHandler(handler)


def log_failure(logger: logging.Logger, message: str, exc: BaseException) -> None:
    """Log a failure the caller recovers from (it retries, or the next round does): one warning
    line with the error's text when the failure is an expected kind (:data:`EXPECTED_FAILURES`:
    backends, disks, networks, timeouts), a full traceback when it is a bug."""
    if isinstance(exc, EXPECTED_FAILURES):
        logger.warning("%s: %s", message, str(exc) or type(exc).__name__)
    else:
        logger.error("%s", message, exc_info=exc)
