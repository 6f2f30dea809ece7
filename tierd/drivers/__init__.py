"""Segment drivers: the contract every driver implements, and the drivers shipped with tierd.

The **contract** is what a driver (shipped or a third party's) implements and imports:
:mod:`~tierd.drivers.segment` (the async ``SegmentDriver``/``DriverRoot`` ABCs and ``FileSegment``,
the append-buffer/commit logic built once on top of them) and :mod:`~tierd.drivers.paths` (segment
path naming). :mod:`~tierd.drivers.registry` finds drivers through the ``tierd.backends``
entry-point group. The contract imports nothing but :mod:`tierd.errors`.

The **shipped drivers** (``posix``, ``memory``, ``s3`` with its capability probe ``s3probe``,
``fsspec``) import from tierd only the contract and the errors, so a third-party driver is written
against exactly the same surface. Nothing here knows the tiering engine (:mod:`tierd.tiered`).

The chunk layout of open segments on object stores (FORMATS §2.3) is public here for readers of
a bucket that run no driver, such as the Spark source: :class:`Layout` (validates a segment's
chunk listing), :class:`Listing`, :class:`ObjectInfo` and ``CHUNK_DIR_SUFFIX``. They load on first
use, so importing one driver loads nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierd.drivers._chunks import CHUNK_DIR_SUFFIX, Layout, Listing, ObjectInfo

__all__ = ["CHUNK_DIR_SUFFIX", "Layout", "Listing", "ObjectInfo"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'tierd.drivers' has no attribute {name!r}")
    return getattr(importlib.import_module("tierd.drivers._chunks"), name)
