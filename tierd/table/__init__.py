"""An Iceberg table view of a topic's sealed cold messages (``docs/table.md``).

Built on :mod:`tierd.arrow` — the bucket, read-only — and nothing else of the cold tier: the
writer reads what was sealed past the table's watermark, writes it as Parquet and commits it
through pyiceberg with the new watermark in the same snapshot, so a crash or a retry never adds a
row twice nor skips one. Needs the ``table`` extra (``pip install 'tierd[table]'``).
"""

from __future__ import annotations

from tierd.table.writer import CRASH_ENV, SyncResult, TableWriter, open_catalog

__all__ = ["CRASH_ENV", "SyncResult", "TableWriter", "open_catalog"]
