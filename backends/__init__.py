"""Segment drivers shipped with tierd, registered under the ``tierd.backends`` entry-point group.

Rule: modules here import only ``tierd.tiered.segment``, ``tierd.tiered.paths`` and
``tierd.errors`` from tierd (plus their own optional dependencies), so a third-party driver can
be written against exactly the same surface.

The chunk layout of open segments on object stores (FORMATS §2.3) is public here for readers of
a bucket that run no driver, such as the Spark source: :class:`Layout` (validates a segment's
chunk listing), :class:`Listing`, :class:`ObjectInfo` and ``CHUNK_DIR_SUFFIX``. They load on first
use, so importing one driver loads nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends._chunks import CHUNK_DIR_SUFFIX, Layout, Listing, ObjectInfo

__all__ = ["CHUNK_DIR_SUFFIX", "Layout", "Listing", "ObjectInfo"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'backends' has no attribute {name!r}")
    return getattr(importlib.import_module("backends._chunks"), name)
