"""``tierd transactions list|commit|rollback``: on the store directory and through a running
daemon, with the same output; bad input is one line on stderr, never a traceback."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx

from tierd import BlockingMessageStore
from tierd.config import TierdConfig
from tierd.message import Message

from ..cli.test_remote import TOKEN, cli, daemon, ok  # noqa: F401  (daemon: a fixture)
from ..scheduled.test_cli import one_line_error
from ..service.conftest import service_config, toml
from .conftest import b64, bodies

if TYPE_CHECKING:
    from pathlib import Path

    from ..service.conftest import TierdProcess


def _check(cfg: Path, tids: tuple[str, str], *, remembers: bool, env: dict[str, str] | None = None) -> None:
    """List both, commit the first, roll back the second, then the errors. ``remembers``: one
    process answers every call (the daemon), so a repeated commit is told how it ended."""
    kept, dropped = tids

    def run(*args: str) -> Any:
        return json.loads(ok(cli("--config", str(cfg), "-o", "json", "transactions", *args, env=env)))

    listed = run("list")["transactions"]
    assert [(t["transaction_id"], t["producer_group"], t["topic"]) for t in listed] == [
        (kept, "pg", "orders"),
        (dropped, "pg", "orders"),
    ]
    assert run("list", "--producer-group", "other")["transactions"] == []
    table = ok(cli("--config", str(cfg), "transactions", "list", env=env))
    assert "2 pending transaction(s)" in table

    done = run("commit", kept)
    assert done["resolution"] == "COMMIT"
    assert done["message"]["queue_offset"] == 0
    assert run("rollback", dropped) == {"transaction_id": dropped, "resolution": "ROLLBACK", "message": None}
    assert run("list")["transactions"] == []

    base = ("--config", str(cfg), "transactions")
    if remembers:
        one_line_error(cli(*base, "commit", kept, env=env), "already committed")
        one_line_error(cli(*base, "rollback", dropped, env=env), "already rolled back")
    else:  # a fresh open reads from the last progress record, past both: not pending, either way
        one_line_error(cli(*base, "commit", kept, env=env), f"no transaction {kept!r} is pending")
        one_line_error(cli(*base, "commit", dropped, env=env), f"no transaction {dropped!r} is pending")
    one_line_error(cli(*base, "commit", "7-NOPE", env=env), "no transaction '7-NOPE' is pending")


def test_on_the_directory(tmp_path: Path) -> None:
    cfg = tmp_path / "tierd.toml"
    data = service_config(tmp_path)
    cfg.write_text(toml(data))
    with BlockingMessageStore.open(TierdConfig.from_dict(data)) as store:
        tids = tuple(
            store.put_half(Message(topic="orders", body=body), producer_group="pg").transaction_id
            for body in (b"kept", b"dropped")
        )
    _check(cfg, tids, remembers=False)  # type: ignore[arg-type]
    with BlockingMessageStore.open(TierdConfig.from_dict(data)) as store:
        got = [m.body for q in range(4) for m in store.get("orders", q, 0, 10).messages]
    assert got == [b"kept"]


def test_through_the_daemon(daemon: tuple[Path, TierdProcess]) -> None:  # noqa: F811
    cfg, proc = daemon
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=proc.url, headers=headers, timeout=30) as http:
        tids = []
        for body in (b"kept", b"dropped"):
            r = http.post("/v1/topics/orders/transactions", json={"body": b64(body), "producer_group": "pg"})
            assert r.status_code == 200, r.text
            tids.append(r.json()["transaction_id"])
        _check(cfg, (tids[0], tids[1]), remembers=True, env={"TIERD_SERVER__TOKEN": TOKEN})
        assert bodies(http, "orders") == [b"kept"]
