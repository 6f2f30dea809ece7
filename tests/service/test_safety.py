"""Safe defaults of the daemon, over real sockets: tokens, what browsers can and cannot do,
bounds on headers, connections and read responses, and logs that stay readable."""

from __future__ import annotations

import base64
import json
import logging
import select
import socket
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.errors import ConfigError
from tierd.logs import JsonFormatter
from tierd.repeats import FailureLog
from tierd.service.daemon import Daemon

from .conftest import TierdProcess, running, service_config, toml

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from .conftest import Running


def cfg_of(tmp_path: Path, **server: Any) -> TierdConfig:
    return TierdConfig.from_dict(service_config(tmp_path, server=server))


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Running]:
    with running(cfg_of(tmp_path)) as r:
        yield r


# ------------------------------------------------------------------------------------- tokens


def test_an_empty_token_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="an empty token is not 'no token'"):
        TierdConfig.load(env={"TIERD_SERVER__TOKEN": ""})
    with pytest.raises(ConfigError, match="an empty token"):
        TierdConfig.load(env={"TIERD_SERVER__TOKEN": "  "})
    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=f"server.token_file {empty} is empty"):
        TierdConfig.load(env={"TIERD_SERVER__TOKEN_FILE": str(empty)})
    with pytest.raises(ConfigError, match="No such file"):
        TierdConfig.load(env={"TIERD_SERVER__TOKEN_FILE": str(tmp_path / "missing")})


def test_tokens_from_the_environment_are_text_and_never_echoed(tmp_path: Path) -> None:
    assert TierdConfig.load(env={"TIERD_SERVER__TOKEN": "123456"}).server.token == "123456"
    assert TierdConfig.load(env={"TIERD_STORE__DIR": "2024"}).store.dir.name == "2024"
    secret = tmp_path / "token"
    secret.write_text("s3cret-from-a-file\n")
    cfg = TierdConfig.load(env={"TIERD_SERVER__TOKEN_FILE": str(secret)})
    assert cfg.server.bearer_token() == "s3cret-from-a-file"
    with pytest.raises(ConfigError) as err:
        TierdConfig.load(env={"TIERD_SERVER__TOKEN": "987654", "TIERD_SERVER__TOKEN_FILE": str(secret)})
    assert "not both" in str(err.value)
    assert "987654" not in str(err.value)


def test_a_token_file_guards_the_api(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("from-a-file\n")
    with running(cfg_of(tmp_path, token_file=str(secret))) as r:
        assert r.client.get("/v1/topics").status_code == 401
        assert r.client.get("/v1/topics", headers={"Authorization": "Bearer from-a-file"}).status_code == 200


@pytest.mark.parametrize("header", ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"])
def test_the_bearer_scheme_is_case_insensitive(tmp_path: Path, header: str) -> None:
    with running(cfg_of(tmp_path, token="s3cret")) as r:
        assert r.client.get("/v1/topics", headers={"Authorization": header}).status_code == 200
        other = r.client.get("/v1/topics", headers={"Authorization": "Basic czNjcmV0"})
        assert other.status_code == 401
        assert "scheme must be Bearer" in other.json()["message"]


def test_a_non_loopback_bind_needs_a_token(tmp_path: Path) -> None:
    import asyncio

    cfg = cfg_of(tmp_path, host="0.0.0.0")
    with pytest.raises(ConfigError, match="reachable from other machines and no token is set"):
        asyncio.run(Daemon(cfg).run())
    assert not (tmp_path / "hot").exists()  # refused before the store was opened
    # allowed with a token, or when the operator says something else authenticates
    for server in ({"token": "t"}, {"allow_unauthenticated": True}):
        with running(cfg_of(tmp_path, host="0.0.0.0", **server)) as r:
            port = r.url.rsplit(":", 1)[1]
            assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200


# ---------------------------------------------------------------------------------- browsers


def test_writes_need_a_json_content_type(svc: Running) -> None:
    body = json.dumps({"body": "aGk="})
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        headers = {} if content_type is None else {"Content-Type": content_type}
        r = svc.client.post("/v1/topics/t/messages", content=body, headers=headers)
        assert r.status_code == 415, (content_type, r.text)
        assert r.json()["error"] == "unsupported_media_type"
        r = svc.client.post("/v1/admin/tier", headers=headers)
        assert r.status_code == 415
    ok = svc.client.post(
        "/v1/topics/t/messages", content=body, headers={"Content-Type": "Application/JSON; charset=utf-8"}
    )
    assert ok.status_code == 200, ok.text
    svc.wait_ready()
    assert svc.client.post("/v1/admin/tier", json={}).status_code == 200
    assert svc.client.delete("/v1/topics").status_code == 405  # routing errors keep their status
    assert svc.client.post("/nowhere").status_code == 404


def test_the_host_header_must_name_this_server(tmp_path: Path) -> None:
    with running(cfg_of(tmp_path, allowed_hosts=["tierd.example"])) as r:
        port = r.url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "tierd.example"):
            assert r.client.get("/v1/topics", headers={"Host": host}).status_code == 200, host
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example"):
            refused = r.client.get("/v1/topics", headers={"Host": host})
            assert refused.status_code == 421, host
            assert refused.json()["error"] == "invalid_host"
        assert r.client.get("/healthz", headers={"Host": "attacker.example"}).status_code == 200


def test_head_health_and_the_docs_page_off_by_default(tmp_path: Path) -> None:
    with running(cfg_of(tmp_path)) as r:
        r.wait_ready()
        head = r.client.head("/healthz")
        assert head.status_code == 200
        assert head.content == b""
        assert r.client.head("/readyz").status_code == 200
        assert r.client.get("/docs").status_code == 404  # it would load scripts from a CDN
        assert r.client.get("/openapi.json").status_code == 200
    with running(cfg_of(tmp_path, api_docs=True)) as r:
        assert "swagger" in r.client.get("/docs").text.lower()


# ------------------------------------------------------------------------------------ bounds


def _raw(url: str, request: bytes, timeout: float = 30) -> bytes:
    """Send bytes on a fresh connection; everything the server answers until it closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_oversized_headers_get_431_and_long_key_lookups_still_fit(svc: Running) -> None:
    big = b"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * (70 * 1024) + b"\r\n\r\n"
    answer = _raw(svc.url, big)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "headers_too_large"
    # The longest key the API accepts (4096 characters), percent-encoded as 4-byte UTF-8: ~48 KiB.
    key = "\U0001f600" * 4096
    r = svc.client.get(f"/v1/topics/t/keys/{key}")
    assert r.status_code == 200, r.text


def test_a_client_that_never_finishes_its_headers_is_cut_off(tmp_path: Path) -> None:
    with running(cfg_of(tmp_path, header_timeout=1.0)) as r:
        answer = _raw(r.url, b"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert _raw(r.url, b"").startswith(b"HTTP/1.1 408 ")  # a connection that sends nothing
        assert r.client.get("/v1/topics").status_code == 200  # others are served meanwhile


#: A produce request whose body never arrives in full (1 byte of the 100 announced).
SLOW_BODY = (
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{"
)


def _trickle(url: str, request: bytes, limit: float = 20) -> bytes:
    """Send ``request``, then one more body byte a second (a slow client: each byte also resets
    the server's keep-alive timer) until the server closes; fail if it has not within ``limit``."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    deadline = time.monotonic() + limit
    with socket.create_connection((host, int(port)), timeout=limit) as s:
        s.sendall(request)
        out = b""
        while True:
            assert time.monotonic() < deadline, f"the server kept the connection open: {out!r}"
            ready, _, _ = select.select([s], [], [], 1.0)  # the client's pace: a byte a second
            if ready:
                chunk = s.recv(65536)
                if not chunk:
                    return out
                out += chunk
            else:
                try:
                    s.sendall(b" ")
                except OSError:  # closed by the server while we wrote
                    return out


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r.getMessage() for r in caplog.records if r.exc_info], "a traceback was logged"


def _wait_for_log(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    deadline = time.monotonic() + 30
    while not (found := [r.getMessage() for r in caplog.records if text in r.getMessage()]):
        assert time.monotonic() < deadline, f"no log line with {text!r}"
        time.sleep(0.05)  # polling interval; the deadline bounds the wait
    return found


def test_a_client_that_never_finishes_its_body_is_cut_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Headers had a time bound, bodies none: a client trickling its body held its connection
    (and a slot of server.max_connections) for as long as it liked."""
    caplog.set_level(logging.INFO)
    with running(cfg_of(tmp_path, body_timeout=1.0)) as r:
        answer = _raw(r.url, SLOW_BODY)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "request_timeout"
        assert r.client.get("/v1/topics").status_code == 200  # others are served meanwhile
        assert len(_wait_for_log(caplog, "request body not complete within 1 s")) == 1
    _no_tracebacks(caplog)


def test_an_unauthenticated_request_is_closed_after_its_401(tmp_path: Path) -> None:
    """The 401 was written, but the connection stayed open (and counted against
    server.max_connections) while the client went on trickling its body."""
    with running(cfg_of(tmp_path, token="s3cret", max_connections=2)) as r:
        for _ in range(3):  # more than the limit, one after the other: each slot is freed
            answer = _trickle(r.url, SLOW_BODY)
            assert answer.startswith(b"HTTP/1.1 401 ")
        ok = httpx.get(f"{r.url}/v1/topics", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


def test_an_aborted_body_is_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A client that goes away mid-body used to log a 40-line traceback per request."""
    caplog.set_level(logging.INFO)
    with running(cfg_of(tmp_path)) as r:
        host, port = r.url.removeprefix("http://").rsplit(":", 1)
        for _ in range(2):
            with socket.create_connection((host, int(port)), timeout=30) as s:
                # "100 Continue" comes when the route starts reading the body: abort only then.
                s.sendall(SLOW_BODY[:-3] + b"Expect: 100-continue\r\n\r\n")
                seen = b""
                while b"100 Continue" not in seen:
                    chunk = s.recv(1024)
                    assert chunk, seen
                    seen += chunk
                s.sendall(b"{")
        lines = _wait_for_log(caplog, "closed the connection before its request body was complete")
        deadline = time.monotonic() + 30
        while len(lines) < 2:
            assert time.monotonic() < deadline, lines
            time.sleep(0.05)  # polling interval; the deadline bounds the wait
            lines = _wait_for_log(caplog, "closed the connection before its request body was complete")
        assert len(lines) == 2  # one line per aborted request
        assert r.client.get("/v1/topics").status_code == 200
    _no_tracebacks(caplog)


def test_connections_beyond_the_limit_get_503(tmp_path: Path) -> None:
    with running(cfg_of(tmp_path, max_connections=2)) as r:
        host, port = r.url.removeprefix("http://").rsplit(":", 1)
        held = [socket.create_connection((host, int(port)), timeout=30) for _ in range(2)]
        try:
            deadline = time.monotonic() + 30
            status = 0
            while time.monotonic() < deadline:
                status = httpx.get(f"{r.url}/v1/topics").status_code
                if status == 503:
                    break
                time.sleep(0.05)  # until the server has accepted both held connections
            assert status == 503
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 30
        while httpx.get(f"{r.url}/v1/topics").status_code != 200:
            assert time.monotonic() < deadline, "the limit never freed"
            time.sleep(0.05)


def _produce(r: Running, sizes: list[int]) -> None:
    batch = [
        {"body": base64.b64encode(bytes([i % 251]) * n).decode(), "queue_id": 0} for i, n in enumerate(sizes)
    ]
    resp = r.client.post("/v1/topics/big/messages:batch", json={"messages": batch})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("policy", ["DISABLE", "FORCE"])
def test_a_read_stops_at_the_byte_bound_but_always_returns_one_message(tmp_path: Path, policy: str) -> None:
    kib = 1024
    with running(cfg_of(tmp_path, max_read_bytes=700 * kib)) as r:
        _produce(r, [300 * kib] * 5 + [900 * kib, 10])
        r.wait_ready()
        assert r.client.post("/v1/admin/tier", json={}).json()["committed"] == 7
        got: list[int] = []
        offset = 0
        while True:
            page = r.client.get(
                "/v1/topics/big/queues/0/messages", params={"offset": offset, "max": 4096, "policy": policy}
            ).json()
            if page["status"] != "FOUND":
                break
            assert page["source"] == ("cold" if policy == "FORCE" else "hot")
            got.append(len(page["messages"]))
            assert page["next_offset"] == offset + len(page["messages"])
            offset = page["next_offset"]
    # 300 KiB messages: two fit in 700 KiB, a third would not; 900 KiB comes alone (it is the
    # first of its read); every message arrives exactly once.
    assert got == [2, 2, 1, 1, 1]


def test_the_python_api_takes_the_same_bound(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path)
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="t", body=b"x" * 1000, queue_id=0) for _ in range(10)])
        assert len(store.get("t", 0, 0, 100).messages) == 10
        bounded = store.get("t", 0, 0, 100, max_bytes=3500)
        assert len(bounded.messages) == 3
        assert bounded.next_offset == 3
        assert len(store.get("t", 0, 0, 100, max_bytes=1).messages) == 1


# -------------------------------------------------------------------------------------- logs


def test_a_held_back_count_is_a_json_field(caplog: pytest.LogCaptureFixture) -> None:
    """FailureLog (tierd/repeats.py) is the one rate limiter; in JSON logs its count of the
    failures it held back is a field of its own, not only text in the message."""
    now = [0.0]
    failures = FailureLog(logging.getLogger("tierd.x"), "tiering t/0", interval=60, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="tierd.x")
    for _ in range(5):
        failures.failed(OSError("S3 down"))
    now[0] = 61.0
    failures.failed(OSError("S3 down"))
    first, again = (json.loads(JsonFormatter().format(r)) for r in caplog.records)
    assert first["message"] == "tiering t/0 failed: S3 down"
    assert "repeats" not in first
    assert again["repeats"] == 4
    assert again["message"] == "tiering t/0 failed: S3 down [4 more failure(s) in the last 60 s]"


def test_json_logs_and_a_backend_outage_in_one_line_each(tmp_path: Path) -> None:
    """log.format = "json": every line the daemon writes is a JSON object. With its S3 server
    gone, tiering fails — as one warning line per failure, never a traceback — and repeated
    identical failures are held back (counted)."""
    from tierd.testing.s3server import create_bucket, start_moto

    s3 = start_moto(tmp_path / "moto")
    try:
        bucket = create_bucket(s3)
        # One attempt per S3 call: the subject is how failures are logged, not botocore's retry
        # backoff, which made each failing tier call 6-17 s and the daemon's stop 19 s.
        options = {**s3.storage_options, "config_kwargs": {"retries": {"max_attempts": 1}}}
        backend = {"name": "s3", "url": f"s3://{bucket}/t", "storage_options": options}
        # Short timers: dispatch rounds and upkeep (seals, metadata, manifests) run during the outage.
        data = service_config(tmp_path, backend, dispatch_interval=0.5, manifest_interval=0.5)
        data["log"] = {"format": "json"}
        path = tmp_path / "tierd.toml"
        path.write_text(toml(data))
        tierd = TierdProcess(path)
        try:
            tierd.wait_for("cold tier ready", 60)
            c = httpx.Client(base_url=tierd.url, timeout=120)
            assert c.post("/v1/topics/t/messages", json={"body": "aGk=", "queue_id": 0}).status_code == 200
            assert c.post("/v1/admin/tier", json={}).json()["committed"] == 1
            s3.stop()  # the outage
            statuses = []
            for topic in ("t", "new", "t", "new"):
                c.post(f"/v1/topics/{topic}/messages", json={"body": "aGk=", "queue_id": 0})
                statuses.append(c.post("/v1/admin/tier", json={}).status_code)
            c.close()
            assert statuses == [502] * 4
            tierd.wait_for("tiering maintenance failed", 90)  # upkeep: was a 126-line traceback
            assert tierd.terminate() == 0
        finally:
            tierd.kill()
    finally:
        s3.stop()
    lines = tierd.output.splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    failures = [r for r in records if r["level"] in ("WARNING", "ERROR")]
    assert failures, lines
    assert not [r for r in records if "exception" in r or "Traceback" in r["message"]], failures
    # An outage fails every round and every request alike: each kind is said once a minute, and
    # a repeat carries the count of the failures held back since.
    answered = [r for r in failures if r["message"].startswith("a request (502 backend_error) failed")]
    assert 1 <= len(answered) < len(statuses), answered
    for kind in ("a request (502", "dispatch round failed", "tiering maintenance failed"):
        said = [r for r in failures if r["message"].startswith(kind)]
        assert all(r.get("repeats", 0) > 0 for r in said[1:]), said
    assert any("stopped cleanly" in r["message"] for r in records)


def test_a_key_query_stops_at_the_byte_bound_and_continues(tmp_path: Path) -> None:
    """A key query over large messages returned every match in one response (559 MB over 4 MiB
    messages); it is bounded by server.max_read_bytes like a queue read, with a continuation —
    also through a batch, whose messages share one store timestamp."""
    kib = 1024
    with running(cfg_of(tmp_path, max_read_bytes=700 * kib)) as r:
        c = r.client
        for i in range(5):
            body = base64.b64encode(bytes([i]) * (300 * kib)).decode()
            msg = {"body": body, "queue_id": i % 2, "keys": ["k"]}
            assert c.post("/v1/topics/big/messages", json=msg).status_code == 200
        batch = [
            {"body": base64.b64encode(bytes([10 + i]) * (300 * kib)).decode(), "keys": ["k"]}
            for i in range(3)
        ]
        assert c.post("/v1/topics/big/messages:batch", json={"messages": batch}).status_code == 200
        pages: list[list[dict[str, Any]]] = []
        params: dict[str, Any] = {"max": 1024}
        while True:
            assert len(pages) < 20, "the continuation does not advance"
            page = c.get("/v1/topics/big/keys/k", params=params)
            assert page.status_code == 200, page.text
            doc = page.json()
            pages.append(doc["messages"])
            if doc["next"] is None:
                break
            params = {"max": 1024, **doc["next"]}
    assert [len(p) for p in pages] == [2, 2, 2, 2]  # 300 KiB each: two fit in 700 KiB
    got = [m for p in pages for m in p]
    firsts = sorted(base64.b64decode(m["body"])[0] for m in got)
    assert firsts == [0, 1, 2, 3, 4, 10, 11, 12]  # every match exactly once
    stamps = [m["store_timestamp"] for m in got]
    assert stamps == sorted(stamps, reverse=True)  # newest first across pages


def _one_response(s: socket.socket) -> tuple[bytes, bytes]:
    """Read one HTTP response (head, body) from ``s``; b"" for the head when the server closed."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return b"", buf
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, "the server closed in the middle of a response body"
        body += chunk
    return head, body


def test_an_answer_before_the_body_keeps_the_connection_unless_it_is_an_error(tmp_path: Path) -> None:
    """A route that does not read its body can answer before the body's last packet is in.
    The connection was then closed without `connection: close`, and the client's next request
    on it (httpx reuses keep-alive connections) was reset. A success keeps the connection now;
    an error still closes it, and says so."""
    with running(cfg_of(tmp_path, token="s3cret")) as r:
        host, port = r.url.removeprefix("http://").rsplit(":", 1)
        start = (
            b"POST /v1/admin/gc HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\n" % (host.encode(), port.encode())
        )
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(start + b"Authorization: Bearer s3cret\r\n\r\n")  # the body is held back
            head, _ = _one_response(s)
            assert head.startswith(b"HTTP/1.1 200 ")
            assert b"connection: close" not in head.lower()
            s.sendall(b"{}")  # the body, late
            s.sendall(
                b"GET /v1/topics HTTP/1.1\r\nHost: %s:%s\r\nAuthorization: Bearer s3cret\r\n\r\n"
                % (host.encode(), port.encode())
            )
            head, body = _one_response(s)
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert "topics" in json.loads(body)
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(start + b"\r\n")  # no token: a 401 before the body
            head, _ = _one_response(s)
            assert head.startswith(b"HTTP/1.1 401 ")
            assert b"connection: close" in head.lower()
            assert s.recv(65536) == b""  # and closed
