"""The C extension's functions for the Spark decoder (:mod:`tierd.spark.decode`): the TOTALSIZE
chain (``frame_records``) and the record checks with the body column (``spark_check``), in
``tierd/format/_batchdecode.c``.

Their body CRC is ISA-L's CRC-32 — the function behind :func:`tierd.format.record.crc32`
(``isal.isal_zlib.crc32``), which isal's extension exports as ``crc32_gzip_refl`` — called from
C with no Python object per body. It is found here and checked against ``isal_zlib.crc32``
before any use.
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, NamedTuple

from tierd.format.record import crc32

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["SparkFunctions", "spark_functions"]

log = logging.getLogger(__name__)


class SparkFunctions(NamedTuple):
    """The extension's functions the Spark decoder calls (see ``_batchdecode.pyi``)."""

    frame_records: Callable[..., tuple[int, int, int, int]]
    spark_check: Callable[..., int]


def spark_functions() -> SparkFunctions | None:
    """The extension's Spark functions bound to ISA-L's CRC-32, or None — and the caller decodes
    in Python — where the extension is not built (or was built before these functions), or the
    CRC function is not found or does not give ``crc32``'s values."""
    try:
        from isal import isal_zlib

        # ImportError too where the extension was built before these functions existed.
        from tierd.format._batchdecode import bind_crc32, frame_records, spark_check
        from tierd.format._batchdecode import crc32 as bound_crc32

        address = ctypes.cast(ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl, ctypes.c_void_p).value
    except (ImportError, AttributeError, OSError) as e:
        log.debug("compiled Spark decoding unavailable (%s): decoding in Python", e)
        return None
    if not address:
        return None
    bind_crc32(address)
    probe = bytes(range(256)) * 9
    if any(bound_crc32(probe[a:b]) != crc32(probe[a:b]) for a, b in ((0, 0), (0, 1), (3, 2049), (7, 2304))):
        log.warning("ISA-L's crc32_gzip_refl does not match isal_zlib.crc32: decoding in Python")
        return None
    return SparkFunctions(frame_records, spark_check)
