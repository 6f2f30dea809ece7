"""The offset message id (RocketMQ's ``MessageDecoder.createMessageId``): the uppercase hex of a
record's STOREHOST bytes (8, or 20 for IPv6) followed by its 8-byte PHYSICALOFFSET — 32 or 56
characters. It names where a message is stored, so it is derived, never stored.

Every message id tierd hands out is built here: :func:`offset_msg_id_template` is the layout,
:func:`offset_msg_id` one id, :func:`offset_msg_ids` a column of them (Spark, with numpy).
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import TYPE_CHECKING, Final

from tierd.errors import InvalidArgumentError
from tierd.format.host import decode_host

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: PHYSICALOFFSET is a signed 64-bit field; the id shows its two's-complement bytes.
OFFSET_MASK: Final = 0xFFFFFFFFFFFFFFFF
_LONG = struct.Struct(">q")


@lru_cache(maxsize=4096)
def offset_msg_id_template(store_host: bytes) -> str:
    """The ids of one store host as a ``%`` template: ``template % (offset & OFFSET_MASK)`` is
    :func:`offset_msg_id` (an offset >= 0, as every commitlog offset is, needs no mask). The put
    path keeps it — one formatting operation per message, no call — and the HTTP batch response
    embeds it in its row template."""
    return store_host.hex().upper() + "%016X"


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """Offset message id: uppercase hex of STOREHOST bytes + the 8-byte PHYSICALOFFSET."""
    return offset_msg_id_template(store_host) % (physical_offset & OFFSET_MASK)


def offset_msg_ids(
    store_hosts: npt.NDArray[np.uint8], v6: npt.NDArray[np.bool_], physical_offsets: npt.NDArray[np.int64]
) -> tuple[bytes, npt.NDArray[np.int32]]:
    """:func:`offset_msg_id` of every row, as the ASCII of all ids one after the other and the
    ``n + 1`` offsets where each starts (an Arrow string column's buffers). ``store_hosts`` holds
    each row's STOREHOST bytes (``n × 20``; only the first 8 are read where ``v6`` is false)."""
    import numpy as np  # here, not at the top: the CLI formats single ids without numpy's start-up

    n = len(physical_offsets)
    if not v6.any():  # IPv4 only: 8 host bytes + 8 offset bytes per row, hexed in one C call
        raw = np.empty((n, 16), np.uint8)
        raw[:, :8] = store_hosts[:, :8]
        raw[:, 8:] = physical_offsets.astype(">i8").view(np.uint8).reshape(n, 8)
        return raw.tobytes().hex().upper().encode(), np.arange(n + 1, dtype=np.int32) * 32
    hexd = np.frombuffer(b"0123456789ABCDEF", np.uint8)
    host_hex = np.empty((n, 40), np.uint8)
    host_hex[:, 0::2] = hexd[store_hosts >> 4]
    host_hex[:, 1::2] = hexd[store_hosts & 0xF]
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    off_hex = hexd[((physical_offsets.astype(np.uint64)[:, None] >> shifts) & np.uint64(0xF)).astype(np.intp)]
    width = np.where(v6, 40, 16)
    full = np.hstack([host_hex, off_hex])
    cols = np.arange(56)
    keep = (cols[None, :] < width[:, None]) | (cols[None, :] >= 40)
    starts = np.zeros(n + 1, np.int32)
    np.cumsum(width + 16, out=starts[1:])
    return full[keep].tobytes(), starts


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
