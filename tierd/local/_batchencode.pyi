"""Types of the C batch encoder (``_batchencode.c``); see :mod:`tierd.local.prepare`."""

from collections.abc import Callable, Mapping, Sequence

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
def key_hash(data: bytes, /) -> int: ...
