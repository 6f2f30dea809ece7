"""Read tierd's cold tier as Arrow — from Polars, DuckDB, pandas or pyarrow, without Spark and
without a running tierd: nothing but the bucket URL.

```python
import tierd.arrow

ds = tierd.arrow.dataset("s3://bucket/prefix", topic="orders")
table = ds.to_table(columns=["queue_offset", "body"])
```

The columns and their meaning are the Spark source's (``docs/spark.md``); how to use each engine,
what is pushed down and what a read costs is in ``docs/arrow.md``. Needs the ``spark`` extra's
pyarrow and fsspec backends (``pip install 'tierd[arrow]'``), not pyspark.
"""

from __future__ import annotations

from tierd.arrow.reader import SCHEMA, TierdDataset, TierdScanner, dataset, read

__all__ = ["SCHEMA", "TierdDataset", "TierdScanner", "dataset", "read"]
