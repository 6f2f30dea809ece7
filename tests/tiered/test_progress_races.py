"""Races in tiering progress: two seal passes over one flat file (issue 29, case 5).

The dispatcher seals rolled segments after each commit and the maintenance task retries failed
seals every ``manifest_interval``; both call :meth:`FlatAppendFile.seal_pending` on the same
list. A second pass starting while the first awaits the backend used to seal the same segment
again and remove it from the list a second time (``ValueError: list.remove(x)``), which
surfaced as a 502 ``backend_error`` on ``POST /v1/admin/tier`` with a healthy backend.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from tierd.config import BackendConfig
from tierd.drivers.segment import FileType
from tierd.tiered.flatfile import FlatAppendFile
from tierd.tiered.roots import open_driver_factory

if TYPE_CHECKING:
    from pathlib import Path


def test_a_second_seal_pass_during_the_first_neither_fails_nor_seals_twice(tmp_path: Path) -> None:
    """The first pass's metadata hook (``on_change``, awaited after each seal) starts a second
    pass: the interleaving a maintenance pass meets when it starts while a commit's pass
    awaits the backend, made deterministic. Both passes end without error, every rolled
    segment is sealed once, with its checksum, and the list of segments to seal is empty."""
    root = open_driver_factory(BackendConfig(name="posix", url=str(tmp_path / "cold")))
    nested: list[int] = []
    changes_after_seal: list[int] = []

    async def on_change(f: FlatAppendFile) -> None:
        sealed = f.sealed_count
        if sealed:
            changes_after_seal.append(sealed)
        if sealed and not nested:  # the first pass has sealed one segment and awaits this hook
            nested.append(len(f.unsealed_full))
            await f.seal_pending()

    async def scenario() -> FlatAppendFile:
        f = FlatAppendFile(root, "c", "b", "t", 0, FileType.COMMIT_LOG, 100, on_change=on_change)
        await f.init_offset(0)
        now = int(time.time() * 1000)
        for i in range(4):  # 60-byte records in 100-byte segments: each append rolls
            await f.append(bytes([i]) * 60, now)
        await f.commit()  # commits the four segments, then seals the three rolled ones
        await root.aclose()
        return f

    f = asyncio.run(scenario())
    assert nested == [2], "the second pass must start while two rolled segments wait for a seal"
    assert f.unsealed_full == []
    infos = f.infos()
    assert [(i.base_offset, i.sealed) for i in infos] == [(0, True), (60, True), (120, True), (180, False)]
    assert all(i.crc32c is not None for i in infos[:3])
    assert changes_after_seal == [1, 2, 3], "each segment is recorded sealed exactly once"
