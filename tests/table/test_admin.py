"""Opting a topic in to its table is configuration (docs/table.md, "Why configuration only"):
``PATCH /v1/topics/{topic}`` with ``table`` says so, with the way that works, and changes
nothing — rather than a 422 about an unknown field, or a 200 for a table nobody writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierd import TierdConfig

from ..service.conftest import running, service_config

if TYPE_CHECKING:
    from pathlib import Path


def test_patch_table_is_refused_with_the_configuration_that_does_it(tmp_path: Path) -> None:
    with running(TierdConfig.from_dict(service_config(tmp_path))) as svc:
        c = svc.client
        assert c.post("/v1/topics", json={"name": "orders", "queues": 2}).status_code in (200, 201)
        before = c.get("/v1/topics/orders").json()
        r = c.patch("/v1/topics/orders", json={"table": "iceberg", "queues": 4})
        assert r.status_code == 400, r.text
        error = r.json()
        assert error["error"] == "invalid_argument"
        assert '[topics.orders] table = "iceberg"' in error["message"]
        assert "Traceback" not in r.text
        assert c.get("/v1/topics/orders").json() == before  # nothing of the call applied
