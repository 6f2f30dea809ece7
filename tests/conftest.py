"""Shared fixtures. Tests never see the developer's own TIERD_* environment."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("TIERD_"):
            monkeypatch.delenv(key)
    yield
