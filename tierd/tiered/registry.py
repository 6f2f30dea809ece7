"""Driver registry: ``[backend] name`` → driver class, through the ``tierd.backends`` entry points.

Why entry points: a third-party package adds a driver by declaring one line in its own
``pyproject.toml`` (``[project.entry-points."tierd.backends"] mydrv = "pkg.mod:MyDriver"``);
tierd needs no import of it and no central list. Loading is lazy (the module is imported only
when its name is configured), so a missing optional dependency (s3fs for ``s3``) only matters
to users who pick that driver — and then they get :class:`~tierd.errors.DriverDependencyError`
naming what to install instead of a bare ImportError.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

from tierd.errors import ConfigError, DriverDependencyError, DriverNotFoundError
from tierd.tiered.segment import SegmentDriver

if TYPE_CHECKING:
    from tierd.config import BackendConfig
    from tierd.tiered.segment import DriverRoot

__all__ = ["ENTRY_POINT_GROUP", "installed_drivers", "load_driver", "open_driver_factory"]

ENTRY_POINT_GROUP = "tierd.backends"

#: Install hints for drivers shipped with tierd whose dependencies are optional extras.
_EXTRAS = {"s3": "s3", "fsspec": "s3"}


def _entry_points() -> dict[str, metadata.EntryPoint]:
    # First registration of a name wins, so a duplicate in another distribution cannot silently
    # shadow a built-in driver depending on import order.
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def installed_drivers() -> list[str]:
    """Names of every registered driver, sorted."""
    return sorted(_entry_points())


def load_driver(name: str) -> type[SegmentDriver]:
    """The driver class registered as ``name``.

    Raises :class:`~tierd.errors.DriverNotFoundError` (listing the installed names) for an
    unknown name and :class:`~tierd.errors.DriverDependencyError` (with an install hint) when the
    driver's module cannot be imported.
    """
    eps = _entry_points()
    ep = eps.get(name)
    if ep is None:
        installed = ", ".join(sorted(eps)) or "none"
        raise DriverNotFoundError(
            f"no segment driver named {name!r} (backend.name); installed drivers: {installed}",
            name=name,
            installed=sorted(eps),
        )
    try:
        cls = ep.load()
    except ImportError as e:
        missing = getattr(e, "name", None) or str(e)
        extra = _EXTRAS.get(name)
        hint = (
            f"pip install 'tierd[{extra}]'"
            if extra
            else f"install the package that provides it (entry point {ep.value})"
        )
        raise DriverDependencyError(
            f"segment driver {name!r} needs {missing!r}, which is not installed: {hint}",
            name=name,
            missing=missing,
        ) from e
    if not (isinstance(cls, type) and issubclass(cls, SegmentDriver)):
        raise DriverNotFoundError(
            f"entry point {name!r} = {ep.value} is not a SegmentDriver subclass", name=name
        )
    return cls


def open_driver_factory(config: BackendConfig) -> DriverRoot:
    """The :class:`~tierd.tiered.segment.DriverRoot` for a ``[backend]`` section: call
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
