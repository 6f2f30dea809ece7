"""AWS Signature Version 4 for one bodiless request: the header-based signature S3 checks.

botocore signs every request through a general pipeline (an ``AWSRequest``, header and query
normalisation, event hooks, a new signer object per request) that costs tierd a few hundred
microseconds of CPU per GET. The cold read path (:mod:`tierd.drivers.s3fastget`) sends many
ranged GETs whose shape never varies — method ``GET``, an object path, a ``Range`` header, no
query, no body — so it signs them here with the algorithm as AWS publishes it ("Signature
Version 4 signing process"), in a handful of C-level ``hmac``/``hashlib`` calls.

Nothing here logs or stores a secret: the signing key is derived per call from the secret the
caller passes in (four one-shot HMACs, cheaper than a cache that would have to keep it), and
the returned headers carry only the signature.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ALGORITHM", "EMPTY_PAYLOAD_SHA256", "Credentials", "sign_headers", "signature"]

ALGORITHM = "AWS4-HMAC-SHA256"
#: The hex SHA-256 of an empty payload: a GET's body. Signing the real (empty) payload's hash is
#: valid over HTTP and HTTPS alike, where ``UNSIGNED-PAYLOAD`` would depend on the scheme.
EMPTY_PAYLOAD_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True, slots=True)
class Credentials:
    """One frozen set of credentials (as botocore resolved them for the client). The secret and
    the session token are left out of ``repr`` so that they cannot reach a log by accident."""

    access_key: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.digest(key, msg.encode(), "sha256")


def signature(
    secret_key: str,
    *,
    stamp: str,
    region: str,
    service: str,
    method: str,
    path: str,
    headers: Mapping[str, str],
    payload_sha256: str,
) -> tuple[str, str]:
    """``(SignedHeaders, Signature)`` of a request with no query string, signed at ``stamp``
    (``YYYYMMDDTHHMMSSZ``) over exactly ``headers`` (lower-case names, values as sent).

    The algorithm's one owner: :func:`sign_headers` signs tierd's requests with it, and the lean
    GET's setup checks with it that the credentials it found are the ones botocore signed with."""
    signed = {name: " ".join(value.split()) for name, value in headers.items()}
    names = sorted(signed)
    signed_names = ";".join(names)
    canonical = "\n".join(
        (
            method,
            path,
            "",  # no query string
            "".join(f"{name}:{signed[name]}\n" for name in names),
            signed_names,
            payload_sha256,
        )
    )
    date = stamp[:8]
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = f"{ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret_key}".encode(), date), region), service), "aws4_request")
    return signed_names, hmac.digest(key, to_sign.encode(), "sha256").hex()


def sign_headers(
    credentials: Credentials,
    *,
    region: str,
    service: str,
    method: str,
    host: str,
    path: str,
    headers: Mapping[str, str],
    now: float | None = None,
) -> dict[str, str]:
    """The headers that sign a bodiless request with no query string: ``X-Amz-Date``,
    ``X-Amz-Content-SHA256`` (the empty payload's hash), ``X-Amz-Security-Token`` when the
    credentials carry a session token, and ``Authorization``.

    ``path`` is the request path exactly as sent (already percent-encoded once: S3 signs the
    path as it is on the wire, without the second encoding other services use); ``host`` the
    ``Host`` header as sent; ``headers`` the other headers to sign (names in any case, values as
    sent, e.g. ``Range``). ``now`` (epoch seconds) pins the clock for known-answer tests.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    signed = {name.lower(): value for name, value in headers.items()}
    signed["host"] = host
    signed["x-amz-date"] = stamp
    signed["x-amz-content-sha256"] = EMPTY_PAYLOAD_SHA256
    if credentials.token:
        signed["x-amz-security-token"] = credentials.token
    signed_names, sig = signature(
        credentials.secret_key,
        stamp=stamp,
        region=region,
        service=service,
        method=method,
        path=path,
        headers=signed,
        payload_sha256=EMPTY_PAYLOAD_SHA256,
    )
    out = {
        "X-Amz-Date": stamp,
        "X-Amz-Content-SHA256": EMPTY_PAYLOAD_SHA256,
        "Authorization": (
            f"{ALGORITHM} Credential={credentials.access_key}/{stamp[:8]}/{region}/{service}/aws4_request, "
            f"SignedHeaders={signed_names}, Signature={sig}"
        ),
    }
    if credentials.token:
        out["X-Amz-Security-Token"] = credentials.token
    return out
