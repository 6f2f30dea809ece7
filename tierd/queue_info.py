"""One queue across both tiers, as the CLI, the HTTP API and the facade report it.

Its own module, not :mod:`tierd.inventory` (which re-exports it): the CLI turns a daemon's reply
into it, and the inventory's imports — the manifest models, the segment drivers — are ~30 M
instructions (~8 ms) of a ``tierd consume`` start that asks the daemon (docs/performance.md,
"CLI start-up").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue across both tiers. Cold fields are None when the queue was never tiered."""

    topic: str
    queue_id: int
    #: Readable offsets across both tiers: [min_offset, max_offset).
    min_offset: int
    max_offset: int
    hot_min_offset: int
    hot_max_offset: int
    cold_min_offset: int | None
    cold_max_offset: int | None
    #: Messages in the hot store not yet committed to the cold tier.
    pending_messages: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
