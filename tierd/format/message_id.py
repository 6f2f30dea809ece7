"""The offset message id (RocketMQ's ``MessageDecoder.createMessageId``): the uppercase hex of a
record's STOREHOST bytes (8, or 20 for IPv6) followed by its 8-byte PHYSICALOFFSET — 32 or 56
characters. It names where a message is stored, so it is derived, never stored.
"""

from __future__ import annotations

import struct
from functools import lru_cache

from tierd.errors import InvalidArgumentError
from tierd.format.host import decode_host

_LONG = struct.Struct(">q")


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """Offset message id: uppercase hex of STOREHOST bytes + the 8-byte PHYSICALOFFSET."""
    return _host_hex(store_host) + f"{physical_offset & 0xFFFFFFFFFFFFFFFF:016X}"


@lru_cache(maxsize=4096)
def _host_hex(store_host: bytes) -> str:
    return store_host.hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of :func:`offset_msg_id`: ``(store host, physical offset)``."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as e:
        raise InvalidArgumentError(f"msg_id must be hex, got {msg_id!r}", msg_id=msg_id) from e
    if len(raw) not in (16, 28):
        raise InvalidArgumentError(
            f"msg_id must be 32 (IPv4) or 56 (IPv6) hex characters, got {len(msg_id)}", msg_id=msg_id
        )
    return decode_host(raw[:-8]), _LONG.unpack(raw[-8:])[0]
