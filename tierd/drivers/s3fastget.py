"""A lean ranged GET for the S3 driver's cold reads: signed by tierd, sent on botocore's session.

Why: a cold consume issues a ranged ``GetObject`` per batch, and botocore's per-request pipeline
(parameter validation, serialisation, endpoint-ruleset resolution, event hooks, user-agent
building, a new signer per request, response parsing) plus s3fs's wrapper costs tierd ~1-1.5 ms
of CPU per request on top of receiving the body — CPU the consume, bound by one GIL, cannot
spare (docs/performance.md, P3). The request itself never varies in shape: ``GET`` of one
object path with a ``Range`` header. So :class:`LeanGet` builds it once per client from what
the client itself resolved and sends each one with a handful of string operations and a SigV4
signature (:mod:`tierd.drivers.sigv4`).

What stays the client's own, so that nothing about *where* and *as whom* differs from a botocore
call — each learnt through public API only (no private attribute of botocore or aiobotocore;
``tests/drivers/test_foreign_internals.py`` holds tierd to that):

* **Transport**: the client's own HTTP session (aiobotocore's ``AIOHTTPSession``: the same
  connection pool, TLS verification, client certificate, proxies and timeouts, and its
  translation of transport failures). tierd makes the client with :class:`ClientSession` as
  its ``http_session_cls`` (aiobotocore's documented ``AioConfig`` option, see
  :func:`with_client_session`): aiobotocore's own session class, which shows the setup's
  marker request (below) the session instance that was about to send it.
* **Endpoint, addressing style, region and signing name** come from the client: at setup, one
  regular ``GetObject`` of a marker key goes through s3fs and botocore as every call does and is
  stopped just before it would be sent (the session answers it; nothing reaches the server).
  The prepared request shows the URL prefix objects live under (path or virtual-host style, any
  endpoint path), the signature and credential scope botocore chose, and every header it adds —
  so ``s3_additional_kwargs`` (SSE-C keys...), requester pays, another signature version or an
  endpoint needing more show up there and keep botocore's pipeline.
* **Credentials** are the ones s3fs hands the client (:func:`signing_credentials`: explicit keys,
  or the botocore session's credentials object, which the client holds too), frozen per request
  (``get_frozen_credentials``), so refreshing credentials (assumed roles, instance metadata)
  refresh exactly as for botocore's own requests; anonymous clients send unsigned requests.
  The setup recomputes the marker request's signature with them: unless it is botocore's,
  byte for byte, the lean GET is not used.

When the lean GET is not used at all (:meth:`LeanGet.setup` returns None and says why, once):
settings that add headers to GetObject (SSE-C keys in ``s3_additional_kwargs``, requester
pays, ...; SSE-S3/KMS settings apply to writes only and do not count), a signature other than
SigV4 or none, an endpoint that needs a query string, an HTTP session class of the user's own
(``config_kwargs.http_session_cls``, e.g. httpx), credentials other than the ones s3fs hands
the client. Not sent: botocore's
``x-amz-checksum-mode`` (S3 returns no checksum for a ranged GET, and every record tierd reads
carries its own CRC, checked on every cold read).

When one request is not served (:meth:`LeanGet.get` then runs the caller's regular path,
botocore's, for that request): any answer other than 200/206 and any failure before the body.
The regular path then does what it always did — botocore's and s3fs's retries of transient
faults (5xx, throttling, dropped connections), the error parsing and :func:`map_s3_error`'s
translation — so errors and retries are the regular path's by construction, at the cost of one
extra request when something is wrong. If the regular path succeeds where a lean GET was
*refused* (3xx, 400, 401, 403: a redirect to another region, a signature the server did not
accept), the lean GET is switched off for this client with a warning: tierd would otherwise pay
two requests per read. Failures while the body arrives are the caller's to map, as for a
regular GET (the body stream is the same aiohttp stream).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit

import botocore
from aiobotocore.awsrequest import AioAWSResponse
from aiobotocore.credentials import AioCredentials
from aiobotocore.httpsession import AIOHTTPSession
from botocore.awsrequest import AWSPreparedRequest

from tierd.drivers.sigv4 import ALGORITHM, Credentials, sign_headers, signature

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    import s3fs

__all__ = ["REFUSED", "ClientSession", "LeanGet", "signing_credentials", "with_client_session"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The key of the GetObject prepared (never sent) at setup to learn how the client builds one.
MARKER = "tierd-lean-get-marker"
#: Statuses meaning the server refused the request as tierd built it (not a missing object, not
#: a transient fault): if botocore's request then succeeds, tierd's differs and is switched off.
REFUSED = frozenset({301, 302, 307, 308, 400, 401, 403})
#: Headers of botocore's GetObject that a lean GET replaces with its own (or leaves out, see
#: the module doc); any other header means the request needs more than a plain signed GET.
_KNOWN_HEADERS = frozenset(
    {
        "range",
        "user-agent",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
        "authorization",
        "amz-sdk-invocation-id",
        "amz-sdk-request",
        "x-amz-checksum-mode",
    }
)
#: Names tierd's lean GETs in server logs (and lets tests tell them from botocore's).
_USER_AGENT = "tierd lean-get"
#: Seconds between two log lines about lean GETs not served (the rest are counted).
LOG_INTERVAL = 60.0


class _NoBody:
    """The body of the response that stops the setup's prepared request: empty."""

    async def read(self) -> bytes:
        return b""


#: Set while :meth:`LeanGet.setup` sends its marker request: where :class:`ClientSession` puts
#: itself and the request instead of sending it.
_CAPTURE: ContextVar[list[tuple[ClientSession, Any]] | None] = ContextVar(
    "tierd_lean_get_capture", default=None
)


class ClientSession(AIOHTTPSession):  # type: ignore[misc]  # aiobotocore ships no types
    """aiobotocore's default HTTP session, which also answers :meth:`LeanGet.setup`'s marker
    request: it records itself and botocore's prepared request, and answers 404 without sending.

    Why a subclass: the lean GET must send on the very session the client sends on (its pool,
    TLS, proxies, timeouts), and aiobotocore offers no public way to ask a client for it; its
    public ``http_session_cls`` option lets tierd choose the class, and a session of this class
    can then say which instance is the client's. Every other request is aiobotocore's own
    ``send``, unchanged."""

    async def send(self, request: Any) -> Any:
        capture = _CAPTURE.get()
        if capture is not None and urlsplit(str(request.url)).path.endswith("/" + MARKER):
            capture.append((self, request))
            return AioAWSResponse(request.url, 404, {}, _NoBody())
        return await super().send(request)


def with_client_session(options: Mapping[str, Any]) -> dict[str, Any]:
    """s3fs options whose client sends on a :class:`ClientSession` — unless the user chose a
    session class (``config_kwargs.http_session_cls``), which is kept (and the lean GET is then
    not used)."""
    out = dict(options)
    config = dict(out.get("config_kwargs") or {})
    config.setdefault("http_session_cls", ClientSession)
    out["config_kwargs"] = config
    return out


async def signing_credentials(fs: s3fs.S3FileSystem) -> Any:
    """The credentials ``fs``'s S3 clients sign with (a botocore credentials object), or None
    for an anonymous filesystem; found as s3fs hands them to aiobotocore's ``create_client``:
    explicit keys (``key``/``secret``/``token``, or the same in ``client_kwargs``) or else the
    botocore session's own credentials — the object the client was given, cached by the session,
    so asking costs no lookup once the client exists.

    Public attributes and calls only (see the module doc); :meth:`LeanGet.setup` checks the
    result against a signature botocore made, so a later s3fs that resolves differently turns
    the lean GET off rather than signing as someone else."""
    if fs.anon:
        return None
    given = fs.client_kwargs
    key = given.get("aws_access_key_id", fs.key)
    secret = given.get("aws_secret_access_key", fs.secret)
    if key is not None and secret is not None:
        return AioCredentials(key, secret, given.get("aws_session_token", fs.token))
    return await fs.session.get_credentials()


@dataclass
class LeanGet:
    """Ranged GETs of one bucket's objects on one aiobotocore client (see module doc).

    Bound to the client it was set up from: a new client (another event loop, after
    ``aclose``) needs a new one."""

    bucket: str
    #: ``scheme://host[:port]`` and the path prefix objects live under (ends with ``/``).
    origin: str
    host: str
    base_path: str
    #: Credential scope (None: the client is anonymous and requests go unsigned).
    region: str | None
    service: str | None
    credentials: Any = field(repr=False)
    session: AIOHTTPSession = field(repr=False)
    #: Called for every request sent: (operation, ``"/" + key``), e.g. ``("GetObject",
    #: "/prefix/key")`` — what botocore's ``before-call`` hook sees as ``url_path`` (tests and
    #: the benchmarks count requests with it).
    observers: list[Callable[[str, str], None]] = field(default_factory=list, repr=False)
    #: Requests sent / not served (repeated on the regular path).
    sent: int = 0
    fell_back: int = 0
    #: Why the lean GET was switched off after it was set up (None while it is on).
    disabled: str | None = None
    _logged_at: float = field(default=-LOG_INTERVAL, repr=False)
    _held: int = field(default=0, repr=False)

    @classmethod
    async def setup(
        cls, fs: s3fs.S3FileSystem, bucket: str, observers: list[Callable[[str, str], None]]
    ) -> LeanGet | None:
        """A lean GET for ``bucket`` on ``fs``'s client, or None (logged once, with the reason)
        when this client's requests need more than a plain signed GET (see module doc)."""
        made: LeanGet | str
        try:
            client = await fs.get_s3(bucket)  # with cache_regions, the bucket's own client
            session_cls = client.meta.config.http_session_cls
            if not (isinstance(session_cls, type) and issubclass(session_cls, ClientSession)):
                made = f"the client's HTTP session class is {getattr(session_cls, '__name__', session_cls)}"
            else:
                captured = await cls._prepare(fs, bucket)
                made = (
                    captured
                    if isinstance(captured, str)
                    else await cls._from_request(*captured, bucket, fs, client, observers)
                )
        except Exception as e:  # the regular path meets (and reports) whatever this was
            made = f"setting it up failed ({type(e).__name__})"
        if isinstance(made, str):
            log.info("S3 cold reads of s3://%s use botocore's request pipeline: %s", bucket, made)
            return None
        log.info(
            "S3 cold reads of s3://%s use tierd's lean GET (%s, %s%s)",
            bucket,
            f"SigV4, region {made.region}" if made.region else "unsigned",
            made.origin,
            made.base_path,
        )
        return made

    @staticmethod
    async def _prepare(fs: s3fs.S3FileSystem, bucket: str) -> tuple[ClientSession, Any] | str:
        """The client's HTTP session and botocore's prepared request for a ranged GetObject of
        :data:`MARKER`, made through s3fs's call path (so with everything s3fs and botocore add)
        and never sent; or why there are none."""
        captured: list[tuple[ClientSession, Any]] = []
        token = _CAPTURE.set(captured)
        error: Exception | None = None
        try:
            await fs._call_s3("get_object", Bucket=bucket, Key=MARKER, Range="bytes=0-0")
        except Exception as e:  # the 404 answered by the session, or no request at all
            error = e
        finally:
            _CAPTURE.reset(token)
        if not captured:
            return f"botocore prepared no GetObject ({type(error).__name__})"
        return captured[0]

    @classmethod
    async def _from_request(
        cls,
        session: ClientSession,
        request: Any,
        bucket: str,
        fs: s3fs.S3FileSystem,
        client: Any,
        observers: list[Callable[[str, str], None]],
    ) -> LeanGet | str:
        parts = urlsplit(str(request.url))
        if parts.query or not parts.path.endswith("/" + MARKER):
            return "botocore's GetObject URL is not the object's path alone"
        headers = {
            str(name).lower(): value.decode() if isinstance(value, bytes) else str(value)
            for name, value in request.headers.items()
        }
        auth = headers.get("authorization")
        algorithm, _, fields = (auth or "").partition(" ")
        if auth is not None and algorithm != ALGORITHM:
            return f"botocore signs GetObject with {algorithm}, not plain SigV4"
        extra = sorted(set(headers) - _KNOWN_HEADERS)
        if extra:  # names only: values may be keys (SSE-C)
            return f"botocore's GetObject carries {', '.join(extra)}"
        base: dict[str, Any] = dict(
            bucket=bucket,
            origin=f"{parts.scheme}://{parts.netloc}",
            host=parts.netloc,
            base_path=parts.path[: -len(MARKER)],
            session=session,
            observers=observers,
        )
        if auth is None:
            if client.meta.config.signature_version is not botocore.UNSIGNED:
                return "botocore's GetObject is neither signed nor anonymous"
            return cls(region=None, service=None, credentials=None, **base)
        signed = dict(field.strip().partition("=")[::2] for field in fields.split(","))
        scope = signed.get("Credential", "").split("/")
        if len(scope) != 5 or scope[-1] != "aws4_request":
            return "botocore's SigV4 credential scope is not one tierd can sign for"
        credentials = await signing_credentials(fs)
        if credentials is None or not await _signs_as(credentials, request, parts, headers, signed):
            return "the credentials s3fs gives the client are not the ones botocore signed with"
        return cls(region=scope[2], service=scope[3], credentials=credentials, **base)

    def _observe(self, path: str) -> None:
        # botocore's url_path for GetObject is "/{Key+}" whatever the addressing style.
        for observer in self.observers:
            observer("GetObject", path)

    async def get(
        self,
        key: str,
        start: int,
        length: int,
        *,
        receive: Callable[[Any], Awaitable[_T]],
        regular: Callable[[], Awaitable[_T]],
    ) -> _T:
        """GET ``length`` (> 0) bytes of ``key`` from ``start``; ``receive(response)`` takes the
        body from aiohttp's response (the caller copies it where it belongs, handles a server
        that ignored ``Range``, maps failures while it arrives) and its result is returned. When
        the request is not served, ``regular()`` (botocore's GET) runs instead."""
        path = self.base_path + quote(key, safe="/~")
        if self.observers:
            self._observe("/" + key)
        self.sent += 1
        try:
            headers = await self._headers(path, f"bytes={start}-{start + length - 1}")
            response = await self.session.send(
                AWSPreparedRequest("GET", self.origin + path, headers, None, True)
            )
        except Exception as e:  # credentials that fail to refresh included: botocore will say
            return await self._fall_back(key, None, e, regular)
        raw = response.raw
        try:
            if response.status_code in (200, 206):
                return await receive(raw)
            with contextlib.suppress(Exception):  # the regular path will meet any fault again
                await raw.read()  # a small error document: read it so the connection is reused
        finally:
            raw.release()
        return await self._fall_back(key, response.status_code, None, regular)

    async def _headers(self, path: str, byte_range: str) -> dict[str, str]:
        headers = {"Range": byte_range}
        if self.region is not None:
            frozen = await self.credentials.get_frozen_credentials()  # refreshes when due
            headers.update(
                sign_headers(
                    Credentials(frozen.access_key, frozen.secret_key, frozen.token),
                    region=self.region,
                    service=self.service or "s3",
                    method="GET",
                    host=self.host,
                    path=path,
                    headers=headers,
                )
            )
        headers["Host"] = self.host
        headers["User-Agent"] = _USER_AGENT
        return headers

    async def _fall_back(
        self, key: str, status: int | None, error: BaseException | None, regular: Callable[[], Awaitable[_T]]
    ) -> _T:
        self.fell_back += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_INTERVAL:
            held, self._held, self._logged_at = self._held, 0, now
            log.info(
                "lean GET of s3://%s/%s not served (%s); repeated through botocore%s",
                self.bucket,
                key,
                f"HTTP {status}" if status is not None else type(error).__name__,
                f" [{held} more in the last {LOG_INTERVAL:.0f} s]" if held else "",
            )
        else:
            self._held += 1
        received = await regular()
        if status in REFUSED and self.disabled is None:
            self.disabled = f"the server answered HTTP {status} where botocore's GET succeeded"
            log.warning(
                "S3 cold reads of s3://%s switch to botocore's request pipeline: %s",
                self.bucket,
                self.disabled,
            )
        return received


async def _signs_as(
    credentials: Any, request: Any, url: Any, headers: dict[str, str], signed: dict[str, str]
) -> bool:
    """Whether ``credentials`` (frozen now) give botocore's signature of ``request``: the same
    access key in its scope, and the same signature recomputed over the headers it signed."""
    frozen = await credentials.get_frozen_credentials()
    names = signed.get("SignedHeaders", "").split(";")
    values = {name: headers.get(name, url.netloc if name == "host" else None) for name in names}
    stamp, payload = headers.get("x-amz-date"), headers.get("x-amz-content-sha256")
    if stamp is None or payload is None or None in values.values():
        return False
    scope = signed["Credential"].split("/")
    if scope[0] != frozen.access_key:
        return False
    signed_names, ours = signature(
        frozen.secret_key,
        stamp=stamp,
        region=scope[2],
        service=scope[3],
        method=str(request.method),
        path=url.path,
        headers={name: value for name, value in values.items() if value is not None},
        payload_sha256=payload,
    )
    return signed_names == signed.get("SignedHeaders") and hmac.compare_digest(
        ours, signed.get("Signature", "")
    )
