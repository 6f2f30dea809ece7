"""Topic admin commands: ``topics create|describe|update|delete`` (``topics ls`` is in
:mod:`tierd.cli.inspect`). Each is one HTTP route when a daemon runs (docs/cli.md has the
table) and the same facade call on the store directory otherwise, so the output does not depend
on where the answer came from. What a topic's settings mean, and what a delete removes:
docs/topics.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tierd.cli.app import echo, emit_json, emit_table, handle_errors, obj
from tierd.cli.inspect import topics_app

if TYPE_CHECKING:
    from tierd.topics import TopicInfo


def _hours_text(text: str | None) -> float | str | None:
    """``--cold-retention-hours``: hours, or ``default`` (back to ``tiered.file_reserved_time``)."""
    if text is None or text == "default":
        return text
    try:
        hours = float(text)
    except ValueError:
        raise typer.BadParameter(
            f"expected hours (a positive number) or 'default', got {text!r}",
            param_hint="--cold-retention-hours",
        ) from None
    if not hours > 0:
        raise typer.BadParameter(f"hours must be positive, got {text!r}", param_hint="--cold-retention-hours")
    return hours


def _show(info: TopicInfo, json_out: bool, done: str | None = None) -> None:
    if json_out:
        emit_json(info.as_dict())
        return
    cold = (
        "no cold tier"
        if info.cold_retention_hours is None
        else f"{info.cold_retention_hours:g} h ({'own' if info.cold_retention_own else 'store default'})"
    )
    emit_table(
        f"{info.name}: {info.queues} queue(s), {info.origin}",
        ["queue", "hot min", "hot max", "cold min", "cold max"],
        [
            [q.queue_id, q.hot_min_offset, q.hot_max_offset, q.cold_min_offset, q.cold_max_offset]
            for q in info.queue_ranges
        ],
    )
    echo(
        f"retention: hot {info.hot_retention_hours:g} h (store-wide), cold {cold}; messages: "
        f"{info.hot_messages} hot, {info.cold_messages} cold ({info.cold_bytes} bytes)"
    )
    if done:
        echo(done)


@topics_app.command("create")
@handle_errors
def topics_create(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name (1-255 of A-Z a-z 0-9 _ % | -).")],
    queues: Annotated[
        int | None,
        typer.Option("--queues", "-n", min=1, help="Queues it spreads over (default store.default_queues)."),
    ] = None,
    cold_retention_hours: Annotated[
        float | None,
        typer.Option("--cold-retention-hours", help="Cold retention (default tiered.file_reserved_time)."),
    ] = None,
) -> None:
    """Create TOPIC with its queue count and cold retention (an error if it exists: it was
    created, is declared in the configuration, or holds messages).

    Example: `tierd topics create orders --queues 16 --cold-retention-hours 720`.
    """
    c = obj(ctx)
    with c.store(create=True) as store:
        info = store.create_topic(topic, queues, cold_retention_hours=cold_retention_hours)
    _show(info, c.json, f"created topic {topic}")


@topics_app.command("describe")
@handle_errors
def topics_describe(ctx: typer.Context, topic: Annotated[str, typer.Argument(help="Topic.")]) -> None:
    """Show TOPIC's queue count, retention in each tier, sizes, and each queue's offsets in
    both tiers."""
    c = obj(ctx)
    with c.store() as store:
        info = store.describe_topic(topic)
    _show(info, c.json)


@topics_app.command("update")
@handle_errors
def topics_update(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic.")],
    queues: Annotated[
        int | None, typer.Option("--queues", "-n", min=1, help="New queue count: it only grows.")
    ] = None,
    cold_retention_hours: Annotated[
        str | None,
        typer.Option("--cold-retention-hours", help="Hours, or 'default' (tiered.file_reserved_time)."),
    ] = None,
    hot_retention_hours: Annotated[
        float | None,
        typer.Option("--hot-retention-hours", help="Refused: hot retention is store-wide (docs/topics.md)."),
    ] = None,
) -> None:
    """Grow TOPIC's queue count and/or set its cold retention. A smaller queue count is refused
    (a queue taken away would strand its messages and move message groups, out of order)."""
    c = obj(ctx)
    hours = _hours_text(cold_retention_hours)
    if queues is None and hours is None and hot_retention_hours is None:
        raise typer.BadParameter("nothing to change: give --queues and/or --cold-retention-hours")
    with c.store() as store:
        info = store.update_topic(
            topic, queues=queues, cold_retention_hours=hours, hot_retention_hours=hot_retention_hours
        )
    _show(info, c.json, f"updated topic {topic}")


@topics_app.command("delete")
@handle_errors
def topics_delete(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic.")],
    force: Annotated[
        bool,
        typer.Option("--force", help="Delete even while a consumer group or a tiering round needs it."),
    ] = False,
) -> None:
    """Delete TOPIC from both tiers: hot queues, cold segments, bucket manifests, key index
    entries and every group's committed offsets of it. Refused while a consumer group has
    offsets on it or messages wait for tiering, unless --force. A crash halfway is finished at
    the next start."""
    c = obj(ctx)
    with c.store() as store:
        store.delete_topic(topic, force=force)
    if c.json:
        emit_json({"topic": topic, "deleted": True})
        return
    echo(f"deleted topic {topic} from both tiers")
