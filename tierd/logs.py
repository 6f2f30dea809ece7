"""Process logging: one line per record, as text or as JSON.

Why a module of its own: the daemon, the CLI and the background services all log through the
standard :mod:`logging` tree, and ``log.format = "json"`` must give one JSON object per line
whoever emits a record (log collectors parse it, and a traceback stays inside its record instead
of spilling over 100 lines). Which failures are one line and how repeats are rate-limited is
:mod:`tierd.repeats`' job (:class:`~tierd.repeats.FailureLog`); its count of held-back failures
becomes the ``repeats`` field here.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any, Literal, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    ``repeats`` when a :class:`~tierd.repeats.FailureLog` held some back, ``exception`` as one
    string."""

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
) -> None:
    """Send every record of the process to ``stream`` (default stderr) in ``fmt``, at ``level``.
    Calling it again replaces tierd's handler.

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
    root.addHandler(handler)
