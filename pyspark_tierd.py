"""``USING tierd`` for SQL-only users, with no Python code and no ``register()`` call.

PySpark (≥ 4.0) looks, the first time a session needs a Python data source, for installed
top-level modules whose name starts with ``pyspark_`` and registers the ``DefaultSource`` class
of each under its ``name()``. ``pip install 'tierd[spark]'`` installs this module, so
``spark-sql``, the Thrift server, ``spark-submit`` of SQL and plain PySpark sessions all know
``format("tierd")`` — provided Spark's Python (``PYSPARK_PYTHON``) is the one tierd is
installed in.
"""

from tierd.spark.source import TierdDataSource as DefaultSource

__all__ = ["DefaultSource"]
