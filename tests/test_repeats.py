"""FailureLog: a failure that repeats is logged once, then once per interval with a count."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tierd.errors import StoreFullError
from tierd.repeats import FailureLog

if TYPE_CHECKING:
    import pytest


def test_a_repeating_failure_is_logged_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = FailureLog(logging.getLogger("tierd.test"), "housekeeping", interval=60, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="tierd.test")
    err = StoreFullError("disk full")
    for _ in range(1000):  # a failure every 0.1 s for 100 s
        failures.failed(err, "retrying every 1 s")
        now[0] += 0.1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # at 0 s and at 60 s (1,000 calls over 100 s)
    assert lines[0] == "housekeeping failed: disk full; retrying every 1 s"
    assert lines[1].endswith("[599 more failure(s) in the last 60 s]")
    assert all(r.exc_info is None for r in caplog.records)  # an expected failure: no traceback
    failures.succeeded()
    failures.succeeded()
    assert caplog.records[-1].getMessage() == "housekeeping recovered after 1000 failure(s)"
    assert len(caplog.records) == 3
    failures.failed(RuntimeError("bug"))  # after recovery the next failure is news again
    assert caplog.records[-1].exc_info is not None  # not an expected kind: with its traceback
