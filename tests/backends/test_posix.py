"""The segment driver conformance suite on the ``posix`` driver (files under a temp dir)."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

import pytest

from backends.posix import PosixDriver
from tierd.testing.segment import SegmentDriverTests

if TYPE_CHECKING:
    from pathlib import Path


class TestPosixDriver(SegmentDriverTests):
    driver_cls = PosixDriver

    @pytest.fixture
    def root_config(self, tmp_path: Path) -> tuple[str, dict[str, Any]]:
        self.dir = tmp_path / "cold"
        return str(self.dir), {}

    def _file(self, path: str) -> Path:
        return self.dir.joinpath(*path.split("/"))

    def backdoor_write(self, path: str, data: bytes) -> None:
        f = self._file(path)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)

    def backdoor_read(self, path: str) -> bytes | None:
        f = self._file(path)
        return f.read_bytes() if f.is_file() else None

    def backdoor_objects(self, path: str) -> list[str]:
        f = self._file(path)
        return [str(f)] if f.exists() else []

    def test_sealed_file_is_read_only_on_disk(self, root_config: tuple[str, dict[str, Any]]) -> None:
        async def main() -> None:
            d = PosixDriver.open_root(*root_config).driver("a/b")
            await d.write(0, b"abc")
            await d.seal()

        asyncio.run(main())
        assert not os.stat(self._file("a/b")).st_mode & 0o222
