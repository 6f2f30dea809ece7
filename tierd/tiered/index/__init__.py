"""The cold key index: writable local files, compacted into INDEX segments on the backend.

One concept per module:

* :mod:`~tierd.tiered.index.format` — the writable and compacted formats, their geometry and
  header checks (FORMATS.md §2.4);
* :mod:`~tierd.tiered.index.results` — hits, file statuses and rows, counters;
* :mod:`~tierd.tiered.index.writable` — one local file, writable then sealed;
* :mod:`~tierd.tiered.index.compaction` — a sealed file into its INDEX segment's bytes;
* :mod:`~tierd.tiered.index.reading` — the I/O-free steps of a lookup in a compacted segment
  (the service and Spark);
* :mod:`~tierd.tiered.index.uploaded` — one uploaded INDEX segment;
* :mod:`~tierd.tiered.index.keys` — the indexed keys of a committed batch and their hashes;
* :mod:`~tierd.tiered.index.service` — :class:`ColdIndexService`: lifecycle, upload, index
  manifest, query, expiry.

The names below are loaded on first use (module ``__getattr__``), as in :mod:`tierd`: a reader
of one module (Spark's lookups import :mod:`~tierd.tiered.index.reading`) does not load the
service behind it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierd.tiered.index.compaction import compact
    from tierd.tiered.index.format import compacted_slots
    from tierd.tiered.index.keys import batch_keys
    from tierd.tiered.index.results import FileStatus, IndexHit
    from tierd.tiered.index.service import ColdIndexService

__all__ = [
    "ColdIndexService",
    "FileStatus",
    "IndexHit",
    "batch_keys",
    "compact",
    "compacted_slots",
]

# Public name → the module that defines it.
_HOMES = {
    "ColdIndexService": "tierd.tiered.index.service",
    "FileStatus": "tierd.tiered.index.results",
    "IndexHit": "tierd.tiered.index.results",
    "batch_keys": "tierd.tiered.index.keys",
    "compact": "tierd.tiered.index.compaction",
    "compacted_slots": "tierd.tiered.index.format",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tierd.tiered.index' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
