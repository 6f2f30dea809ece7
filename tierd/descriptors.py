"""The process's file-descriptor limit, read in one place.

The hot store, the HTTP and ops listeners and the gRPC listener each bound their own descriptors
as a share of this limit (see each one's setting); none of them may run the process out of
descriptors for the others. A top-level leaf so that every layer can ask without importing the
hot store.
"""

from __future__ import annotations

import resource


def open_files_limit() -> int:
    """The soft RLIMIT_NOFILE of this process (a large number when unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 30
