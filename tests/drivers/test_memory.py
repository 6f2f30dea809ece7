"""The segment driver conformance suite on the ``memory`` driver."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from tierd.drivers.memory import MemoryDriver, StoredSegment, drop_namespace, namespace
from tierd.testing.segment import SegmentDriverTests

if TYPE_CHECKING:
    from collections.abc import Iterator


class TestMemoryDriver(SegmentDriverTests):
    driver_cls = MemoryDriver

    @pytest.fixture
    def root_config(self) -> Iterator[tuple[str, dict[str, Any]]]:
        self.name = f"test-{uuid.uuid4().hex}"
        yield f"memory://{self.name}", {}
        drop_namespace(self.name)

    def backdoor_write(self, path: str, data: bytes) -> None:
        namespace(self.name)[path] = StoredSegment(bytearray(data))

    def backdoor_read(self, path: str) -> bytes | None:
        seg = namespace(self.name).get(path)
        return None if seg is None else bytes(seg.data)

    def backdoor_objects(self, path: str) -> list[str]:
        return [path] if path in namespace(self.name) else []
