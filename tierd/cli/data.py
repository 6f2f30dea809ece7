"""Data commands: ``produce``, ``consume``, ``query``, ``message`` — for trying a store out and for
operators looking at real messages."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import typer

from tierd.cli.app import app, echo, emit_json, emit_table, handle_errors, obj
from tierd.cli.consumers import parse_time
from tierd.cli.scheduled import report_scheduled, schedule
from tierd.errors import InvalidArgumentError, NotFoundError
from tierd.message import GetResult, GetStatus, Message, ReadPolicy

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from tierd.format.message_ext import MessageExt
    from tierd.queue_info import QueueInfo

PREVIEW = 60


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def _preview(body: bytes) -> str:
    return printable(body[:PREVIEW]) + ("…" if len(body) > PREVIEW else "")


def _message_rows(messages: list[MessageExt] | tuple[MessageExt, ...]) -> list[list[Any]]:
    return [
        [
            m.queue_id,
            m.queue_offset,
            _when(m.store_timestamp),
            ",".join(m.keys),
            m.tags,
            len(m.body),
            _preview(m.body),
        ]
        for m in messages
    ]


MESSAGE_COLUMNS = ["queue", "offset", "stored (UTC)", "keys", "tags", "bytes", "body"]


def _properties(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--property")
        out[key] = value
    return out


def _bodies(body: str | None, file: Path | None, lines: bool) -> list[bytes]:
    """The message bodies: the BODY argument, the file, or — with neither, when stdin is not a
    terminal — one message per line of stdin (as kcat and kafka-console-producer read)."""
    if body is not None and file is not None:
        raise typer.BadParameter("give a BODY argument or --file, not both")
    if body is not None:
        data = body.encode()
    elif file is not None:
        try:
            data = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
        except OSError as e:  # missing, a directory, no permission: the operator's to fix
            raise InvalidArgumentError(
                f"cannot read --file {file}: {e.strerror or e}", path=str(file)
            ) from None
    elif not sys.stdin.isatty():
        data, lines = sys.stdin.buffer.read(), True
    else:
        raise typer.BadParameter(
            "give the message body as an argument, --file PATH (- for stdin), or pipe lines into stdin"
        )
    if not lines:
        return [data]
    found = [line for line in data.splitlines() if line]
    if not found:
        raise typer.BadParameter("no message: the input holds no non-empty line")
    return found


@app.command()
@handle_errors
def produce(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to write to (created on first use).")],
    body: Annotated[str | None, typer.Argument(help="Message body (UTF-8). Or use --file.")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read the body from a file; '-' reads stdin.")
    ] = None,
    lines: Annotated[
        bool, typer.Option("--lines", help="One message per non-empty line of the body (one batch).")
    ] = False,
    key: Annotated[list[str] | None, typer.Option("--key", "-k", help="Message key (repeatable).")] = None,
    tag: Annotated[str | None, typer.Option("--tag", "-t", help="Message tag.")] = None,
    queue: Annotated[
        int | None, typer.Option("--queue", "-q", help="Queue id (default: round robin).", min=0)
    ] = None,
    prop: Annotated[
        list[str] | None, typer.Option("--property", "-p", help="User property KEY=VALUE (repeatable).")
    ] = None,
    deliver_at: Annotated[
        int | None,
        typer.Option("--deliver-at", help="Scheduled: visible at this time (ms since the epoch)."),
    ] = None,
    delay_level: Annotated[
        int | None, typer.Option("--delay-level", help="Scheduled: after RocketMQ delay level 1-18.")
    ] = None,
) -> None:
    """Append messages to TOPIC and print where they landed (scheduled: its handle).

    Examples: `tierd produce orders 'hello' -k o-1 -t paid`;
    `seq 1000 | tierd produce orders` (one message per line of stdin, sent as one batch).
    """
    c = obj(ctx)
    properties = _properties(prop or [])
    msgs = [
        Message(topic=topic, body=b, queue_id=queue, keys=tuple(key or ()), tags=tag, properties=properties)
        for b in _bodies(body, file, lines)
    ]
    if deliver_at is not None or delay_level is not None:
        if len(msgs) != 1:
            raise typer.BadParameter("a scheduled message is produced one at a time (no --lines)")
        with c.store(create=True) as store:
            report_scheduled(schedule(store, msgs[0], deliver_at, delay_level), c.json)
        return
    with c.store(create=True) as store:
        results = [store.put(msgs[0])] if len(msgs) == 1 else list(store.put_batch(msgs))
    if c.json:
        emit_json([dataclasses.asdict(r) for r in results])
    elif len(results) == 1:
        r = results[0]
        echo(f"stored {topic}/{r.queue_id}@{r.queue_offset} msg_id={r.msg_id}")
    else:
        echo(f"stored {len(results)} messages in {topic} (queues {sorted({r.queue_id for r in results})})")


#: ``--follow``: how long one idle read waits on the server for a message (ms) when every queue
#: is caught up — bounded by ``server.long_poll_max_ms``; see :func:`_follow`.
FOLLOW_WAIT_MS = 1000
#: ``--follow`` against a server that does not long-poll: seconds between idle rounds.
FOLLOW_POLL_SECONDS = 1.0
#: Messages asked for per queue and read while following (the server caps a read's bytes too).
FOLLOW_BATCH = 256
#: Exit status of ``consume --follow`` ended by Ctrl-C: a deliberate stop, as with ``kcat -C``.
EXIT_INTERRUPTED = 0


class _Store(Protocol):
    """What ``consume`` needs of a store: the facade here, or the daemon over HTTP."""

    def queues(self, topic: str) -> Sequence[QueueInfo]: ...
    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        policy: ReadPolicy | str | None = None,
        *,
        tags: str | None = None,
        wait_ms: int = 0,
    ) -> GetResult: ...
    def offset_for_time(self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower") -> int: ...
    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]: ...
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...


class _Start(enum.Enum):
    beginning = "beginning"
    end = "end"


@dataclass
class _Reader:
    """Where ``consume`` is in each queue of the topic, and how it reads on."""

    store: _Store
    topic: str
    only: list[int] | None
    start: _Start | int | dict[int, int]  # where a queue not seen before starts
    group: str | None
    commit: bool
    policy: ReadPolicy | None
    tags: str | None
    positions: dict[int, int] = field(default_factory=dict)
    results: dict[int, GetResult] = field(default_factory=dict)
    #: Offsets committed for the group by this run, by queue.
    committed: dict[int, int] = field(default_factory=dict)

    def refresh(self, *, missing_ok: bool) -> list[int]:
        """The queues to read (new ones start where ``start`` says). ``missing_ok``: a topic
        that does not exist yet has none (``--follow`` waits for it)."""
        try:
            infos = {q.queue_id: q for q in self.store.queues(self.topic)}
        except NotFoundError:
            if not missing_ok:
                raise
            infos = {}
        ids = sorted(infos) if self.only is None else self.only
        committed = self.store.committed_offsets(self.group) if self.group is not None else {}
        for q in ids:
            if q in self.positions:
                continue
            info = infos.get(q)
            lo, hi = (info.min_offset, info.max_offset) if info is not None else (0, 0)
            at = committed.get((self.topic, q))
            if at is None:
                if isinstance(self.start, dict):
                    at = self.start.get(q, lo)
                elif isinstance(self.start, int):
                    at = self.store.offset_for_time(self.topic, q, self.start)
                else:
                    at = lo if self.start is _Start.beginning else hi
            self.positions[q] = at
        return ids

    def read(self, q: int, count: int, wait_ms: int = 0) -> GetResult:
        res = self.store.get(
            self.topic, q, self.positions[q], count, self.policy, tags=self.tags, wait_ms=wait_ms
        )
        self.results[q] = res
        return res

    def advance(self, q: int, res: GetResult, taken: Sequence[MessageExt]) -> None:
        """Move queue ``q`` past what was printed of ``res`` (all of it, or the first few) and
        commit that for the group."""
        if len(taken) == len(res.messages):
            nxt = res.next_offset
        else:
            nxt = taken[-1].queue_offset + 1 if taken else self.positions[q]
        if res.status is GetStatus.NO_MATCHED_LOGIC_QUEUE or nxt == self.positions[q]:
            return
        self.positions[q] = nxt
        if self.group is not None and self.commit:
            self.store.commit_offset(self.group, self.topic, q, nxt)
            self.committed[q] = nxt


@app.command()
@handle_errors
def consume(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    queue: Annotated[
        list[int] | None,
        typer.Option("--queue", "-q", help="Only this queue id (repeatable; default: every queue).", min=0),
    ] = None,
    offset: Annotated[
        int | None,
        typer.Option(
            "--offset", help="First queue offset (one --queue only; default: see --from-beginning)."
        ),
    ] = None,
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning",
            help="Start at the oldest message kept (either tier). The default, except with --follow, "
            "which starts at the end (new messages only) unless this is given.",
        ),
    ] = False,
    from_time: Annotated[
        str | None,
        typer.Option(
            "--from-time",
            help="Start at the first message stored at or after this time: ms since the epoch or "
            "ISO-8601 (UTC unless given), cold tier included.",
        ),
    ] = None,
    max_count: Annotated[
        int | None,
        typer.Option(
            "--max",
            "-n",
            help="At most this many messages in all (default 32; with --follow: no limit).",
            min=1,
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep reading: print messages as they arrive, every queue, until Ctrl-C (exit 0) or "
            "--max. Idle reads long-poll the server; nothing spins.",
        ),
    ] = False,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="table, body (one body per line), json (NDJSON: one message per line), or a format "
            "string such as '%k %t %s\\n' (codes in docs/cli.md). Default: table; with --follow, "
            "body (json with -o json).",
        ),
    ] = None,
    policy: Annotated[
        ReadPolicy | None,
        typer.Option(
            "--policy",
            help="Where to read: NOT_IN_DISK (cold only when gone from disk), NOT_IN_MEM, FORCE (always "
            "cold when committed there), DISABLE (hot only). Default: tiered.storage_level.",
            case_sensitive=False,
        ),
    ] = None,
    tags: Annotated[
        str | None,
        typer.Option(
            "--tags",
            help="Only messages with these tags: 'paid || refunded' ('*' = all). Others are skipped "
            "without being read; status NO_MATCHED_MESSAGE when none matched.",
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            help="Consumer group: start at its committed offset in each queue (where it has none, "
            "as without --group) and commit past what was printed (see --no-commit).",
        ),
    ] = None,
    commit: Annotated[
        bool, typer.Option("--commit/--no-commit", help="With --group: commit the next offset.")
    ] = True,
    wait_ms: Annotated[
        int,
        typer.Option(
            "--wait-ms",
            help="Without --follow, long poll: when every queue is caught up, wait up to this many ms "
            "for a matching message (at most server.long_poll_max_ms).",
            min=0,
        ),
    ] = 0,
) -> None:
    """Read messages of a topic — every queue, or those given with -q — from whichever tier
    holds them. Without --follow it prints at most --max messages, oldest first across queues,
    and stops; with --follow it tails the topic until Ctrl-C.

    Examples: `tierd consume orders` (the 32 oldest); `tierd consume orders -f` (new messages,
    bodies, until Ctrl-C); `tierd consume orders -f --from-time 2024-05-01T00:00:00Z --format
    '%o %k %s\\n'`; `tierd consume orders --group billing --tags 'paid || refunded'` (run it
    again to continue where the group stopped).
    """
    c = obj(ctx)
    starts = [from_beginning, from_time is not None, offset is not None, group is not None]
    if sum(starts) > 1:
        raise typer.BadParameter(
            "give at most one of --from-beginning, --from-time, --offset and --group (a group starts "
            "at its committed offsets; move them with `tierd groups reset`)"
        )
    if offset is not None and (queue is None or len(queue) != 1):
        raise typer.BadParameter("--offset needs exactly one --queue", param_hint="--offset")
    out = _Output.of(fmt, follow=follow, json_doc=c.json)
    only = sorted(set(queue)) if queue else None
    start: _Start | int | dict[int, int]
    if from_time is not None:
        start = parse_time(from_time, "--from-time")
    elif offset is not None and only is not None:
        start = {only[0]: offset}
    else:
        start = _Start.end if follow and not from_beginning else _Start.beginning
    with c.store() as store:
        reader = _Reader(store, topic, only, start, group, commit, policy, tags)
        if follow:
            cfg = c.client()
            wait = (
                min(FOLLOW_WAIT_MS, cfg.server.long_poll_max_ms) if c.server_url is None else FOLLOW_WAIT_MS
            )
            _follow(reader, out, max_count, wait)
            return
        messages = _read_once(reader, max_count or 32, wait_ms)
    out.batch(reader, messages)


#: ``--format`` codes (``%s`` body, ``%%`` a percent sign; docs/cli.md has the table).
_CODES: dict[str, Callable[[MessageExt], str]] = {
    "t": lambda m: m.topic,
    "p": lambda m: str(m.queue_id),
    "o": lambda m: str(m.queue_offset),
    "k": lambda m: " ".join(m.keys),
    "g": lambda m: m.tags or "",
    "T": lambda m: str(m.store_timestamp),
    "B": lambda m: str(m.born_timestamp),
    "i": lambda m: m.msg_id,
    "u": lambda m: m.uniq_key or "",
    "h": lambda m: ",".join(f"{k}={v}" for k, v in sorted(m.properties.items())),
    "S": lambda m: str(len(m.body)),
}


def printable(body: bytes) -> str:
    r"""A body as text that is safe on a terminal: UTF-8 as it is, except that bytes which are
    not UTF-8 and every control character (escape sequences, NUL, DEL, C1, line and paragraph
    separators, newlines — so that one message stays one line) are written as ``\xNN``
    (``\uNNNN`` above 0xFF), and a backslash as ``\\``: unambiguous, and never a raw byte that
    could drive the terminal."""
    out = []
    for ch in body.decode("utf-8", errors="surrogateescape"):
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= o <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x20 or 0x7F <= o <= 0x9F:
            out.append(f"\\x{o:02x}")
        elif o in (0x2028, 0x2029):
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


@dataclass
class _Output:
    """How ``consume`` prints: one of ``table``, ``body``, ``json`` (NDJSON), ``document`` (the
    one JSON document of ``-o json`` without --follow) or a ``%`` format string (docs/cli.md)."""

    kind: str
    template: str = ""
    #: Raw bodies are written only where nobody reads them as text: not to a terminal.
    raw: bool = field(default_factory=lambda: not sys.stdout.isatty())

    @classmethod
    def of(cls, fmt: str | None, *, follow: bool, json_doc: bool) -> _Output:
        if fmt is None:
            fmt = ("json" if follow else "document") if json_doc else ("body" if follow else "table")
        if "%" in fmt:
            return cls("format", _unescape(fmt))
        if fmt not in ("table", "body", "json", "document") or (fmt in ("table", "document") and follow):
            raise typer.BadParameter(
                f"expected table, body, json or a format string with % codes, got {fmt!r}"
                + (" (--follow prints line by line: body, json or a format string)" if follow else ""),
                param_hint="--format",
            )
        return cls(fmt)

    def messages(self, messages: Sequence[MessageExt]) -> None:
        """Print messages line by line (everything but the table and the document)."""
        if self.kind == "json":
            text = "".join(json.dumps(m.to_json(), sort_keys=True) + "\n" for m in messages)
            sys.stdout.write(text)
        elif self.kind == "body" and self.raw:
            sys.stdout.flush()
            sys.stdout.buffer.write(b"".join(m.body + b"\n" for m in messages))
        elif self.kind == "body":
            sys.stdout.write("".join(printable(m.body) + "\n" for m in messages))
        else:
            for m in messages:
                self._formatted(m)
        sys.stdout.flush()

    def _formatted(self, m: MessageExt) -> None:
        parts = re.split(r"(%.)", self.template)
        if not self.raw:
            sys.stdout.write("".join(self._code(m, p) if p.startswith("%") else p for p in parts))
            return
        sys.stdout.flush()
        sys.stdout.buffer.write(
            b"".join(
                m.body if p == "%s" else (self._code(m, p) if p.startswith("%") else p).encode()
                for p in parts
            )
        )

    def _code(self, m: MessageExt, code: str) -> str:
        if code == "%s":
            return printable(m.body)
        if code == "%%":
            return "%"
        fn = _CODES.get(code[1:])
        if fn is None:
            raise typer.BadParameter(
                f"unknown format code {code!r} (docs/cli.md lists them)", param_hint="--format"
            )
        value = fn(m)
        return value if self.raw else printable(value.encode())

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            sys.stdout.flush()

    def batch(self, reader: _Reader, messages: list[MessageExt]) -> None:
        """The one-shot read's output."""
        if self.kind == "document":
            emit_json(_document(reader, messages))
            return
        if self.kind != "table":
            self.messages(messages)
            return
        emit_table(None, MESSAGE_COLUMNS, _message_rows(messages))
        queues = sorted(reader.results)
        sources = sorted({reader.results[q].source for q in queues if reader.results[q].messages})
        echo(
            f"{len(messages)} message(s) from {len(queues)} queue(s)"
            + (f", {' and '.join(sources)} tier" if sources else "")
        )
        for q in queues:
            res = reader.results[q]
            echo(
                f"  queue {q}: {res.status.name}; next offset {reader.positions[q]} "
                f"(holds [{res.min_offset}, {res.max_offset}))"
            )
        if len(reader.committed) == 1:
            [(q, at)] = reader.committed.items()
            echo(
                f"committed offset {at} for group {reader.group}"
                + (f" in queue {q}" if len(queues) > 1 else "")
            )
        elif reader.committed:
            echo(f"committed the next offsets of {len(reader.committed)} queues for group {reader.group}")


def _unescape(fmt: str) -> str:
    r"""``\n``, ``\t``, ``\r`` and ``\\`` in a format string, as typed in a shell."""
    return re.sub(r"\\([ntr\\])", lambda m: _TYPED_ESCAPES[m.group(1)], fmt)


#: What ``\n``, ``\t``, ``\r`` and ``\\`` in a format string stand for.
_TYPED_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def _document(reader: _Reader, messages: list[MessageExt]) -> dict[str, Any]:
    """``-o json``: the messages and, per queue, the read's status and where it continues. With
    one queue that queue's fields are also at the top, as before queues were read together."""
    rows = []
    for q in sorted(reader.results):
        res = reader.results[q]
        rows.append(
            {
                "queue_id": q,
                "status": res.status.name,
                "source": res.source,
                "next_offset": reader.positions[q],
                "min_offset": res.min_offset,
                "max_offset": res.max_offset,
            }
        )
    out: dict[str, Any] = {"topic": reader.topic, "queues": rows, "messages": [m.to_json() for m in messages]}
    if len(rows) == 1:
        out |= {k: v for k, v in rows[0].items() if k != "queue_id"}
    if reader.group is not None:
        # One queue: the offset committed (None when nothing moved), as before queues were read
        # together; several: {queue id: offset} of those that moved.
        by_queue = {str(q): at for q, at in sorted(reader.committed.items())}
        one = next(iter(reader.committed.values()), None)
        out |= {"group": reader.group, "committed": one if len(rows) == 1 else by_queue}
    return out


def _read_once(reader: _Reader, max_count: int, wait_ms: int) -> list[MessageExt]:
    """The ``max_count`` oldest messages (by store time) from each queue's start on; every queue
    moves past what is returned (and commits it for the group)."""
    ids = reader.refresh(missing_ok=False)
    got = {q: reader.read(q, max_count) for q in ids}
    if wait_ms and ids and not any(r.messages for r in got.values()):
        got[ids[0]] = reader.read(ids[0], max_count, wait_ms)
    merged = sorted(
        (m for r in got.values() for m in r.messages),
        key=lambda m: (m.store_timestamp, m.queue_id, m.queue_offset),
    )[:max_count]
    for q, res in got.items():
        reader.advance(q, res, [m for m in merged if m.queue_id == q])
    return merged


def _follow(reader: _Reader, out: _Output, max_count: int | None, wait_ms: int) -> None:
    """Tail the topic: read every queue in turn; when a whole round found nothing, one read
    long-polls the server (``wait_ms``) on the queues in rotation, so a message on the queue
    being waited on prints at once and one on another queue within ``wait_ms``. Ends on Ctrl-C
    (exit :data:`EXIT_INTERRUPTED`), at ``max_count``, or when stdout is closed (``| head``)."""
    printed = 0
    turn = 0
    try:
        while max_count is None or printed < max_count:
            ids = reader.refresh(missing_ok=True)
            found = False
            for q in ids:
                left = FOLLOW_BATCH if max_count is None else min(FOLLOW_BATCH, max_count - printed)
                res = reader.read(q, left)
                if res.messages:
                    found = True
                    out.messages(res.messages)
                    reader.advance(q, res, res.messages)
                    printed += len(res.messages)
                    if max_count is not None and printed >= max_count:
                        return
            if found:
                continue
            if not ids or wait_ms <= 0:
                time.sleep(FOLLOW_POLL_SECONDS)  # nothing to long-poll on: a poll interval
                continue
            q = ids[turn % len(ids)]
            turn += 1
            res = reader.read(q, FOLLOW_BATCH if max_count is None else max_count - printed, wait_ms)
            if res.messages:
                out.messages(res.messages)
                reader.advance(q, res, res.messages)
                printed += len(res.messages)
    except KeyboardInterrupt:
        out.flush()
        typer.echo(f"tierd: stopped after {printed} message(s)", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:  # the reader went away (`| head -3`): not an error of ours
        _quiet_stdout()
        raise typer.Exit(0) from None


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush stays silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@app.command()
@handle_errors
def query(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to search.")],
    key: Annotated[str, typer.Argument(help="Message key (KEYS) or unique key (UNIQ_KEY).")],
    max_count: Annotated[int, typer.Option("--max", "-n", help="At most this many messages.", min=1)] = 32,
    begin: Annotated[int, typer.Option("--begin", help="Earliest store time, ms since the epoch.")] = 0,
    end: Annotated[int, typer.Option("--end", help="Latest store time, ms since the epoch.")] = 2**63 - 1,
) -> None:
    """Find messages by key in both tiers (only messages that really carry the key).

    Example: `tierd query orders o-1`.
    """
    c = obj(ctx)
    if begin > end:
        raise InvalidArgumentError(f"--begin ({begin}) must not be after --end ({end})")
    with c.store() as store:
        hits = store.query(topic, key, max_count, begin, end)
    if c.json:
        emit_json([m.to_json() for m in hits])
        return
    emit_table(None, MESSAGE_COLUMNS, _message_rows(hits))
    echo(f"{len(hits)} message(s) with key {key!r}")


@app.command("message")
@handle_errors
def message_(
    ctx: typer.Context,
    msg_id: Annotated[
        str,
        typer.Argument(
            metavar="ID",
            help="An offset id (what produce prints as msg_id) or a client id (the UNIQ_KEY producers "
            "and gRPC clients know a message by).",
        ),
    ],
    topic: Annotated[
        str | None,
        typer.Option(
            "--topic", help="Search only this topic (a client id is otherwise looked up in every topic)."
        ),
    ] = None,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="table (default), body, json (one line), or a format string such as '%t %o %s\\n' "
            "(the codes of consume, docs/cli.md).",
        ),
    ] = None,
) -> None:
    """Find one message by its id, in either tier, and print it (formats as `tierd consume`).

    An offset id is read at the hot commitlog position it names; once that position has left the
    hot tier the id cannot be resolved (the error says so: look the message up by its client id,
    which both tiers index). Exit 1 when no message, or more than one, has the id.

    Examples: `tierd message 7F00000100002A9F0000000000000000`; `tierd message --topic orders
    AC110002000078308DB1...`; `tierd message ID --format body > body.bin`.
    """
    c = obj(ctx)
    out = _Output.of(fmt, follow=False, json_doc=c.json)
    with c.store() as store:
        found = store.message(msg_id, topic=topic)
    m = found.message
    if out.kind == "document":
        emit_json({"id": msg_id, "matched": found.matched, "tier": found.tier, "message": m.to_json()})
    elif out.kind == "table":
        emit_table(None, ["topic", *MESSAGE_COLUMNS], [[m.topic, *row] for row in _message_rows([m])])
        how = "offset id" if found.matched == "offset" else "client id (UNIQ_KEY)"
        echo(f"{m.topic}/{m.queue_id}@{m.queue_offset}, found by its {how} in the {found.tier} tier")
    else:
        out.messages([m])
