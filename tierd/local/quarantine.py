"""Quarantined commitlog ranges: damage found in the hot commitlog, set aside, never served.

When recovery meets bytes that are not a valid record (bad magic, framing or CRC) but finds
valid records after them, those bytes are *damage*, not the end of the log: every later record is
kept, and the damaged range ``[start, end)`` is quarantined. Its bytes stay where they are (offsets
never move) and are also copied to ``{store.dir}/quarantine/{start}-{end}.bin`` for inspection;
``{store.dir}/quarantine/ranges.json`` lists every range with the messages known to be lost in
it (topic, queue id, queue offset).

The lost messages leave a *hole* in their queues: the consume-queue unit of each points into the
quarantined range, so a read knows it as a hole — not as a corrupt record — and reports it with
``OFFSET_FOUND_NULL`` and a ``next_offset`` past it (the loss is known, logged, counted and listed
by ``tierd verify``). The tiering dispatcher carries holes to the cold tier as units without
bytes (size 0).
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tierd.errors import CorruptionError
from tierd.local.mapped_file import fsync_dir

if TYPE_CHECKING:
    from pathlib import Path

    import numpy.typing as npt

log = logging.getLogger(__name__)
QUARANTINE_DIR = "quarantine"
RANGES_FILE = "ranges.json"
#: Bytes of a damaged range copied aside (the rest stays only in the commitlog).
COPY_LIMIT = 64 * 1024 * 1024

#: A message known lost: (topic, queue id, queue offset).
Lost = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class QuarantinedRange:
    start: int
    end: int
    #: When it was found (ms since the epoch).
    found_at: int
    lost: tuple[Lost, ...]
    #: File under the quarantine directory holding a copy of the damaged bytes (None: none made).
    copy: str | None
    #: What happened to the bytes (None: damaged in place; else e.g. the file that went missing).
    what: str | None = None

    def describe(self) -> str:
        lost = ", ".join(f"{t}/{q}@{o}" for t, q, o in self.lost[:10])
        more = f" and {len(self.lost) - 10} more" if len(self.lost) > 10 else ""
        return (
            f"commitlog bytes [{self.start}, {self.end}) are {self.what or 'damaged'} and quarantined"
            + (f" (copy: {QUARANTINE_DIR}/{self.copy})" if self.copy else "")
            + (f"; lost: {lost}{more}" if lost else "; no message known lost")
        )


class Quarantine:
    """The quarantined ranges of one store (sorted, non-overlapping), persisted atomically."""

    def __init__(self, store_dir: Path, *, read_only: bool = False) -> None:
        self.dir = store_dir / QUARANTINE_DIR
        self.ranges: list[QuarantinedRange] = []
        self._starts: list[int] = []
        #: ``tierd verify`` without --repair: :meth:`add` keeps a range in memory only (reads
        #: and checks treat it as quarantined) and lists its start in :attr:`pending`.
        self.read_only = read_only
        #: Starts of ranges found by this read-only open and not recorded on disk.
        self.pending: set[int] = set()

    def load(self) -> None:
        path = self.dir / RANGES_FILE
        if not path.exists():
            return
        try:
            raw = json.loads(path.read_text())
            ranges = [
                QuarantinedRange(
                    int(r["start"]),
                    int(r["end"]),
                    int(r["found-at"]),
                    tuple((str(t), int(q), int(o)) for t, q, o in r["lost"]),
                    r.get("copy"),
                    r.get("what"),
                )
                for r in raw["ranges"]
            ]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"quarantine record {path} is not valid: {e}", path=str(path)) from e
        self._set(ranges)

    def _set(self, ranges: list[QuarantinedRange]) -> None:
        self.ranges = sorted(ranges, key=lambda r: r.start)
        self._starts = [r.start for r in self.ranges]

    @property
    def lost_messages(self) -> int:
        return sum(len(r.lost) for r in self.ranges)

    def covers(self, offset: int) -> QuarantinedRange | None:
        """The quarantined range holding commitlog ``offset``, if any."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0 and offset < self.ranges[i].end:
            return self.ranges[i]
        return None

    def covers_many(self, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """For each commitlog offset: is it inside a quarantined range?"""
        if not self.ranges:
            return np.zeros(len(offsets), np.bool_)
        starts = np.asarray(self._starts, np.int64)
        ends = np.asarray([r.end for r in self.ranges], np.int64)
        i = np.searchsorted(starts, offsets, side="right") - 1
        hit: npt.NDArray[np.bool_] = (i >= 0) & (offsets < ends[np.maximum(i, 0)])
        return hit

    def add(
        self, start: int, end: int, data: bytes | memoryview, lost: list[Lost], what: str | None = None
    ) -> QuarantinedRange:
        """Record a damaged range (a copy of its first :data:`COPY_LIMIT` bytes is kept; no copy
        when there are no bytes — a missing file). ``what``: see :attr:`QuarantinedRange.what`."""
        if self.read_only:
            found = QuarantinedRange(start, end, int(time.time() * 1000), tuple(lost), None, what)
            self._set([*(r for r in self.ranges if r.start != start), found])
            self.pending.add(start)
            return found
        self.dir.mkdir(parents=True, exist_ok=True)
        name: str | None = None
        if len(data):
            name = f"{start:020d}-{end:020d}.bin"
            tmp = self.dir / (name + ".tmp")
            with tmp.open("wb") as fh:
                fh.write(data[:COPY_LIMIT])
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.dir / name)
        found = QuarantinedRange(start, end, int(time.time() * 1000), tuple(lost), name, what)
        self._set([*(r for r in self.ranges if r.start != start), found])
        self._save()
        return found

    def _save(self) -> None:
        path = self.dir / RANGES_FILE
        tmp = self.dir / (RANGES_FILE + ".tmp")
        doc = {
            "format-version": 1,
            "ranges": [
                {"start": r.start, "end": r.end, "found-at": r.found_at, "lost": r.lost, "copy": r.copy}
                | ({"what": r.what} if r.what else {})
                for r in self.ranges
            ],
        }
        with tmp.open("w") as fh:
            json.dump(doc, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(self.dir)
