"""Who holds a store directory, asked without opening the store.

The CLI asks this before every command to choose between opening the directory and asking the
running daemon over HTTP. It lives apart from :mod:`tierd.store` so that the question costs no
more than a ``flock``: importing the facade pulls in numpy, the hot store and the tiering engine
(about a second), which a command that only talks to the daemon never needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tierd.local.checkpoint import StoreLock

if TYPE_CHECKING:
    from tierd.config import ClientConfig, TierdConfig

#: The lock file inside ``store.dir`` (the hot store takes it on open).
LOCK_FILE = "lock"


def lock_path(cfg: TierdConfig | ClientConfig) -> Path:
    """Where the store directory of ``cfg`` keeps its lock."""
    return Path(cfg.store.dir) / LOCK_FILE


def lock_holder(cfg: TierdConfig | ClientConfig) -> int | None:
    """The pid of the process holding ``cfg``'s store directory (0 when the lock file does not
    say), or None when none does."""
    return StoreLock.holder(lock_path(cfg))
