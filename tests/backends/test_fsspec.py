"""The segment driver conformance suite on the ``fsspec`` driver, over fsspec's ``memory://``
and ``file://`` filesystems (the same chunk scheme as S3, composed on the client)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import fsspec
import pytest

from backends.fsspec import FsspecDriver
from tierd.testing.segment import SegmentDriverTests

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


class TestFsspecDriver(SegmentDriverTests):
    driver_cls = FsspecDriver

    @pytest.fixture(params=["memory", "file"])
    def root_config(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        if request.param == "memory":
            self.fs = fsspec.filesystem("memory")
            self.base = f"/tierd-{uuid.uuid4().hex}"
            yield f"memory://{self.base}", {}
            if self.fs.exists(self.base):
                self.fs.rm(self.base, recursive=True)
        else:
            self.fs = fsspec.filesystem("file")
            self.base = str(tmp_path / "cold")
            yield f"file://{self.base}", {"auto_mkdir": True}

    def _key(self, path: str) -> str:
        return f"{self.base}/{path}"

    def backdoor_write(self, path: str, data: bytes) -> None:
        self.fs.makedirs(self.fs._parent(self._key(path)), exist_ok=True)
        self.fs.pipe_file(self._key(path), data)

    def backdoor_objects(self, path: str) -> list[str]:
        key = self._key(path)
        found = [key] if self.fs.isfile(key) else []
        if self.fs.isdir(key + ".chunks"):
            found += sorted(self.fs.ls(key + ".chunks", detail=False))
        return found

    def backdoor_read(self, path: str) -> bytes | None:
        key = self._key(path)
        if self.fs.isfile(key):
            return bytes(self.fs.cat_file(key))
        chunks = [k for k in self.backdoor_objects(path) if k != key]
        if not chunks:
            return None
        return b"".join(bytes(self.fs.cat_file(k)) for k in chunks)
