"""Read tierd's cold tier with Spark — nothing but the bucket path needed (no daemon, no local
metadata, no Hadoop S3A jars).

```python
from tierd.spark import register
register(spark)
df = spark.read.format("tierd").option("path", "s3://bucket/prefix").load()
```

Options, schema and the pushdown setting are documented in ``docs/spark.md``. Importing this
package does not import pyspark (``tierd`` must work without the ``spark`` extra); the data
source class is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SPARK_SCHEMA", "TierdDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``tierd`` format with ``spark`` (once per session)."""
    from tierd.spark.source import TierdDataSource

    spark.dataSource.register(TierdDataSource)


def __getattr__(name: str) -> Any:
    if name in ("SPARK_SCHEMA", "TierdDataSource"):
        from tierd.spark import source

        return getattr(source, name)
    raise AttributeError(f"module 'tierd.spark' has no attribute {name!r}")
