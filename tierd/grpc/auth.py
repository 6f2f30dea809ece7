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

from rocketmq.grpc_protocol import definition_pb2 as pb

from tierd.errors import ConfigError, TierdError
from tierd.repeats import FailureLog

if TYPE_CHECKING:
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


_failures = FailureLog(log, "gRPC authentication")


def refused(e: UnauthenticatedError) -> Any:
    """The ``UNAUTHORIZED`` status answering ``e`` — in the RPC's own response, as the proxy
    answers, so clients report it as such — logged as one line (rate-limited)."""
    _failures.failed(e)
    return pb.Status(code=pb.UNAUTHORIZED, message=str(e))
