"""tierd — a RocketMQ-style message store with tiered storage.

Public API (stable names)::

    from tierd import MessageStore, BlockingMessageStore, Message, TierdConfig, ReadPolicy, GetStatus

The names are loaded on first use (module ``__getattr__``), not when the package is imported:
a third-party segment driver imports ``tierd.drivers.segment`` — the driver contract — and must
get exactly that and ``tierd.errors``, not the facade with numpy, pydantic and mmh3 behind it
(``tests/test_layers.py`` checks this).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierd.config import TierdConfig
    from tierd.errors import TierdError
    from tierd.format.message_ext import MessageExt
    from tierd.message import GetResult, GetStatus, Message, PutResult, ReadPolicy
    from tierd.store import BlockingMessageStore, MessageStore

__version__ = "0.1.0"

__all__ = [
    "BlockingMessageStore",
    "GetResult",
    "GetStatus",
    "Message",
    "MessageExt",
    "MessageStore",
    "PutResult",
    "ReadPolicy",
    "TierdConfig",
    "TierdError",
    "__version__",
]

# Public name → the module that defines it.
_HOMES = {
    "BlockingMessageStore": "tierd.store",
    "GetResult": "tierd.message",
    "GetStatus": "tierd.message",
    "Message": "tierd.message",
    "MessageExt": "tierd.format.message_ext",
    "MessageStore": "tierd.store",
    "PutResult": "tierd.message",
    "ReadPolicy": "tierd.message",
    "TierdConfig": "tierd.config",
    "TierdError": "tierd.errors",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tierd' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
