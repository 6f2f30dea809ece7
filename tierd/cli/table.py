"""Table commands: ``table sync TOPIC`` (one pass of the Iceberg table writer) and ``table
lag TOPIC``. They read the bucket and the catalog, never the hot store: they run beside a
daemon, whose own passes a concurrent one cannot make add a row twice (docs/table.md)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from tierd.cli.app import app, echo, emit_json, handle_errors, obj

table_app = typer.Typer(help="Iceberg tables of opted-in topics (docs/table.md).", no_args_is_help=True)
app.add_typer(table_app, name="table")


@table_app.command("sync")
@handle_errors
def table_sync(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help='A topic with [topics.<name>] table = "iceberg".')],
    maintain: Annotated[bool, typer.Option(help="Also compact, expire snapshots, delete orphans.")] = False,
) -> None:
    """Commit what was sealed since the table's watermark (one pass)."""
    from tierd.table import TableWriter

    c = obj(ctx)
    writer = TableWriter(c.config())
    result = writer.sync(topic)
    done = writer.maintain(topic) if maintain else None
    if c.json:
        out = dataclasses.asdict(result)
        if done is not None:
            out["maintenance"] = dataclasses.asdict(done)
        emit_json(out)
        return
    echo(
        f"{topic}: {result.rows} row(s) in {result.commits} commit(s), {result.dead_letters} dead "
        f"letter(s), {result.skipped} skipped; lag {result.lag}"
    )
    if done is not None:
        echo(
            f"{topic}: compacted {done.compacted_files} file(s), expired {done.expired_snapshots} "
            f"snapshot(s), deleted {done.deleted_orphans} orphan(s)"
        )


@table_app.command("lag")
@handle_errors
def table_lag(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="A topic with a table.")],
) -> None:
    """Messages sealed in the cold tier but not yet in the topic's table."""
    from tierd.table import TableWriter

    c = obj(ctx)
    lag = TableWriter(c.config()).lag(topic)
    if c.json:
        emit_json({"topic": topic, "lag": lag})
        return
    echo(f"{topic}: {lag} message(s) sealed but not in the table")
