"""The tiering engine: moves the hot store's messages to a cold tier and reads them back.

:mod:`~tierd.tiered.service` (the cold tier's lifecycle inside a store), the dispatcher, flat
files, the fetcher and its read-ahead cache, the cold key index, local metadata, bucket manifests,
ownership, restore and the backend guard. It talks to storage only through the driver contract in
:mod:`tierd.drivers`, which imports nothing of the engine (``docs/design.md``).
"""
