"""docs/spark.md as pasted: every ``python`` and ``sql`` block runs, in order, against a real
cold tier on moto — only the placeholders the page uses are pointed at the test's bucket
(``s3://bucket/prefix``, ``http://127.0.0.1:9000``, ``/tmp/tierd-checkpoints``). The first block
also runs alone, in a fresh Python of the checkout's venv — the editable install ``make test``
creates — as a user pastes it. And the page states the PySpark version the ``spark`` extra pins.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierd import Message
from tierd.testing.s3server import create_bucket

from ..tiered.conftest import cold_config
from .conftest import SEGMENT, Produced, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tierd.testing.s3server import S3Server

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "spark.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(kind: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(DOC.read_text()) if lang == kind]


def test_the_page_states_the_pinned_pyspark() -> None:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    pin = next(d for d in extra if d.startswith("pyspark"))
    text = DOC.read_text()
    assert f"`{pin}`" in text
    major_minor = re.search(r">=(\d+\.\d+)", pin)
    assert major_minor is not None
    assert f"PySpark {major_minor.group(1)}" in text
    assert "≥ 4.0 (filter" not in text  # the old requirement line


def _cold_tier(moto_server: S3Server, tmp_path: Path) -> tuple[str, Produced]:
    """The bucket the page's placeholders stand for: two topics, keys, tags, the index uploaded."""
    url = f"s3://{create_bucket(moto_server)}/prefix"
    cfg = cold_config(
        tmp_path / "store",
        {"name": "s3", "url": url, "storage_options": moto_server.storage_options},
        **SEGMENT,
    )
    produced = produce(
        cfg,
        [
            [
                Message(
                    topic="orders" if i % 4 else "audit",
                    body=b"order %d" % i,
                    keys=[f"order-{i}"],
                    tags="paid" if i % 3 else "unpaid",
                    properties={"UNIQ_KEY": f"u-{i}"},
                )
                for i in range(120)
            ]
        ],
        index_after=1,
    )
    return url, produced


#: A row of ``DataFrame.show()`` for ``groupBy("topic", "queue_id").count()``.
SHOW_ROW = re.compile(r"^\|\s*(\w+)\|\s*(\d+)\|\s*(\d+)\|$", re.MULTILINE)


def test_the_first_snippet_runs_as_pasted_in_the_checkouts_venv(
    moto_server: S3Server, tmp_path: Path
) -> None:
    """What a reader of the README does: ``make test`` (an editable install into ``.venv``), then
    the page's first snippet in that venv's Python, not activated — no ``PYSPARK_PYTHON``, no
    ``PYTHONPATH``, ``python3`` on PATH not the venv's, started outside the checkout. Spark must
    find ``format("tierd")`` by itself (no ``register()``) and its workers must import tierd."""
    url, produced = _cold_tier(moto_server, tmp_path)
    first = _blocks("python")[0]
    assert "register(" not in first
    script = tmp_path / "first.py"
    script.write_text(
        first.replace("s3://bucket/prefix", url).replace("http://127.0.0.1:9000", moto_server.endpoint_url)
    )
    venv_bin = Path(sys.executable).parent
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != venv_bin)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        AWS_ACCESS_KEY_ID=moto_server.access_key,
        AWS_SECRET_ACCESS_KEY=moto_server.secret_key,
        AWS_DEFAULT_REGION="us-east-1",
    )
    # Bounded below pytest's per-test timeout: a JVM start here takes up to a minute.
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # Java stack frames left out: the Python traceback and Spark's error class are what tell.
    out = "\n".join(line for line in (run.stdout + run.stderr).splitlines() if not line.startswith("\tat "))
    assert run.returncode == 0, out[-4000:]
    counts: dict[str, int] = {}
    for topic, _queue, n in SHOW_ROW.findall(run.stdout):
        counts[topic] = counts.get(topic, 0) + int(n)
    assert counts == {"orders": len(produced.bodies("orders"))}, run.stdout


def test_every_python_and_sql_snippet_runs_as_pasted(
    spark: SparkSession, moto_server: S3Server, tmp_path: Path
) -> None:
    url, _ = _cold_tier(moto_server, tmp_path)

    def here(text: str) -> str:
        return (
            text.replace("s3://bucket/prefix", url)
            .replace("http://127.0.0.1:9000", moto_server.endpoint_url)
            .replace("/tmp/tierd-checkpoints", str(tmp_path / "checkpoints"))
        )

    python, sql = _blocks("python"), _blocks("sql")
    assert len(python) >= 4
    assert len(sql) >= 1
    spark.sql("DROP TABLE IF EXISTS orders")
    before = spark.conf.get("spark.sql.python.filterPushdown.enabled")
    scope: dict[str, Any] = {}
    try:
        for block in python:
            exec(compile(here(block), str(DOC), "exec"), scope)
        for block in sql:
            for statement in filter(str.strip, here(block).split(";")):
                spark.sql(statement).collect()
    finally:
        spark.sql("DROP TABLE IF EXISTS orders")
        spark.conf.set("spark.sql.python.filterPushdown.enabled", before or "false")
    # What the snippets computed is right, not merely error-free.
    assert scope["paid"] == sum(1 for i in range(120) if i % 3)
    assert [r.keys for r in scope["one"]] == [["order-42"]]
    assert (tmp_path / "checkpoints" / "orders" / "commits" / "0").exists()  # the stream ran a batch
