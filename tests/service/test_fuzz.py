"""Property-based fuzzing of the whole API from its own OpenAPI document (schemathesis).

Every operation gets ``EXAMPLES`` generated requests (valid and invalid ones) against a real
daemon with a posix cold tier. Operations without parameters exhaust after a case or two, so
``EXAMPLES`` is set for the seven parametrised ones to give ≥ 1000 requests per run — the module
fixture counts them and fails if a full run made fewer. Whatever the input,
the server must never answer 5xx (``not_a_server_error``), must answer with the documented
status codes, content types and response schemas, and must reject what the schema forbids.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tierd import TierdConfig
from tierd.service.app import create_app

from .conftest import running, service_config

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .conftest import Running

EXAMPLES = 150
MIN_CASES = 1000
#: Requests sent per operation (checked when the module's daemon stops).
SENT: dict[str, int] = {}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("fuzz")
    # Long polls bounded at 100 ms: a generated wait_ms must not park the fuzzer for 30 s.
    with running(TierdConfig.from_dict(service_config(root, server={"long_poll_max_ms": 100}))) as r:
        # Some data, so reads, key queries and segment listings have something to find.
        r.client.post("/v1/topics/orders/messages", json={"body": "aGVsbG8=", "keys": ["k"], "queue_id": 0})
        r.client.post("/v1/admin/tier", json={})
        yield r
    if len(SENT) == OPERATIONS:  # a full run (not a -k selection)
        assert sum(SENT.values()) >= MIN_CASES, SENT


# The schema comes from the app itself (no server needed at import time: the OpenAPI document
# does not depend on the store); cases are sent over HTTP to the daemon (``base_url``).
# (schemathesis' lazy ``from_fixture`` loader does not work with pytest 9.)
SPEC = create_app(TierdConfig.from_dict(service_config(Path("/nonexistent"))), lambda: None).openapi()
OPERATIONS = sum(len(ops) for ops in SPEC["paths"].values())
schema = schemathesis.openapi.from_dict(SPEC)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    print_blob=True,
)
def test_api_never_fails_and_follows_its_schema(daemon: Running, case: schemathesis.Case[Any]) -> None:
    key = case.operation.label  # per operation, whatever method a case probes it with
    SENT[key] = SENT.get(key, 0) + 1
    case.call_and_validate(base_url=daemon.url, checks=CHECKS)
