"""The open-files limit is shared out in one table (``tierd.descriptors.SHARES``)."""

from __future__ import annotations

import logging
import resource
from typing import TYPE_CHECKING

from tierd.descriptors import RESERVED, SHARES, descriptor_bound

if TYPE_CHECKING:
    from collections.abc import Iterator

import pytest


@pytest.fixture
def soft_limit_256() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_holders_leave_room_for_the_commitlog_index_and_cold_tier() -> None:
    assert RESERVED >= 1 / 16
    assert all(0 < share < 1 for share in SHARES.values())


def test_a_setting_above_the_share_is_capped_and_said(
    soft_limit_256: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="tierd.descriptors"):
        assert descriptor_bound("http", 10_000, "server.max_connections") == 128
        assert descriptor_bound("consume_queues", 10_000, "store.max_open_queue_files") == 64
        assert descriptor_bound("grpc", 10, "grpc.max_connections") == 10  # under its share: as set
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "server.max_connections is 10000" in lines[0]
    assert "1/2 of the open-files limit 256" in lines[0]
