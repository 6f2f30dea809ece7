"""BORNHOST / STOREHOST (FORMATS §1.1): ``"ip:port"`` as 4+4 bytes, ``"[v6]:port"`` as 16+4.

A record's SYSFLAG says which width each host has (see :mod:`tierd.format.record`).
"""

from __future__ import annotations

import ipaddress
import struct
from functools import lru_cache

from tierd.errors import InvalidArgumentError

_PORT = struct.Struct(">i")


@lru_cache(maxsize=1024)
def encode_host(host: str) -> bytes:
    """``"ip:port"`` / ``"[v6]:port"`` → 4+4 or 16+4 bytes as RocketMQ writes them."""
    if host.startswith("["):
        addr, _, port = host[1:].partition("]:")
    else:
        addr, _, port = host.rpartition(":")
    try:
        ip = ipaddress.ip_address(addr)
        port_num = int(port)
    except ValueError as e:
        raise InvalidArgumentError(f"host must be 'ip:port' or '[ipv6]:port', got {host!r}", host=host) from e
    if not 0 <= port_num <= 65535:
        raise InvalidArgumentError(f"host port must be in 0..65535, got {host!r}", host=host)
    return ip.packed + _PORT.pack(port_num)


@lru_cache(maxsize=4096)
def decode_host(raw: bytes) -> str:
    """Inverse of :func:`encode_host` (8 or 20 bytes)."""
    ip = ipaddress.ip_address(raw[:-4])
    port = _PORT.unpack(raw[-4:])[0]
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
