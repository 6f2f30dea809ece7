"""Spark's Python workers without tierd: one clear error when the source is registered, naming
``PYSPARK_PYTHON`` and the Python — not ``No module named 'tierd'`` at the bottom of a JVM stack
trace when the first read is planned.

The shared session is reused: ``SparkContext.pythonExec`` is what PySpark reads ``PYSPARK_PYTHON``
into when a session starts and what it pickles a registered data source with, so pointing it at
another Python is a session whose ``PYSPARK_PYTHON`` names that Python.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tierd.errors import ConfigError
from tierd.spark import register

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_workers_without_tierd_fail_once_clearly_before_planning(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A driver started outside the checkout (in it, `python -c` finds tierd/ in the current
    # directory), and the interpreter this venv was made from: a real Python without its packages.
    monkeypatch.chdir(tmp_path)
    bare = str(Path(sys.base_prefix, "bin", "python3"))
    lacks = subprocess.run(
        [bare, "-c", "import tierd"], capture_output=True, text=True, timeout=60, check=False
    )
    assert lacks.returncode != 0, f"{bare} imports tierd: not a Python without it"

    def register_and_read() -> None:
        register(spark)
        spark.read.format("tierd").load((tmp_path / "cold").as_uri()).count()

    sc = spark.sparkContext
    before = sc.pythonExec
    sc.pythonExec = bare
    try:
        with pytest.raises(ConfigError) as caught:
            register_and_read()
    finally:
        sc.pythonExec = before
        register(spark)  # the shared session's own registration, for the tests after this one
    message = str(caught.value)
    assert "\n" not in message
    assert f"Spark runs its Python workers with {bare!r}" in message
    assert "No module named 'tierd'" in message
    assert "Set PYSPARK_PYTHON to a Python with tierd[spark] installed" in message
    assert sys.executable in message  # the Python that does have it
    assert caught.value.detail["python"] == bare
