"""Segment drivers shipped with tierd, registered under the ``tierd.backends`` entry-point group.

Rule: modules here import only ``tierd.tiered.segment``, ``tierd.tiered.paths`` and
``tierd.errors`` from tierd (plus their own optional dependencies), so a third-party driver can
be written against exactly the same surface.
"""
