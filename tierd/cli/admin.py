"""Operator commands: ``serve``, ``tier``, ``verify``, ``gc``, ``restore``, ``takeover``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tierd.cli.app import (
    app,
    echo,
    emit_json,
    emit_table,
    handle_errors,
    obj,
    progress_bar,
    store_lock_hint,
)
from tierd.cli.remote import RemoteStore
from tierd.errors import StoreLockedError

if TYPE_CHECKING:
    from tierd.cli.app import Context
    from tierd.config import TierdConfig
    from tierd.store import BlockingMessageStore, RestoreReport
    from tierd.verify import Progress as VerifyProgress
    from tierd.verify import VerifyReport

POLL_SECONDS = 0.2


@app.command()
@handle_errors
def serve(ctx: typer.Context) -> None:
    """Run the daemon until SIGTERM/SIGINT: HTTP API, tiering dispatcher, index service,
    retention and manifest upkeep, in one asyncio process.

    On a signal it stops accepting writes, flushes the hot store, commits what is pending to
    the cold tier within server.shutdown_grace seconds, and exits 0.
    """
    from tierd.service.daemon import serve as run_daemon

    c = obj(ctx)
    c.quiet_logs = False
    run_daemon(c.config())


def _pending(store: BlockingMessageStore | RemoteStore) -> int:
    return sum(q.pending_messages for t in store.topics() for q in store.queues(t))


@app.command()
@handle_errors
def tier(ctx: typer.Context) -> None:
    """Commit every message not yet in the cold tier now, and update the bucket manifests.

    Prints what each queue committed and what is still pending. Exits 1, naming each queue that
    failed and the backend's error, when anything pending could not be committed (backend
    unreachable, bucket gone, a conflict) or when another store owns the bucket prefix.
    """
    c = obj(ctx)
    # Closed without a second commit round: this command just made one (and if it failed, a
    # retry within the same second would only fail again, slower).
    with c.store() as store:
        if isinstance(store, RemoteStore):
            report = store.tier_now()  # the daemon's POST /v1/admin/tier: the same report
        elif not store.config.tiered.enabled:
            echo("tiering is disabled (tiered.enabled = false): nothing to do")
            return
        else:
            report = _tier_with_progress(store, quiet=c.json)
    if c.json:
        emit_json(report)
        return
    if report["queues"]:
        emit_table(
            None,
            ["topic", "queue", "committed", "pending"],
            [[q["topic"], q["queue_id"], q["committed"], q["pending"]] for q in report["queues"]],
        )
    echo(f"committed {report['committed']} message(s) to the cold tier; {report['pending']} pending")


def _tier_with_progress(store: BlockingMessageStore, quiet: bool) -> dict[str, Any]:
    """``tier_now`` with a progress bar; its report as the daemon sends it (``as_dict``)."""
    import concurrent.futures  # here, not at the top: ~5 ms of every other command's start

    total = _pending(store)
    with (
        progress_bar("tiering", quiet=quiet) as bar,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        task = bar.tasks[0].id
        bar.update(task, total=max(total, 1))
        job = pool.submit(store.tier_now)
        while True:
            try:
                return job.result(timeout=POLL_SECONDS).as_dict()
            except concurrent.futures.TimeoutError:
                bar.update(task, completed=max(0, total - _pending(store)))


@app.command()
@handle_errors
def verify(
    ctx: typer.Context,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Fix what can be fixed safely and list what changed: the hot store's recovery (a "
            "torn commitlog tail cut, a missing commitlog file's range recorded as lost, damaged "
            "consume-queue units and key-index files rebuilt, records re-dispatched after a crash), "
            "wrong consume-queue units rebuilt from the commitlog, consumer offsets and tiering "
            "metadata from their readable twin, bucket manifests rewritten from metadata (as the "
            "prefix's owner).",
        ),
    ] = False,
) -> None:
    """Check a stopped store and its bucket, read-only: hot record CRCs (every bad record, not
    just the first), consume queues against the commitlog, both tiering metadata files, cold
    segment sizes and checksums, cold queues against cold records, bucket manifests against
    metadata and the objects, objects nobody knows, and who owns the bucket prefix. Lists every
    problem with where it is; exits 1 if any is left. Nothing is written without --repair.
    With a daemon running, the daemon checks its store (`POST /v1/admin/verify`); --repair
    needs it stopped.
    """
    c = obj(ctx)
    remote = c.remote() if c.bucket_url is None else None
    if remote is not None:  # the daemon checks its own store (read-only, no progress to show)
        if repair:
            raise StoreLockedError(
                f"`tierd verify --repair` changes the store directory, and a running daemon holds it "
                f"({remote.api.url}): stop the daemon, repair, start it again (without --repair the "
                "daemon checks its store itself)",
                command="verify",
            )
        with progress_bar("verifying (the daemon reports when done)", quiet=c.json):
            report = remote.verify()
    else:
        cfg = c.local_only("verify") if c.bucket_url is None else c.config()
        with store_lock_hint(), progress_bar("verifying", bytes_=True, quiet=c.json) as bar:
            task = bar.tasks[0].id

            def progress(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=f"verifying {what}")

            report = _verify(c, cfg, progress, repair)
    if c.json:
        emit_json(report.as_dict())
    else:
        if report.problems:
            emit_table(
                f"{len(report.problems)} problem(s)",
                ["area", "where", "problem", "--repair"],
                [
                    [p.area, p.where, p.message, "repaired" if p.fixed else (p.fix or "—")]
                    for p in report.problems
                ],
            )
        for line in report.repairs:
            echo(f"repaired: {line}")
        left = report.counts()
        summary = ", ".join(f"{n} {area}" for area, n in left.items())
        echo(
            f"{'OK' if report.ok else f'PROBLEMS FOUND ({summary})'}: checked {report.records} records, "
            f"{report.units} queue units, {report.segments} cold segments"
        )
    if not report.ok:
        raise typer.Exit(1)


def _verify(c: Context, cfg: TierdConfig, progress: VerifyProgress, repair: bool) -> VerifyReport:
    """``verify`` of the stopped store and its bucket — or, with ``--bucket``, of that bucket
    alone, opened read-only (nothing can be repaired there: it belongs to its owner)."""
    if c.bucket_url is not None:
        with c.bucket() as bucket:
            return bucket.verify(progress, repair=repair)
    from tierd.store import BlockingMessageStore

    return BlockingMessageStore.verify_store(cfg, progress, repair=repair)


@app.command()
@handle_errors
def gc(ctx: typer.Context) -> None:
    """Apply retention now: expired hot commitlog files (only once they are in the cold tier)
    and cold segments older than their topic's reserve time (commitlog, queue and index
    segments of a range go together). With a daemon running, the daemon does it
    (`POST /v1/admin/gc`)."""
    c = obj(ctx)
    with c.store() as store:
        if isinstance(store, RemoteStore):
            done = store.gc()
        else:
            report = store.gc()
            done = {"hot_files": report.hot_files, "cold_segments": report.cold_segments}
    if c.json:
        emit_json(done)
    else:
        echo(f"deleted {done['hot_files']} hot commitlog file(s) and {done['cold_segments']} cold segment(s)")


@app.command()
@handle_errors
def restore(
    ctx: typer.Context,
    source: Annotated[
        str,
        typer.Option(
            "--from",
            help="Bucket URL tierd wrote, e.g. s3://bucket/prefix or /path/to/cold. Storage options "
            "come from [backend] when the scheme matches.",
        ),
    ],
    take_over: Annotated[
        bool,
        typer.Option(
            "--take-over",
            help="Take the bucket prefix over from the store that owns it, FENCING that store (if "
            "it still runs, it tiers nothing more). Without it a restore of an owned bucket is "
            "refused, naming the owner.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Only report what a restore would bring back (topics, queues, offset ranges, "
            "messages, bytes, consumer groups' offsets, damage) and whom it would fence; nothing "
            "is written or claimed, store.dir is not touched.",
        ),
    ] = False,
) -> None:
    """Rebuild an EMPTY store directory (store.dir) from a bucket alone: topics, queues and
    segments come from its manifests; the hot queues continue after the cold tier's end. Then
    start the daemon with [backend] pointing at the same bucket.

    The new store takes ownership of the bucket prefix (a new epoch): the store that wrote it
    before is fenced — if it is still running, its next commit fails and it writes nothing more
    there. Stop the old store first when you can (docs/tiering.md, "Moving a store"). A
    bucket another store owns is restored only with --take-over: the owner records cannot tell
    whether that store still runs. For a DR drill, `--dry-run` or `tierd --bucket URL ...`
    read the bucket without taking it (docs/tiering.md, "DR drills")."""
    from tierd.store import BlockingMessageStore
    from tierd.tiered.roots import backend_for_url

    c = obj(ctx)
    cfg = c.config()
    cfg = cfg.model_copy(update={"backend": backend_for_url(source, cfg.backend)})
    with progress_bar("reading queues" if dry_run else "restoring queues", quiet=c.json) as bar:
        task = bar.tasks[0].id

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"restoring {what}")

        report = BlockingMessageStore.restore(cfg, progress, take_over=take_over, dry_run=dry_run)
    if c.json:
        emit_json(report.as_dict())
        return
    if report.dry_run:
        _show_dry_run(report)
    else:
        echo(
            f"restored {report.topics} topic(s), {report.queues} queue(s), {report.segments} segment(s) "
            f"holding {report.messages} message(s) and the committed offsets of {report.groups} "
            f"consumer group(s) into {cfg.store.dir}; "
            f"set [backend] url = {cfg.backend.url!r} and run `tierd serve`"
        )
        owner = report.owner
        if owner is not None:
            previous = f"; store {owner.previous_store_id} is fenced" if owner.previous_store_id else ""
            echo(f"this store ({owner.store_id}) owns the bucket prefix now: epoch {owner.epoch}{previous}")
    for d in report.damaged:  # restored without them (docs/tiering.md, "Damage in the bucket")
        echo(
            f"DAMAGED: {d.topic}/{d.queue_id} queue offsets {d.first}..{d.end - 1} ({d.lost} message(s)) "
            f"cannot be read from the bucket and the queue is not tiered into: {d.error.message}"
        )


def _show_dry_run(report: RestoreReport) -> None:
    """``restore --dry-run`` for people: per queue what comes back, the groups, whom it fences."""
    emit_table(
        "a restore would bring back",
        ["topic", "queue", "first", "end", "messages", "bytes"],
        [[r.topic, r.queue_id, r.first, r.end, r.messages, r.bytes] for r in report.ranges],
    )
    for group, table in sorted(report.offsets.items()):
        shown = ", ".join(f"{t}/{q}@{o}" for (t, q), o in sorted(table.items()))
        echo(f"group {group} resumes at {shown}")
    echo(
        f"DRY RUN, nothing written: {report.topics} topic(s), {report.queues} queue(s), "
        f"{report.segments} segment(s), {report.messages} message(s), {report.bytes} bytes, "
        f"{report.groups} consumer group(s)"
    )
    fences = report.fences
    if fences is not None:
        echo(
            f"a restore would FENCE {fences.describe()} (pid {fences.pid}, store.dir {fences.store_dir}): "
            "it needs --take-over"
        )
    elif report.fences_unreadable:
        echo("a restore would fence whoever wrote the unreadable highest owner record")
    else:
        echo("the bucket prefix is unowned: a restore fences nobody")


@app.command()
@handle_errors
def takeover(
    ctx: typer.Context,
    unreadable: Annotated[
        int,
        typer.Option(
            "--unreadable",
            help="Epoch of the unreadable owner record (as `tierd verify` or the start-up error "
            "names it); it must be the highest one.",
        ),
    ],
) -> None:
    """Take the bucket prefix over from an UNREADABLE owner record: create the next epoch for
    this store (store.dir), so that it tiers again. Stop the store that wrote that record first,
    if one still runs: it is fenced from its next check on. The unreadable record stays (owner
    records are never rewritten). A readable owner is taken over only by `tierd restore`."""
    from tierd.store import BlockingMessageStore

    c = obj(ctx)
    cfg = c.config()
    record = BlockingMessageStore.take_over_unreadable(cfg, unreadable)
    if c.json:
        emit_json(record.as_dict())
    else:
        echo(
            f"this store ({record.store_id}) owns the bucket prefix now: epoch {record.epoch}, after the "
            f"unreadable record of epoch {unreadable}; restart its daemon to tier again"
        )
