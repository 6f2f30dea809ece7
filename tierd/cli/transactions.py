"""Transactions on the command line (docs/transactions.md): ``tierd transactions list`` shows the
half messages waiting for their producer, ``commit`` / ``rollback`` resolve one by id -- what
an operator does for a producer that is gone for good, instead of waiting for
``transactions.check_max`` check-backs. Each is one HTTP route when a daemon runs and the same
facade call on the store directory otherwise, so the output does not depend on where the answer
came from."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tierd.cli.app import app, echo, emit_json, emit_table, handle_errors, obj
from tierd.cli.remote import RemoteStore

if TYPE_CHECKING:
    from tierd.store import BlockingMessageStore

transactions_app = typer.Typer(
    help="Transactional messages waiting for a commit or rollback.", no_args_is_help=True
)
app.add_typer(transactions_app, name="transactions")


def _path(*parts: str) -> str:
    return "".join("/" + urllib.parse.quote(p, safe="") for p in parts)


def _pending(store: BlockingMessageStore | RemoteStore, group: str | None, due: bool) -> list[dict[str, Any]]:
    """Pending transactions as `GET /v1/transactions` lists them, oldest first."""
    if isinstance(store, RemoteStore):
        query: dict[str, Any] = {"due": "true" if due else "false"}
        if group is not None:
            query["producer_group"] = group
        rows: list[dict[str, Any]] = store.api.call("GET", "/v1/transactions", query=query)["transactions"]
        return rows
    return [
        {
            "transaction_id": p.transaction_id,
            "producer_group": p.producer_group,
            "topic": p.topic,
            "queue_id": p.queue_id,
            "msg_id": p.uniq_key,
            "stored_at": p.stored_at,
            "checks": p.checks,
        }
        for p in store.pending_transactions(group, due=due)
    ]


def _end(store: BlockingMessageStore | RemoteStore, tid: str, how: str) -> dict[str, Any]:
    """Commit or roll back; the answer as `POST /v1/transactions/{id}/commit` gives it."""
    if isinstance(store, RemoteStore):
        verb = "commit" if how == "COMMIT" else "rollback"
        doc: dict[str, Any] = store.api.call("POST", _path("v1", "transactions", tid, verb), body={})
        return doc
    r = store.end_transaction(tid, how)
    put = r.put
    message = (
        None
        if put is None
        else {
            "queue_id": put.queue_id,
            "queue_offset": put.queue_offset,
            "commitlog_offset": put.commitlog_offset,
            "msg_id": put.msg_id,
        }
    )
    return {"transaction_id": r.transaction_id, "resolution": r.resolution.value, "message": message}


@transactions_app.command("list")
@handle_errors
def list_(
    ctx: typer.Context,
    producer_group: Annotated[
        str | None, typer.Option("--producer-group", "-g", help="Only this producer group's.")
    ] = None,
    due: Annotated[
        bool,
        typer.Option("--due", help="Only those older than transactions.transaction_timeout (checked back)."),
    ] = False,
) -> None:
    """Transactions waiting for a commit or rollback, oldest first."""
    c = obj(ctx)
    with c.store() as store:
        rows = _pending(store, producer_group, due)
    if c.json:
        emit_json({"transactions": rows})
        return
    emit_table(
        f"{len(rows)} pending transaction(s)",
        ["transaction id", "producer group", "topic", "msg id", "stored at (ms)", "checks"],
        [
            [r["transaction_id"], r["producer_group"], r["topic"], r["msg_id"], r["stored_at"], r["checks"]]
            for r in rows
        ],
    )


def _resolve(ctx: typer.Context, tid: str, how: str) -> None:
    c = obj(ctx)
    with c.store() as store:
        doc = _end(store, tid, how)
    if c.json:
        emit_json(doc)
    elif doc["message"] is None:
        echo(f"rolled back {tid}")
    else:
        m = doc["message"]
        echo(f"committed {tid}: queue {m['queue_id']} offset {m['queue_offset']} msg_id={m['msg_id']}")


@transactions_app.command("commit")
@handle_errors
def commit(
    ctx: typer.Context,
    transaction_id: Annotated[str, typer.Argument(help="The id `tierd transactions list` shows.")],
) -> None:
    """Commit: the message becomes visible in its topic, once. Fails with one line for an
    unknown id, or one already resolved (saying how)."""
    _resolve(ctx, transaction_id, "COMMIT")


@transactions_app.command("rollback")
@handle_errors
def rollback(
    ctx: typer.Context,
    transaction_id: Annotated[str, typer.Argument(help="The id `tierd transactions list` shows.")],
) -> None:
    """Roll back: the message is never delivered. Fails with one line for an unknown id, or one
    already resolved (saying how)."""
    _resolve(ctx, transaction_id, "ROLLBACK")
