"""First writes into directories a listing found empty (``DriverRoot.expect_new_dirs``).

A tiering round that creates queues lists each topic's directory once, delimited (a page per
1,000 queue directories); the first write of every segment in a queue directory found empty is
then a create-only PUT with no confirming listing of its own — two listings per new queue saved.
A directory holding anything, one the listing did not reach, or any write after
:meth:`forget_new_dirs` keeps the per-segment rules (blind write confirmed by a listing, or a
listing first), so nothing already stored is ever written over.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from tierd.drivers import s3 as s3_driver
from tierd.drivers.s3 import S3Root
from tierd.drivers.segment import ByteRange
from tierd.errors import CorruptionError
from tierd.testing.s3server import create_bucket

if TYPE_CHECKING:
    from tierd.testing.s3server import S3Server


async def _ops(root: S3Root) -> list[str]:
    """A live log of the root's S3 operations."""
    fs = await root.filesystem()
    ops: list[str] = []
    fs.s3.meta.events.register("before-call.s3", lambda model, **_: ops.append(model.name))
    return ops


def test_first_writes_into_directories_listed_empty_need_no_listing_of_their_own(
    moto_server: S3Server,
) -> None:
    bucket = create_bucket(moto_server)

    async def main() -> None:
        async with S3Root(f"s3://{bucket}/cold", moto_server.storage_options) as root:
            await root.check_capabilities()
            await root.driver("t/taken/COMMIT_LOG/s").write(0, b"old")  # a queue dir with history
            ops = await _ops(root)
            names = ["taken", "1", "2", "3"]
            assert await root.expect_new_dirs("t", names, max_requests=4) == 3
            assert ops == ["ListObjectsV2"]  # one delimited listing for the whole topic
            for name in ["1", "2", "3"]:
                for kind in ["COMMIT_LOG", "CONSUME_QUEUE"]:
                    await root.driver(f"t/{name}/{kind}/s").write(0, f"{name}{kind}".encode())
            assert ops == ["ListObjectsV2"] + ["PutObject"] * 6  # no listing per segment
            # The directory with history is decided by its own listing: its bytes are compared,
            # never written over.
            with pytest.raises(CorruptionError, match="conflicts with the 3 bytes already stored"):
                await root.driver("t/taken/COMMIT_LOG/s").write(0, b"new")
            assert await root.driver("t/taken/COMMIT_LOG/s").read(ByteRange(0, 3)) == b"old"
            assert await root.driver("t/2/CONSUME_QUEUE/s").read(ByteRange(0, 14)) == b"2CONSUME_QUEUE"
            # Forgotten after the round: a first write confirms itself again (PUT, then a listing).
            root.forget_new_dirs()
            del ops[:]
            await root.driver("t/4/COMMIT_LOG/s").write(0, b"x")
            assert ops == ["PutObject", "ListObjectsV2"]

    asyncio.run(main())


def test_a_directory_taken_since_the_listing_is_not_written_over(moto_server: S3Server) -> None:
    """The PUT after the listing is still create-only: a segment written meanwhile by someone
    else (another driver instance here) is compared, not replaced."""
    bucket = create_bucket(moto_server)

    async def main() -> None:
        async with S3Root(f"s3://{bucket}/cold", moto_server.storage_options) as root:
            await root.check_capabilities()
            assert await root.expect_new_dirs("t", ["1"], max_requests=1) == 1
            await root.driver("t/1/COMMIT_LOG/s").write(0, b"theirs")
            with pytest.raises(CorruptionError, match="conflicts"):
                await root.driver("t/1/COMMIT_LOG/s").write(0, b"ours!!")
            assert await root.driver("t/1/COMMIT_LOG/s").read(ByteRange(0, 6)) == b"theirs"

    asyncio.run(main())


def test_a_listing_cut_short_confirms_only_the_directories_it_reached(
    moto_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages are sorted: a directory before the last name listed that was not listed is empty;
    one after it is unknown (its first write confirms itself)."""
    bucket = create_bucket(moto_server)
    monkeypatch.setattr(s3_driver, "NEW_DIRS_PAGE", 2)

    async def main() -> tuple[int, list[str]]:
        async with S3Root(f"s3://{bucket}/cold", moto_server.storage_options) as root:
            await root.check_capabilities()
            for name in ["a", "c", "e", "g"]:
                await root.driver(f"t/{name}/COMMIT_LOG/s").write(0, b"x")
            ops = await _ops(root)
            # One page: "a/" and "c/" — so "b" is empty, "d" and "f" are beyond what was seen.
            found = await root.expect_new_dirs("t", ["b", "d", "f"], max_requests=1)
            del ops[:]
            for name in ["b", "d"]:
                await root.driver(f"t/{name}/COMMIT_LOG/s").write(0, b"y")
            return found, ops

    found, ops = asyncio.run(main())
    assert found == 1
    assert ops == ["PutObject", "PutObject", "ListObjectsV2"]  # "d" confirmed its own write


def test_roots_without_confirming_listings_find_nothing_to_save(tmp_path: Any) -> None:
    from tierd.drivers.posix import PosixRoot

    async def main() -> int:
        root = PosixRoot(str(tmp_path))
        return await root.expect_new_dirs("t", ["1"], max_requests=1)

    assert asyncio.run(main()) == 0
