"""The segment driver conformance suite on the ``fsspec`` driver, over fsspec's ``memory://``
and ``file://`` filesystems (the same chunk scheme as S3, composed on the client)."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

import fsspec
import pytest

import tierd.drivers.fsspec
from tierd.drivers._objects import TEMP_MARKER
from tierd.drivers.fsspec import FsspecDriver, FsspecRoot
from tierd.errors import BackendError, ObjectExistsError, UnsupportedOperationError
from tierd.testing.s3server import create_bucket
from tierd.testing.segment import SegmentDriverTests

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tierd.testing.s3server import S3Server


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


# ---------------------------------------------------------------------------- whole objects
def test_object_put_on_a_filesystem_without_atomic_pipe_moves_a_temporary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pretend memory:// were such a filesystem (sftp, hdfs, ...): write a temporary, then move it.
    monkeypatch.setattr(tierd.drivers.fsspec, "ATOMIC_PIPE_PROTOCOLS", frozenset())
    fs = fsspec.filesystem("memory")
    base = f"/tierd-{uuid.uuid4().hex}"
    moves: list[tuple[str, str]] = []
    real_mv = fs.mv

    def spy_mv(path1: str, path2: str, **kwargs: Any) -> None:
        moves.append((path1, path2))
        real_mv(path1, path2, **kwargs)

    async def main() -> None:
        root = FsspecRoot(f"memory://{base}")
        await root.driver("q/seg").write(0, b"segment")
        root.filesystem()[0].mv = spy_mv
        await root.put_object("q/MANIFEST.json", b"v1")
        await root.put_object("q/MANIFEST.json", b"v2")
        assert await root.get_object("q/MANIFEST.json") == b"v2"
        assert await root.list_objects("q") == ["q/MANIFEST.json", "q/seg"]
        with pytest.raises(BackendError, match="directory"):
            await root.put_object("q", b"x")  # a move would land inside the directory

    try:
        asyncio.run(main())
        assert len(moves) == 2
        assert all(TEMP_MARKER in src and dst == f"{base}/q/MANIFEST.json" for src, dst in moves)
        assert sorted(fs.ls(f"{base}/q", detail=False)) == [f"{base}/q/MANIFEST.json", f"{base}/q/seg.chunks"]
    finally:
        fs.rm(base, recursive=True)


def test_object_listing_hides_sealing_and_temporary_files(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    base = tmp_path / "cold"
    fs.makedirs(str(base / "q" / "seg.chunks"))
    fs.pipe_file(str(base / "q" / "seg.sealing"), b"compose in progress")
    fs.pipe_file(str(base / "q" / f"MANIFEST.json{TEMP_MARKER}{'a' * 32}"), b"crashed put")
    fs.pipe_file(str(base / "q" / "seg.chunks" / f"{0:020d}"), b"chunk")

    async def main() -> list[str]:
        root = FsspecRoot(f"file://{base}")
        await root.put_object("q/MANIFEST.json", b"{}")
        return await root.list_objects("")

    assert asyncio.run(main()) == ["q/MANIFEST.json", "q/seg"]
    assert sorted(p.name for p in (base / "q").iterdir()) == [
        "MANIFEST.json",
        f"MANIFEST.json{TEMP_MARKER}{'a' * 32}",  # only the crashed put's own leftover
        "seg.chunks",
        "seg.sealing",
    ]


# ---------------------------------------------------------------------------- create-if-absent
def test_create_object_is_refused_where_the_filesystem_cannot_guarantee_it() -> None:
    # fsspec's "dir" wrapper (over memory) is one of the many filesystems with no exclusive create.
    base = f"/tierd-{uuid.uuid4().hex}"

    async def main() -> None:
        root = FsspecRoot("dir://", {"path": base, "target_protocol": "memory"})
        assert root.supports_create_object is False
        with pytest.raises(UnsupportedOperationError, match="no atomic create-if-absent"):
            await root.create_object("owner/1", b"claim")
        assert await root.list_objects("") == []  # nothing was written

    asyncio.run(main())


def test_create_object_on_s3_through_s3fs_is_a_conditional_put(moto_server: S3Server) -> None:
    bucket = create_bucket(moto_server)
    url = f"s3://{bucket}/fs"

    async def main() -> None:
        roots = [FsspecRoot(url, dict(moto_server.storage_options)) for _ in range(4)]
        assert all(r.supports_create_object for r in roots)
        results = await asyncio.gather(
            *(r.create_object("owner/1", b"claimant-%d" % i) for i, r in enumerate(roots)),
            return_exceptions=True,
        )
        winners = [i for i, res in enumerate(results) if res is None]
        assert len(winners) == 1, results
        assert all(isinstance(res, ObjectExistsError) for res in results if res is not None)
        assert await roots[0].get_object("owner/1") == b"claimant-%d" % winners[0]

    asyncio.run(main())
