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

import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Final

from tierd.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SPARK_SCHEMA", "TierdDataSource", "check_worker_python", "register"]

#: What a Python worker imports to plan and decode (numpy, pyarrow, the record codec); PySpark
#: itself is put on the workers' path by Spark, so the probe leaves it out.
WORKER_PROBE: Final = "import tierd.spark.decode"
#: Bound of the probe: a cold start of numpy and pyarrow takes about a second.
PROBE_TIMEOUT_S: Final = 60.0


def register(spark: SparkSession) -> None:
    """Register the ``tierd`` format with ``spark`` (once per session), after checking that the
    Python Spark runs for its workers can import tierd (:func:`check_worker_python`)."""
    check_worker_python(spark)
    from tierd.spark.source import TierdDataSource

    spark.dataSource.register(TierdDataSource)


def check_worker_python(spark: SparkSession) -> None:
    """Fail now, with one error naming the setting, if Spark's Python workers cannot import tierd.

    A registered data source is pickled with the Python the session runs its workers with
    (``SparkContext.pythonExec``: ``PYSPARK_PYTHON`` when the session started, else ``python3``
    from ``PATH`` — outside an activated venv, not the driver's). Planning runs in such a worker on
    the driver's host, so without this check every read fails there with ``No module named
    'tierd'`` at the bottom of a JVM stack trace. The probe runs that Python on this host: it
    vouches for planning and for a local master's tasks, not for executors on other hosts
    (docs/spark.md, "Spark's Python")."""
    configured = spark.sparkContext.pythonExec
    exe = shutil.which(configured) or configured
    if os.path.abspath(exe) == os.path.abspath(sys.executable):
        return  # this very interpreter: it imported tierd
    why = (
        "PYSPARK_PYTHON" if os.environ.get("PYSPARK_PYTHON") == configured else "the session's worker Python"
    )
    try:
        probe = subprocess.run(
            [exe, "-c", WORKER_PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        failure = f"{type(e).__name__}: {e}"
    else:
        if probe.returncode == 0:
            return
        lines = probe.stderr.strip().splitlines()
        failure = lines[-1] if lines else f"exit status {probe.returncode}"
    raise ConfigError(
        f"Spark runs its Python workers with {configured!r} ({why}), which cannot import tierd "
        f"({failure}); planning and reading format('tierd') happen there. Set PYSPARK_PYTHON to a "
        f"Python with tierd[spark] installed before the SparkSession starts (this driver's is "
        f"{sys.executable}), or install tierd[spark] into {exe}",
        python=configured,
        failure=failure,
    )


def __getattr__(name: str) -> Any:
    if name in ("SPARK_SCHEMA", "TierdDataSource"):
        from tierd.spark import source

        return getattr(source, name)
    raise AttributeError(f"module 'tierd.spark' has no attribute {name!r}")
