"""Data commands: ``produce``, ``consume``, ``query`` — for trying a store out and for
operators looking at real messages."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tierd.cli.app import app, echo, emit_json, emit_table, handle_errors, obj
from tierd.errors import InvalidArgumentError
from tierd.format.message_ext import MessageExt
from tierd.message import GetStatus, Message, ReadPolicy

PREVIEW = 60


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def _preview(body: bytes) -> str:
    text = body[:PREVIEW].decode("utf-8", errors="replace")
    text = text.replace("\n", "\\n")
    return text + ("…" if len(body) > PREVIEW else "")


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
) -> None:
    """Append messages to TOPIC and print where they landed.

    Examples: `tierd produce orders 'hello' -k o-1 -t paid`;
    `seq 1000 | tierd produce orders` (one message per line of stdin, sent as one batch).
    """
    c = obj(ctx)
    properties = _properties(prop or [])
    msgs = [
        Message(topic=topic, body=b, queue_id=queue, keys=tuple(key or ()), tags=tag, properties=properties)
        for b in _bodies(body, file, lines)
    ]
    with c.store(create=True) as store:
        results = [store.put(msgs[0])] if len(msgs) == 1 else list(store.put_batch(msgs))
    if c.json:
        emit_json([dataclasses.asdict(r) for r in results])
    elif len(results) == 1:
        r = results[0]
        echo(f"stored {topic}/{r.queue_id}@{r.queue_offset} msg_id={r.msg_id}")
    else:
        echo(f"stored {len(results)} messages in {topic} (queues {sorted({r.queue_id for r in results})})")


@app.command()
@handle_errors
def consume(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    queue: Annotated[int, typer.Option("--queue", "-q", help="Queue id.", min=0)] = 0,
    offset: Annotated[
        int | None, typer.Option("--offset", help="First queue offset (default: the oldest kept).")
    ] = None,
    max_count: Annotated[int, typer.Option("--max", "-n", help="At most this many messages.", min=1)] = 32,
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
            help="Consumer group: start at its committed offset (the oldest kept if it has none) "
            "and commit where this read ended (see --no-commit).",
        ),
    ] = None,
    commit: Annotated[
        bool, typer.Option("--commit/--no-commit", help="With --group: commit the next offset.")
    ] = True,
    wait_ms: Annotated[
        int,
        typer.Option(
            "--wait-ms",
            help="Long poll: when caught up, wait up to this many ms for a matching message "
            "(at most server.long_poll_max_ms).",
            min=0,
        ),
    ] = 0,
) -> None:
    """Read messages of one queue, from whichever tier holds them.

    Examples: `tierd consume orders -q 0 --offset 0 -n 10 --policy FORCE`;
    `tierd consume orders -q 0 --group billing --tags 'paid || refunded'` (run it again to
    continue where the group stopped).
    """
    c = obj(ctx)
    if group is not None and offset is not None:
        raise typer.BadParameter(
            "--group starts at the group's committed offset; move it with `tierd groups reset`",
            param_hint="--offset",
        )
    committed = None
    with c.store() as store:
        if group is not None:
            start = store.committed_offsets(group).get((topic, queue))
        else:
            start = offset
        if start is None:
            start = store.min_offset(topic, queue)
        res = store.get(topic, queue, start, max_count, policy, tags=tags, wait_ms=wait_ms)
        moved = res.next_offset != start and res.status is not GetStatus.NO_MATCHED_LOGIC_QUEUE
        if group is not None and commit and moved:
            store.commit_offset(group, topic, queue, res.next_offset)
            committed = res.next_offset
    if c.json:
        out: dict[str, Any] = {
            "status": res.status.name,
            "source": res.source,
            "next_offset": res.next_offset,
            "min_offset": res.min_offset,
            "max_offset": res.max_offset,
            "messages": [m.to_json() for m in res.messages],
        }
        if group is not None:
            out |= {"group": group, "committed": committed}
        emit_json(out)
        return
    emit_table(None, MESSAGE_COLUMNS, _message_rows(res.messages))
    echo(
        f"{res.status.name}: {len(res.messages)} message(s) from the {res.source} tier; "
        f"next offset {res.next_offset} (queue holds [{res.min_offset}, {res.max_offset}))"
    )
    if committed is not None:
        echo(f"committed offset {committed} for group {group}")


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
