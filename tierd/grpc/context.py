"""Request ids and log context at the gRPC boundary (the fields of :mod:`tierd.logs`), as
:mod:`tierd.service.context` does for HTTP.

The call boundary (:mod:`tierd.grpc.boundary`) binds ``request_id`` for the whole call, before
anything else runs: the client's ``x-mq-request-id`` metadata (RocketMQ clients send one per
call) when it is well-formed (:func:`tierd.logs.request_id`), else a generated one. It binds nothing else
from the metadata: ``authorization`` carries a signature and stays out of every log line.

The ``topic``, ``group`` and ``queue`` a request names are bound by the servicer where it reads
the request (:func:`bind_names`): only it knows which field of which message holds them. A
binding made during the call ends with it, as the boundary restores what was bound before.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from tierd.logs import bind, unbind
from tierd.store import TOPIC_MAX_LENGTH

if TYPE_CHECKING:
    from collections.abc import Mapping
    from contextvars import Token

#: The metadata key RocketMQ clients put their per-call request id in.
REQUEST_ID_METADATA = "x-mq-request-id"


def asked_id(metadata: Any) -> str | None:
    """The client's request id in ``metadata`` (a sequence of key/value pairs), if any."""
    for key, value in metadata or ():
        if key == REQUEST_ID_METADATA:
            return value if isinstance(value, str) else None
    return None


def bind_names(topic: str | None = None, group: str | None = None, queue: int | None = None) -> None:
    """Bind the names a request carries for the rest of the call; an empty name is left unbound
    and a long one is cut to the longest valid name (an invalid name is logged too: it is what
    the call's error is about). A queue id below 0 means "every queue" and is left out."""
    bind(
        topic=topic[:TOPIC_MAX_LENGTH] if topic else None,
        group=group[:TOPIC_MAX_LENGTH] if group else None,
        queue=queue if queue is not None and queue >= 0 else None,
    )


def unbind_quietly(token: Token[Mapping[str, str | int]]) -> None:
    """:func:`tierd.logs.unbind`, where the binding may belong to another context."""
    # A stream closed from elsewhere (garbage collection of an abandoned generator) runs its
    # ``finally`` in another context, where this token means nothing: that context never saw
    # the binding, so there is nothing to restore.
    with contextlib.suppress(ValueError):
        unbind(token)
