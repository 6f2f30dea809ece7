"""The S3 driver's lean ranged GET (``tierd.drivers.s3fastget``) and its SigV4 signing
(``tierd.drivers.sigv4``): known-answer signatures, reads served by it on real servers (SeaweedFS
and LocalStack check every signature), the configurations that keep botocore's pipeline, and
the faults after which a request is repeated through botocore — with the same errors as before."""

from __future__ import annotations

import asyncio
import calendar
import datetime
import logging
from typing import TYPE_CHECKING, Any, TypeVar

import botocore.auth
import pytest
from aiobotocore.credentials import AioCredentials, AioRefreshableCredentials
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import AioSession
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials

from tierd.drivers import s3fastget
from tierd.drivers.s3 import S3Driver, S3Root
from tierd.drivers.s3fastget import LeanGet
from tierd.drivers.segment import ByteRange
from tierd.drivers.sigv4 import Credentials, sign_headers
from tierd.errors import BackendError, CorruptionError, SegmentNotFoundError, TierdError
from tierd.testing.s3proxy import PreconditionStrippingProxy
from tierd.testing.s3server import S3Server, create_bucket, free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

_T = TypeVar("_T")
DATA = bytes(range(256)) * 64  # 16 KiB
#: Object paths whose keys need percent-encoding (a signed path must be the one on the wire).
PATHS = ["plain/seg", "with space/a+b=c", "odd/%41~é!'()*"]


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(coro)


def _put(server: S3Server, bucket: str, key: str, data: bytes) -> None:
    client = server.boto3_client()
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data)
    finally:
        client.close()


async def _read_both(root: S3Root, path: str, start: int, length: int) -> tuple[bytes, bytes]:
    """The range through ``read_into`` (a commitlog batch's path) and ``read`` (a consume
    queue's), on a driver that has no layout yet (it lists, then GETs)."""
    driver = root.driver(path)
    out = bytearray(length)
    await driver.read_into(ByteRange(start, length), memoryview(out))
    return bytes(out), await root.driver(path).read(ByteRange(start, length))


async def _no_lean(cls: type[LeanGet], *args: Any) -> None:
    """Stands in for :meth:`LeanGet.setup`: every GET takes botocore's pipeline (the before)."""
    return None


# ---------------------------------------------------------------------------- signing
EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
EXAMPLE_TIME = calendar.timegm((2013, 5, 24, 0, 0, 0))


def test_signature_matches_the_published_s3_example() -> None:
    # AWS's "Signature Calculations for the Authorization Header" example: GET /test.txt with
    # Range: bytes=0-9 from examplebucket.s3.amazonaws.com.
    headers = sign_headers(
        EXAMPLE,
        region="us-east-1",
        service="s3",
        method="GET",
        host="examplebucket.s3.amazonaws.com",
        path="/test.txt",
        headers={"Range": "bytes=0-9"},
        now=EXAMPLE_TIME,
    )
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["X-Amz-Date"] == "20130524T000000Z"


@pytest.mark.parametrize("token", [None, "session-token/with+odd=chars"])
@pytest.mark.parametrize(
    "path", ["/bucket/plain/seg", "/with%20space/a%2Bb%3Dc", "/odd/%2541~%C3%A9%21%27%28%29%2A"]
)
def test_signature_matches_botocores_signer(
    monkeypatch: pytest.MonkeyPatch, token: str | None, path: str
) -> None:
    """botocore's S3 SigV4 signer, given the same request, time and credentials, produces the
    same Authorization header (an independent implementation of the same public algorithm)."""
    moment = datetime.datetime(2026, 11, 24, 13, 5, 7)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: moment)
    host = "127.0.0.1:8333"
    request = AWSRequest("GET", f"http://{host}{path}", headers={"Range": "bytes=10-4194313"})
    creds = BotoCredentials(EXAMPLE.access_key, EXAMPLE.secret_key, token)
    botocore.auth.S3SigV4Auth(creds, "s3", "eu-west-3").add_auth(request)
    ours = sign_headers(
        Credentials(EXAMPLE.access_key, EXAMPLE.secret_key, token),
        region="eu-west-3",
        service="s3",
        method="GET",
        host=host,
        path=path,
        headers={"Range": "bytes=10-4194313"},
        now=calendar.timegm(moment.timetuple()),
    )
    assert ours["Authorization"] == request.headers["Authorization"]
    assert ours["X-Amz-Date"] == request.headers["X-Amz-Date"]
    assert ours.get("X-Amz-Security-Token") == request.headers.get("X-Amz-Security-Token")


def test_credentials_never_show_their_secret() -> None:
    creds = Credentials("AKID", "the-secret-value", "the-token-value")
    assert "the-secret-value" not in repr(creds)
    assert "the-token-value" not in repr(creds)


# ---------------------------------------------------------------------------- served lean
def test_ranged_reads_are_lean_gets_the_server_accepts(s3_server: S3Server, s3_bucket: str) -> None:
    """Every ranged GET of both read paths goes out as a lean GET and is served (SeaweedFS and
    LocalStack verify the signature; keys needing percent-encoding included)."""
    for path in PATHS:
        _put(s3_server, s3_bucket, f"cold/{path}", DATA)

    async def main() -> LeanGet:
        async with S3Root(f"s3://{s3_bucket}/cold", s3_server.storage_options) as root:
            for path in PATHS:
                assert await _read_both(root, path, 0, len(DATA)) == (DATA, DATA)
                assert await _read_both(root, path, 1000, 3000) == (DATA[1000:4000], DATA[1000:4000])
            lean = await root.lean_get()
            assert lean is not None
            return lean

    lean = _run(main())
    assert (lean.sent, lean.fell_back, lean.disabled) == (4 * len(PATHS), 0, None)
    assert lean.region == s3_server.region


async def _refreshing(server: S3Server, source: Callable[[], object]) -> dict[str, Any]:
    """s3fs options for ``server`` with credentials that refresh: they expire within botocore's
    mandatory refresh window, so every freeze refreshes them, calling ``source()`` first (count
    the refreshes, or raise to make them fail)."""

    async def refresh() -> dict[str, Any]:
        source()
        soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)
        return {
            "access_key": server.access_key,
            "secret_key": server.secret_key,
            "token": None,
            "expiry_time": soon.isoformat(),
        }

    session = AioSession()
    session._credentials = AioRefreshableCredentials.create_from_metadata(
        await refresh(), refresh, "tierd-test"
    )
    return {
        "endpoint_url": server.endpoint_url,
        "session": session,
        "client_kwargs": {"region_name": server.region},
    }


def test_refreshing_credentials_are_frozen_per_request(seaweedfs_server: S3Server) -> None:
    """Credentials that refresh (assumed roles, instance metadata) are the client's own object,
    asked for a frozen copy per request: each lean GET uses what botocore would use then."""
    bucket = create_bucket(seaweedfs_server)
    _put(seaweedfs_server, bucket, "cold/seg", DATA)
    refreshed: list[int] = []

    async def main() -> LeanGet:
        options = await _refreshing(seaweedfs_server, lambda: refreshed.append(1))
        async with S3Root(f"s3://{bucket}/cold", options) as root:
            lean = await root.lean_get()
            assert lean is not None
            driver = root.driver("seg")
            out = memoryview(bytearray(1000))
            for start in range(0, 4000, 1000):
                before = len(refreshed)
                await driver._get_into("cold/seg", start, out)  # a GET and nothing else
                assert bytes(out) == DATA[start : start + 1000]
                assert len(refreshed) > before
            return lean

    lean = _run(main())
    assert (lean.sent, lean.fell_back) == (4, 0)


def test_credentials_failing_to_refresh_give_the_regular_error(
    seaweedfs_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When refreshing the credentials fails at a read, the lean GET is not sent and the read
    raises what botocore's GET raises then (a BackendError naming the failure)."""
    bucket = create_bucket(seaweedfs_server)
    _put(seaweedfs_server, bucket, "cold/seg", DATA)

    async def read() -> tuple[type[BaseException], str, int]:
        down: list[bool] = []

        def source() -> None:
            if down:
                raise RuntimeError("the credential source is down")

        options = await _refreshing(seaweedfs_server, source)
        async with S3Root(f"s3://{bucket}/cold", options) as root:
            await root.filesystem()
            down.append(True)  # from here on every refresh fails
            read = root.driver("seg")._get_into("cold/seg", 0, memoryview(bytearray(10)))
            with pytest.raises(TierdError) as exc:
                await read
            lean = root._lean
            return type(exc.value), str(exc.value), lean.fell_back if lean else -1

    lean = _run(read())
    monkeypatch.setattr(LeanGet, "setup", classmethod(_no_lean))
    regular = _run(read())
    assert lean[:2] == regular[:2]
    assert lean[0] is BackendError
    assert (lean[2], regular[2]) == (1, -1)


def test_anonymous_clients_send_unsigned_lean_gets(moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    client = moto_server.boto3_client()
    try:
        client.put_bucket_acl(Bucket=bucket, ACL="public-read")
        client.put_object(Bucket=bucket, Key="cold/seg", Body=DATA, ACL="public-read")
    finally:
        client.close()

    async def main() -> LeanGet:
        options = {"endpoint_url": moto_server.endpoint_url, "anon": True}
        options["client_kwargs"] = {"region_name": moto_server.region}
        async with S3Root(f"s3://{bucket}/cold", options) as root:
            # moto serves anonymous GETs; the listing goes through botocore, unsigned too.
            assert await _read_both(root, "seg", 5, 100) == (DATA[5:105], DATA[5:105])
            lean = await root.lean_get()
            assert lean is not None
            return lean

    lean = _run(main())
    assert (lean.region, lean.sent, lean.fell_back) == (None, 2, 0)


def test_virtual_host_addressing_is_the_clients(moto_server: S3Server) -> None:
    """The URL prefix is whatever the client resolved: with virtual-host addressing the bucket
    moves into the host name (checked without a request: no DNS for it here)."""
    options = moto_server.storage_options | {"config_kwargs": {"s3": {"addressing_style": "virtual"}}}
    options["endpoint_url"] = "http://s3.example.test:9000"

    async def main() -> LeanGet | None:
        async with S3Root("s3://my-bucket/cold", options) as root:
            return await root.lean_get()

    lean = _run(main())
    assert lean is not None
    assert (lean.origin, lean.host, lean.base_path) == (
        "http://my-bucket.s3.example.test:9000",
        "my-bucket.s3.example.test:9000",
        "/",
    )


# ---------------------------------------------------------------------------- the client's own, publicly
@pytest.mark.parametrize("where", ["storage_options", "client_kwargs", "environment"])
def test_credentials_are_the_ones_the_client_signs_with(
    seaweedfs_server: S3Server, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Every way s3fs hands credentials to the client — ``key``/``secret``, the same in
    ``client_kwargs``, or none (botocore's session resolves them, here from the environment) —
    is found without botocore's private attributes, and SeaweedFS (which checks every
    signature) serves the lean GETs."""
    bucket = create_bucket(seaweedfs_server)
    _put(seaweedfs_server, bucket, "cold/seg", DATA)
    server = seaweedfs_server
    base: dict[str, Any] = {
        "endpoint_url": server.endpoint_url,
        "client_kwargs": {"region_name": server.region},
    }
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    if where == "storage_options":
        options = base | {"key": server.access_key, "secret": server.secret_key}
    elif where == "client_kwargs":
        client = {"aws_access_key_id": server.access_key, "aws_secret_access_key": server.secret_key}
        options = base | {"client_kwargs": base["client_kwargs"] | client}
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
        options = base

    async def main() -> LeanGet:
        async with S3Root(f"s3://{bucket}/cold", options) as root:
            assert await _read_both(root, "seg", 10, 1000) == (DATA[10:1010], DATA[10:1010])
            lean = await root.lean_get()
            assert lean is not None
            return lean

    lean = _run(main())
    assert (lean.sent, lean.fell_back) == (2, 0)


def test_credentials_other_than_botocores_turn_the_lean_get_off(
    moto_server: S3Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The setup recomputes botocore's signature of its marker request with the credentials it
    found; if a later s3fs or botocore gave the client others, reads stay on botocore's pipeline
    (with one INFO line saying why) instead of signing as someone else."""
    bucket = create_bucket(moto_server)
    _put(moto_server, bucket, "cold/seg", DATA)

    async def someone_else(fs: Any) -> Any:
        return AioCredentials(moto_server.access_key, "not-the-secret-the-client-has")

    monkeypatch.setattr(s3fastget, "signing_credentials", someone_else)

    async def main() -> LeanGet | None:
        async with S3Root(f"s3://{bucket}/cold", moto_server.storage_options) as root:
            assert await _read_both(root, "seg", 3, 30) == (DATA[3:33], DATA[3:33])
            return await root.lean_get()

    with caplog.at_level(logging.INFO, logger=s3fastget.__name__):
        assert _run(main()) is None
    assert "not the ones botocore signed with" in caplog.text
    assert "not-the-secret" not in caplog.text


def test_lean_gets_go_out_on_the_clients_own_session(moto_server: S3Server) -> None:
    """The session a lean GET sends on is the one aiobotocore made for the client (its pool,
    TLS, proxies and timeouts): the client's ``http_session_cls`` (tierd's
    :class:`~tierd.drivers.s3fastget.ClientSession`) names itself at setup. The private
    attribute is read here, in the test only, to check that claim."""
    bucket = create_bucket(moto_server)

    async def main() -> None:
        async with S3Root(f"s3://{bucket}/cold", moto_server.storage_options) as root:
            fs = await root.filesystem()
            lean = await root.lean_get()
            assert lean is not None
            assert isinstance(lean.session, s3fastget.ClientSession)
            assert lean.session is (await fs.get_s3(bucket))._endpoint.http_session

    _run(main())


def test_a_session_class_of_the_users_own_keeps_botocores_gets(
    moto_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A user who chose the client's ``http_session_cls`` keeps it; tierd then cannot know the
    client's session and leaves every GET to botocore (one INFO line), reads unchanged."""
    bucket = create_bucket(moto_server)
    _put(moto_server, bucket, "cold/seg", DATA)
    options = moto_server.storage_options | {"config_kwargs": {"http_session_cls": AIOHTTPSession}}

    async def main() -> LeanGet | None:
        async with S3Root(f"s3://{bucket}/cold", options) as root:
            assert await _read_both(root, "seg", 3, 30) == (DATA[3:33], DATA[3:33])
            return await root.lean_get()

    with caplog.at_level(logging.INFO, logger=s3fastget.__name__):
        assert _run(main()) is None
    assert "HTTP session class is AIOHTTPSession" in caplog.text


# ---------------------------------------------------------------------------- kept on botocore
@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (
            {"s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32}},
            "x-amz-server-side-encryption-customer-algorithm",
        ),
        ({"requester_pays": True}, "x-amz-request-payer"),
        ({"config_kwargs": {"signature_version": "s3"}}, "plain SigV4"),
    ],
)
def test_clients_adding_to_every_request_keep_botocores_gets(
    moto_server: S3Server, caplog: pytest.LogCaptureFixture, extra: dict[str, Any], reason: str
) -> None:
    """Settings that add headers or parameters to GetObject (SSE-C keys, requester pays) or sign
    otherwise keep every GET on botocore's pipeline, which applies them; the log names the
    header, never its value."""
    bucket = create_bucket(moto_server)
    _put(moto_server, bucket, "cold/seg", DATA)

    async def main() -> LeanGet | None:
        async with S3Root(f"s3://{bucket}/cold", moto_server.storage_options | extra) as root:
            assert await _read_both(root, "seg", 7, 70) == (DATA[7:77], DATA[7:77])
            return await root.lean_get()

    with caplog.at_level(logging.INFO, logger=s3fastget.__name__):
        assert _run(main()) is None
    assert [r.getMessage() for r in caplog.records if reason in r.getMessage()], caplog.text
    assert "k" * 32 not in caplog.text


def test_settings_that_do_not_touch_gets_keep_the_lean_get(moto_server: S3Server) -> None:
    """SSE-S3 or SSE-KMS in ``s3_additional_kwargs`` apply to writes only (s3fs passes GetObject
    just the parameters it takes): reads stay lean."""
    bucket = create_bucket(moto_server)
    options = moto_server.storage_options | {"s3_additional_kwargs": {"ServerSideEncryption": "AES256"}}

    async def main() -> LeanGet | None:
        async with S3Root(f"s3://{bucket}/cold", options) as root:
            await root.driver("seg").write(0, DATA)
            assert await _read_both(root, "seg", 7, 70) == (DATA[7:77], DATA[7:77])
            return await root.lean_get()

    lean = _run(main())
    assert lean is not None
    assert (lean.sent, lean.fell_back) == (2, 0)


def test_sse_c_reads_go_through_botocore_with_the_key(moto_server: S3Server) -> None:
    """An SSE-C object can only be read with its key in the request headers; s3fs adds them
    from ``s3_additional_kwargs``, so those reads stay on botocore's pipeline and succeed."""
    bucket = create_bucket(moto_server)
    sse_c = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32}
    options = moto_server.storage_options | {"s3_additional_kwargs": sse_c}

    async def main() -> tuple[bytes, bytes]:
        async with S3Root(f"s3://{bucket}/cold", options) as root:
            driver = root.driver("seg")
            await driver.write(0, DATA)
            assert await root.lean_get() is None
            return await _read_both(root, "seg", 100, 1000)

    assert _run(main()) == (DATA[100:1100], DATA[100:1100])


# ---------------------------------------------------------------------------- faults
def _proxy_root(proxy: PreconditionStrippingProxy, bucket: str) -> S3Root:
    return S3Root(f"s3://{bucket}/cold", proxy.storage_options)


def _lean_gets(proxy: PreconditionStrippingProxy) -> list[str]:
    return [path for method, path, agent in proxy.requests if method == "GET" and "lean-get" in agent]


def _botocore_gets(proxy: PreconditionStrippingProxy, key: str) -> list[str]:
    return [
        path
        for method, path, agent in proxy.requests
        if method == "GET" and "lean-get" not in agent and path.endswith(key)
    ]


@pytest.mark.parametrize(("status", "code"), [(503, "SlowDown"), (500, "InternalError")])
def test_a_transient_fault_is_retried_as_botocore_retries_it(
    moto_server: S3Server, status: int, code: str
) -> None:
    """A lean GET answered with a transient fault is repeated through botocore, whose own
    retries (and s3fs's) then ride out the fault as they did before: three faults in a row,
    then the object."""
    bucket = create_bucket(moto_server)
    _put(moto_server, bucket, "cold/seg", DATA)
    faults = [3]

    def answer(method: str, path: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
        if method == "GET" and path.endswith("/cold/seg") and faults[0] > 0:
            faults[0] -= 1
            return status, code
        return None

    async def main(proxy: PreconditionStrippingProxy) -> LeanGet:
        async with _proxy_root(proxy, bucket) as root:
            out = bytearray(500)
            await root.driver("seg").read_into(ByteRange(10, 500), memoryview(out))
            assert bytes(out) == DATA[10:510]
            lean = await root.lean_get()
            assert lean is not None  # a transient fault does not switch the lean GET off
            assert await root.driver("seg").read(ByteRange(0, 4)) == DATA[:4]
            return lean

    with PreconditionStrippingProxy(moto_server, answer=answer) as proxy:
        lean = _run(main(proxy))
        assert (lean.sent, lean.fell_back) == (2, 1)
        assert len(_lean_gets(proxy)) == 2
        assert len(_botocore_gets(proxy, "/cold/seg")) == 3  # two more faults, then served


def test_a_refused_lean_get_switches_to_botocore(
    moto_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that refuses tierd's request but serves botocore's (here: by User-Agent; in the
    field a redirect or a signature it reads differently) costs one extra request, once: the
    lean GET is switched off for the client, with a warning."""
    bucket = create_bucket(moto_server)
    _put(moto_server, bucket, "cold/seg", DATA)

    def answer(method: str, path: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
        return (403, "SignatureDoesNotMatch") if "lean-get" in headers.get("User-Agent", "") else None

    async def main(proxy: PreconditionStrippingProxy) -> LeanGet | None:
        async with _proxy_root(proxy, bucket) as root:
            for start in (0, 100, 200):
                assert await _read_both(root, "seg", start, 50) == (DATA[start : start + 50],) * 2
            assert await root.lean_get() is None
            return root._lean

    with (
        caplog.at_level(logging.INFO, logger=s3fastget.__name__),
        PreconditionStrippingProxy(moto_server, answer=answer) as proxy,
    ):
        lean = _run(main(proxy))
        assert lean is not None
        assert lean.disabled is not None
        assert (lean.sent, lean.fell_back) == (1, 1)
        assert len(_lean_gets(proxy)) == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "botocore's request pipeline" in warnings[0].getMessage()


@pytest.mark.parametrize("into", [True, False])
def test_errors_are_the_regular_paths(
    seaweedfs_server: S3Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, into: bool
) -> None:
    """A missing object (404), rejected credentials (403), a missing bucket, a range past the
    end (416): the lean GET is repeated through botocore once and the read raises the error
    botocore's GET raised before (same type, same message); neither the secret nor a signature
    reaches a tierd log line or a message."""
    bucket = create_bucket(seaweedfs_server)
    _put(seaweedfs_server, bucket, "cold/seg", DATA)
    secret = "wrong-secret-" + "7" * 20
    good = seaweedfs_server.storage_options
    cases = [
        (bucket, good, "cold/gone", 0),
        (bucket, good | {"secret": secret}, "cold/seg", 0),
        ("no-such-bucket-lean", good, "cold/seg", 0),
        (bucket, good, "cold/seg", len(DATA) + 10),
    ]

    async def errors() -> list[tuple[type[BaseException], str, int]]:
        found: list[tuple[type[BaseException], str, int]] = []
        for name, options, key, start in cases:
            async with S3Root(f"s3://{name}/cold", options) as root:
                driver = root.driver("seg")
                read = (
                    driver._get_into(key, start, memoryview(bytearray(100)))
                    if into
                    else driver._get(key, start, start + 100)
                )
                with pytest.raises(TierdError) as exc:
                    await read
                lean = root._lean
                found.append((type(exc.value), str(exc.value), lean.fell_back if lean else -1))
        return found

    with caplog.at_level(logging.DEBUG):
        lean = _run(errors())
    monkeypatch.setattr(LeanGet, "setup", classmethod(_no_lean))
    regular = _run(errors())
    assert [(t, m) for t, m, _ in lean] == [(t, m) for t, m, _ in regular]
    assert [t for t, _, _ in lean] == [SegmentNotFoundError, BackendError, BackendError, BackendError]
    assert "rejected the credentials" in lean[1][1]
    assert "does not exist" in lean[2][1]
    assert "InvalidRange" in lean[3][1]
    assert [n for _, _, n in lean] == [1, 1, 1, 1]
    assert [n for _, _, n in regular] == [-1, -1, -1, -1]
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        assert secret not in text, text
        if record.name.startswith("tierd"):
            assert "Signature=" not in text, text
            assert "Credential=" not in text, text


def test_an_unreachable_endpoint_is_the_regular_error() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {
        "endpoint_url": endpoint,
        "key": "k",
        "secret": "s",
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }

    async def main() -> tuple[BackendError, LeanGet | None]:
        async with S3Root("s3://bucket/p", options) as root:
            lean = await root.lean_get()
            assert lean is not None
            out = memoryview(bytearray(10))
            with pytest.raises(BackendError) as exc:
                await lean.get(
                    "p/seg",
                    0,
                    10,
                    receive=lambda response: pytest.fail("no response expected"),
                    regular=lambda: S3Driver(root, "seg")._get_into_regular("p/seg", 0, out),
                )
            return exc.value, lean

    err, lean = _run(main())
    assert f"cannot connect to the S3 endpoint {endpoint}" in str(err)
    assert lean is not None
    assert (lean.sent, lean.fell_back) == (1, 1)


# ---------------------------------------------------------------------------- odd bodies
def test_a_server_ignoring_range_is_cut_on_the_lean_path(moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    _put(moto_server, bucket, "cold/seg", DATA)

    async def main(proxy: PreconditionStrippingProxy) -> LeanGet:
        async with _proxy_root(proxy, bucket) as root:
            assert await _read_both(root, "seg", 300, 1000) == (DATA[300:1300], DATA[300:1300])
            lean = await root.lean_get()
            assert lean is not None
            return lean

    with PreconditionStrippingProxy(moto_server, strip_ranges=True) as proxy:
        lean = _run(main(proxy))
    assert (lean.sent, lean.fell_back) == (2, 0)


def test_a_short_body_is_corruption(s3_server: S3Server, s3_bucket: str) -> None:
    """A range past the object's end comes back short (206 with what there is): corruption,
    named with the offending lengths, as before."""
    _put(s3_server, s3_bucket, "cold/seg", DATA)

    async def main() -> tuple[CorruptionError, LeanGet | None]:
        async with S3Root(f"s3://{s3_bucket}/cold", s3_server.storage_options) as root:
            driver = root.driver("seg")
            lean = await root.lean_get()
            assert lean is not None
            out = memoryview(bytearray(1000))
            with pytest.raises(CorruptionError) as exc:
                await driver._get_into("cold/seg", len(DATA) - 100, out)
            return exc.value, lean

    err, lean = _run(main())
    assert err.detail["received"] == 100
    assert err.detail["length"] == 1000
    assert lean is not None
    assert (lean.sent, lean.fell_back) == (1, 0)
