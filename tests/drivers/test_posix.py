"""The segment driver conformance suite on the ``posix`` driver (files under a temp dir)."""

from __future__ import annotations

import asyncio
import errno
import os
from typing import TYPE_CHECKING, Any

import pytest

from tierd.drivers._objects import TEMP_MARKER
from tierd.drivers.posix import PosixDriver, PosixRoot
from tierd.drivers.segment import ByteRange
from tierd.errors import BackendError
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

    def test_read_into_receives_straight_into_the_buffer(
        self, root_config: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The cold read path receives batches into buffers it reuses: the posix driver reads
        into them with ``preadv``, never through a ``bytes`` of the range and a second copy."""
        data = bytes(range(256)) * 64

        async def main() -> bytearray:
            d = PosixDriver.open_root(*root_config).driver("a/b")
            await d.write(0, data)
            monkeypatch.setattr("tierd.drivers.posix._pread_exact", _no_bytes_read)
            out = bytearray(5000)
            await d.read_into(ByteRange(1000, 5000), memoryview(out))
            return out

        assert asyncio.run(main()) == data[1000:6000]


def _no_bytes_read(fd: int, length: int, offset: int) -> bytes:
    raise AssertionError(f"read_into made bytes of [{offset}, {offset + length})")


# ---------------------------------------------------------------------------- whole objects
def _posix_root(directory: Path, **options: Any) -> PosixRoot:
    return PosixRoot(str(directory), options)


def test_object_put_leaves_no_temporary_files(tmp_path: Path) -> None:
    async def main() -> None:
        root = _posix_root(tmp_path)
        for i in range(5):
            await root.put_object("b/MANIFEST.json", b"v%d" % i)
        assert await root.get_object("b/MANIFEST.json") == b"v4"

    asyncio.run(main())
    assert sorted(os.listdir(tmp_path / "b")) == ["MANIFEST.json"]
    assert os.stat(tmp_path / "b" / "MANIFEST.json").st_mode & 0o777 == 0o644


def test_object_temporaries_of_a_crashed_put_are_not_listed(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / f"MANIFEST.json{TEMP_MARKER}{'0' * 32}").write_bytes(b"half")
    (tmp_path / "b" / "MANIFEST.json.tierd-tmp-notours").write_bytes(b"a real object")

    async def main() -> list[str]:
        return await _posix_root(tmp_path).list_objects("")

    assert asyncio.run(main()) == ["b/MANIFEST.json.tierd-tmp-notours"]


def test_object_failed_put_keeps_the_old_file_and_removes_its_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _posix_root(tmp_path)
    asyncio.run(root.put_object("b/MANIFEST.json", b"old"))

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(BackendError, match="Input/output error"):
        asyncio.run(root.put_object("b/MANIFEST.json", b"new"))
    monkeypatch.undo()
    assert asyncio.run(root.get_object("b/MANIFEST.json")) == b"old"
    assert os.listdir(tmp_path / "b") == ["MANIFEST.json"]


def test_object_put_over_a_directory_is_a_backend_error(tmp_path: Path) -> None:
    async def main() -> None:
        root = _posix_root(tmp_path)
        await root.driver("q/COMMIT_LOG/seg").write(0, b"abc")
        with pytest.raises(BackendError, match="directory"):
            await root.put_object("q/COMMIT_LOG", b"x")
        assert await root.driver("q/COMMIT_LOG/seg").read_all() == b"abc"
        assert await root.list_objects("q") == ["q/COMMIT_LOG/seg"]

    asyncio.run(main())
    assert os.listdir(tmp_path / "q") == ["COMMIT_LOG"]


def test_object_api_without_fsync(tmp_path: Path) -> None:
    async def main() -> None:
        root = _posix_root(tmp_path, fsync=False)
        await root.put_object("a/b/c", b"abc")
        assert await root.list_objects("a") == ["a/b/c"]
        await root.delete_object("a/b/c")
        assert await root.list_objects("") == []

    asyncio.run(main())
