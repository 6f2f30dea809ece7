"""Driver registry: entry points, unknown names, missing optional dependencies, config → root."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tierd.config import BackendConfig
from tierd.drivers.memory import MemoryDriver, MemoryRoot, drop_namespace
from tierd.drivers.posix import PosixDriver
from tierd.drivers.registry import installed_drivers, load_driver
from tierd.errors import ConfigError, DriverDependencyError, DriverNotFoundError, InvalidArgumentError
from tierd.tiered.roots import open_driver_factory


def test_shipped_drivers_are_registered() -> None:
    assert {"posix", "memory", "s3", "fsspec"} <= set(installed_drivers())
    assert load_driver("posix") is PosixDriver
    assert load_driver("memory") is MemoryDriver
    assert load_driver("s3").__name__ == "S3Driver"
    assert load_driver("fsspec").__name__ == "FsspecDriver"


def test_unknown_driver_lists_the_installed_ones() -> None:
    with pytest.raises(DriverNotFoundError) as exc:
        load_driver("ftp")
    message = str(exc.value)
    assert "'ftp'" in message
    assert "backend.name" in message
    for name in ("fsspec", "memory", "posix", "s3"):
        assert name in message
    assert isinstance(exc.value, ConfigError)  # and a ValueError for plain-Python callers


def test_missing_optional_dependency_gives_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tierd.drivers.s3", raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)  # makes `import s3fs` raise ImportError
    with pytest.raises(DriverDependencyError) as exc:
        load_driver("s3")
    assert "pip install 'tierd[s3]'" in str(exc.value)
    assert "s3fs" in str(exc.value)
    assert isinstance(exc.value, ImportError)
    assert isinstance(exc.value.__cause__, ImportError)


def test_config_selects_the_driver(tmp_path: object) -> None:
    root = open_driver_factory(BackendConfig(name="memory", url="memory://registry-test"))
    assert isinstance(root, MemoryRoot)

    async def main() -> bytes:
        async with root:
            d = root.driver("a/b")
            await d.write(0, b"via config")
            return await d.read_all()

    try:
        assert asyncio.run(main()) == b"via config"
    finally:
        drop_namespace("registry-test")


def test_config_with_bad_options_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        open_driver_factory(BackendConfig(name="posix", url="/tmp/x", storage_options={"bogus": 1}))
    with pytest.raises(InvalidArgumentError):
        open_driver_factory(BackendConfig(name="s3", url="not-a-bucket-url"))


def test_wrappers_cannot_be_opened_by_url() -> None:
    from tierd.testing.faults import FaultyDriver

    with pytest.raises(TypeError):
        FaultyDriver.open_root("memory://x")
