"""docs/table.md as pasted: its configuration blocks load, and every ``python`` block runs, in
order, against a table the writer made from a real cold tier — only the page's store dir
(``/var/lib/tierd/hot``) is pointed at the test's. What each engine's snippet computes is
compared with what the raw source returns. The PySpark block needs a Spark session: it runs in
tests/spark/test_table_parquet.py."""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierd import TierdConfig
from tierd.table import TableWriter

from .conftest import Tier, sealed, writer_config

if TYPE_CHECKING:
    import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "table.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: The store dir the page's snippets name.
PAGE_STORE = "/var/lib/tierd/hot"


def blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(DOC.read_text()) if kind == lang]


def spark_blocks() -> list[str]:
    """The page's PySpark snippets (they use a ``spark`` session)."""
    return [b for b in blocks("python") if "spark." in b]


def test_every_configuration_block_loads() -> None:
    tomls = blocks("toml")
    assert len(tomls) >= 2
    for text in tomls:
        cfg = TierdConfig.from_dict({"store": {"dir": PAGE_STORE}, **tomllib.loads(text)})
        assert cfg.table.catalog == "sql"
    opted = TierdConfig.from_dict(tomllib.loads(tomls[0]))
    assert sorted(n for n, t in opted.topics.items() if t.table == "iceberg") == ["events", "orders"]


def test_every_engine_snippet_runs_as_pasted(
    tier: Tier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # as the page says
    store = (tmp_path / "hot").resolve()
    writer = TableWriter(writer_config(tier, store, orders={}))
    assert writer.sync("orders").lag == 0
    expected = sealed(tier.url, "orders")
    assert expected.num_rows > 0

    engines = [b for b in blocks("python") if b not in spark_blocks()]
    assert len(engines) >= 4
    scope: dict[str, Any] = {}
    for block in engines:
        exec(compile(block.replace(PAGE_STORE, str(store)), str(DOC), "exec"), scope)

    assert scope["recent"].num_rows == expected.num_rows  # every message is from this month on
    queues = Counter(expected.column("queue_id").to_pylist())
    assert dict(scope["by_queue"].iter_rows()) == queues
    assert scope["by_tag"] == sorted(Counter(expected.column("tags").to_pylist()).items())
    df = scope["df"].sort_values(["queue_id", "queue_offset"])
    assert df["body"].tolist() == expected.column("body").to_pylist()
