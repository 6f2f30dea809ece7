"""The tiering layer: segment driver contract, cold-tier path naming, driver registry.

``segment`` holds the async :class:`~tierd.tiered.segment.SegmentDriver` contract that every
backend in ``backends/`` implements, and :class:`~tierd.tiered.segment.FileSegment`, the
append-buffer/commit logic built once on top of it.
"""
