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

from tierd.drivers.segment import SegmentDriver
from tierd.errors import DriverDependencyError, DriverNotFoundError

__all__ = ["ENTRY_POINT_GROUP", "installed_drivers", "load_driver"]

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
