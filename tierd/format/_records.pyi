"""Types of the record format's C extension (``_records.c``, ``_decode.c``, ``_encode.c``); bound
in :mod:`tierd.format.compiled`."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tierd.format.message_ext import MessageExt

_T = TypeVar("_T", bound=tuple[Any, ...])

# The one CRC hookup (_records.c).
def bind_crc32(crc32: Callable[[bytes | bytearray | memoryview], int], /) -> None: ...
def crc32(data: bytes | bytearray | memoryview, /) -> int: ...
def crc32_function() -> Callable[[bytes | bytearray | memoryview], int] | None: ...

# The cold read path's decoder (tierd.format.batch).
def bind_decoder(cls: type[MessageExt], untrack: bool, /) -> None: ...
def check_queue(
    data: bytes | bytearray | memoryview,
    starts: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    topic_utf8: bytes,
    queue_id: int,
    first_queue_offset: int,
    /,
) -> bool: ...
def decode_queue(
    data: bytes | bytearray | memoryview,
    starts: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    start: int,
    stop: int,
    topic: str,
    topic_utf8: bytes,
    queue_id: int,
    first_queue_offset: int,
    /,
) -> list[MessageExt] | None: ...

# The Spark decoder's functions (tierd.spark.decode).
def frame_records(
    data: bytes | bytearray | memoryview, starts: npt.NDArray[np.int64], min_size: int, max_size: int, /
) -> tuple[int, int, int, int]: ...
def spark_check(
    data: bytes | bytearray | memoryview,
    starts: npt.NDArray[np.int64],
    end: int,
    flat_base: int,
    topic_utf8: bytes,
    queue_id: int,
    rows: npt.NDArray[np.void],
    body_offsets: pa.Buffer,
    bodies: pa.Buffer,
    /,
) -> int: ...

# put and put_batch's encoder (tierd.local.prepare): messages of tierd.message.Message, a class
# outside the format (Any here).
def bind_encoder(
    cls: type[Any],
    encode_host: Callable[[str], bytes],
    empty_properties: Mapping[str, str],
    /,
) -> None: ...
def encode(
    messages: Sequence[Any],
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
) -> tuple[bytearray, bytes, bytes, bytes, bytes, list[tuple[str, int]], bytes, bytes, bytes] | None: ...
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
    message: Any,
    topic: str,
    entry: tuple[int, bytes],
    key: tuple[str, int] | None,
    limits: tuple[int, int, int, int],
    store_host: bytes,
    now_ms: int,
    topic_keys: list[tuple[str, int]] | None,
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
def untrack_tuple(t: _T, /) -> _T: ...
