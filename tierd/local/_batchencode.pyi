"""Types of the C plain-batch encoder (``_batchencode.c``); see :mod:`tierd.local.prepare`."""

from collections.abc import Callable, Sequence

from tierd.message import Message

def bind(cls: type[Message], crc32: Callable[[bytes], int], defaults: tuple[object, ...], /) -> None: ...
def encode_plain(
    messages: Sequence[Message],
    topic: str,
    topic_part: bytes,
    magic: int,
    max_body: int,
    max_record: int,
    max_properties: int,
    store_host: bytes,
    born_timestamp: int,
    max_buffer: int,
    /,
) -> tuple[bytearray, bytes, bytes, int] | None: ...
def stamp(
    records: bytearray,
    start: int,
    count: int,
    queue_id: int,
    first_queue_offset: int,
    first_physical_offset: int,
    store_timestamp: int,
    /,
) -> int: ...
def key_hash(data: bytes, /) -> int: ...
