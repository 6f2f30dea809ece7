"""Transactional messages over HTTP against a running daemon: a half message is invisible, a
commit makes it visible exactly once, a rollback never; check-backs by polling; bad input gets
a 4xx with a stable code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierd.config import TierdConfig

from ..service.conftest import running
from .conftest import TOPIC, b64, bodies, half, tx_config, wait_until

if TYPE_CHECKING:
    from pathlib import Path

SYSTEM = {"RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "RMQ_SYS_TRANS_PROGRESS"}


def test_half_is_invisible_commit_shows_it_once_rollback_never(tmp_path: Path) -> None:
    with running(TierdConfig.from_dict(tx_config(tmp_path))) as d:
        c = d.client
        kept, dropped = half(c, b"kept", keys=["order-1"]), half(c, b"dropped")
        assert bodies(c) == []
        listed = {t["name"] for t in c.get("/v1/topics").json()["topics"]}
        assert not listed & SYSTEM, listed

        r = c.post(f"/v1/transactions/{kept}/commit", json={})
        assert r.status_code == 200, r.text
        assert r.json()["resolution"] == "COMMIT"
        assert r.json()["message"]["queue_offset"] == 0
        r = c.post(f"/v1/transactions/{dropped}/rollback", json={})
        assert r.status_code == 200, r.text
        assert r.json() == {"transaction_id": dropped, "resolution": "ROLLBACK", "message": None}
        assert bodies(c) == [b"kept"]
        (m,) = c.get(f"/v1/topics/{TOPIC}/keys/order-1").json()["messages"]
        assert m["properties"]["__transactionId__"] == kept
        assert "REAL_TOPIC" not in m["properties"]

        again = c.post(f"/v1/transactions/{kept}/commit", json={})
        assert again.status_code == 409, again.text
        assert again.json()["error"] == "transaction_resolved"
        assert again.json()["detail"]["resolution"] == "COMMIT"
        late = c.post(f"/v1/transactions/{dropped}/commit", json={})
        assert late.status_code == 409, late.text
        assert late.json()["detail"]["resolution"] == "ROLLBACK"
        assert bodies(c) == [b"kept"]  # neither the retry nor the late commit wrote anything


def test_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    with running(TierdConfig.from_dict(tx_config(tmp_path))) as d:
        c = d.client
        unknown = c.post("/v1/transactions/7-NOSUCH/commit", json={})
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["error"] == "unknown_transaction"
        assert unknown.json()["detail"]["transaction_id"] == "7-NOSUCH"
        for body, status in (
            ({"body": b64(b"x")}, 422),  # no producer group
            ({"body": b64(b"x"), "producer_group": "pg", "delay_level": 1}, 422),
            ({"body": b64(b"x"), "producer_group": "pg", "properties": {"REAL_TOPIC": "x"}}, 400),
        ):
            r = c.post(f"/v1/topics/{TOPIC}/transactions", json=body)
            assert r.status_code == status, r.text
            assert "Traceback" not in r.text
        sent = {"body": b64(b"x"), "producer_group": "pg"}
        system = c.post("/v1/topics/RMQ_SYS_TRANS_HALF_TOPIC/transactions", json=sent)
        assert system.status_code == 400, system.text
        assert system.json()["error"] == "invalid_topic"


def test_unanswered_check_backs_roll_back(tmp_path: Path) -> None:
    cfg = tx_config(tmp_path, transaction_timeout=0.2, check_interval=0.2, check_max=2)
    with running(TierdConfig.from_dict(cfg)) as d:
        c = d.client
        tid = half(c, b"silent", group="quiet")
        other = half(c, b"other group", group="chatty")

        def checked_twice() -> bool:
            pending = c.get("/v1/transactions", params={"producer_group": "quiet", "due": "true"}).json()
            return any(p["checks"] >= 2 for p in pending["transactions"]) or not pending["transactions"]

        wait_until("two check-backs", checked_twice)
        listed = c.get("/v1/transactions", params={"producer_group": "chatty", "due": "true"}).json()
        assert [p["transaction_id"] for p in listed["transactions"]] in ([other], [])
        r = c.post(f"/v1/transactions/{other}/commit", json={})  # answering a check-back: it commits
        if r.status_code != 200:  # the checker was faster than this test: it rolled back
            assert r.json()["detail"]["resolution"] == "ROLLBACK"

        def rolled_back() -> bool:
            r = c.get("/v1/transactions", params={"producer_group": "quiet"})
            left: list[object] = r.json()["transactions"]
            return not left

        wait_until("the rollback after check_max", rolled_back)
        late = c.post(f"/v1/transactions/{tid}/commit", json={})
        assert late.status_code == 409, late.text
        assert late.json()["detail"]["resolution"] == "ROLLBACK"
        assert b"silent" not in bodies(c)
        metrics = c.get("/metrics").text
        assert "tierd_transaction_rollbacks_total" in metrics
