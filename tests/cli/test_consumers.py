"""Consumer commands through Typer's runner: ``consume --tags/--group``, ``groups``, ``seek``,
``earliest-time`` — their JSON, their text, and what bad input gets."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import pytest

from .test_commands import _config, tierd, tierd_json

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = _config(tmp_path)
    for i in range(12):
        tierd(
            path,
            "produce",
            "orders",
            f"m{i}",
            "-q",
            "0",
            *(("-t", "paid") if i % 3 == 0 else ("-t", "other")),
        )
    return path


def test_consume_with_tags(cfg: Path) -> None:
    got = tierd_json(cfg, "consume", "orders", "--tags", "paid", "-n", "100")
    assert [base64.b64decode(m["body"]) for m in got["messages"]] == [b"m0", b"m3", b"m6", b"m9"]
    assert (got["status"], got["next_offset"]) == ("FOUND", 12)  # examined every unit
    none = tierd_json(cfg, "consume", "orders", "--tags", "refunded")
    assert (none["status"], none["messages"], none["next_offset"]) == ("NO_MATCHED_MESSAGE", [], 12)
    bad = tierd(cfg, "consume", "orders", "--tags", "paid ||", code=1)
    assert bad.stderr.startswith("tierd: error: tag 2 of 'paid ||' is empty")
    assert "Traceback" not in bad.stderr


def test_consume_with_a_group_continues_where_it_stopped(cfg: Path) -> None:
    first = tierd_json(cfg, "consume", "orders", "--group", "billing", "-n", "2", "--tags", "paid")
    assert ([m["queue_offset"] for m in first["messages"]], first["committed"]) == ([0, 3], 4)
    text = tierd(cfg, "consume", "orders", "--group", "billing", "-n", "2", "--tags", "paid").stdout
    assert "committed offset 10 for group billing" in text
    peek = tierd_json(cfg, "consume", "orders", "--group", "billing", "--no-commit")
    assert ([m["queue_offset"] for m in peek["messages"]], peek["committed"]) == ([10, 11], None)
    assert tierd_json(cfg, "groups", "show", "billing")["queues"][0]["committed"] == 10
    usage = tierd(cfg, "consume", "orders", "--group", "billing", "--offset", "3", code=2)
    assert "groups reset" in usage.stderr


def test_groups_commands(cfg: Path) -> None:
    assert tierd_json(cfg, "groups", "ls") == []
    assert tierd_json(cfg, "groups", "commit", "billing", "orders", "--offset", "5") == {
        "group": "billing",
        "topic": "orders",
        "queue_id": 0,
        "offset": 5,
    }
    [g] = tierd_json(cfg, "groups", "ls")
    assert (g["group"], g["lag"]) == ("billing", 7)
    assert "billing" in tierd(cfg, "groups", "ls").stdout
    shown = tierd(cfg, "groups", "show", "billing").stdout
    assert "lag 7 message(s)" in shown
    reset = tierd_json(cfg, "groups", "reset", "billing", "orders", "--to", "latest")
    assert reset == {"group": "billing", "offsets": [{"topic": "orders", "queue_id": 0, "offset": 12}]}
    reset = tierd_json(
        cfg, "groups", "reset", "billing", "orders", "--to", "timestamp", "--time", "1970-01-01T00:00:00Z"
    )
    assert reset["offsets"][0]["offset"] == 0
    err = tierd(
        cfg, "groups", "reset", "billing", "orders", "--to", "offset", "--offset", "13", "-q", "0", code=1
    )
    assert "its offsets are [0, 12]" in err.stderr
    err = tierd(cfg, "groups", "commit", "billing", "orders", "--offset", "99", code=1)
    assert "beyond the end of orders/0" in err.stderr
    err = tierd(
        cfg, "groups", "reset", "billing", "orders", "--to", "timestamp", "--time", "yesterday", code=2
    )
    assert "ISO-8601" in err.stderr
    assert tierd_json(cfg, "groups", "delete", "billing") == {"group": "billing", "queues": 1}
    err = tierd(cfg, "groups", "show", "billing", code=1)
    assert "has no committed offsets" in err.stderr


def test_seek_and_earliest_time(cfg: Path) -> None:
    [first] = tierd_json(cfg, "consume", "orders", "-n", "1")["messages"]
    ts = first["store_timestamp"]
    rows = tierd_json(cfg, "seek", "orders", "--time", str(ts))
    assert rows == [{"topic": "orders", "queue_id": 0, "timestamp": ts, "boundary": "lower", "offset": 0}]
    assert tierd_json(cfg, "seek", "orders", "--time", "2999-01-01T00:00:00+00:00")[0]["offset"] == 12
    assert tierd_json(cfg, "seek", "orders", "-q", "0", "--time", "0")[0]["offset"] == 0
    assert tierd_json(cfg, "earliest-time", "orders") == [
        {"topic": "orders", "queue_id": 0, "earliest_time": ts}
    ]
    assert "earliest time" in tierd(cfg, "earliest-time", "orders").stdout
    text = tierd(cfg, "seek", "orders", "--time", "0").stdout
    assert "orders: first offset stored at or after 1970-01-01T00:00:00.000+00:00 per queue" in text
    tierd(cfg, "seek", "orders", "--time", "soon", code=2)
