"""The process's file-descriptor limit, and how it is shared out, in one place.

The hot store's consume-queue files and the HTTP, gRPC and ops listeners' connections each hold
descriptors; each is capped at its share of the soft RLIMIT_NOFILE (:data:`SHARES`), so none can
run the process out of descriptors for the others. The shares add up to less than the whole: the
rest is for the commitlog, the key index, the cold tier's files and its sockets. A top-level leaf
so that every layer can ask without importing the hot store.
"""

from __future__ import annotations

import logging
import resource
from typing import Final, Literal

log = logging.getLogger(__name__)

#: Who holds descriptors in bulk.
Holder = Literal["consume_queues", "http", "grpc", "ops"]

#: Each holder's share of the open-files limit. Above its share a listener answers a new
#: connection 503 (gRPC: closes it as it opens) so accept() never runs out of descriptors, and the
#: hot store closes its least recently used consume-queue file before opening another.
SHARES: Final[dict[Holder, float]] = {
    "consume_queues": 1 / 4,
    "http": 1 / 2,
    "grpc": 1 / 8,
    "ops": 1 / 16,
}

#: What no holder may take: the commitlog, the index, the cold tier's files and sockets.
RESERVED: Final = 1 - sum(SHARES.values())


def open_files_limit() -> int:
    """The soft RLIMIT_NOFILE of this process (a large number when unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def descriptor_bound(holder: Holder, setting: int, setting_name: str) -> int:
    """``setting`` (the user's own cap, named ``setting_name``), or ``holder``'s share of the
    open-files limit when that is less — said once in the log, with both numbers, because the
    user asked for more than the process can give."""
    limit = open_files_limit()
    bound = min(setting, max(1, int(limit * SHARES[holder])))
    if bound < setting:
        log.info(
            "%s: at most %d descriptors at once (%s is %d; %s of the open-files limit %d is less)",
            holder.replace("_", " "),
            bound,
            setting_name,
            setting,
            _fraction(SHARES[holder]),
            limit,
        )
    return bound


def _fraction(share: float) -> str:
    return f"1/{round(1 / share)}" if share > 0 else "0"
