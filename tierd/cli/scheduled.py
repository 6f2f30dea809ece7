"""Scheduled messages on the command line (docs/scheduled.md): ``tierd produce --deliver-at``
/ ``--delay-level`` (in :mod:`tierd.cli.data`, which calls :func:`schedule` here) and
``tierd recall HANDLE``. Both work on the store directory or through the running daemon, as every
store command does."""

from __future__ import annotations

import base64
import urllib.parse
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tierd.cli.app import app, echo, emit_json, handle_errors, obj
from tierd.cli.remote import RemoteStore

if TYPE_CHECKING:
    from tierd.message import Message
    from tierd.store import BlockingMessageStore


def _path(*parts: str) -> str:
    return "".join("/" + urllib.parse.quote(p, safe="") for p in parts)


def _message_json(m: Message) -> dict[str, Any]:
    """The message as `POST /v1/topics/{topic}/messages` takes it (absent fields left out)."""
    doc: dict[str, Any] = {
        "body": base64.b64encode(m.body).decode("ascii"),
        "keys": list(m.keys) or None,
        "tags": m.tags,
        "properties": dict(m.properties) or None,
        "queue_id": m.queue_id,
        "flag": m.flag or None,
    }
    return doc


def schedule(
    store: BlockingMessageStore | RemoteStore,
    message: Message,
    deliver_at: int | None,
    delay_level: int | None,
) -> dict[str, Any]:
    """Schedule one message; its handle, delivery time, UNIQ_KEY and topic."""
    if isinstance(store, RemoteStore):
        body = _message_json(message) | {"deliver_at": deliver_at, "delay_level": delay_level}
        body = {k: v for k, v in body.items() if v is not None}
        doc: dict[str, Any] = store.api.call(
            "POST", _path("v1", "topics", message.topic, "messages"), body=body
        )
        return doc
    r = store.schedule(message, deliver_at=deliver_at, delay_level=delay_level)
    return {"handle": r.handle, "deliver_at": r.deliver_at, "msg_id": r.msg_id, "topic": r.topic}


def report_scheduled(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(doc)
    else:
        at, handle = doc["deliver_at"], doc["handle"]
        echo(f"scheduled for {doc['topic']} at {at} handle={handle} msg_id={doc['msg_id']}")


@app.command()
@handle_errors
def recall(
    ctx: typer.Context,
    handle: Annotated[str, typer.Argument(help="The handle `tierd produce --deliver-at` printed.")],
) -> None:
    """Cancel a scheduled message before it is due (RocketMQ 5.3 RecallMessage).

    Fails with one line when the handle is unknown or the message is already in its topic."""
    c = obj(ctx)
    with c.store() as store:
        if isinstance(store, RemoteStore):
            recalled = bool(store.api.call("DELETE", _path("v1", "scheduled", handle))["recalled"])
        else:
            recalled = store.recall(handle)
    if c.json:
        emit_json({"handle": handle, "recalled": recalled})
    else:
        echo(f"recalled {handle}" if recalled else f"{handle} was already recalled")
