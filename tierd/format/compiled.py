"""The record format's C extension, ``tierd.format._records``, imported and bound here once:
one module (``_records.c``; its units ``_decode.c`` and ``_encode.c``) with one binding of the
body CRC for all of it.

* The decoder (:mod:`tierd.format.batch`: ``check_queue``, ``decode_queue``; bound to
  :class:`~tierd.format.message_ext.MessageExt` there).
* The Spark functions (:mod:`tierd.spark.decode`): the TOTALSIZE chain (``frame_records``) and
  the record checks with the body column (``spark_check``).
* The encoder (:mod:`tierd.local.prepare`: ``encode``, ``stamp``, ``encode_one``, ``place``;
  bound to :class:`tierd.Message` there, a class outside the format).

The body CRC is ISA-L's CRC-32 — the function behind :func:`tierd.format.record.crc32`
(``isal.isal_zlib.crc32``), which isal's extension exports as ``crc32_gzip_refl`` — called from
C with no Python object per body. It is found here and checked against ``isal_zlib.crc32``
before any use; where it is not found or disagrees, the C code calls :func:`crc32` instead (and
the Spark functions, which need the C function, are not offered).

Where the extension is not built (no compiler at install time), :data:`records` is None and
every caller runs the Python code that writes and reads the same bytes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from tierd.format.record import crc32

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["ACCELERATED", "MODULE", "SparkFunctions", "bind_crc32", "records", "spark_functions"]

log = logging.getLogger(__name__)

#: The extension's import name (for messages: it is optional).
MODULE: Final = "tierd.format._records"


class SparkFunctions(NamedTuple):
    """The extension's functions the Spark decoder calls (see ``_records.pyi``)."""

    frame_records: Callable[..., tuple[int, int, int, int]]
    spark_check: Callable[..., int]


def _isal_crc32_address() -> int | None:
    """The address of ISA-L's CRC-32 in isal's extension, or None where it is not found."""
    try:
        import ctypes

        from isal import isal_zlib

        address = ctypes.cast(ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl, ctypes.c_void_p).value
    except (ImportError, AttributeError, OSError) as e:
        log.debug("ISA-L's CRC-32 not found (%s): body CRCs through isal_zlib.crc32", e)
        return None
    return address or None


def bind_crc32() -> bool:
    """(Re)bind the extension's one CRC hookup: ISA-L's C function where it is found and gives
    :func:`crc32`'s values, else :func:`crc32` itself (a Python call per body). Returns whether
    the C function is bound. Idempotent; :data:`records` must not be None."""
    address = _isal_crc32_address()
    records.bind_crc32(crc32, address)
    probe = bytes(range(256)) * 9
    if address is not None and any(
        records.crc32(probe[a:b]) != crc32(probe[a:b]) for a, b in ((0, 0), (0, 1), (3, 2049), (7, 2304))
    ):
        log.warning("ISA-L's crc32_gzip_refl does not match isal_zlib.crc32: body CRCs through Python")
        records.bind_crc32(crc32, None)
        return False
    return address is not None


def _load() -> Any:
    """The extension module, or None where it is not built."""
    try:
        import tierd.format._records as records_module
    except ImportError:
        log.debug("%s is not built: records are encoded and decoded in Python", MODULE)
        return None
    return records_module


#: The extension module (see ``_records.pyi``), its CRC bound below; None where it is not built.
records: Final[Any] = _load()
#: Whether the C extension is built.
ACCELERATED: Final = records is not None
if records is not None:
    bind_crc32()


def spark_functions() -> SparkFunctions | None:
    """The extension's Spark functions, or None — and the caller decodes in Python — where the
    extension is not built or ISA-L's CRC function is not found or disagrees (the Spark checks
    need it as a C function; the hookup is bound again here, see :func:`bind_crc32`)."""
    if records is None or not bind_crc32():
        return None
    return SparkFunctions(records.frame_records, records.spark_check)
