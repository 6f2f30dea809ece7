"""The store commands' second backend: a running daemon, over its HTTP API.

Why: a daemon holds its store directory locked, so in a pod ``kubectl exec … -- tierd segments
ls`` could not open it. With the daemon running the commands send the same calls over HTTP
instead and render the replies with the same code, so the output does not depend on where the
answer came from. :class:`RemoteStore` offers the subset of
:class:`~tierd.BlockingMessageStore` the commands use, and returns the same types
(:class:`~tierd.message.GetResult`, :class:`~tierd.inventory.QueueInfo`, …).

Adding a route: one method here that calls :meth:`HttpApi.call` and turns the JSON into the
facade's type. Errors come back as the typed error the server raised (the ``error`` code of the
body picks the :class:`~tierd.errors.TierdError` subclass), so ``tierd: error: …`` reads the
same in both modes.

Only the standard library is used (``http.client``): the runtime image carries no HTTP client
package. The facade's result types are imported where a reply is turned into one, not at the
top: this module is on every command's start-up path, and the modules defining some of them
bring the hot store and numpy along.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import urllib.parse
from typing import TYPE_CHECKING, Any

from tierd.errors import InvalidArgumentError, NotFoundError, TierdError
from tierd.format.message_ext import MessageExt
from tierd.message import GetResult, GetStatus, PutResult, ReadPolicy

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from tierd.consumption.groups import GroupInfo
    from tierd.inventory import SegmentRow
    from tierd.lookup import FoundMessage
    from tierd.message import Message
    from tierd.queue_info import QueueInfo
    from tierd.topics import TopicInfo
    from tierd.verify import VerifyReport

#: Longest wait for one reply (tiering everything now can take a while on a slow backend).
TIMEOUT = 300.0
#: Longest wait for ``verify`` through the daemon: it reads every byte of both tiers.
VERIFY_TIMEOUT = 3600.0
#: The API's own bounds (docs/http.md): larger requests are sent in pieces or capped.
MAX_BATCH = 1024
MAX_GET = 4096
MAX_QUERY = 1024


class ServerUnavailableError(TierdError, ConnectionError):
    """No tierd daemon answers at the address the CLI was given or derived from the config."""

    code = "server_unavailable"
    http_status = 503


class RemoteError(TierdError):
    """An error reply whose code this CLI does not know (a newer server)."""

    code = "remote_error"


def _error_classes() -> dict[str, type[TierdError]]:
    """Every TierdError subclass by its code (the most general class wins a shared code)."""
    found: dict[str, type[TierdError]] = {}
    todo: list[type[TierdError]] = [TierdError]
    while todo:
        cls = todo.pop(0)
        found.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return found


class HttpApi:
    """JSON over HTTP/1.1 to one daemon (a fresh connection per call: the CLI makes few)."""

    def __init__(self, url: str, token: str | None, timeout: float = TIMEOUT, why: str | None = None) -> None:
        try:  # urlsplit refuses an unclosed "[", .port a port that is not 0-65535
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise InvalidArgumentError(
                f"server URL must look like http://HOST:PORT, got {url!r} ({e})", url=url
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgumentError(f"server URL must look like http://HOST:PORT, got {url!r}", url=url)
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port
        self._base = parts.path.rstrip("/")
        self._token = token
        #: Longest wait for one reply (a long poll adds its wait).
        self.timeout = timeout
        #: How the CLI came to ask this address (named when nothing answers there).
        self.why = why

    def call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """One request; the decoded JSON reply, or the server's error raised as its typed error."""
        target = self._base + path
        params = {k: v for k, v in (query or {}).items() if v is not None}
        if params:
            target += "?" + urllib.parse.urlencode(params)
        headers = {"Accept": "application/json"}
        data = None
        if method != "GET":  # every write carries a JSON body (the server requires the type)
            headers["Content-Type"] = "application/json"
            data = json.dumps({} if body is None else body).encode()
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        conn_cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = conn_cls(self._host, self._port, timeout=self.timeout if timeout is None else timeout)
        try:
            conn.request(method, target, body=data, headers=headers)
            reply = conn.getresponse()
            raw = reply.read()
        except (OSError, http.client.HTTPException) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
            why = f" ({self.why})" if self.why else ""
            raise ServerUnavailableError(
                f"no answer from a tierd daemon at {self.url}{why}: {reason}", url=self.url
            ) from e
        finally:
            conn.close()
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if reply.status >= 400:
            raise self._error(reply.status, doc, raw)
        return doc

    def _error(self, status: int, doc: Any, raw: bytes) -> TierdError:
        if not (isinstance(doc, dict) and isinstance(doc.get("error"), str)):
            text = raw[:200].decode("utf-8", errors="replace").strip()
            return RemoteError(f"{self.url} answered HTTP {status}: {text}", status=status)
        detail: dict[str, Any] = doc["detail"] if isinstance(doc.get("detail"), dict) else {}
        cls = _error_classes().get(doc["error"], RemoteError)
        err = cls.__new__(cls)
        TierdError.__init__(err, str(doc.get("message", "")), **detail)
        return err


def _message_json(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"body": base64.b64encode(m.body).decode("ascii")}
    if m.keys:
        out["keys"] = list(m.keys)
    if m.tags is not None:
        out["tags"] = m.tags
    if m.properties:
        out["properties"] = dict(m.properties)
    if m.queue_id is not None:
        out["queue_id"] = m.queue_id
    if m.flag:
        out["flag"] = m.flag
    return out


def _put_result(doc: dict[str, Any]) -> PutResult:
    return PutResult(doc["queue_id"], doc["queue_offset"], doc["commitlog_offset"], doc["msg_id"])


def _path(*parts: str | int) -> str:
    return "".join("/" + urllib.parse.quote(str(p), safe="") for p in parts)


def _chunks(items: Sequence[Message], n: int) -> Iterator[Sequence[Message]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


class RemoteStore:
    """The store commands' view of a running daemon (see the module docstring)."""

    def __init__(self, api: HttpApi) -> None:
        self.api = api

    def put(self, message: Message) -> PutResult:
        doc = self.api.call(
            "POST", _path("v1", "topics", message.topic, "messages"), body=_message_json(message)
        )
        return _put_result(doc)

    def put_batch(self, messages: Sequence[Message]) -> list[PutResult]:
        """One request per 1024 messages (the API's batch bound); each request is all or nothing."""
        out: list[PutResult] = []
        for chunk in _chunks(messages, MAX_BATCH):
            topic = chunk[0].topic
            doc = self.api.call(
                "POST",
                _path("v1", "topics", topic) + "/messages:batch",
                body={"messages": [_message_json(m) for m in chunk]},
            )
            out += [_put_result(r) for r in doc["results"]]
        return out

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        policy: ReadPolicy | str | None = None,
        *,
        tags: str | None = None,
        wait_ms: int = 0,
    ) -> GetResult:
        shown = policy.value if isinstance(policy, ReadPolicy) else policy
        query = {"offset": offset, "max": min(max_count, MAX_GET), "policy": shown, "tags": tags}
        doc = self.api.call(
            "GET",
            _path("v1", "topics", topic, "queues", queue_id, "messages"),
            {**query, "wait_ms": wait_ms},
            timeout=self.api.timeout + wait_ms / 1000,  # a long poll answers after its wait
        )
        return GetResult(
            GetStatus(doc["status"]),
            tuple(MessageExt.from_json(m) for m in doc["messages"]),
            doc["next_offset"],
            doc["min_offset"],
            doc["max_offset"],
            doc["source"],
        )

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The oldest readable offset (0 for a queue the daemon does not know, as locally)."""
        try:
            rows = self.queues(topic)
        except NotFoundError:
            return 0
        return next((q.min_offset for q in rows if q.queue_id == queue_id), 0)

    def query(
        self, topic: str, key: str, max_count: int = 32, begin: int = 0, end: int = 2**63 - 1
    ) -> list[MessageExt]:
        """Follows the answer's continuation (``next``: the server bounds each answer's bytes)
        until ``max_count`` messages or no more."""
        out: list[MessageExt] = []
        params: dict[str, Any] = {"begin": begin, "end": end}
        while len(out) < max_count:
            params["max"] = min(max_count - len(out), MAX_QUERY)
            doc = self.api.call("GET", _path("v1", "topics", topic, "keys", key), params)
            out += [MessageExt.from_json(m) for m in doc["messages"]]
            nxt = doc.get("next")
            if not nxt or not doc["messages"]:
                break
            params |= nxt
        return out

    def message(self, msg_id: str, *, topic: str | None = None) -> FoundMessage:
        from tierd.lookup import FoundMessage

        doc = self.api.call("GET", _path("v1", "messages", msg_id), {"topic": topic})
        return FoundMessage(MessageExt.from_json(doc["message"]), doc["tier"], doc["matched"])

    def topics(self) -> dict[str, list[int]]:
        doc = self.api.call("GET", "/v1/topics")
        return {t["name"]: list(t["queues"]) for t in doc["topics"]}

    # ---------------------------------------------------------------- topic admin
    def create_topic(
        self, topic: str, queues: int | None = None, *, cold_retention_hours: float | None = None
    ) -> TopicInfo:
        body = {"name": topic, "queues": queues, "cold_retention_hours": cold_retention_hours}
        doc = self.api.call("POST", "/v1/topics", body={k: v for k, v in body.items() if v is not None})
        return _topic_info(doc)

    def describe_topic(self, topic: str) -> TopicInfo:
        return _topic_info(self.api.call("GET", _path("v1", "topics", topic)))

    def update_topic(
        self,
        topic: str,
        *,
        queues: int | None = None,
        cold_retention_hours: float | str | None = None,
        hot_retention_hours: float | None = None,
    ) -> TopicInfo:
        given = {
            "queues": queues,
            "cold_retention_hours": cold_retention_hours,
            "hot_retention_hours": hot_retention_hours,
        }
        body = {k: v for k, v in given.items() if v is not None}
        return _topic_info(self.api.call("PATCH", _path("v1", "topics", topic), body=body))

    def delete_topic(self, topic: str, *, force: bool = False) -> None:
        self.api.call("DELETE", _path("v1", "topics", topic), {"force": "true" if force else None})

    def list_topics(self) -> list[str]:
        return [t["name"] for t in self.api.call("GET", "/v1/topics")["topics"]]

    def queues(self, topic: str) -> list[QueueInfo]:
        from tierd.queue_info import QueueInfo  # not tierd.inventory: its imports cost ~8 ms

        doc = self.api.call("GET", _path("v1", "topics", topic, "queues"))
        return [QueueInfo(**q) for q in doc["queues"]]

    def segments(
        self, topic: str | None = None, queue_id: int | None = None, type: str | None = None
    ) -> list[SegmentRow]:
        from tierd.inventory import SegmentRow

        doc = self.api.call("GET", "/v1/segments", {"topic": topic, "queue": queue_id, "type": type})
        return [SegmentRow(**s) for s in doc["segments"]]

    def tier_now(self) -> dict[str, Any]:
        """The daemon's ``POST /v1/admin/tier`` report: the shape of ``TierReport.as_dict()``."""
        doc: dict[str, Any] = self.api.call("POST", "/v1/admin/tier")
        return doc

    def gc(self) -> dict[str, int]:
        """The daemon's ``POST /v1/admin/gc``: ``{"hot_files": n, "cold_segments": n}``."""
        doc: dict[str, int] = self.api.call("POST", "/v1/admin/gc")
        return doc

    def verify(self) -> VerifyReport:
        """The daemon's ``POST /v1/admin/verify`` (read-only), as the facade's report."""
        from tierd.verify import Problem, VerifyReport

        doc = self.api.call("POST", "/v1/admin/verify", timeout=VERIFY_TIMEOUT)
        problems = [
            Problem(p["area"], p["where"], p["message"], p["fix"], p["fixed"]) for p in doc["problems"]
        ]
        return VerifyReport(
            doc["records"], doc["units"], doc["segments"], doc["bytes"], problems, doc["repairs"]
        )

    # ---------------------------------------------------------------- consumers and groups
    def offset_for_time(self, topic: str, queue_id: int, timestamp: int, boundary: str = "lower") -> int:
        path = _path("v1", "topics", topic, "queues", queue_id, "offset")
        return int(self.api.call("GET", path, {"timestamp": timestamp, "boundary": boundary})["offset"])

    def earliest_time(self, topic: str, queue_id: int) -> int:
        path = _path("v1", "topics", topic, "queues", queue_id, "earliest-time")
        return int(self.api.call("GET", path)["earliest_time"])

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return _offsets(self.api.call("GET", _path("v1", "groups", group, "offsets")))

    def consumer_groups(self, group: str | None = None) -> list[GroupInfo]:
        from tierd.consumption.groups import GroupInfo, QueueLag

        if group is None:
            docs = self.api.call("GET", "/v1/groups")["groups"]
        else:
            docs = [self.api.call("GET", _path("v1", "groups", group))]
        return [
            GroupInfo(
                g["group"],
                tuple(
                    QueueLag(q["topic"], q["queue_id"], q["committed"], q["min_offset"], q["max_offset"])
                    for q in g["queues"]
                ),
            )
            for g in docs
        ]

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        path = _path("v1", "groups", group, "topics", topic, "queues", queue_id, "offset")
        self.api.call("PUT", path, body={"offset": offset})

    def reset_offsets(
        self,
        group: str,
        topic: str,
        to: str,
        *,
        timestamp: int | None = None,
        offset: int | None = None,
        queue_id: int | None = None,
    ) -> dict[tuple[str, int], int]:
        given = {"topic": topic, "to": to, "timestamp": timestamp, "offset": offset, "queue_id": queue_id}
        body = {k: v for k, v in given.items() if v is not None}
        return _offsets(self.api.call("POST", _path("v1", "groups", group, "reset"), body=body))

    def delete_group(self, group: str, topic: str | None = None) -> int:
        return int(self.api.call("DELETE", _path("v1", "groups", group), {"topic": topic})["queues"])


def _topic_info(doc: dict[str, Any]) -> TopicInfo:
    """``TopicDetailOut`` → the facade's :class:`~tierd.topics.TopicInfo`."""
    from tierd.topics import QueueView, TopicInfo

    ranges = tuple(QueueView(**q) for q in doc["queue_ranges"])
    return TopicInfo(**{**doc, "queue_ranges": ranges})


def _offsets(doc: dict[str, Any]) -> dict[tuple[str, int], int]:
    """``GroupOffsetsOut`` → {(topic, queue id): offset}, as the facade returns them."""
    return {(o["topic"], o["queue_id"]): o["offset"] for o in doc["offsets"]}


def loopback_url(host: str, port: int) -> str:
    """The URL a client on the same machine (or pod) uses for a daemon bound to ``host:port``:
    a wildcard bind is reached on loopback."""
    name = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{name}]:{port}" if ":" in name else f"http://{name}:{port}"


def probe(url: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``url`` (no HTTP exchanged)."""
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=timeout):
            return True
    except OSError:
        return False
