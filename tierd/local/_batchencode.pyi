"""Types of the C batch encoder (``_batchencode.c``); see :mod:`tierd.local.prepare`."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tierd.message import Message

def bind(
    cls: type[Message],
    crc32: Callable[[bytes], int],
    encode_host: Callable[[str], bytes],
    empty_properties: Mapping[str, str],
    /,
) -> None: ...
def encode(
    messages: Sequence[Message],
    topics: dict[str, tuple[int, bytes]],
    choose: Callable[[str], int],
    max_queues: int,
    max_body: int,
    max_record: int,
    max_properties: int,
    store_host: bytes,
    now_ms: int,
    max_buffer: int,
    /,
) -> tuple[bytearray, bytes, bytes, bytes, list[tuple[str, int]], bytes, bytes, bytes] | None: ...
def stamp(
    records: bytearray,
    start: int,
    queue_offsets: object,
    count: int,
    first_physical_offset: int,
    store_timestamp: int,
    /,
) -> int: ...
def encode_one(
    message: Message,
    topic: str,
    entry: tuple[int, bytes],
    key: tuple[str, int] | None,
    limits: tuple[int, int, int, int],
    store_host: bytes,
    now_ms: int,
    /,
) -> tuple[tuple[str, int], bytes, int, int | tuple[int, ...], int, int] | None: ...
def place(
    buffer: Any,
    position: int,
    record: bytes,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    store_timestamp_at: int,
    /,
) -> None: ...
def key_hash(data: bytes, /) -> int: ...
