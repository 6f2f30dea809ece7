"""The key index's hash (FORMATS §1.3): each indexed key is the string ``topic#key``, hashed
with unsigned 32-bit mmh3 (seed 0) of its UTF-8 bytes.

tierd uses mmh3 instead of Java's ``String.hashCode``: it spreads keys better, and the hot
store's index files, the cold tier's compacted index and Spark's key lookups all hash with the
functions here, so one hash serves both tiers.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING, cast

import mmh3
import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import numpy.typing as npt


def index_key(topic: str, key: str) -> str:
    """The indexed string for ``key`` of ``topic`` (RocketMQ's ``topic#key``)."""
    return f"{topic}#{key}"


def key_hash(key: str) -> int:
    """Unsigned 32-bit mmh3 (seed 0) of the UTF-8 ``key`` (already ``topic#key``)."""
    if not key.isascii():
        key.encode()  # UnicodeEncodeError for a lone surrogate, which crashes mmh3's C code
    return int(mmh3.hash(key, 0, signed=False))


def key_hashes(keys: Sequence[str] | Sequence[bytes]) -> npt.NDArray[np.uint32]:
    """:func:`key_hash` of every key, as a numpy array, in one C-level loop: the hot store's
    index hashes its ``topic#key`` strings, the cold index the UTF-8 bytes it cut out of records
    (for bytes mmh3's digest function is the fastest form; both give the same hash)."""
    if keys and isinstance(keys[0], bytes):
        hashes: Iterator[int] = map(mmh3.mmh3_32_uintdigest, keys)
    else:
        texts = cast("Sequence[str]", keys)
        if not all(map(str.isascii, texts)):
            for text in texts:
                text.encode()  # UnicodeEncodeError for a lone surrogate, which crashes mmh3's C code
        hashes = map(mmh3.hash, keys, repeat(0), repeat(False))
    return np.fromiter(hashes, dtype=np.uint32, count=len(keys))
