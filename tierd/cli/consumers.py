"""Consumer commands: ``seek`` and ``earliest-time`` (replay from a point in time) and
``groups`` (committed offsets, lag, commits, resets). Each maps to one HTTP route
(docs/cli.md has the table)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer

from tierd.cli.app import app, echo, emit_json, emit_table, handle_errors, obj

#: The targets of ``groups reset --to``, for its help text. The store owns them
#: (``tierd.consumption.groups.RESET_TARGETS``, which imports the offsets machinery) and checks the value;
#: this copy keeps ``tierd --help`` from importing it, and a test holds the two equal.
RESET_TARGETS_HELP = ("earliest", "latest", "timestamp", "offset")
#: A store time is a signed 64-bit field of the record (docs/formats.md).
MAX_TIMESTAMP = 2**63 - 1

groups_app = typer.Typer(
    help="Consumer groups: committed offsets, lag per queue, commits and resets.", no_args_is_help=True
)
app.add_typer(groups_app, name="groups")


def parse_time(text: str, option: str = "--time") -> int:
    """Milliseconds since the epoch, or an ISO-8601 time (``2024-05-01T12:00:00Z``; without an
    offset it is UTC) → milliseconds."""
    if text.lstrip("-").isdigit():
        ms = int(text)
    else:
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise typer.BadParameter(
                f"expected milliseconds since the epoch or an ISO-8601 time such as "
                f"2024-05-01T12:00:00Z, got {text!r}",
                param_hint=option,
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise typer.BadParameter(f"the time must not be before 1970, got {text!r}", param_hint=option)
    if ms > MAX_TIMESTAMP:
        raise typer.BadParameter(
            f"the time must be at most {MAX_TIMESTAMP} ms (a signed 64-bit store time), got {text!r}",
            param_hint=option,
        )
    return ms


def _when(ms: int) -> str:
    if ms < 0:
        return "-"
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):  # past year 9999: no date to show, the ms stand
        return f"{ms} ms"


@app.command()
@handle_errors
def seek(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic.")],
    time: Annotated[
        str,
        typer.Option("--time", "-t", help="Milliseconds since the epoch, or ISO-8601 (UTC unless given)."),
    ],
    queue: Annotated[
        list[int] | None, typer.Option("--queue", "-q", help="Queue id (repeatable; default: all).", min=0)
    ] = None,
    upper: Annotated[
        bool, typer.Option("--upper", help="The last offset stored exactly at --time, not the first.")
    ] = False,
) -> None:
    """Find, per queue, the first offset stored at or after a time — where a replay from that
    time starts (both tiers). Then read from it with `tierd consume --offset`, or move a group
    there with `tierd groups reset GROUP TOPIC --to timestamp --time ...`.

    Example: `tierd seek orders --time 2024-05-01T00:00:00Z`.
    """
    c = obj(ctx)
    ms = parse_time(time)
    boundary = "upper" if upper else "lower"
    with c.store() as store:
        queues = queue or [q.queue_id for q in store.queues(topic)]
        rows = [(q, store.offset_for_time(topic, q, ms, boundary)) for q in queues]
    if c.json:
        emit_json(
            [
                {"topic": topic, "queue_id": q, "timestamp": ms, "boundary": boundary, "offset": off}
                for q, off in rows
            ]
        )
        return
    emit_table(None, ["queue", "offset"], [[q, off] for q, off in rows])
    which = "last offset stored exactly at" if upper else "first offset stored at or after"
    echo(f"{topic}: {which} {_when(ms)} per queue")


@app.command("earliest-time")
@handle_errors
def earliest_time(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic.")],
    queue: Annotated[
        list[int] | None, typer.Option("--queue", "-q", help="Queue id (repeatable; default: all).", min=0)
    ] = None,
) -> None:
    """Show how far back each queue reaches: the store time of its first readable message
    (either tier; -1 when it holds none)."""
    c = obj(ctx)
    with c.store() as store:
        queues = queue or [q.queue_id for q in store.queues(topic)]
        rows = [(q, store.earliest_time(topic, q)) for q in queues]
    if c.json:
        emit_json([{"topic": topic, "queue_id": q, "earliest_time": ms} for q, ms in rows])
        return
    emit_table(topic, ["queue", "earliest time (UTC)", "ms"], [[q, _when(ms), ms] for q, ms in rows])


def _offset_rows(plan: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    return [{"topic": t, "queue_id": q, "offset": o} for (t, q), o in sorted(plan.items())]


@groups_app.command("ls")
@handle_errors
def groups_ls(ctx: typer.Context) -> None:
    """List consumer groups with their total lag (messages after their committed offsets)."""
    c = obj(ctx)
    with c.store() as store:
        groups = store.consumer_groups()
    if c.json:
        emit_json([g.as_dict() for g in groups])
        return
    emit_table(
        None,
        ["group", "topics", "queues", "lag"],
        [[g.group, " ".join(sorted({q.topic for q in g.queues})), len(g.queues), g.lag] for g in groups],
    )
    echo(f"{len(groups)} group(s)")


@groups_app.command("show")
@handle_errors
def groups_show(ctx: typer.Context, group: Annotated[str, typer.Argument(help="Consumer group.")]) -> None:
    """Show a group's committed offset and lag per queue (every queue of each topic it
    committed on; '-' where it never committed)."""
    c = obj(ctx)
    with c.store() as store:
        [info] = store.consumer_groups(group)
    if c.json:
        emit_json(info.as_dict())
        return
    emit_table(
        group,
        ["topic", "queue", "committed", "min", "max", "lag"],
        [
            [
                q.topic,
                q.queue_id,
                "-" if q.committed is None else q.committed,
                q.min_offset,
                q.max_offset,
                q.lag,
            ]
            for q in info.queues
        ],
    )
    echo(f"lag {info.lag} message(s)")


@groups_app.command("commit")
@handle_errors
def groups_commit(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    topic: Annotated[str, typer.Argument(help="Topic.")],
    offset: Annotated[int, typer.Option("--offset", help="Next offset the group reads.", min=0)],
    queue: Annotated[int, typer.Option("--queue", "-q", help="Queue id.", min=0)] = 0,
) -> None:
    """Commit an offset for GROUP on TOPIC/QUEUE (at most the queue's max offset)."""
    c = obj(ctx)
    with c.store() as store:
        store.commit_offset(group, topic, queue, offset)
    if c.json:
        emit_json({"group": group, "topic": topic, "queue_id": queue, "offset": offset})
    else:
        echo(f"committed {group} at {topic}/{queue}@{offset}")


@groups_app.command("reset")
@handle_errors
def groups_reset(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    topic: Annotated[str, typer.Argument(help="Topic.")],
    to: Annotated[str, typer.Option("--to", help=f"Where to: {', '.join(RESET_TARGETS_HELP)}.")],
    time: Annotated[
        str | None, typer.Option("--time", "-t", help="With --to timestamp: ms or ISO-8601 (UTC).")
    ] = None,
    offset: Annotated[int | None, typer.Option("--offset", help="With --to offset (needs --queue).")] = None,
    queue: Annotated[
        int | None, typer.Option("--queue", "-q", help="Only this queue (default: every queue).", min=0)
    ] = None,
) -> None:
    """Move GROUP on TOPIC: to the earliest or latest offset of each queue, to the first
    offset stored at/after a time (replay from then, cold tier included), or to an offset of
    one queue. An offset outside the queue's range is an error, never clamped. Stop the
    group's consumers first: a running consumer commits its own position over the reset.

    Example: `tierd groups reset billing orders --to timestamp --time 2024-05-01T00:00:00Z`.
    """
    c = obj(ctx)
    ms = parse_time(time) if time is not None else None
    with c.store() as store:
        plan = store.reset_offsets(group, topic, to.lower(), timestamp=ms, offset=offset, queue_id=queue)
    if c.json:
        emit_json({"group": group, "offsets": _offset_rows(plan)})
        return
    emit_table(
        f"{group} reset to {to}",
        ["topic", "queue", "offset"],
        [[t, q, o] for (t, q), o in sorted(plan.items())],
    )


@groups_app.command("delete")
@handle_errors
def groups_delete(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    topic: Annotated[str | None, typer.Option("--topic", help="Only this topic's offsets.")] = None,
) -> None:
    """Forget GROUP's committed offsets (or one topic's)."""
    c = obj(ctx)
    with c.store() as store:
        n = store.delete_group(group, topic)
    if c.json:
        emit_json({"group": group, "queues": n})
    else:
        echo(f"forgot {n} committed offset(s) of {group}")
