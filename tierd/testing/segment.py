"""Conformance suite for segment drivers, shipped in the package so third-party drivers run it too.

Usage — one subclass per driver, in a file pytest collects::

    from tierd.testing.segment import SegmentDriverTests

    class TestMyDriver(SegmentDriverTests):
        driver_cls = MyDriver

        @pytest.fixture
        def root_config(self, tmp_path):           # a fresh, isolated location per test
            return f"mydrv://{tmp_path}", {}

        def backdoor_write(self, path, data): ...  # put a complete segment, bypassing the driver
        def backdoor_read(self, path): ...         # the segment's bytes as stored, or None
        def backdoor_objects(self, path): ...      # names of what is stored for it

Backdoor hooks touch the backend directly, so reads are tested on data the driver did not
write and writes are checked in the backend rather than through the driver. ``backdoor_write``
stores the segment in the backend's final form (a file; for chunked drivers the sealed object);
``backdoor_read`` returns the bytes a reader of the raw backend would assemble (for chunked
drivers: the sealed object, else the chunks in key order), or None when nothing is stored;
``backdoor_objects`` names everything stored for the segment (chunks included).

The same subclass also runs :class:`ObjectApiTests` (inherited by :class:`SegmentDriverTests`):
the root's whole-object API (``put_object``, ``get_object``, ``delete_object``, ``list_objects``)
that holds the cold tier's manifests, and ``create_object`` (create-if-absent, exactly one
winner among racing creators) that the prefix-ownership claim stands on, checked with the same
fixture and backdoor hooks.

Where behaviour depends on a capability flag, one test asserts what each flag value promises
(nothing is skipped); a driver may override one test visibly (redefine the method with a
comment) but not silence it.
Tests are synchronous pytest functions that run one ``asyncio.run`` each (no pytest-asyncio):
the ``root`` fixture is made fresh per test and closed inside the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import pickle
import random
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import pytest

from tierd.drivers.paths import cluster_dir, segment_path
from tierd.drivers.segment import (
    MAX_POSITION,
    AppendResult,
    ByteRange,
    DriverRoot,
    FileSegment,
    FileType,
    SegmentDriver,
)
from tierd.errors import (
    ConcurrentCommitError,
    CorruptionError,
    InvalidArgumentError,
    InvalidRangeError,
    ObjectExistsError,
    SegmentNotFoundError,
    SegmentReadError,
    SegmentSealedError,
    StoreClosedError,
    UnsupportedOperationError,
)
from tierd.testing.faults import Fault, FaultPlan, FaultyRoot, InjectedFault

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

__all__ = ["DriverSuite", "ObjectApiTests", "SegmentDriverTests", "async_test"]

_S = TypeVar("_S", bound="DriverSuite")
MiB = 1024 * 1024
PATH = "seg/00000000000000000000"
OBJ = "m/MANIFEST.json"


def async_test(
    fn: Callable[[_S, DriverRoot], Coroutine[Any, Any, None]],
) -> Callable[[_S, DriverRoot], None]:
    """Run an ``async def test(self, root)`` in its own event loop and close ``root`` in it."""

    @functools.wraps(fn)
    def wrapper(self: _S, root: DriverRoot) -> None:
        async def main() -> None:
            try:
                await fn(self, root)
            finally:
                await root.aclose()

        asyncio.run(main())

    return wrapper


def _data(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


async def _retry_commit(seg: FileSegment, limit: int = 100) -> None:
    """Commit until it succeeds (injected faults only), as the dispatcher's retry loop would."""
    for _ in range(limit):
        try:
            await seg.commit()
        except InjectedFault:
            continue
        if not seg.needs_commit:
            return
    raise AssertionError(f"commit did not succeed in {limit} attempts")


class DriverSuite:
    """Hooks and plumbing shared by :class:`ObjectApiTests` and :class:`SegmentDriverTests`."""

    driver_cls: ClassVar[type[SegmentDriver]]
    url: str
    storage_options: dict[str, Any]

    # ------------------------------------------------------------------ subclass hooks
    @pytest.fixture
    def root_config(self) -> tuple[str, dict[str, Any]]:
        """``(url, storage_options)`` of a fresh, empty, isolated location for one test."""
        raise NotImplementedError("override the root_config fixture")

    def backdoor_write(self, path: str, data: bytes) -> None:
        """Store ``data`` as the complete segment ``path`` without the driver."""
        raise NotImplementedError

    def backdoor_read(self, path: str) -> bytes | None:
        """The bytes stored for segment ``path`` read without the driver, or None."""
        raise NotImplementedError

    def backdoor_objects(self, path: str) -> list[str]:
        """Names of every object/file stored for segment ``path`` (empty when none)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ plumbing
    @pytest.fixture
    def root(self, root_config: tuple[str, dict[str, Any]]) -> DriverRoot:
        self.url, self.storage_options = root_config
        return self.make_root()

    def make_root(self) -> DriverRoot:
        """Another root on the same location (what a second process would open)."""
        return self.driver_cls.open_root(self.url, dict(self.storage_options))


_BAD_PATHS = ["", "/abs/path", "a/../b", "a//b", "./a", "a/", "a\\b", "a/./b", "a\x00b"]
_BAD_PREFIXES = ["/", "/abs", "a/../b", "a//b", "a//", "./a", "a\\b", ".."]


class ObjectApiTests(DriverSuite):
    """The whole-object API of :class:`~tierd.drivers.segment.DriverRoot` (``put_object``,
    ``get_object``, ``delete_object``, ``list_objects``): the bucket manifests of the cold tier.

    Inherited by :class:`SegmentDriverTests`, so every driver's test file runs it; it uses the
    same ``root_config`` fixture and backdoor hooks (a complete segment written through
    ``backdoor_write`` is, on every backend, exactly a whole object).
    """

    @async_test
    async def test_object_put_then_get(self, root: DriverRoot) -> None:
        await root.put_object(OBJ, b'{"version": 1}')
        assert await root.get_object(OBJ) == b'{"version": 1}'
        assert self.backdoor_read(OBJ) == b'{"version": 1}'  # stored as one whole object
        other = self.make_root()
        try:
            assert await other.get_object(OBJ) == b'{"version": 1}'
        finally:
            await other.aclose()

    @async_test
    async def test_object_put_replaces_the_whole_object(self, root: DriverRoot) -> None:
        long, short = _data(5000, seed=11), b"short"
        await root.put_object(OBJ, long)
        await root.put_object(OBJ, short)
        assert await root.get_object(OBJ) == short  # no tail of the longer value survives
        await root.put_object(OBJ, long)
        assert await root.get_object(OBJ) == long
        assert self.backdoor_read(OBJ) == long
        for i in range(5):
            await root.put_object(OBJ, b"v%d" % i)
        assert await root.get_object(OBJ) == b"v4"
        assert await root.list_objects("") == [OBJ]  # one object, no temporaries left visible

    @async_test
    async def test_object_get_of_a_missing_object_raises_not_found(self, root: DriverRoot) -> None:
        with pytest.raises(SegmentNotFoundError):
            await root.get_object(OBJ)
        with pytest.raises(FileNotFoundError):  # the builtin works too
            await root.get_object("never/put")
        await root.put_object("d/inner", b"x")
        with pytest.raises(SegmentNotFoundError):  # a directory-like prefix is not an object
            await root.get_object("d")

    @async_test
    async def test_object_delete_is_idempotent(self, root: DriverRoot) -> None:
        await root.delete_object(OBJ)  # missing: a no-op
        await root.put_object(OBJ, b"x")
        await root.delete_object(OBJ)
        await root.delete_object(OBJ)
        await root.put_object("d/inner", b"keep")
        await root.delete_object("d")  # only a prefix of another object: nothing to delete
        assert await root.get_object("d/inner") == b"keep"
        assert await root.list_objects("") == ["d/inner"]

    @async_test
    async def test_object_delete_then_get_raises_not_found(self, root: DriverRoot) -> None:
        await root.put_object(OBJ, b"manifest")
        await root.delete_object(OBJ)
        with pytest.raises(SegmentNotFoundError):
            await root.get_object(OBJ)
        assert self.backdoor_read(OBJ) is None
        assert await root.list_objects("") == []
        await root.put_object(OBJ, b"again")  # the path is free again
        assert await root.get_object(OBJ) == b"again"

    @async_test
    async def test_object_empty(self, root: DriverRoot) -> None:
        await root.put_object(OBJ, b"")
        assert await root.get_object(OBJ) == b""
        assert await root.list_objects("") == [OBJ]
        await root.put_object(OBJ, b"full")
        await root.put_object(OBJ, b"")
        assert await root.get_object(OBJ) == b""
        assert self.backdoor_read(OBJ) == b""

    @async_test
    async def test_object_large(self, root: DriverRoot) -> None:
        big = _data(6 * MiB + 3, seed=12)
        await root.put_object(OBJ, big)
        assert await root.get_object(OBJ) == big
        assert self.backdoor_read(OBJ) == big
        await root.put_object(OBJ, b"small again")
        assert await root.get_object(OBJ) == b"small again"

    @async_test
    async def test_object_list_under_a_prefix(self, root: DriverRoot) -> None:
        for path in ["a/b/x", "a/b/c/d", "a/bc/y", "a/bx", "a/b0", "z", "zz/a/b/x"]:
            await root.put_object(path, path.encode())
        expected_ab = ["a/b/c/d", "a/b/x"]  # recursive and sorted; not a/bc, a/bx or a/b0
        assert await root.list_objects("a/b") == expected_ab
        assert await root.list_objects("a/b/") == expected_ab
        assert await root.list_objects("a") == ["a/b/c/d", "a/b/x", "a/b0", "a/bc/y", "a/bx"]
        assert await root.list_objects("") == [
            "a/b/c/d",
            "a/b/x",
            "a/b0",
            "a/bc/y",
            "a/bx",
            "z",
            "zz/a/b/x",
        ]
        assert await root.list_objects("a/b/c") == ["a/b/c/d"]
        assert await root.list_objects("nothing/here") == []
        assert await root.list_objects("a/b/x") == []  # an object, not a directory-like prefix
        assert await root.list_objects("a/b/x/") == []

    @async_test
    async def test_object_list_reports_segments_once_and_hides_driver_internals(
        self, root: DriverRoot
    ) -> None:
        open_seg, sealed_seg, empty_seg = root.driver("q/seg1"), root.driver("q/seg2"), root.driver("q/seg3")
        await open_seg.write(0, b"abc")
        await open_seg.write(3, b"def")  # two chunks on chunked drivers
        await sealed_seg.write(0, b"sealed")
        await sealed_seg.write(6, b"!")
        await sealed_seg.seal()
        await empty_seg.create()
        await root.put_object("q/MANIFEST.json", b"{}")
        await root.put_object("q/MANIFEST.json", b"{ }")
        listed = await root.list_objects("q")
        assert listed == ["q/MANIFEST.json", "q/seg1", "q/seg2", "q/seg3"]
        assert await root.list_objects("") == listed
        assert not [p for p in listed if ".chunks" in p or ".tierd-tmp-" in p or p.endswith(".sealing")]
        await open_seg.delete()
        assert await root.list_objects("q") == ["q/MANIFEST.json", "q/seg2", "q/seg3"]

    @async_test
    async def test_object_beside_segment_directories(self, root: DriverRoot) -> None:
        broker = f"{cluster_dir('DefaultCluster')}/broker-a"
        queue = f"{broker}/TopicTest/0"
        cl = segment_path("", "DefaultCluster", "broker-a", "TopicTest", 0, FileType.COMMIT_LOG, 0)
        cq = segment_path("", "DefaultCluster", "broker-a", "TopicTest", 0, FileType.CONSUME_QUEUE, 0)
        assert cl.startswith(queue + "/COMMIT_LOG/")
        await root.driver(cl).write(0, b"commitlog")  # directories exist before the manifest
        await root.put_object(f"{queue}/MANIFEST.json", b"queue manifest")
        await root.put_object(f"{broker}/MANIFEST.json", b"broker manifest")
        await root.driver(cq).write(0, b"cq")  # and are created after it
        await root.driver(cl).write(9, b"+more")
        await root.driver(cq).seal()
        assert await root.get_object(f"{queue}/MANIFEST.json") == b"queue manifest"
        assert await root.get_object(f"{broker}/MANIFEST.json") == b"broker manifest"
        assert await root.driver(cl).read_all() == b"commitlog+more"
        assert await root.list_objects(queue) == sorted([cl, cq, f"{queue}/MANIFEST.json"])
        assert await root.list_objects(broker) == sorted(
            [cl, cq, f"{queue}/MANIFEST.json", f"{broker}/MANIFEST.json"]
        )
        await root.delete_object(f"{queue}/MANIFEST.json")
        assert await root.driver(cl).read_all() == b"commitlog+more"
        assert await root.driver(cq).is_sealed() is True
        await root.put_object(f"{queue}/MANIFEST.json", b"queue manifest 2")
        await root.driver(cl).delete()
        await root.driver(cq).delete()
        assert await root.get_object(f"{queue}/MANIFEST.json") == b"queue manifest 2"
        assert await root.list_objects(queue) == [f"{queue}/MANIFEST.json"]

    @async_test
    async def test_object_concurrent_puts_and_gets_never_mix(self, root: DriverRoot) -> None:
        a, b = _data(MiB, seed=21), _data(MiB, seed=22)
        await root.put_object(OBJ, a)
        done = asyncio.Event()
        seen: list[int] = [0, 0, 0]

        async def writer() -> None:
            for i in range(20):
                await root.put_object(OBJ, b if i % 2 == 0 else a)
                await asyncio.sleep(0)
            done.set()

        async def reader(n: int) -> None:
            while True:
                got = await root.get_object(OBJ)
                assert got in (a, b), f"a get returned {len(got)} bytes that are neither value"
                seen[n] += 1
                if done.is_set():
                    return
                await asyncio.sleep(0)  # a root that never suspends (memory) must let the writer run

        await asyncio.gather(writer(), reader(0), reader(1), reader(2))
        assert min(seen) >= 1
        assert await root.get_object(OBJ) == a  # the 20th put wins
        # Concurrent puts of one path: the last to land wins, whole.
        await asyncio.gather(*(root.put_object(OBJ, a if i % 2 else b) for i in range(6)))
        assert await root.get_object(OBJ) in (a, b)
        assert await root.list_objects("") == [OBJ]

    @async_test
    async def test_object_invalid_paths_are_rejected(self, root: DriverRoot) -> None:
        for bad in _BAD_PATHS:
            with pytest.raises(InvalidArgumentError):
                await root.put_object(bad, b"x")
            with pytest.raises(InvalidArgumentError):
                await root.get_object(bad)
            with pytest.raises(InvalidArgumentError):
                await root.delete_object(bad)
        for bad in _BAD_PREFIXES:
            with pytest.raises(InvalidArgumentError):
                await root.list_objects(bad)
        with pytest.raises(ValueError, match="component"):  # the builtin works too
            await root.put_object("../escape", b"x")
        assert await root.list_objects("") == []  # nothing was written

    @async_test
    async def test_object_root_pickle_round_trip(self, root: DriverRoot) -> None:
        await root.put_object(OBJ, b"before")
        copy = pickle.loads(pickle.dumps(root))
        try:
            assert type(copy) is type(root)
            assert await copy.get_object(OBJ) == b"before"
            await copy.put_object(OBJ, b"after")
            await copy.put_object("m/other", b"other")
            assert await root.get_object(OBJ) == b"after"
            assert await copy.list_objects("m") == [OBJ, "m/other"]
            await copy.delete_object("m/other")
        finally:
            await copy.aclose()
        assert await root.list_objects("m") == [OBJ]

    @async_test
    async def test_object_reads_are_never_served_from_a_cache(self, root: DriverRoot) -> None:
        await root.put_object(OBJ, b"one")
        assert await root.get_object(OBJ) == b"one"
        assert await root.list_objects("m") == [OBJ]
        self.backdoor_write(OBJ, b"two, written behind the root's back")
        self.backdoor_write("m/new", b"new")
        assert await root.get_object(OBJ) == b"two, written behind the root's back"
        assert await root.get_object("m/new") == b"new"
        assert await root.list_objects("m") == [OBJ, "m/new"]
        other = self.make_root()
        try:
            await other.delete_object("m/new")
            await other.put_object(OBJ, b"three")
        finally:
            await other.aclose()
        assert await root.get_object(OBJ) == b"three"
        assert await root.list_objects("m") == [OBJ]
        with pytest.raises(SegmentNotFoundError):
            await root.get_object("m/new")

    @async_test
    async def test_object_faults_keep_the_previous_object(self, root: DriverRoot) -> None:
        plan = (
            FaultPlan()
            .fail_nth("put_object", 2, Fault.BEFORE)
            .fail_nth("put_object", 3, Fault.AFTER)
            .fail_nth("get_object", 1, Fault.BEFORE)
        )
        froot = FaultyRoot(root, plan)
        await froot.put_object(OBJ, b"v1")
        with pytest.raises(InjectedFault):
            await froot.put_object(OBJ, b"v2")  # never left: the old object is intact
        assert await root.get_object(OBJ) == b"v1"
        with pytest.raises(InjectedFault):
            await froot.get_object(OBJ)
        assert await froot.get_object(OBJ) == b"v1"
        with pytest.raises(InjectedFault):
            await froot.put_object(OBJ, b"v3")  # landed, acknowledgement lost: the new object, whole
        assert await froot.get_object(OBJ) == b"v3"
        assert await froot.list_objects("m") == [OBJ]
        await froot.delete_object(OBJ)
        with pytest.raises(SegmentNotFoundError):
            await froot.get_object(OBJ)
        assert [(c.method, c.args, c.outcome) for c in froot.calls] == [
            ("put_object", f"{OBJ}:2", "ok"),
            ("put_object", f"{OBJ}:2", "fault:before"),
            ("get_object", OBJ, "fault:before"),
            ("get_object", OBJ, "ok"),
            ("put_object", f"{OBJ}:2", "fault:after"),
            ("get_object", OBJ, "ok"),
            ("list_objects", "m", "ok"),
            ("delete_object", OBJ, "ok"),
            ("get_object", OBJ, "error:SegmentNotFoundError"),
        ]
        assert froot.plan.count("put_object") == 3
        with pytest.raises(ValueError, match="write only"):
            FaultPlan().fail_nth("put_object", 1, Fault.HALF)  # puts are atomic: no half objects
        with pytest.raises(InvalidArgumentError):
            await froot.put_object("../x", b"")  # validated before any fault is drawn
        await froot.aclose()

    # ------------------------------------------------------------------ create-if-absent
    async def _refuses_create(self, root: DriverRoot) -> bool:
        """For a root without :attr:`~DriverRoot.supports_create_object`: check it refuses
        cleanly (typed error, nothing written) and return True — the caller's test then has
        nothing more to check. False for a root that supports it."""
        if root.supports_create_object:
            return False
        with pytest.raises(UnsupportedOperationError):
            await root.create_object(OBJ, b"x")
        with pytest.raises(SegmentNotFoundError):
            await root.get_object(OBJ)
        return True

    @async_test
    async def test_object_create_when_absent(self, root: DriverRoot) -> None:
        if await self._refuses_create(root):
            return
        await root.create_object(OBJ, b'{"epoch": 1}')
        assert await root.get_object(OBJ) == b'{"epoch": 1}'
        assert self.backdoor_read(OBJ) == b'{"epoch": 1}'
        assert await root.list_objects("m") == [OBJ]
        other = self.make_root()
        try:
            assert await other.get_object(OBJ) == b'{"epoch": 1}'
        finally:
            await other.aclose()
        await root.create_object("m/empty", b"")
        assert await root.get_object("m/empty") == b""

    @async_test
    async def test_object_create_never_replaces(self, root: DriverRoot) -> None:
        if await self._refuses_create(root):
            return
        await root.put_object(OBJ, b"first")
        with pytest.raises(ObjectExistsError):
            await root.create_object(OBJ, b"second")
        with pytest.raises(FileExistsError):  # the builtin works too
            await root.create_object(OBJ, b"third")
        assert await root.get_object(OBJ) == b"first"
        assert self.backdoor_read(OBJ) == b"first"
        self.backdoor_write(PATH, b"segment bytes")  # a segment occupies its path as well
        with pytest.raises(ObjectExistsError):
            await root.create_object(PATH, b"object")
        assert self.backdoor_read(PATH) == b"segment bytes"
        await root.delete_object(OBJ)
        await root.create_object(OBJ, b"again")  # free once deleted
        assert await root.get_object(OBJ) == b"again"

    @async_test
    async def test_object_create_races_have_exactly_one_winner(self, root: DriverRoot) -> None:
        if await self._refuses_create(root):
            return
        roots = [self.make_root() for _ in range(6)]  # six "processes" racing for one name
        try:
            results = await asyncio.gather(
                *(r.create_object(OBJ, b"claimant-%d" % i) for i, r in enumerate(roots)),
                return_exceptions=True,
            )
        finally:
            for r in roots:
                await r.aclose()
        winners = [i for i, res in enumerate(results) if res is None]
        assert len(winners) == 1, results
        assert all(isinstance(res, ObjectExistsError) for res in results if res is not None), results
        assert await root.get_object(OBJ) == b"claimant-%d" % winners[0]

    @async_test
    async def test_object_create_validates_the_path_and_survives_faults(self, root: DriverRoot) -> None:
        if await self._refuses_create(root):
            return
        for bad in _BAD_PATHS:
            with pytest.raises(InvalidArgumentError):
                await root.create_object(bad, b"x")
        assert await root.list_objects("") == []
        froot = FaultyRoot(root, FaultPlan().fail_nth("create_object", 1, Fault.AFTER))
        with pytest.raises(InjectedFault):
            await froot.create_object(OBJ, b"mine")  # landed, acknowledgement lost
        with pytest.raises(ObjectExistsError):
            await froot.create_object(OBJ, b"mine")  # a retry cannot tell: read it back
        assert await froot.get_object(OBJ) == b"mine"


class SegmentDriverTests(ObjectApiTests):
    """The shared behaviours of every :class:`~tierd.drivers.segment.SegmentDriver` (see module
    doc), plus those of its root's whole-object API (inherited from :class:`ObjectApiTests`)."""

    # ================================================================== driver: basics
    def test_capability_flags_are_declared(self) -> None:
        assert isinstance(self.driver_cls.supports_append, bool)
        assert isinstance(self.driver_cls.needs_seal, bool)
        # A driver that cannot append must compose on seal, and vice versa.
        assert self.driver_cls.supports_append is not self.driver_cls.needs_seal

    @async_test
    async def test_capability_check_is_repeatable_and_leaves_nothing_visible(self, root: DriverRoot) -> None:
        # A driver that probes its backend (S3) does it in scratch objects hidden from listings.
        report = await root.check_capabilities()
        assert report is None or dict(report) == dict(root.capability_report() or {})
        assert await root.check_capabilities() == report  # cached: the same verdict again
        assert await root.list_objects("") == []
        await root.driver(PATH).write(0, b"abc")  # and writing works after it
        assert await root.list_objects("") == [PATH]

    @async_test
    async def test_missing_segment_does_not_exist(self, root: DriverRoot) -> None:
        assert await root.driver(PATH).exists() is False
        assert self.backdoor_objects(PATH) == []

    @async_test
    async def test_missing_segment_raises_not_found(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        with pytest.raises(SegmentNotFoundError):
            await d.size()
        with pytest.raises(SegmentNotFoundError):
            await d.read(ByteRange(0, 1))
        with pytest.raises(SegmentNotFoundError):
            await d.is_sealed()
        with pytest.raises(SegmentNotFoundError):
            await d.seal()
        with pytest.raises(FileNotFoundError):  # the builtin works too
            await d.size()

    @async_test
    async def test_create_makes_an_empty_segment(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.create()
        assert await d.exists() is True
        assert await d.size() == 0
        assert await d.is_sealed() is False
        assert await d.read_all() == b""

    @async_test
    async def test_create_is_idempotent_and_never_truncates(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.create()
        await d.create()
        await d.write(0, b"abc")
        await d.create()
        assert await d.read_all() == b"abc"

    @async_test
    async def test_write_at_zero_creates_the_segment(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"hello")
        assert await d.exists() is True
        assert await d.size() == 5
        assert await d.read_all() == b"hello"

    @async_test
    async def test_write_elsewhere_on_a_missing_segment_is_refused(self, root: DriverRoot) -> None:
        with pytest.raises(SegmentNotFoundError):
            await root.driver(PATH).write(3, b"x")
        assert await root.driver(PATH).exists() is False

    @async_test
    async def test_appending_writes_grow_the_segment(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        expected = b""
        for i in range(5):
            piece = _data(10 + i, seed=i)
            await d.write(len(expected), piece)
            expected += piece
            assert await d.size() == len(expected)
        assert await d.read_all() == expected

    # ================================================================== driver: write rules
    @async_test
    async def test_write_past_the_end_is_refused(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"abc")
        with pytest.raises(InvalidRangeError) as exc:
            await d.write(4, b"x")
        assert exc.value.detail["size"] == 3
        assert await d.read_all() == b"abc"

    @async_test
    async def test_write_at_negative_position_is_refused(self, root: DriverRoot) -> None:
        with pytest.raises(InvalidRangeError):
            await root.driver(PATH).write(-1, b"x")

    @async_test
    async def test_write_of_no_bytes_is_refused(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        with pytest.raises(InvalidRangeError):
            await d.write(0, b"")
        assert await d.exists() is False

    @async_test
    async def test_rewriting_the_same_bytes_is_a_noop(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        data = _data(100)
        await d.write(0, data)
        before = self.backdoor_objects(PATH)
        await d.write(0, data)
        await d.write(10, data[10:50])
        await d.write(99, data[99:])
        assert await d.size() == 100
        assert await d.read_all() == data
        assert self.backdoor_objects(PATH) == before
        assert self.backdoor_read(PATH) == data

    @async_test
    async def test_rewriting_different_bytes_is_corruption(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"abcdef")
        with pytest.raises(CorruptionError):
            await d.write(2, b"XY")
        with pytest.raises(CorruptionError):
            await d.write(4, b"eZmore")
        assert await d.read_all() == b"abcdef"

    @async_test
    async def test_partial_write_is_completed_by_repeating_it(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"head-")
        data = _data(64, seed=7)
        await d.write(5, data[:20])  # as if the write had landed only partly
        await d.write(5, data)
        assert await d.size() == 5 + 64
        assert await d.read_all() == b"head-" + data
        assert self.backdoor_read(PATH) == b"head-" + data

    @async_test
    async def test_overlapping_write_appends_only_the_new_tail(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"0123456789")
        await d.write(6, b"6789abc")
        assert await d.read_all() == b"0123456789abc"

    # ================================================================== driver: ranges
    @async_test
    async def test_read_inside(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        data = _data(1000)
        await d.write(0, data)
        assert await d.read(ByteRange(100, 250)) == data[100:350]

    @async_test
    async def test_read_first_and_last_byte(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        data = _data(300)
        await d.write(0, data)
        assert await d.read(ByteRange(0, 1)) == data[:1]
        assert await d.read(ByteRange(299, 1)) == data[299:]
        assert await d.read(ByteRange(0, 300)) == data

    @async_test
    async def test_read_into_fills_the_buffer_like_read(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        data = _data(4000, seed=5)
        for a, b in itertools.pairwise([0, 100, 1500, 4000]):  # several writes (chunks)
            await d.write(a, data[a:b])
        buf = bytearray(b"\xee" * 4100)
        for start, length in [(0, 4000), (99, 1403), (1499, 2), (3999, 1)]:
            view = memoryview(buf)[50 : 50 + length]
            await d.read_into(ByteRange(start, length), view)
            assert bytes(view) == data[start : start + length]
            view.release()
        assert buf[:50] == b"\xee" * 50  # nothing written outside the view
        await d.seal()
        with memoryview(buf)[:1000] as view:
            await d.read_into(ByteRange(3000, 1000), view)
        assert bytes(buf[:1000]) == data[3000:]
        with pytest.raises(SegmentReadError):
            await d.read_into(ByteRange(3500, 600), memoryview(bytearray(600)))
        with pytest.raises(InvalidRangeError):
            await d.read_into(ByteRange(0, 10), memoryview(bytearray(11)))

    @async_test
    async def test_read_past_the_end_is_refused(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"abcdef")
        with pytest.raises(SegmentReadError):
            await d.read(ByteRange(3, 4))
        with pytest.raises(SegmentReadError):
            await d.read(ByteRange(6, 1))
        with pytest.raises(SegmentReadError):
            await d.read(ByteRange(1000, 1))

    @async_test
    async def test_read_of_an_empty_segment_is_refused(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.create()
        with pytest.raises(SegmentReadError):
            await d.read(ByteRange(0, 1))

    def test_byte_range_rejects_negative_start(self) -> None:
        with pytest.raises(InvalidRangeError):
            ByteRange(-1, 1)

    def test_byte_range_rejects_empty_and_negative_length(self) -> None:
        with pytest.raises(InvalidRangeError):
            ByteRange(0, 0)
        with pytest.raises(InvalidRangeError):
            ByteRange(5, -3)

    def test_byte_range_rejects_overflow(self) -> None:
        with pytest.raises(InvalidRangeError):
            ByteRange(MAX_POSITION, 1)
        with pytest.raises(ValueError, match="overflow"):  # also a builtin ValueError
            ByteRange(2**62, 2**62)
        assert ByteRange(MAX_POSITION - 1, 1).end == MAX_POSITION

    @async_test
    async def test_read_spanning_many_writes(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        data = _data(4000, seed=3)
        cuts = [0, 1, 2, 100, 101, 1500, 2999, 3000, 4000]
        for a, b in itertools.pairwise(cuts):
            await d.write(a, data[a:b])
        for start, length in [(0, 4000), (1, 2), (99, 1403), (2999, 1001), (150, 2)]:
            assert await d.read(ByteRange(start, length)) == data[start : start + length]

    @async_test
    async def test_concurrent_reads(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        data = _data(5000, seed=4)
        for a in range(0, 5000, 1000):
            await d.write(a, data[a : a + 1000])
        ranges = [ByteRange(s, 777) for s in range(0, 4000, 250)]
        got = await asyncio.gather(*(d.read(r) for r in ranges))
        assert got == [data[r.start : r.end] for r in ranges]

    # ================================================================== driver: backdoor
    @async_test
    async def test_reads_data_written_through_the_backdoor(self, root: DriverRoot) -> None:
        data = _data(777, seed=5)
        self.backdoor_write(PATH, data)
        d = root.driver(PATH)
        assert await d.exists() is True
        assert await d.size() == 777
        assert await d.read(ByteRange(700, 77)) == data[700:]
        assert await d.read_all() == data

    @async_test
    async def test_writes_land_in_the_backend(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"abc")
        await d.write(3, b"defg")
        assert self.backdoor_read(PATH) == b"abcdefg"

    @async_test
    async def test_data_written_behind_the_driver_follows_its_capabilities(self, root: DriverRoot) -> None:
        """A file-like backend extends a file it finds (``supports_append``); an object store
        treats a whole object it finds as a composed, sealed segment (``needs_seal``). Every
        driver is one of the two, and this checks the behaviour its flags promise."""
        self.backdoor_write(PATH, b"native")
        d = root.driver(PATH)
        if self.driver_cls.supports_append:
            assert await d.is_sealed() is False
            await d.write(6, b"+more")
            assert self.backdoor_read(PATH) == b"native+more"
        else:
            assert self.driver_cls.needs_seal is True
            assert await d.is_sealed() is True
            with pytest.raises(SegmentSealedError):
                await d.write(6, b"x")
            assert self.backdoor_read(PATH) == b"native"

    # ================================================================== driver: seal
    @async_test
    async def test_seal_keeps_the_bytes_readable(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        data = _data(3000, seed=6)
        for a in range(0, 3000, 700):
            await d.write(a, data[a : a + 700])
        await d.seal()
        assert await d.is_sealed() is True
        assert await d.size() == 3000
        assert await d.read(ByteRange(690, 20)) == data[690:710]
        assert await d.read_all() == data
        assert self.backdoor_read(PATH) == data

    @async_test
    async def test_write_after_seal_is_refused(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"abc")
        await d.seal()
        with pytest.raises(SegmentSealedError):
            await d.write(3, b"d")
        with pytest.raises(PermissionError):  # the builtin works too
            await d.write(0, b"abc")
        assert await root.driver(PATH).read_all() == b"abc"

    @async_test
    async def test_seal_is_idempotent(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"abc")
        await d.seal()
        await d.seal()
        await root.driver(PATH).seal()
        assert await d.read_all() == b"abc"

    @async_test
    async def test_seal_of_an_empty_segment(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.create()
        await d.seal()
        assert await d.is_sealed() is True
        assert await d.size() == 0
        with pytest.raises(SegmentSealedError):
            await d.write(0, b"x")

    @async_test
    async def test_seal_leaves_one_object(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        for i in range(6):
            await d.write(i * 10, _data(10, seed=i))
        await d.seal()
        assert len(self.backdoor_objects(PATH)) == 1

    @async_test
    async def test_seal_of_mixed_chunk_sizes(self, root: DriverRoot) -> None:
        # Sizes around S3's 5 MiB part minimum: small runs, big chunks, small runs between.
        sizes = [1000, 6 * MiB, 100, 3 * MiB, 6 * MiB + 7, 10, 2 * MiB + 5, 1]
        d = root.driver(PATH)
        data = _data(sum(sizes), seed=8)
        pos = 0
        for n in sizes:
            await d.write(pos, data[pos : pos + n])
            pos += n
        await d.seal()
        assert await d.size() == len(data)
        assert await d.read(ByteRange(6 * MiB - 5, 1000)) == data[6 * MiB - 5 : 6 * MiB + 995]
        assert self.backdoor_read(PATH) == data

    # ================================================================== driver: delete
    @async_test
    async def test_delete_removes_everything(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"abc")
        await d.write(3, b"def")
        await d.delete()
        assert await d.exists() is False
        assert self.backdoor_objects(PATH) == []
        with pytest.raises(SegmentNotFoundError):
            await d.size()

    @async_test
    async def test_delete_twice_and_delete_missing_are_noops(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.delete()
        await d.write(0, b"abc")
        await d.delete()
        await d.delete()
        assert await d.exists() is False

    @async_test
    async def test_delete_a_sealed_segment(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"abc")
        await d.seal()
        await d.delete()
        assert await d.exists() is False
        assert self.backdoor_objects(PATH) == []
        await d.write(0, b"new")  # the path is free again
        assert await d.read_all() == b"new"

    # ================================================================== driver: identity
    @async_test
    async def test_prefix_siblings_are_not_confused(self, root: DriverRoot) -> None:
        a, b = root.driver("q/000"), root.driver("q/0001")
        await a.write(0, b"A" * 10)
        await b.write(0, b"B" * 5)
        assert await a.size() == 10
        assert await b.size() == 5
        await a.seal()
        assert await b.is_sealed() is False
        await b.write(5, b"b")
        await a.delete()
        assert await b.read_all() == b"BBBBBb"
        assert await a.exists() is False

    @async_test
    async def test_realistic_segment_paths(self, root: DriverRoot) -> None:
        cl = segment_path("", "DefaultCluster", "broker-a", "TopicTest", 0, FileType.COMMIT_LOG, 0)
        cq = segment_path("", "DefaultCluster", "broker-a", "TopicTest", 0, FileType.CONSUME_QUEUE, 0)
        await root.driver(cl).write(0, b"commitlog")
        await root.driver(cq).write(0, b"cq")
        assert await root.driver(cl).read_all() == b"commitlog"
        assert await root.driver(cq).read_all() == b"cq"
        assert self.backdoor_read(cl) == b"commitlog"

    @async_test
    async def test_pickle_round_trip(self, root: DriverRoot) -> None:
        d = root.driver(PATH)
        await d.write(0, b"before")
        copy = pickle.loads(pickle.dumps(d))
        assert type(copy) is type(d)
        assert copy.path == d.path
        try:
            assert await copy.read_all() == b"before"
            await copy.write(6, b"+after")
            assert await d.read_all() == b"before+after"
            root_copy = pickle.loads(pickle.dumps(root))
            try:
                assert await root_copy.driver(PATH).size() == 12
            finally:
                await root_copy.aclose()
        finally:
            await copy.root.aclose()

    @async_test
    async def test_another_root_sees_the_data(self, root: DriverRoot) -> None:
        await root.driver(PATH).write(0, b"shared")
        other = self.make_root()
        try:
            d = other.driver(PATH)
            assert await d.read_all() == b"shared"
            await d.write(6, b"!")
        finally:
            await other.aclose()
        assert await root.driver(PATH).read_all() == b"shared!"

    def test_invalid_paths_are_rejected(self, root: DriverRoot) -> None:
        for bad in ["", "/abs/path", "a/../b", "a//b", "./a", "a/", "a\\b"]:
            with pytest.raises(InvalidArgumentError):
                root.driver(bad)

    # ================================================================== FileSegment
    def _segment(self, driver: SegmentDriver, **kwargs: Any) -> FileSegment:
        kwargs.setdefault("max_size", 1 << 30)
        return FileSegment(driver, FileType.COMMIT_LOG, 1000, **kwargs)

    @async_test
    async def test_segment_append_moves_the_append_position_only(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        assert seg.append(b"abc", 10) is AppendResult.SUCCESS
        assert seg.append(b"de", 11) is AppendResult.SUCCESS
        assert (seg.append_position, seg.commit_position) == (5, 0)
        assert (seg.append_offset, seg.commit_offset) == (1005, 1000)
        assert seg.needs_commit
        assert await seg.commit() == 5
        assert (seg.append_position, seg.commit_position, seg.needs_commit) == (5, 5, False)
        assert self.backdoor_read(PATH) == b"abcde"

    @async_test
    async def test_segment_file_full(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH), max_size=10)
        assert seg.append(b"123456", 1) is AppendResult.SUCCESS
        assert seg.append(b"12345", 1) is AppendResult.FILE_FULL
        assert seg.append(b"1234", 1) is AppendResult.SUCCESS
        assert seg.append(b"1", 1) is AppendResult.FILE_FULL
        assert seg.append_position == 10

    @async_test
    async def test_segment_buffer_full(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH), max_buffer_count=3)
        for _ in range(3):
            assert seg.append(b"x", 1) is AppendResult.SUCCESS
        assert seg.append(b"x", 1) is AppendResult.BUFFER_FULL
        await seg.commit()
        assert seg.append(b"x", 1) is AppendResult.SUCCESS

    @async_test
    async def test_segment_file_closed(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        seg.append(b"abc", 1)
        await seg.commit()
        seg.close()
        assert seg.append(b"x", 1) is AppendResult.FILE_CLOSED
        with pytest.raises(StoreClosedError):
            await seg.commit()
        assert await seg.read(0, 3) == b"abc"  # reads still work

    @async_test
    async def test_segment_reads_only_committed_bytes(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        seg.append(b"committed", 1)
        await seg.commit()
        seg.append(b"buffered", 2)
        assert await seg.read(0, 9) == b"committed"
        with pytest.raises(SegmentReadError):
            await seg.read(9, 1)

    @async_test
    async def test_segment_read_clamps_the_length(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        seg.append(b"0123456789", 1)
        await seg.commit()
        assert await seg.read(5, 1000) == b"56789"

    @async_test
    async def test_segment_read_rejects_bad_ranges(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        with pytest.raises(SegmentReadError):
            await seg.read(0, 1)  # nothing committed
        seg.append(b"abc", 1)
        await seg.commit()
        for position, length in [(-1, 1), (0, 0), (0, -5), (3, 1), (10, 1)]:
            with pytest.raises(SegmentReadError):
                await seg.read(position, length)

    @async_test
    async def test_segment_commit_is_one_driver_write(self, root: DriverRoot) -> None:
        froot = FaultyRoot(root)
        seg = self._segment(froot.driver(PATH))
        for i in range(50):
            seg.append(_data(100, seed=i), i)
        await seg.commit()
        assert [(c.method, c.args, c.outcome) for c in froot.calls] == [("write", "0+5000", "ok")]
        assert await seg.commit() == 0  # nothing to do: no call at all
        assert len(froot.calls) == 1

    @async_test
    async def test_segment_concurrent_commits_are_refused(self, root: DriverRoot) -> None:
        froot = FaultyRoot(root, FaultPlan(delays={"write": 0.05}))
        seg = self._segment(froot.driver(PATH))
        seg.append(b"abc", 1)
        first = asyncio.create_task(seg.commit())
        await asyncio.sleep(0)  # let the first commit start and park in its write
        with pytest.raises(ConcurrentCommitError):
            await seg.commit()
        with pytest.raises(ConcurrentCommitError):
            await seg.seal()
        assert await first == 3
        assert self.backdoor_read(PATH) == b"abc"

    @async_test
    async def test_segment_commit_reconciles_after_a_lost_ack(self, root: DriverRoot) -> None:
        froot = FaultyRoot(root, FaultPlan().fail_nth("write", 1, Fault.AFTER))
        seg = self._segment(froot.driver(PATH))
        seg.append(b"first", 1)
        with pytest.raises(InjectedFault):
            await seg.commit()
        seg.append(b"+second", 2)
        assert await seg.commit() == 12
        assert [(c.method, c.args, c.outcome) for c in froot.calls] == [
            ("write", "0+5", "fault:after"),
            ("size", "", "ok"),
            ("read", "0+5", "ok"),  # what landed is compared with what was sent
            ("write", "5+7", "ok"),  # the landed bytes are not sent again
        ]
        assert self.backdoor_read(PATH) == b"first+second"

    @async_test
    async def test_segment_commit_completes_a_partial_write(self, root: DriverRoot) -> None:
        froot = FaultyRoot(root, FaultPlan().fail_nth("write", 1, Fault.HALF))
        seg = self._segment(froot.driver(PATH))
        seg.append(b"0123456789", 1)
        with pytest.raises(InjectedFault):
            await seg.commit()
        assert await root.driver(PATH).read_all() == b"01234"
        seg.append(b"abc", 2)
        await seg.commit()
        assert [(c.method, c.args) for c in froot.calls] == [
            ("write", "0+10"),
            ("size", ""),
            ("read", "0+5"),
            ("write", "5+8"),
        ]
        assert seg.commit_position == 13
        assert self.backdoor_read(PATH) == b"0123456789abc"

    @async_test
    async def test_segment_commit_retries_a_write_that_never_left(self, root: DriverRoot) -> None:
        froot = FaultyRoot(root, FaultPlan().fail_nth("write", 1, Fault.BEFORE))
        seg = self._segment(froot.driver(PATH))
        seg.append(b"abc", 1)
        with pytest.raises(InjectedFault):
            await seg.commit()
        assert seg.commit_position == 0
        assert seg.append_position == 3
        await seg.commit()
        assert [c.args for c in froot.calls if c.method == "write"] == ["0+3", "0+3"]
        assert self.backdoor_read(PATH) == b"abc"

    @async_test
    async def test_segment_commit_survives_a_failed_reconcile(self, root: DriverRoot) -> None:
        plan = FaultPlan().fail_nth("write", 1, Fault.AFTER).fail_nth("size", 1, Fault.BEFORE)
        froot = FaultyRoot(root, plan)
        seg = self._segment(froot.driver(PATH))
        seg.append(b"abc", 1)
        with pytest.raises(InjectedFault):
            await seg.commit()
        with pytest.raises(InjectedFault):
            await seg.commit()  # the size() of the reconcile fails: still safe to call again
        await seg.commit()
        assert self.backdoor_read(PATH) == b"abc"
        assert seg.commit_position == 3

    @async_test
    async def test_segment_detects_a_foreign_writer(self, root: DriverRoot) -> None:
        froot = FaultyRoot(root, FaultPlan().fail_nth("write", 2, Fault.BEFORE))
        seg = self._segment(froot.driver(PATH))
        seg.append(b"abc", 1)
        await seg.commit()
        seg.append(b"def", 2)
        with pytest.raises(InjectedFault):
            await seg.commit()
        await root.driver(PATH).write(3, b"XYZW")  # someone else wrote meanwhile
        with pytest.raises(CorruptionError):
            await seg.commit()

    @async_test
    async def test_segment_never_adopts_a_foreign_writers_bytes(self, root: DriverRoot) -> None:
        await root.driver(PATH).write(0, b"XYZ")  # another store wrote here first
        seg = self._segment(root.driver(PATH))
        seg.append(b"abcdef", 1)
        for _ in range(3):  # every retry fails the same way: the conflict is not a partial write
            with pytest.raises(CorruptionError, match="conflicts"):
                await seg.commit()
        assert (seg.commit_position, seg.append_position) == (0, 6)
        assert self.backdoor_read(PATH) == b"XYZ"  # nothing of ours was stitched onto theirs

    @async_test
    async def test_segment_reconcile_compares_what_landed(self, root: DriverRoot) -> None:
        froot = FaultyRoot(root, FaultPlan().fail_nth("write", 1, Fault.BEFORE))
        seg = self._segment(froot.driver(PATH))
        seg.append(b"ours!", 1)
        with pytest.raises(InjectedFault):
            await seg.commit()  # never left, but the segment cannot know that
        await root.driver(PATH).write(0, b"THEIR")  # same length, another writer's bytes
        with pytest.raises(CorruptionError, match="did not write"):
            await seg.commit()
        assert seg.commit_position == 0  # their bytes were not taken for ours
        assert self.backdoor_read(PATH) == b"THEIR"

    @async_test
    async def test_segment_random_faults_never_duplicate_or_lose_bytes(self, root: DriverRoot) -> None:
        plan = FaultPlan(probability=0.3, methods=frozenset({"write", "size"}), seed=1234)
        froot = FaultyRoot(root, plan)
        seg = self._segment(froot.driver(PATH))
        rng = random.Random(99)
        expected = bytearray()
        for i in range(200):
            data = rng.randbytes(rng.randint(1, 48))
            assert seg.append(data, i) is AppendResult.SUCCESS
            expected += data
            if rng.random() < 0.3:
                with contextlib.suppress(InjectedFault):  # retried later, as the dispatcher would
                    await seg.commit()
        await _retry_commit(seg)
        assert seg.commit_position == len(expected)
        assert await root.driver(PATH).read_all() == bytes(expected)
        assert self.backdoor_read(PATH) == bytes(expected)
        outcomes = {c.outcome for c in froot.calls}
        assert {"fault:before", "fault:after", "fault:half"} <= outcomes

    @async_test
    async def test_segment_tracks_store_timestamps(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        assert (seg.min_timestamp, seg.max_timestamp) == (None, None)
        for ts in (500, 100, 900, 300):
            seg.append(b"x", ts)
        assert (seg.min_timestamp, seg.max_timestamp) == (100, 900)

    @async_test
    async def test_segment_seal_commits_then_seals(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        seg.append(b"abc", 1)
        await seg.seal()
        assert seg.sealed
        assert seg.closed
        assert await root.driver(PATH).is_sealed() is True
        assert seg.append(b"d", 2) is AppendResult.FILE_CLOSED
        assert await seg.read(0, 3) == b"abc"
        await seg.seal()  # idempotent

    @async_test
    async def test_segment_seal_of_an_empty_segment(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        await seg.seal()
        assert await root.driver(PATH).size() == 0
        assert await root.driver(PATH).is_sealed() is True

    @async_test
    async def test_segment_destroy(self, root: DriverRoot) -> None:
        seg = self._segment(root.driver(PATH))
        seg.append(b"abc", 1)
        await seg.commit()
        seg.append(b"pending", 2)
        await seg.destroy()
        assert await root.driver(PATH).exists() is False
        assert seg.append(b"x", 3) is AppendResult.FILE_CLOSED
        await seg.destroy()  # idempotent

    @async_test
    async def test_segment_recovers_its_position_from_the_backend(self, root: DriverRoot) -> None:
        await root.driver(PATH).write(0, b"0123456789")
        seg = self._segment(root.driver(PATH))
        assert await seg.load_position() == 10
        seg.append(b"abc", 1)
        await seg.commit()
        assert self.backdoor_read(PATH) == b"0123456789abc"
        fresh = self._segment(root.driver("seg/new"))
        assert await fresh.load_position() == 0
