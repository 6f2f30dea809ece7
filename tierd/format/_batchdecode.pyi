"""Types of the C batch decoder (``_batchdecode.c``); see :mod:`tierd.format.batch`."""

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

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
