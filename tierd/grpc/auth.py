"""RocketMQ's access-key / secret-key signature on every gRPC call, as the proxy checks it.

A client given credentials sends, with each call, the metadata ``x-mq-date-time`` (its clock,
``YYYYMMDDTHHMMSSZ``) and ``authorization: MQv2-HMAC-SHA1 Credential=<access key>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the date-time under the secret key>``.
When any credentials are configured (``grpc.credentials`` or ``grpc.credentials_file``) every
call must carry a valid one; otherwise the proxy's ``UNAUTHORIZED`` is the answer — a status in
the RPC's own response, as for every other failure, so clients report it as such.

Secrets never reach a log line or an error: the access key is named, the secret never.
"""

from __future__ import annotations

import hmac
import logging
import re
from hashlib import sha1
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import message_factory
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tierd.errors import ConfigError, TierdError
from tierd.repeats import FailureLog

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from tierd.config import GrpcConfig

log = logging.getLogger("tierd.grpc")

_AUTHORIZATION = re.compile(
    r"MQv2-HMAC-SHA1\s+Credential=(?P<ak>[^,\s]+),\s*SignedHeaders=(?P<headers>[^,\s]+),\s*Signature=(?P<sig>[0-9a-fA-F]+)"
)


class UnauthenticatedError(TierdError):
    """A call without valid RocketMQ credentials where credentials are required."""

    code = "unauthenticated"
    http_status = 401


def load_credentials(cfg: GrpcConfig) -> dict[str, str]:
    """Access key → secret key, from the config and the credentials file (``ACCESS:SECRET`` per
    line, ``#`` comments). A malformed file is a ConfigError naming the line number only."""
    keys = {ak: sk.get_secret_value() for ak, sk in cfg.credentials.items()}
    path = cfg.credentials_file
    if path is None:
        return keys
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"grpc.credentials_file {path}: {e.strerror or e}", path=str(path)) from e
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        ak, sep, sk = line.partition(":")
        if not sep or not ak.strip() or not sk.strip():
            raise ConfigError(
                f"grpc.credentials_file {path} line {n}: expected ACCESS_KEY:SECRET_KEY",
                path=str(path),
                line=n,
            )
        keys[ak.strip()] = sk.strip()
    if not keys:
        raise ConfigError(
            f"grpc.credentials_file {path} holds no credentials (a missing secret?)", path=str(path)
        )
    return keys


def check_signature(keys: dict[str, str], metadata: Any) -> None:
    """Raise :class:`UnauthenticatedError` unless ``metadata`` carries a valid signature."""
    md = {k.lower(): v for k, v in (metadata or ())}
    header = md.get("authorization")
    if not isinstance(header, str):
        raise UnauthenticatedError("no credentials: this server requires RocketMQ access-key credentials")
    m = _AUTHORIZATION.fullmatch(header.strip())
    if m is None:
        raise UnauthenticatedError("malformed authorization metadata (expected MQv2-HMAC-SHA1)")
    ak = m["ak"]
    secret = keys.get(ak)
    signed = md.get("x-mq-date-time")
    if secret is None:
        raise UnauthenticatedError(f"unknown access key {ak!r}", access_key=ak)
    if m["headers"].lower() != "x-mq-date-time" or not isinstance(signed, str):
        raise UnauthenticatedError("the signature must cover x-mq-date-time", access_key=ak)
    want = hmac.new(secret.encode(), signed.encode(), sha1).hexdigest()
    if not hmac.compare_digest(want, m["sig"].lower()):
        raise UnauthenticatedError(f"wrong signature for access key {ak!r}", access_key=ak)


_METHODS = svc.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name
_failures = FailureLog(log, "gRPC authentication")


class SignatureInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Answers an unauthenticated call with the RPC's own response carrying ``UNAUTHORIZED``."""

    def __init__(self, keys: dict[str, str]) -> None:
        self.keys = keys

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        try:
            check_signature(self.keys, details.invocation_metadata)
        except UnauthenticatedError as e:
            _failures.failed(e)
            return _refusal(details.method, str(e))
        return await continuation(details)


def _refusal(method: str, reason: str) -> Any:
    name = method.rsplit("/", 1)[-1]
    desc = _METHODS.get(name)
    if desc is None:
        return None  # unknown method: gRPC answers UNIMPLEMENTED
    request = message_factory.GetMessageClass(desc.input_type)
    response = message_factory.GetMessageClass(desc.output_type)
    codec = {"request_deserializer": request.FromString, "response_serializer": response.SerializeToString}
    status = pb.Status(code=pb.UNAUTHORIZED, message=reason)
    if desc.client_streaming:

        async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            yield response(status=status)

        return grpc.stream_stream_rpc_method_handler(stream_stream, **codec)
    if desc.server_streaming:

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            yield response(status=status)

        return grpc.unary_stream_rpc_method_handler(unary_stream, **codec)

    async def unary_unary(request: Any, context: Any) -> Any:
        return response(status=status)

    return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)
