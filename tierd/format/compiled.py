"""The record format's C extension, ``tierd.format._records``, imported and bound here once:
one module (``_records.c``; its units ``_decode.c`` and ``_encode.c``) with one binding of the
body CRC for all of it.

* The decoder (:mod:`tierd.format.batch`: ``check_queue``, ``decode_queue``; bound to
  :class:`~tierd.format.message_ext.MessageExt` there).
* The Spark functions (:mod:`tierd.spark.decode`): the TOTALSIZE chain (``frame_records``) and
  the record checks with the body column (``spark_check``).
* The encoder (:mod:`tierd.local.prepare`: ``encode``, ``stamp``, ``encode_one``, ``place``;
  bound to :class:`tierd.Message` there, a class outside the format).

The body CRC is :func:`tierd.format.record.crc32` (``isal.isal_zlib.crc32``), bound once and
called by the C code through its public Python API — one call per body, with the body or a
memoryview of it. Reaching into isal's shared object for its C function instead saved ~100 ns a
message, about 1 % of a Spark full scan's CPU: too little to depend on another library's private
symbols (docs/performance.md).

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


def bind_crc32() -> None:
    """(Re)bind the extension's one CRC hookup to :func:`crc32`. Idempotent; :data:`records` must
    not be None."""
    records.bind_crc32(crc32)


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
    extension is not built."""
    if records is None:
        return None
    return SparkFunctions(records.frame_records, records.spark_check)
