"""Types of the C batch decoder (``_batchdecode.c``); see :mod:`tierd.format.batch`."""

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tierd.format.message_ext import MessageExt

def bind(cls: type[MessageExt], crc32: Callable[[bytes], int], untrack: bool, /) -> None: ...
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
def bind_crc32(address: int, /) -> None: ...
def crc32(data: bytes | bytearray | memoryview, /) -> int: ...
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
