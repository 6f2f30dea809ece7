"""The configured cold root: a ``[backend]`` section (or a bucket URL) → an open driver root.

This is where configuration meets the driver contract: :mod:`tierd.drivers.registry` finds the
driver class by name and knows nothing of tierd's settings; the daemon, ``verify`` and the
offline CLI commands open their root here, so a capability setting is applied (or refused) the
same way everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierd.drivers.registry import load_driver
from tierd.errors import ConfigError

if TYPE_CHECKING:
    from tierd.config import BackendConfig
    from tierd.drivers.segment import DriverRoot

__all__ = ["backend_for_url", "open_driver_factory"]


def open_driver_factory(config: BackendConfig) -> DriverRoot:
    """The :class:`~tierd.drivers.segment.DriverRoot` for a ``[backend]`` section: call
    ``root.driver(path)`` for each segment, ``await root.aclose()`` at shutdown. No I/O happens
    until a driver is used, so bad credentials or endpoints surface on first use as
    :class:`~tierd.errors.BackendError`. The capability settings (``conditional_writes``,
    ``server_side_copy``, ``single_writer``) go to roots that probe their server."""
    root = load_driver(config.name).open_root(config.url, config.storage_options)
    settings: dict[str, bool] = {
        name: value
        for name, value in (
            ("conditional_writes", config.conditional_writes),
            ("server_side_copy", config.server_side_copy),
        )
        if value is not None
    }
    if config.single_writer:
        settings["single_writer"] = True
    if settings:
        # Capability settings exist for drivers that probe their server (s3); elsewhere they
        # would be silently meaningless, so they are refused.
        apply = getattr(root, "apply_capability_settings", None)
        if apply is None:
            raise ConfigError(
                f"backend.{', backend.'.join(sorted(settings))} only apply to the s3 driver, "
                f"not to {config.name!r}",
                name=config.name,
            )
        apply(**settings)
    return root


def backend_for_url(url: str, base: BackendConfig) -> BackendConfig:
    """A ``[backend]`` section for a bucket URL given on the command line: the driver follows the
    scheme (``s3://`` → s3, ``memory://`` → memory, a path or ``file://`` → posix, any other
    fsspec URL → fsspec). Storage options carry over from ``base`` when it names the same
    driver, so ``--backend-url s3://other-bucket`` keeps the configured endpoint."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("", "file"):
        name, url = "posix", url.removeprefix("file://")
    elif scheme in ("s3", "s3a"):
        name, url = "s3", "s3://" + url.split("://", 1)[1]
    elif scheme == "memory":
        name = "memory"
    else:
        name = "fsspec"
    options = base.storage_options if base.name == name else {}
    return base.model_copy(update={"name": name, "url": url, "storage_options": options})
