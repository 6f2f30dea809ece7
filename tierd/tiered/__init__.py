"""The cold tier, in two rooms.

The **driver contract** — what a segment driver (``backends/`` or a third party's) implements and
imports: :mod:`~tierd.tiered.segment` (the async ``SegmentDriver``/``DriverRoot`` ABCs and
``FileSegment``, the append-buffer/commit logic built once on top of them) and
:mod:`~tierd.tiered.paths` (segment path naming); :mod:`~tierd.tiered.registry` finds drivers
through entry points.

The **tiering engine** — everything else here: :mod:`~tierd.tiered.service` (the cold tier's
lifecycle inside a store), the dispatcher, flat files, the fetcher and its read-ahead cache, the
cold key index, local metadata, bucket manifests, ownership, restore and the backend guard.
The contract imports nothing of the engine (``docs/design.md``).
"""
