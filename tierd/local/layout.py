"""The layout record: the settings that fix the shape of a store's files, kept with the store.

``commitlog_file_size``, ``consumequeue_file_units``, ``index_slots`` and ``index_items`` decide
how big each file is and where every byte lives in it (a record's file is its offset divided by
the file size; a unit's file its queue offset divided by the units per file). Opening existing
files with other values is not a setting change, it is a misreading: before this record, a store
made with 1 MiB commitlog files and opened with the 1 GiB default had its files *grown* to 1 GiB
(even by ``tierd verify``), after which it refused to open with the right setting too.

So the values are written to ``{store.dir}/layout.json`` when the store is created, and every
open compares the configuration with it *before anything is written*: a difference is a
:class:`~tierd.errors.ConfigError` naming the setting, the value the store was created with and
the value configured. A store from before this record (or a RocketMQ store directory) has its
layout read off its files — names and sizes — and recorded once it matched.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from tierd.errors import ConfigError, CorruptionError
from tierd.format.cq_unit import UNIT_SIZE
from tierd.local.index import index_file_size
from tierd.local.mapped_file import fsync_dir

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.config import StoreConfig

LAYOUT_FILE = "layout.json"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Layout:
    """The layout settings (names are the ``[store]`` keys)."""

    commitlog_file_size: int
    consumequeue_file_units: int
    index_slots: int
    index_items: int

    @classmethod
    def of(cls, cfg: StoreConfig) -> Layout:
        return cls(cfg.commitlog_file_size, cfg.consumequeue_file_units, cfg.index_slots, cfg.index_items)

    def to_json(self) -> dict[str, Any]:
        return {"format-version": FORMAT_VERSION, **{k.replace("_", "-"): v for k, v in asdict(self).items()}}

    @classmethod
    def from_json(cls, raw: object, path: Path) -> Layout:
        def bad(why: str) -> CorruptionError:
            return CorruptionError(f"layout record {path} is not valid: {why}", path=str(path))

        if not isinstance(raw, dict) or raw.get("format-version") != FORMAT_VERSION:
            raise bad("not a format-version 1 layout record")
        values = {f.name: raw.get(f.name.replace("_", "-")) for f in fields(cls)}
        for name, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise bad(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        return cls(**values)  # type: ignore[arg-type]


def _file_names(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.isdigit() and len(p.name) == 20 and p.is_file())


def _file_span(directory: Path) -> int | None:
    """Bytes per file of a queue of fixed-size files named by start offset: the distance between
    two names, else the size of the only (preallocated) file; None when there is none."""
    names = _file_names(directory)
    if len(names) >= 2:
        return int(names[1].name) - int(names[0].name)
    if names and (size := names[0].stat().st_size) > 0:
        return size
    return None


#: A contradiction: (setting, value of the store, value configured, message).
Problem = tuple[str, int, int, str]


def _mismatch(name: str, found: int, want: int, why: str) -> Problem:
    return (
        name,
        found,
        want,
        f"store.{name} is configured as {want}, but the store was created with {found} ({why})",
    )


def _found_on_disk(store_dir: Path, cfg: StoreConfig) -> list[Problem]:
    """A store without a layout record: each layout setting its files contradict."""
    out: list[Problem] = []
    commitlog = _file_span(store_dir / "commitlog")
    if commitlog is not None and commitlog != cfg.commitlog_file_size:
        why = f"its commitlog files hold {commitlog} bytes"
        out.append(_mismatch("commitlog_file_size", commitlog, cfg.commitlog_file_size, why))
    cq_root = store_dir / "consumequeue"
    topics = sorted(t for t in cq_root.iterdir() if t.is_dir()) if cq_root.is_dir() else []
    for qdir in (q for t in topics for q in sorted(t.iterdir()) if q.is_dir()):
        span = _file_span(qdir)
        if span is None:
            continue
        if span % UNIT_SIZE or span // UNIT_SIZE != cfg.consumequeue_file_units:
            why = f"its consume-queue files hold {span} bytes ({qdir})"
            out.append(
                _mismatch("consumequeue_file_units", span // UNIT_SIZE, cfg.consumequeue_file_units, why)
            )
        break
    index_dir = store_dir / "index"
    index_files = sorted(p for p in index_dir.iterdir() if p.is_file()) if index_dir.is_dir() else []
    expected = index_file_size(cfg.index_slots, cfg.index_items)
    sizes = [size for p in index_files if (size := p.stat().st_size)]
    if sizes and sizes[0] != expected:
        out.append(
            (
                "index_slots/index_items",
                sizes[0],
                expected,
                f"store.index_slots = {cfg.index_slots} and store.index_items = {cfg.index_items} make "
                f"{expected}-byte index files, but the store's index files hold {sizes[0]} bytes",
            )
        )
    return out


def _write(path: Path, layout: Layout) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        json.dump(layout.to_json(), fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def check_layout(store_dir: Path, cfg: StoreConfig, *, read_only: bool = False) -> Layout:
    """Compare the configured layout with the store's (recorded, or read off its files) and
    refuse a difference before anything is written; record it for a store that has none yet
    (not when ``read_only``: ``tierd verify`` writes nothing). Call with the store lock held."""
    path = store_dir / LAYOUT_FILE
    configured = Layout.of(cfg)
    if path.exists():
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CorruptionError(f"layout record {path} is not readable JSON: {e}", path=str(path)) from e
        recorded = Layout.from_json(raw, path)
        problems = [
            _mismatch(f.name, getattr(recorded, f.name), getattr(configured, f.name), f"recorded in {path}")
            for f in fields(Layout)
            if getattr(recorded, f.name) != getattr(configured, f.name)
        ]
    else:
        problems = _found_on_disk(store_dir, cfg)
    if problems:
        fix = ", ".join(f"store.{name} = {found}" for name, found, _, _ in problems if "/" not in name)
        raise ConfigError(
            f"{store_dir}: {'; '.join(p[3] for p in problems)}. These settings fix where every byte "
            "lives and cannot change for an existing store; nothing was written. Set "
            f"{fix or 'the values the store was created with'} (or use a new store.dir).",
            store_dir=str(store_dir),
            settings={name: {"store": found, "configured": want} for name, found, want, _ in problems},
        )
    if not path.exists() and not read_only:
        _write(path, configured)
    return configured
