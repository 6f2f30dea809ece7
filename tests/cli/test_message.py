"""``tierd message ID`` against a live daemon (a real ``tierd serve`` process; the CLI a real
subprocess, through ``GET /v1/messages/{id}``): offset ids in the hot tier, client ids (UNIQ_KEY)
in both tiers, what an offset id whose hot file is gone answers, and ids that must never return a
message — malformed, unknown, a position inside a record, a record image inside a body."""

from __future__ import annotations

import base64
import json
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tierd.format.host import encode_host
from tierd.format.layout import HEADER_V4, MAGIC_V1
from tierd.format.message_id import offset_msg_id
from tierd.format.record import encode_record, topic_field

from ..service.conftest import TierdProcess, toml
from .test_remote import TOKEN, _free_port, cli, ok

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

WAIT = 60.0  # seconds: the bound of every wait below
STORE_HOST = "127.0.0.1:10911"  # store.store_host's default: the host part of every offset id


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[dict[str, str], httpx.Client]]:
    """A daemon whose hot commitlog files are small (256 KiB) and expire as soon as they are in the
    cold tier (retention every 0.2 s, hot retention 36 ms): ``tierd tier`` then moves a filled
    file's messages to the cold tier only. Yields the CLI's environment and an HTTP client."""
    cfg = tmp_path / "tierd.toml"
    data = {
        "store": {
            "dir": str(tmp_path / "hot"),
            "commitlog_file_size": 256 * 1024,
            "max_message_size": 64 * 1024,
            "consumequeue_file_units": 1000,
            "index_slots": 64,
            "index_items": 4000,
            "file_reserved_time": 0.00001,
            "retention_interval": 0.2,
        },
        "backend": {"name": "posix", "url": str(tmp_path / "cold")},
        "tiered": {"dispatch_interval": 3600},
        "server": {"host": "127.0.0.1", "port": _free_port()},
        "grpc": {"port": 0},
    }
    cfg.write_text(toml(data))
    proc = TierdProcess(cfg, env={"TIERD_SERVER__TOKEN": TOKEN})
    try:
        proc.wait_for("cold tier ready", WAIT)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=proc.url, headers=headers, timeout=WAIT) as http:
            yield {"TIERD_CONFIG": str(cfg), "TIERD_SERVER__TOKEN": TOKEN}, http
    finally:
        proc.kill()


def _produce(env: dict[str, str], topic: str, body: str, *extra: str) -> dict[str, Any]:
    [placed] = json.loads(ok(cli("-o", "json", "produce", topic, body, *extra, env=env)))
    return dict(placed)


def _found(env: dict[str, str], msg_id: str, *extra: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(ok(cli("-o", "json", "message", msg_id, *extra, env=env)))
    return doc


def _refused(env: dict[str, str], msg_id: str, *extra: str) -> str:
    """The CLI's one error line for a lookup that must not answer (exit 1, no traceback)."""
    res = cli("message", msg_id, *extra, env=env)
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert res.stdout == ""
    assert res.stderr.startswith("tierd: error: ")
    assert res.stderr.count("\n") == 1, res.stderr
    return res.stderr


def test_offset_id_finds_the_message_in_the_hot_tier(daemon: tuple[dict[str, str], httpx.Client]) -> None:
    env, http = daemon
    placed = _produce(env, "orders", "hello world", "-k", "k-1", "-q", "2")
    _produce(env, "orders", "a neighbour")
    doc = _found(env, placed["msg_id"])
    assert (doc["id"], doc["matched"], doc["tier"]) == (placed["msg_id"], "offset", "hot")
    m = doc["message"]
    assert (m["topic"], m["queue_id"], m["queue_offset"]) == ("orders", 2, placed["queue_offset"])
    assert base64.b64decode(m["body"]) == b"hello world"
    assert m["commitlog_offset"] == placed["commitlog_offset"]
    # The formats of `tierd consume`: body, a format string, NDJSON, and the table.
    assert ok(cli("message", placed["msg_id"], "--format", "body", env=env)) == "hello world\n"
    assert ok(cli("message", placed["msg_id"], "--format", r"%t/%p@%o %k %s\n", env=env)) == (
        f"orders/2@{placed['queue_offset']} k-1 hello world\n"
    )
    [line] = ok(cli("message", placed["msg_id"], "--format", "json", env=env)).splitlines()
    assert json.loads(line)["msg_id"] == placed["msg_id"]
    table = ok(cli("message", placed["msg_id"], env=env))
    assert "hello world" in table
    assert table.endswith(f"orders/2@{placed['queue_offset']}, found by its offset id in the hot tier\n")
    # With --topic: the same message in its topic, not found in another.
    assert _found(env, placed["msg_id"], "--topic", "orders")["message"]["queue_id"] == 2
    assert "which holds a message of topic orders" in _refused(env, placed["msg_id"], "--topic", "other")
    # The HTTP route answers the same document.
    r = http.get(f"/v1/messages/{placed['msg_id']}")
    assert r.status_code == 200
    assert r.json()["message"]["body"] == m["body"]


def test_client_id_in_both_tiers_and_an_offset_id_whose_hot_file_is_gone(
    daemon: tuple[dict[str, str], httpx.Client],
) -> None:
    env, http = daemon
    target = _produce(env, "orders", "the one", "-p", "UNIQ_KEY=AC11000100002A9F0000000000000001")
    cid = "AC11000100002A9F0000000000000001"  # a client id shaped like an offset id of another host
    hot = _found(env, cid)
    assert (hot["matched"], hot["tier"]) == ("client", "hot")
    assert base64.b64decode(hot["message"]["body"]) == b"the one"

    # Fill the first 256 KiB commitlog file, move everything to the cold tier: retention then
    # deletes the hot file (it may, once tiered), and the message exists in the cold tier only.
    filler = "x" * 60_000
    for _ in range(5):
        _produce(env, "filler", filler)
    assert json.loads(ok(cli("-o", "json", "tier", env=env)))["pending"] == 0
    deadline = time.monotonic() + WAIT
    while True:
        r = http.get(f"/v1/messages/{target['msg_id']}")
        if r.status_code == 404:
            break
        assert r.status_code == 200, r.text
        assert time.monotonic() < deadline, "hot retention never deleted the tiered commitlog file"
        time.sleep(0.1)  # polling interval; the deadline bounds the wait
    # The offset id now names a position the hot tier has dropped: not found, saying why and
    # what to use instead — never a message found at some other position.
    body = r.json()
    assert body["error"] == "message_not_found"
    assert body["detail"]["msg_id"] == target["msg_id"]
    assert "has left the hot tier" in body["message"]
    line = _refused(env, target["msg_id"])
    assert "has left the hot tier" in line
    assert "client id (UNIQ_KEY)" in line

    # The client id still finds it, read from the cold tier (by key index and verified UNIQ_KEY).
    cold = _found(env, cid)
    assert (cold["matched"], cold["tier"]) == ("client", "cold")
    m = cold["message"]
    assert (m["topic"], m["queue_id"], m["queue_offset"]) == ("orders", target["queue_id"], 0)
    assert base64.b64decode(m["body"]) == b"the one"
    assert m["properties"]["UNIQ_KEY"] == cid
    assert ok(cli("message", cid, "--topic", "orders", "--format", "body", env=env)) == "the one\n"
    assert "no client id (UNIQ_KEY) in topic filler" in _refused(env, cid, "--topic", "filler")


def test_malformed_and_unknown_ids_are_one_clear_error(daemon: tuple[dict[str, str], httpx.Client]) -> None:
    env, http = daemon
    placed = _produce(env, "orders", "present")
    for bad in ("two words", "tab\there", "x" * 4097):
        line = _refused(env, bad)
        assert "a message id is 1-4096 printable characters without spaces" in line
    r = http.get("/v1/messages/two%20words")
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_argument"

    unknown = offset_msg_id(encode_host(STORE_HOST), placed["commitlog_offset"] + 10**9)
    assert "beyond the end of the hot commitlog" in _refused(env, unknown)
    elsewhere = offset_msg_id(encode_host("10.1.2.3:10911"), placed["commitlog_offset"])
    assert f"this store is {STORE_HOST}" in _refused(env, elsewhere)
    assert "no message has id 'no-such-id'" in _refused(env, "no-such-id")
    for msg_id in (unknown, elsewhere, "no-such-id"):
        r = http.get(f"/v1/messages/{msg_id}")
        assert r.status_code == 404
        assert (r.json()["error"], r.json()["detail"]["msg_id"]) == ("message_not_found", msg_id)


def test_an_offset_inside_a_record_never_returns_a_message(
    daemon: tuple[dict[str, str], httpx.Client],
) -> None:
    """Every position inside a stored record, and a position where a body holds a well-formed
    record image (right CRC, its own position in PHYSICALOFFSET, this store's host, naming a real
    queue and offset), is not a message: the consume queue never pointed there."""
    env, http = daemon
    host = encode_host(STORE_HOST)
    magic, topic_part = topic_field(b"orders")
    assert magic == MAGIC_V1
    path = env["TIERD_CONFIG"] + ".body"
    prev = _produce(env, "orders", "the real one", "-q", "0")
    # The next record starts where the last one ends, unless the daemon appended one of its own
    # in between (its system topics): then try again after that. Its body starts after the IPv4
    # header; plant a record image 8 bytes into it, naming orders/0 offset 0 (a real message).
    for _ in range(5):
        at = prev["commitlog_offset"] + _found(env, prev["msg_id"])["message"]["size"]
        fake_at = at + HEADER_V4 + 8
        fake = encode_record(b"forged", topic_part, magic, b"", 0, 0, 0, fake_at, 0, 1, host, 1, host)
        with open(path, "wb") as fh:
            fh.write(b"........" + fake + b"........")
        [carrier] = json.loads(ok(cli("-o", "json", "produce", "orders", "--file", path, "-q", "1", env=env)))
        if carrier["commitlog_offset"] == at:
            break  # the planted image sits where it was meant to
        prev = carrier
    else:
        pytest.fail("the daemon wrote between every two produces: the image never landed in place")

    forged = offset_msg_id(host, fake_at)
    assert "where no message of a live queue starts" in _refused(env, forged)
    r = http.get(f"/v1/messages/{forged}")
    assert (r.status_code, r.json()["error"]) == (404, "message_not_found")
    end = at + _found(env, carrier["msg_id"])["message"]["size"]
    for pos in range(prev["commitlog_offset"] + 1, end):  # inside either record
        if pos == at:
            continue
        r = http.get(f"/v1/messages/{offset_msg_id(host, pos)}")
        assert r.status_code == 404, (pos, r.text)
        assert r.json()["error"] == "message_not_found"


def test_an_id_that_names_several_messages_is_ambiguous(daemon: tuple[dict[str, str], httpx.Client]) -> None:
    """A producer's retry stores the same client id twice; so can two topics. The lookup lists
    them instead of picking one; a topic narrows it."""
    env, http = daemon
    a = _produce(env, "orders", "first try", "-p", "UNIQ_KEY=retried-1", "-q", "0")
    b = _produce(env, "orders", "second try", "-p", "UNIQ_KEY=retried-1", "-q", "3")
    line = _refused(env, "retried-1")
    assert (
        f"2 messages answer to id 'retried-1': orders/0@{a['queue_offset']}, orders/3@{b['queue_offset']}"
        in line
    )
    r = http.get("/v1/messages/retried-1")
    assert r.status_code == 409
    assert r.json()["error"] == "ambiguous_message_id"
    assert r.json()["detail"]["candidates"] == [
        f"orders/0@{a['queue_offset']}",
        f"orders/3@{b['queue_offset']}",
    ]

    _produce(env, "payments", "elsewhere", "-p", "UNIQ_KEY=twice-1")
    _produce(env, "refunds", "and here", "-p", "UNIQ_KEY=twice-1")
    assert "or narrow the search with a topic" in _refused(env, "twice-1")
    assert ok(cli("message", "twice-1", "--topic", "refunds", "--format", "body", env=env)) == "and here\n"
