"""The user's workload behind the tiering and cold-read figures (``bench/tiering.py``,
``bench/cold_read.py``; docs/performance.md P2/P3), shared so both measure the same thing.

What a user does: a :class:`~tierd.BlockingMessageStore` with the **default** configuration —
only ``store.dir`` and the ``[backend]`` section (an S3 server) are set — holding 1 KiB bodies,
each with one key (so the hot and cold key indexes do real work), spread over a topic's queues
with ``put_batch`` batches of 1,000.

The S3 servers are the ones the tests use (:mod:`tierd.testing.s3server`): moto (Python: it
shares the CPU with tierd) and SeaweedFS (Go). Raw baselines talk to the same server with a
plain boto3 client, sequentially, as a user's script would.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierd.config import TierdConfig
from tierd.message import Message
from tierd.testing.s3server import S3Server, start_moto, start_seaweedfs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from tierd.store import BlockingMessageStore

__all__ = [
    "BATCH",
    "BODY",
    "SERVERS",
    "TAGS",
    "TOPIC",
    "bench_main",
    "count_requests",
    "delete_prefix",
    "list_objects",
    "log_requests",
    "produce_keyed",
    "record_puts",
    "spread",
    "start_server",
    "topics",
    "user_config",
]

#: Body bytes of every message, and messages per ``put_batch`` call.
BODY = 1024
BATCH = 1000
TOPIC = "bench"
SERVERS = ("moto", "seaweedfs")


def start_server(name: str, workdir: Path) -> S3Server:
    """Start the S3 server ``name`` (one of :data:`SERVERS`) under ``workdir``."""
    if name == "moto":
        return start_moto(workdir)
    if name == "seaweedfs":
        return start_seaweedfs(workdir)
    raise ValueError(f"unknown S3 server {name!r}; expected one of {', '.join(SERVERS)}")


def user_config(
    store_dir: Path, server: S3Server, bucket: str, prefix: str, *, tiered: dict[str, Any] | None = None
) -> TierdConfig:
    """Default settings everywhere; only where the store lives and which bucket it tiers to
    (and the ``[tiered]`` settings a figure names, e.g. a long ``dispatch_interval``)."""
    raw: dict[str, Any] = {
        "store": {"dir": str(store_dir)},
        "backend": {
            "name": "s3",
            "url": f"s3://{bucket}/{prefix}",
            "storage_options": server.storage_options,
        },
    }
    if tiered:
        raw["tiered"] = dict(tiered)
    return TierdConfig.from_dict(raw)


#: Distinct tags :func:`produce_keyed` cycles through when asked for tags (a consumer filters
#: on a few values; every message carries one, as nearly every RocketMQ message does).
TAGS = tuple(f"tag{i}" for i in range(8))


def topics(queues: int, per_topic: int | None) -> list[str]:
    """The topics :func:`produce_keyed` writes: :data:`TOPIC`, or ``{TOPIC}-{n}`` for each
    ``per_topic`` queues."""
    if per_topic is None:
        return [TOPIC]
    return [f"{TOPIC}-{n}" for n in range(-(-queues // per_topic))]


def _batches(messages: int, queues: int, tags: bool, per_topic: int | None) -> Iterator[list[Message]]:
    # Distinct bodies cost randomness per message; slices of one random block are as good for
    # every layer here (nothing compresses or deduplicates).
    block = os.urandom(64 * BODY)
    names = topics(queues, per_topic)
    width = per_topic or queues
    for first in range(0, messages, BATCH):
        yield [
            Message(
                topic=names[(i % queues) // width],
                body=block[(i * 61) % (len(block) - BODY) :][:BODY],
                queue_id=i % queues % width,
                keys=(f"k{i}",),
                tags=TAGS[i % len(TAGS)] if tags else None,
            )
            for i in range(first, min(first + BATCH, messages))
        ]


def produce_keyed(
    store: BlockingMessageStore,
    messages: int,
    queues: int,
    *,
    tags: bool = False,
    queues_per_topic: int | None = None,
) -> None:
    """Put ``messages`` 1 KiB messages with one key each (and, with ``tags``, one of
    :data:`TAGS`), round robin over ``queues`` queues (explicit queue ids) of :data:`TOPIC` —
    or, with ``queues_per_topic``, of as many topics as :func:`topics` names (a store caps the
    queues of a topic: ``store.max_queues``) — in ``put_batch`` calls of :data:`BATCH`."""
    for batch in _batches(messages, queues, tags, queues_per_topic):
        store.put_batch(batch)


def count_requests(store: BlockingMessageStore) -> collections.Counter[str]:
    """S3 API calls the store's own client makes from now on, by operation (a botocore event
    hook on the client; it costs a counter increment per request)."""
    counter: collections.Counter[str] = collections.Counter()

    def seen(model: Any, **_: Any) -> None:
        counter[model.name] += 1

    _hook_requests(store, seen)
    return counter


def record_puts(store: BlockingMessageStore) -> list[int]:
    """Body sizes of the ``PutObject`` requests the store's own client makes from now on, in
    the order botocore serialised them (what a raw client must replay to make the same PUTs)."""
    sizes: list[int] = []

    def seen(model: Any, params: Any, **_: Any) -> None:
        if model.name == "PutObject":
            sizes.append(_body_size(params.get("body")))

    _hook_requests(store, seen)
    return sizes


def _body_size(body: Any) -> int:
    """Bytes of a request body as botocore holds it: ``bytes``, or a file (tierd's
    ``RequestBody``, a ``BytesIO``) measured without moving its position."""
    if body is None:
        return 0
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    if hasattr(body, "__len__"):
        return len(body)
    here = body.tell()
    end = body.seek(0, os.SEEK_END)
    body.seek(here)
    return int(end)


def log_requests(store: BlockingMessageStore) -> list[tuple[str, str]]:
    """S3 API calls the store's own client makes from now on, in order: (operation, the URL
    path botocore serialised — it ends with the object key for object requests)."""
    calls: list[tuple[str, str]] = []

    def seen(model: Any, params: Any, **_: Any) -> None:
        calls.append((model.name, str(params.get("url_path", ""))))

    _hook_requests(store, seen)
    return calls


def _hook_requests(store: BlockingMessageStore, hook: Callable[..., None]) -> None:
    assert store.tiering is not None
    assert store._loop is not None
    root = store.tiering.root.inner
    fs = store._loop.run(root.filesystem())  # type: ignore[attr-defined]
    fs.s3.meta.events.register("before-call.s3", hook)
    # Cold reads' ranged GETs bypass botocore's pipeline (tierd.drivers.s3fastget): seen apart.
    root.request_observers.append(  # type: ignore[attr-defined]
        lambda operation, path: hook(model=types.SimpleNamespace(name=operation), params={"url_path": path})
    )


def lean_gets(store: BlockingMessageStore) -> dict[str, int]:
    """How many lean GETs (``tierd.drivers.s3fastget``) the store's S3 root sent so far, and how
    many of them were repeated through botocore (all zero where botocore's pipeline is used)."""
    assert store.tiering is not None
    lean = store.tiering.root.inner._lean  # type: ignore[attr-defined]
    return {"sent": lean.sent if lean else 0, "fell_back": lean.fell_back if lean else 0}


def list_objects(server: S3Server, bucket: str, prefix: str) -> list[tuple[str, int]]:
    """(key, size) of every object under ``prefix``, in key order."""
    client = server.boto3_client()
    try:
        return [
            (str(o["Key"]), int(o["Size"]))
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])
        ]
    finally:
        client.close()


def delete_prefix(server: S3Server, bucket: str, prefix: str) -> None:
    """Delete everything under ``prefix`` (moto slows down as it accumulates objects)."""
    client = server.boto3_client()
    try:
        keys = [{"Key": k} for k, _ in list_objects(server, bucket, prefix)]
        for first in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys[first : first + 1000]})
    finally:
        client.close()


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, minimum, maximum and every value of a series of rounds."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": [round(v, 3) for v in values],
    }


def bench_main(
    argv: list[str] | None,
    *,
    doc: str | None,
    figure: str,
    what: str,
    run_server: Callable[[str, argparse.Namespace, Path], dict[str, Any]],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """The command line both scripts share: parse the workload's options (and a script's own,
    from ``add_arguments``: they are echoed in the JSON), run ``run_server`` on each chosen S3
    server in one scratch directory (``TIERD_BENCH_DIR`` picks where), print the figure's JSON."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--mib", type=int, default=256, help="MiB of 1 KiB bodies (default 256)")
    parser.add_argument("--queues", type=int, default=16, help="queues they are spread over (default 16)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds per server (default 3)")
    parser.add_argument("--server", choices=[*SERVERS, "both"], default="both", help="S3 server(s)")
    shared = set(vars(parser.parse_args([])))
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    names = SERVERS if args.server == "both" else (args.server,)
    with tempfile.TemporaryDirectory(prefix="tierd-bench-", dir=os.environ.get("TIERD_BENCH_DIR")) as tmp:
        results = {name: run_server(name, args, Path(tmp)) for name in names}
    out = {
        "figure": figure,
        "what": what,
        "mib": args.mib,
        "queues": args.queues,
        "message_body_bytes": BODY,
        "keys_per_message": 1,
        **{k: v for k, v in vars(args).items() if k not in shared},
        "repeat": args.repeat,
        "servers": results,
        "meets_target": all(r["meets_target"] for r in results.values()),
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
