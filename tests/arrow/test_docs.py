"""docs/arrow.md as pasted: every ``python`` block runs, in order, against a real cold tier on
moto — only the page's placeholders (``s3://bucket/prefix``, ``http://127.0.0.1:9000``) are
pointed at the test's bucket, and credentials come from the environment, as the page says.
What the snippets compute is checked, not merely that they run. The page also names the extra
that installs the reader.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierd import BlockingMessageStore, Message
from tierd.testing.s3server import create_bucket

from ..tiered.conftest import cold_config

if TYPE_CHECKING:
    import pytest

    from tierd.testing.s3server import S3Server

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "arrow.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_page_names_the_extra() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("pyarrow") for d in extras["arrow"])
    assert "pip install 'tierd[arrow]'" in DOC.read_text()


def test_every_python_snippet_runs_as_pasted(
    moto_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{create_bucket(moto_server)}/prefix"
    so = moto_server.storage_options
    cfg = cold_config(tmp_path / "store", {"name": "s3", "url": url, "storage_options": so})
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch(
            [
                Message(
                    topic="orders" if i % 4 else "audit",
                    body=b"order %d" % i,
                    keys=[f"order-{i}"],
                    tags="paid" if i % 3 else "unpaid",
                    queue_id=i % 2,
                    properties={"UNIQ_KEY": f"u-{i}"},
                )
                for i in range(120)
            ]
        )
        assert store.tier_now().committed == 120
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", so["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", so["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    blocks = [body for lang, body in BLOCK.findall(DOC.read_text()) if lang == "python"]
    assert len(blocks) >= 5
    scope: dict[str, Any] = {}
    for block in blocks:
        code = block.replace("s3://bucket/prefix", url).replace(
            "http://127.0.0.1:9000", moto_server.endpoint_url
        )
        exec(compile(code, str(DOC), "exec"), scope)

    orders = [i for i in range(120) if i % 4]
    assert scope["table"].num_rows == len(orders)
    paid = scope["paid"].rows()
    assert paid == [(q, sum(1 for i in orders if i % 3 and i % 2 == q)) for q in (0, 1)]
    assert scope["by_tag"] == [
        ("paid", sum(1 for i in orders if i % 3)),
        ("unpaid", sum(1 for i in orders if i % 3 == 0)),
    ]
    assert scope["total"] == [(len(orders),)]
    assert scope["df"]["keys"].map(list).tolist() == [["order-42"]]
    assert scope["sizes"] == sum(len(b"order %d" % i) for i in orders if i % 2 == 0)
