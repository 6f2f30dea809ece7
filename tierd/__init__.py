"""tierd — a RocketMQ-style message store with tiered storage.

Public API (stable names)::

    from tierd import MessageStore, BlockingMessageStore, Message, TierdConfig, ReadPolicy, GetStatus
"""

from tierd.config import TierdConfig
from tierd.errors import TierdError
from tierd.message import GetResult, GetStatus, Message, MessageExt, PutResult, ReadPolicy
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
