"""Process logging: one line per record, as text or as JSON.

Why a module of its own: the daemon, the CLI and the background services all log through the
standard :mod:`logging` tree, and ``log.format = "json"`` must give one JSON object per line
whoever emits a record (log collectors parse it, and a traceback stays inside its record instead
of spilling over 100 lines). Which failures are one line and how repeats are rate-limited is
:mod:`tierd.repeats`' job (:class:`~tierd.repeats.FailureLog`); its count of held-back failures
becomes the ``repeats`` field here.

Context fields: a JSON line carries ``request_id``, ``topic``, ``queue`` and ``group`` when the
code that logs runs on behalf of one (:data:`LOG_FIELDS`). They are bound where they are known —
the HTTP and gRPC request boundaries (:mod:`tierd.service.context`, :mod:`tierd.grpc.context`)
— in a :class:`~contextvars.ContextVar`, so every record of that request carries them without
each log call restating them: each asyncio task and each thread has its own, and ``asyncio.to_thread``
carries them along. A record's own ``extra={"topic": …}`` wins over the bound value. Only these
fields are ever added: nothing a request carries (its token, its body) reaches a log line this
way.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import re
import sys
import uuid
from contextvars import ContextVar, Token
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The context fields a JSON line may carry, in this order.
LOG_FIELDS = ("request_id", "topic", "queue", "group")

#: A caller's request id kept as it is (HTTP ``X-Request-Id``, gRPC ``x-mq-request-id``): what
#: tracing systems, load balancers and RocketMQ clients send (UUIDs, W3C trace ids, AWS
#: ``Root=1-…`` ids), bounded. Anything else is replaced, not logged: it must not forge a line.
REQUEST_ID = re.compile(r"[A-Za-z0-9._:=+/-]{1,128}")

_EMPTY: Mapping[str, str | int] = MappingProxyType({})
_fields: ContextVar[Mapping[str, str | int]] = ContextVar("tierd_log_fields", default=_EMPTY)


def bind(**fields: str | int | None) -> Token[Mapping[str, str | int]]:
    """Add ``fields`` (None: left as they are) to every record logged from this task or thread
    from now on; :func:`unbind` with the token restores what was bound before."""
    unknown = set(fields) - set(LOG_FIELDS)
    if unknown:
        raise ValueError(f"not a log context field: {sorted(unknown)} (fields: {LOG_FIELDS})")
    merged = dict(_fields.get())
    merged.update({k: v for k, v in fields.items() if v is not None})
    return _fields.set(MappingProxyType(merged))


def request_id(asked: str | None) -> str:
    """``asked`` when well-formed (:data:`REQUEST_ID`), else a new id (32 hex digits)."""
    if asked is not None and REQUEST_ID.fullmatch(asked):
        return asked
    return uuid.uuid4().hex


def unbind(token: Token[Mapping[str, str | int]]) -> None:
    _fields.reset(token)


@contextlib.contextmanager
def log_context(**fields: str | int | None) -> Iterator[None]:
    """:func:`bind` for the duration of a ``with`` block (threads that outlive the work)."""
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


def log_fields() -> Mapping[str, str | int]:
    """The fields bound now."""
    return _fields.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    the context fields that apply (:data:`LOG_FIELDS`), ``repeats`` when a
    :class:`~tierd.repeats.FailureLog` held some back, ``exception`` as one string. Formatting
    runs in the thread that logs (a plain StreamHandler), so the bound fields are the caller's."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        bound = _fields.get()
        for name in LOG_FIELDS:
            value = getattr(record, name, None)
            if value is None:
                value = bound.get(name)
            if value is not None:
                out[name] = value
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
