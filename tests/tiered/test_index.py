"""The cold key index (tierd/tiered/index/) against FORMATS.md §2.4.

Expected bytes are built here with ``struct`` — by hand for the golden files, and by a naive
one-item-at-a-time reference (insert, chain walk, compaction) for the property tests — never
with the code under test. Backends: the memory driver, wrapped in the fault injector whenever a
test needs to count reads or break a write.

    add() ──▶ writable file (TIDX, chained slots) ──seal──▶ compact (numpy) ──▶ INDEX segment (TIDC)
              {store}/tiered_index/{begin}                        {cluster}/{broker}/rmq_sys_INDEX/0/INDEX/
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import struct
import tempfile
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import mmh3
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierd.drivers.memory import MemoryRoot, StoredSegment, drop_namespace, namespace
from tierd.drivers.paths import segment_name
from tierd.drivers.posix import PosixRoot
from tierd.errors import CorruptionError, StoreClosedError
from tierd.format.host import encode_host
from tierd.format.key_hash import key_hashes as hash_keys
from tierd.format.properties import decode_properties, encode_properties
from tierd.format.record import MAGIC_V2, encode_record, topic_field
from tierd.testing.clock import ManualClock
from tierd.testing.faults import Fault, FaultPlan, FaultyRoot, InjectedFault
from tierd.tiered.flatmessage import CommittedBatch
from tierd.tiered.index import (
    ColdIndexService,
    FileStatus,
    IndexHit,
    batch_keys,
    compact,
    compaction,
)
from tierd.tiered.index import service as index_service

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator

    from tierd.drivers.segment import DriverRoot
    from tierd.tiered.records import LocalSegment

T = TypeVar("T")
HEADER = struct.Struct(">Iqqii")
SLOT = struct.Struct(">ii")
ITEM = struct.Struct(">Iiiqiii")
CITEM = struct.Struct(">Iiiqii")
TIDX, TIDC = 0x54494458, 0x54494443
T0 = 1_700_000_000_000  # ms
CLUSTER, BROKER = "DefaultCluster", "broker-a"
HOUR = 3_600_000
# "t#k17874" and "t#k109888" have the same mmh3 hash (found by brute force, checked below).
COLLIDING = ("k17874", "k109888")


class Clock(ManualClock):
    def __init__(self, now: int = T0) -> None:
        super().__init__(now)


class Meta:
    """What the owner persists through on_change: the uploaded infos, and a call count."""

    def __init__(self) -> None:
        self.infos: list[LocalSegment] = []
        self.calls = 0
        self.fail_next = 0
        self.svc: ColdIndexService | None = None

    async def __call__(self) -> None:
        self.calls += 1
        if self.fail_next:
            self.fail_next -= 1
            raise OSError("metadata disk full (injected)")
        assert self.svc is not None
        self.infos = self.svc.uploaded_infos()


def arun(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(params=["memory", "posix"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DriverRoot]:
    """The memory driver and the posix driver (a directory beside the store)."""
    if request.param == "posix":
        yield PosixRoot(str(tmp_path / "cold"))
        return
    root = MemoryRoot(f"memory://index-{uuid.uuid4().hex}")
    yield root
    drop_namespace(root.name)


async def stored(root: DriverRoot, path: str) -> tuple[bytes, bool]:
    """(bytes, sealed) of a segment, read through a fresh driver of the unwrapped root."""
    driver = root.driver(path)
    return await driver.read_all(), await driver.is_sealed()


def make_service(
    store: Path, root: Any, slots: int, items: int, clock: Clock, meta: Meta | None = None, **kw: Any
) -> ColdIndexService:
    svc = ColdIndexService(store, root, CLUSTER, BROKER, slots, items, on_change=meta, clock=clock, **kw)
    if meta is not None:
        meta.svc = svc
    return svc


def local_path(store: Path, begin: int) -> Path:
    return store / "tiered_index" / str(begin)


def h32(topic: str, key: str) -> int:
    return int(mmh3.hash(f"{topic}#{key}", 0, signed=False))


# --------------------------------------------------------------------------- records / batches
HOST = encode_host("127.0.0.1:10911")
HOST6 = encode_host("[2001:db8::1]:10911")


def record(
    topic: str, queue_id: int, props: dict[str, str], ts: int, *, body: bytes = b"body", v6: bool = False
) -> bytes:
    magic, topic_part = topic_field(topic.encode())
    return encode_record(
        body,
        topic_part,
        magic,
        encode_properties(props),
        queue_id,
        0,
        0,
        0,
        0,
        ts,
        HOST6 if v6 else HOST,
        ts,
        HOST,
    )


def batch(
    topic: str, queue_id: int, recs: list[bytes], stamps: list[int], first_flat: int = 0
) -> CommittedBatch:
    sizes = np.array([len(r) for r in recs], dtype=np.int64)
    flat = first_flat + np.cumsum(sizes) - sizes
    return CommittedBatch(topic, queue_id, 0, flat, sizes, np.array(stamps, dtype=np.int64), b"".join(recs))


def keyed(
    topic: str, queue_id: int, keys: list[str], stamps: list[int], first_flat: int = 0
) -> CommittedBatch:
    """One record per key (KEYS = that key)."""
    recs = [record(topic, queue_id, {"KEYS": k}, ts) for k, ts in zip(keys, stamps, strict=True)]
    return batch(topic, queue_id, recs, stamps, first_flat)


# --------------------------------------------------------------------------- naive reference
def ref_writable(
    slots: int, items: int, begin: int, entries: list[tuple[int, int, int, int, int, int]]
) -> bytes:
    """A writable file built one item at a time, RocketMQ's putKey way."""
    buf = bytearray(28 + slots * 8 + (items + 1) * 32)
    end, used, count = begin, 0, 0
    for h, tid, qid, off, size, ts in entries:
        count += 1
        s = h % slots
        (head,) = struct.unpack_from(">i", buf, 28 + s * 8)
        if head == 0:
            used += 1
        ITEM.pack_into(buf, 28 + slots * 8 + count * 32, h, tid, qid, off, size, (ts - begin) // 1000, head)
        struct.pack_into(">i", buf, 28 + s * 8, count)
        end = max(end, ts)
    HEADER.pack_into(buf, 0, TIDX, begin, end, used, count)
    return bytes(buf)


def ref_compact(buf: bytes, slots: int, items: int) -> bytes:
    """Compaction by walking every slot's chain, one item at a time (RocketMQ's way), then
    regrouping the items newest first into ceil(count*slots/items) compacted slots."""
    magic, begin, end, _, count = HEADER.unpack_from(buf, 0)
    assert magic == TIDX
    base = 28 + slots * 8
    walked: list[tuple[int, tuple[int, ...]]] = []  # (item index, fields)
    for s in range(slots):
        (cur,) = struct.unpack_from(">i", buf, 28 + s * 8)
        chain = []
        while cur:
            fields = ITEM.unpack_from(buf, base + cur * 32)
            assert fields[0] % slots == s
            chain.append(cur)
            walked.append((cur, fields))
            cur = fields[6]
        assert chain == sorted(chain, reverse=True)  # newest first
    assert sorted(i for i, _ in walked) == list(range(1, count + 1))  # every item on one chain
    cslots = max(1, min(slots, -(-count * slots // items)))
    buckets: list[list[tuple[int, bytes]]] = [[] for _ in range(cslots)]
    for i, fields in walked:
        buckets[fields[0] % cslots].append((i, CITEM.pack(*fields[:6])))
    out = bytearray(HEADER.pack(TIDC, begin, end, sum(1 for b in buckets if b), count))
    pos = 28 + cslots * 8
    for bucket in buckets:
        out += SLOT.pack(pos if bucket else 0, 28 * len(bucket))
        pos += 28 * len(bucket)
    for bucket in buckets:
        out += b"".join(raw for _, raw in sorted(bucket, reverse=True))
    return bytes(out)


def ref_compact_simple(buf: bytes, slots: int, items: int) -> bytes:
    """Same result, by scanning item indices from newest to oldest (no chain walk)."""
    _, begin, end, _, count = HEADER.unpack_from(buf, 0)
    base = 28 + slots * 8
    cslots = max(1, min(slots, -(-count * slots // items)))
    buckets: list[list[bytes]] = [[] for _ in range(cslots)]
    for i in range(count, 0, -1):
        fields = ITEM.unpack_from(buf, base + i * 32)
        buckets[fields[0] % cslots].append(CITEM.pack(*fields[:6]))
    out = bytearray(HEADER.pack(TIDC, begin, end, sum(1 for b in buckets if b), count))
    pos = 28 + cslots * 8
    for b in buckets:
        out += SLOT.pack(pos if b else 0, 28 * len(b))
        pos += 28 * len(b)
    for b in buckets:
        out += b"".join(b)
    return bytes(out)


# --------------------------------------------------------------------------- golden files
# Five items in a file with 4 slots and room for 6: hashes 5, 9, 13 land in slot 1, 2 and 6 in
# slot 2. One item is older than the file's begin (negative seconds).
GOLDEN = [
    # hash, topic id, queue id, flat offset, size, store ts
    (5, 7, 0, 0, 100, T0 + 1_500),
    (9, 7, 1, 100, 120, T0 + 2_000),
    (2, 7, 0, 220, 90, T0 - 2_500),
    (13, 8, 3, 310, 64, T0 + 61_999),
    (6, 7, 2, 374, 77, T0 + 5_000),
]


def golden_writable() -> bytes:
    """Built by hand: every slot and item written out."""
    slots_and_items = [
        HEADER.pack(TIDX, T0, T0 + 61_999, 2, 5),
        SLOT.pack(0, 0),
        SLOT.pack(4, 0),  # slot 1: newest item 4 (hash 13) → 2 → 1
        SLOT.pack(5, 0),  # slot 2: newest item 5 (hash 6) → 3
        SLOT.pack(0, 0),
        bytes(32),  # item 0: reserved
        ITEM.pack(5, 7, 0, 0, 100, 1, 0),
        ITEM.pack(9, 7, 1, 100, 120, 2, 1),
        ITEM.pack(2, 7, 0, 220, 90, -3, 0),  # floor(-2.5 s)
        ITEM.pack(13, 8, 3, 310, 64, 61, 2),
        ITEM.pack(6, 7, 2, 374, 77, 5, 3),
        bytes(32),  # item 6: free
    ]
    return b"".join(slots_and_items)


def golden_compacted() -> bytes:
    """Compacted slots = ceil(5 * 4 / 6) = 4; items start at 28 + 4*8 = 60."""
    return b"".join(
        [
            HEADER.pack(TIDC, T0, T0 + 61_999, 2, 5),
            SLOT.pack(0, 0),
            SLOT.pack(60, 84),  # slot 1: items 4, 2, 1
            SLOT.pack(144, 56),  # slot 2: items 5, 3
            SLOT.pack(0, 0),
            CITEM.pack(13, 8, 3, 310, 64, 61),
            CITEM.pack(9, 7, 1, 100, 120, 2),
            CITEM.pack(5, 7, 0, 0, 100, 1),
            CITEM.pack(6, 7, 2, 374, 77, 5),
            CITEM.pack(2, 7, 0, 220, 90, -3),
        ]
    )


def put_golden(svc: ColdIndexService) -> None:
    cols = list(zip(*GOLDEN, strict=True))
    svc.put_items(*(np.array(c) for c in cols))


def test_mmh3_is_the_key_hash() -> None:
    assert hash_keys([b"TopicTest#MessageKey"]).tolist() == [2917063644]
    assert hash_keys(["t#ключ".encode()]).tolist() == [h32("t", "ключ")]
    a, b = COLLIDING
    assert h32("t", a) == h32("t", b)


def test_writable_file_golden_bytes(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        svc = make_service(tmp_path, mem, 4, 6, Clock())
        await svc.load([])
        put_golden(svc)
        assert local_path(tmp_path, T0).read_bytes() == golden_writable()
        await svc.close()
        assert local_path(tmp_path, T0).stat().st_size == 28 + 4 * 8 + 7 * 32

    arun(main())


def test_writable_golden_equals_the_naive_reference() -> None:
    assert ref_writable(4, 6, T0, GOLDEN) == golden_writable()
    assert ref_compact(golden_writable(), 4, 6) == golden_compacted()


def test_compacted_golden_bytes_direct_and_uploaded(tmp_path: Path, backend: DriverRoot) -> None:
    assert compact(golden_writable(), 4, 6).data.tobytes() == golden_compacted()

    async def main() -> None:
        clock = Clock()
        meta = Meta()
        svc = make_service(tmp_path, backend, 4, 6, clock, meta)
        await svc.load([])
        put_golden(svc)
        clock.now += HOUR  # old enough to seal
        await svc.maintain()
        path = svc.segment_path(T0)
        assert path == f"212d6b50_{CLUSTER}/{BROKER}/rmq_sys_INDEX/0/INDEX/{segment_name(T0)}"
        assert path.endswith(f"{T0:020d}")
        assert await stored(backend, path) == (golden_compacted(), True)
        assert not local_path(tmp_path, T0).exists()
        [info] = meta.infos
        assert info.type == "INDEX"
        assert (info.base_offset, info.size, info.sealed) == (T0, len(golden_compacted()), True)
        assert (info.min_store_timestamp, info.max_store_timestamp) == (T0 - 3_000, T0 + 61_999)
        assert info.crc32c is not None
        await svc.close()

    arun(main())


def test_compacted_slot_count_follows_the_load_factor() -> None:
    # Same five items in a file with room for 20: ceil(5*4/20) = 1 slot holding all, newest first.
    buf = ref_writable(4, 20, T0, GOLDEN)
    expected = b"".join(
        [
            HEADER.pack(TIDC, T0, T0 + 61_999, 1, 5),
            SLOT.pack(36, 140),
            CITEM.pack(6, 7, 2, 374, 77, 5),
            CITEM.pack(13, 8, 3, 310, 64, 61),
            CITEM.pack(2, 7, 0, 220, 90, -3),
            CITEM.pack(9, 7, 1, 100, 120, 2),
            CITEM.pack(5, 7, 0, 0, 100, 1),
        ]
    )
    assert compact(buf, 4, 20).data.tobytes() == expected
    assert ref_compact(buf, 4, 20) == expected


# --------------------------------------------------------------------------- property tests
entry = st.tuples(
    st.sampled_from([0, 1, 2, 3, 7, 8, 0xFFFFFFFF, 0x80000000, 12345]),  # few hashes: many collisions
    st.integers(0, 3),
    st.integers(0, 7),
    st.integers(0, 2**40),
    st.integers(1, 10_000),
    st.integers(T0 - 100_000, T0 + 10_000_000),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slots=st.integers(1, 9),
    items=st.integers(1, 40),
    entries=st.lists(entry, min_size=1, max_size=40),
    full=st.booleans(),
    cuts=st.lists(st.integers(0, 40), max_size=4),
)
def test_vectorised_insert_and_compaction_equal_the_naive_reference(
    slots: int, items: int, entries: list[tuple[int, int, int, int, int, int]], full: bool, cuts: list[int]
) -> None:
    """Insert in several batches, compare the file with the one-by-one reference writer, then
    compact it both ways (chain peeling — taken for full files — and the sort) and compare
    with the per-item chain-walk reference."""
    entries = (entries * items)[:items] if full else entries[:items]
    with tempfile.TemporaryDirectory() as d:

        async def main() -> bytes:
            svc = make_service(Path(d), MemoryRoot("memory://unused"), slots, items, Clock())
            await svc.load([])
            bounds = sorted({0, len(entries), *(c for c in cuts if c < len(entries))})
            for a, b in itertools.pairwise(bounds):  # several batches
                cols = list(zip(*entries[a:b], strict=True))
                svc.put_items(*(np.array(c, dtype=np.int64) for c in cols))
            raw = local_path(Path(d), T0).read_bytes()
            await svc.close()
            return raw

        raw = arun(main())
    assert raw == ref_writable(slots, items, T0, entries)
    expected = ref_compact(raw, slots, items)
    assert expected == ref_compact_simple(raw, slots, items)
    assert compact(raw, slots, items).data.tobytes() == expected
    assert compact(raw, slots, items, use_chains=False).data.tobytes() == expected


@settings(max_examples=100, deadline=None)
@given(
    slots=st.integers(1, 6),
    hashes=st.lists(st.integers(0, 20), min_size=2, max_size=30),
    victim=st.integers(0, 29),
    value=st.integers(-5, 40),
    head=st.booleans(),
)
def test_torn_chains_fall_back_to_the_sort_and_give_the_same_bytes(
    slots: int, hashes: list[int], victim: int, value: int, head: bool
) -> None:
    """A full file whose chain link or slot head is garbage (a power loss tore it): the chain
    peeling must notice and the sort must give the bytes the item table alone defines."""
    items = len(hashes)
    entries = [(h, 1, 0, i * 10, 10, T0 + i) for i, h in enumerate(hashes)]
    raw = bytearray(ref_writable(slots, items, T0, entries))
    if head:
        struct.pack_into(">i", raw, 28 + (victim % slots) * 8, value)
    else:
        struct.pack_into(">i", raw, 28 + slots * 8 + (victim % items + 1) * 32 + 28, value)
    assert compact(bytes(raw), slots, items).data.tobytes() == ref_compact_simple(bytes(raw), slots, items)


def test_chain_peeling_is_used_when_the_slot_count_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    sorts: list[int] = []
    real = compaction._order_by_sort

    def spy(slot: Any, count: int) -> Any:
        sorts.append(count)
        return real(slot, count)

    monkeypatch.setattr(compaction, "_order_by_sort", spy)
    entries = [(h, 1, 0, i, 1, T0) for i, h in enumerate([3, 7, 3, 1, 11, 3])]
    intact = ref_writable(4, 6, T0, entries)
    compact(intact, 4, 6)
    assert sorts == []  # full and intact: chains
    compact(ref_writable(4, 7, T0, entries), 4, 7)
    assert sorts == []  # ceil(6*4/7) = 4 slots: the chains still apply
    compact(ref_writable(4, 10, T0, entries), 4, 10)
    assert sorts == [6]  # ceil(6*4/10) = 3 slots: regrouped by the sort
    torn = bytearray(intact)
    struct.pack_into(">i", torn, 28 + 3 * 8, 5)  # slot 3's head now points at item 5 (slot 3: 3, 11)
    got = compact(bytes(torn), 4, 6).data.tobytes()
    assert sorts == [6, 6]
    assert got == ref_compact_simple(intact, 4, 6)


@settings(max_examples=60, deadline=None)
@given(
    props=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "KEYS": st.lists(st.sampled_from(["a", "b", "ключ", "", "a"]), max_size=4).map(" ".join),
                "UNIQ_KEY": st.sampled_from(["U1", "a", "Ü"]),
                "TAGS": st.just("x"),
                "MYKEYS": st.just("nope"),
            },
        ),
        min_size=1,
        max_size=8,
    ),
    long_topic=st.booleans(),
    v6=st.booleans(),
)
def test_batch_keys_match_decoded_properties(props: list[dict[str, str]], long_topic: bool, v6: bool) -> None:
    topic = "T" * 200 if long_topic else "orders"
    recs = [record(topic, 1, p, T0, body=b"x" * i, v6=v6) for i, p in enumerate(props)]
    if long_topic:
        assert struct.unpack_from(">I", recs[0], 4)[0] == MAGIC_V2
    keys, owners = batch_keys(batch(topic, 1, recs, [T0] * len(recs)))
    expected: list[tuple[bytes, int]] = []
    for i, r in enumerate(recs):
        decoded = decode_properties(r[-len(encode_properties(props[i])) :] if props[i] else b"")
        # RocketMQ's IndexService order: the UNIQ_KEY item first, then each KEYS token.
        ks = [decoded["UNIQ_KEY"]] if decoded.get("UNIQ_KEY") else []
        ks += [k for k in decoded.get("KEYS", "").split(" ") if k]
        expected += [(f"{topic}#{k}".encode(), i) for k in dict.fromkeys(ks)]
    assert list(zip(keys, owners, strict=True)) == expected


def per_record_keys(topic: str, props_of: list[bytes]) -> list[tuple[bytes, int]]:
    """The key cutter batch_keys replaced, one Python step per record, kept as the reference:
    split on 0x02, name up to the first 0x01, the last non-empty value of KEYS and UNIQ_KEY
    wins, UNIQ_KEY first, then KEYS split on spaces with blanks dropped, repeats once."""
    out: list[tuple[bytes, int]] = []
    for i, props in enumerate(props_of):
        keys = uniq = b""
        for item in props.split(b"\x02"):
            name, sep, value = item.partition(b"\x01")
            if sep and value:
                if name == b"KEYS":
                    keys = value
                elif name == b"UNIQ_KEY":
                    uniq = value
        found = [uniq] if uniq else []
        found += [k for k in keys.split(b" ") if k]
        out += [(topic.encode() + b"#" + k, i) for k in dict.fromkeys(found)]
    return out


def raw_record(topic: str, props: bytes, *, body: bytes = b"body", v6: bool = False) -> bytes:
    """A record whose PROPERTIES field is ``props`` as given (any bytes, not just pairs)."""
    magic, topic_part = topic_field(topic.encode())
    host = HOST6 if v6 else HOST
    return encode_record(body, topic_part, magic, props, 1, 0, 0, 0, 0, T0, host, T0, HOST)


# Pieces the random properties are made of: the two names and their look-alikes, both
# separators, the key separator, non-ASCII, a value holding a name.
PROP_PIECES = [
    b"KEYS", b"UNIQ_KEY", b"MYKEYS", b"KEYSX", b"KEY", b"UNIQ_KEYS", b"XUNIQ_KEY", b"TAGS",
    b"\x01", b"\x02", b" ", b"  ", b"a", b"b", b"k1", "ключ".encode(), "Ü".encode(), b"KEYS\x01",
    b"\x02KEYS\x01", b"\x02UNIQ_KEY\x01", b"",
]  # fmt: skip


def random_props(rng: np.random.Generator) -> bytes:
    shape = rng.integers(0, 4)
    if shape == 0:  # well-formed pairs of chosen names and values
        items = []
        for _ in range(rng.integers(0, 5)):
            name = [b"KEYS", b"UNIQ_KEY", b"TAGS", b"MYKEYS", b"KEYSX", b""][rng.integers(0, 6)]
            value = b" ".join(PROP_PIECES[j] for j in rng.integers(0, len(PROP_PIECES), rng.integers(0, 4)))
            items.append(name + b"\x01" + value.replace(b"\x02", b""))
        tail = b"\x02" if rng.integers(0, 2) else b""
        return b"\x02".join(items) + (tail if items else b"")
    if shape == 1:  # any sequence of pieces
        return b"".join(PROP_PIECES[j] for j in rng.integers(0, len(PROP_PIECES), rng.integers(0, 12)))
    if shape == 2:  # random bytes from a small alphabet that keeps hitting the separators
        return bytes(rng.choice(list(b"KEYS\x01\x02 aU"), size=rng.integers(0, 40)))
    return b"KEYS\x01" + b"x" * int(rng.integers(32000, 32762)) + b"\x02"  # near the maximum length


@pytest.mark.parametrize("seed", range(4))
def test_batch_keys_match_the_per_record_cutter(seed: int) -> None:
    rng = np.random.default_rng(seed)
    fixed = [
        b"", b"KEYS\x01a\x02", b"TAGS\x01x\x02KEYS\x01a b\x02", b"KEYS\x01a\x02TAGS\x01x",
        b"KEYS\x01\x02", b"KEYS\x01a\x02KEYS\x01\x02", b"KEYS\x01a\x02KEYS\x01b\x02", b"KEYS\x01 a  b a \x02",
        b"MYKEYS\x01a\x02", b"KEYSX\x01a\x02", b"TAGS\x01KEYS\x01a\x02", b"TAGS\x01x KEYS\x01a",
        b"KEYS\x01a\x01b\x02", b"KEYS", b"KEYS\x01", b"UNIQ_KEY\x01u\x02KEYS\x01a u\x02",
        b"KEYS\x01u\x02UNIQ_KEY\x01u\x02", b"UNIQ_KEY\x01u v\x02", b"UNIQ_KEY\x01\x02", b"\x02\x02KEYS\x01z",
        "KEYS\x01ключ Ü\x02".encode(), b"KEYS\x01   \x02UNIQ_KEY\x01 \x02",
    ]  # fmt: skip
    for _ in range(30):
        props_of = [random_props(rng) for _ in range(int(rng.integers(1, 60)))]
        if rng.integers(0, 2):
            props_of += fixed
        rng.shuffle(props_of)
        topic = "T" * 200 if rng.integers(0, 2) else "orders"
        recs = [
            raw_record(topic, p, body=b"x" * (i % 3), v6=bool(i % 5 == 0)) for i, p in enumerate(props_of)
        ]
        keys, owners = batch_keys(batch(topic, 1, recs, [T0] * len(recs)))
        assert list(zip(keys, owners.tolist(), strict=True)) == per_record_keys(topic, props_of)


def test_batch_keys_of_a_batch_without_keys_or_properties() -> None:
    recs = [raw_record("t", b""), raw_record("t", b"TAGS\x01x\x02")]
    keys, owners = batch_keys(batch("t", 0, recs, [T0, T0]))
    assert keys == []
    assert owners.tolist() == []


def test_a_batch_whose_records_do_not_add_up_is_corruption() -> None:
    good = record("t", 0, {"KEYS": "a"}, T0)
    bad = bytearray(good)
    struct.pack_into(">i", bad, len(bad) - len(encode_properties({"KEYS": "a"})) - 2, 0)  # props length
    with pytest.raises(CorruptionError):
        batch_keys(batch("t", 0, [good, bytes(bad)], [T0, T0]))
    with pytest.raises(CorruptionError):
        batch_keys(CommittedBatch("t", 0, 0, np.array([0]), np.array([len(good) + 1]), np.array([T0]), good))


# --------------------------------------------------------------------------- queries
def hits_of(hits: list[IndexHit]) -> list[tuple[int, int]]:
    return [(h.queue_id, h.flat_offset) for h in hits]


def test_add_indexes_keys_and_uniq_key_once_each(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        svc = make_service(tmp_path, mem, 8, 100, Clock())
        await svc.load([])
        recs = [
            record("orders", 3, {"KEYS": "a b  a", "UNIQ_KEY": "U1"}, T0 + 1000),
            record("orders", 3, {}, T0 + 2000),
            record("orders", 3, {"KEYS": "b", "UNIQ_KEY": "b"}, T0 + 3000, v6=True),
            record("orders", 3, {"TAGS": "t"}, T0 + 4000),
        ]
        b = batch("orders", 3, recs, [T0 + 1000, T0 + 2000, T0 + 3000, T0 + 4000], first_flat=5000)
        assert svc.add(b, 11) == 4  # a, b, U1 ; b
        off = b.flat_offsets.tolist()
        q = svc.query
        assert hits_of(await q("orders", 11, "a", 10, 0, T0 * 2)) == [(3, off[0])]
        assert hits_of(await q("orders", 11, "b", 10, 0, T0 * 2)) == [(3, off[2]), (3, off[0])]
        [hit] = await q("orders", 11, "U1", 10, 0, T0 * 2)
        assert hit == IndexHit(11, 3, off[0], len(recs[0]), T0 + 1000)
        assert await q("orders", 12, "a", 10, 0, T0 * 2) == []  # other topic id
        assert await q("other", 11, "a", 10, 0, T0 * 2) == []  # other topic name → other hash
        assert svc.add(batch("orders", 3, [recs[1]], [T0]), 11) == 0
        await svc.close()

    arun(main())


def test_lookup_in_an_uploaded_file_costs_exactly_two_reads(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        root = FaultyRoot(mem)
        clock = Clock()
        svc = make_service(tmp_path, root, 1000, 1000, clock)
        await svc.load([])
        keys = [f"key-{i}" for i in range(300)]
        b = keyed("t", 0, keys, [T0 + i for i in range(300)])
        svc.add(b, 1)
        clock.now += HOUR
        await svc.maintain()
        # Sealing by age created an (empty) writable file first: the newest local file is
        # always the writable one.
        assert [f.status for f in svc.files()] == [FileStatus.UPLOADED, FileStatus.UNSEALED]
        cslots = 300  # ceil(300 * 1000 / 1000): one slot per item on average, many empty
        for i in (0, 17, 299):
            root.calls.clear()
            hits = await svc.query("t", 1, keys[i], 5, 0, T0 * 2)
            assert (int(b.flat_offsets[i]), int(b.sizes[i])) in [(h.flat_offset, h.size) for h in hits]
            reads = root.calls_of("read")
            assert [c.outcome for c in root.calls] == ["ok", "ok"]
            assert len(reads) == 2
            slot_pos = 28 + (h32("t", keys[i]) % cslots) * 8
            assert reads[0].args == f"{slot_pos}+8"
            raw = bytes(namespace(mem.name)[svc.segment_path(T0)].data)
            pos, length = SLOT.unpack_from(raw, slot_pos)
            assert reads[1].args == f"{pos}+{length}"
        # A key whose slot is empty costs the slot read only.
        raw = bytes(namespace(mem.name)[svc.segment_path(T0)].data)
        empty = next(s for s in range(cslots) if SLOT.unpack_from(raw, 28 + s * 8) == (0, 0))
        absent = next(k for k in (f"absent-{j}" for j in range(10_000)) if h32("t", k) % cslots == empty)
        root.calls.clear()
        assert await svc.query("t", 1, absent, 5, 0, T0 * 2) == []
        assert len(root.calls_of("read")) == 1
        await svc.close()

    arun(main())


def test_a_hot_key_longer_than_one_read_is_read_in_pieces(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        root = FaultyRoot(mem)
        clock = Clock()
        svc = make_service(tmp_path, root, 1, 50_000, clock)
        await svc.load([])
        n = 40_000  # 1.12 MB of items in one slot
        h = h32("t", "hot")
        svc.put_items(np.full(n, h, np.uint32), 1, 0, np.arange(n) * 100, 100, T0 + np.arange(n))
        clock.now += HOUR
        await svc.maintain()
        root.calls.clear()
        hits = await svc.query("t", 1, "hot", 10, 0, T0 * 2)
        assert [x.flat_offset for x in hits] == [(n - 1 - i) * 100 for i in range(10)]  # newest first
        assert len(root.calls_of("read")) == 2
        root.calls.clear()
        assert len(await svc.query("t", 1, "hot", n, 0, T0 * 2)) == n
        assert len(root.calls_of("read")) == 3
        await svc.close()

    arun(main())


def test_query_spans_local_and_uploaded_files_newest_first_with_overlap(
    tmp_path: Path, mem: MemoryRoot
) -> None:
    """Uploaded A (begins T0), sealed local B (T0+1 h; its upload fails), writable C (T0+2 h)."""

    async def main() -> None:
        plan = FaultPlan().fail_nth("write", 2)  # A's upload is write 1, B's is write 2
        root = FaultyRoot(mem, plan)
        clock = Clock()
        svc = make_service(tmp_path, root, 16, 100, clock)
        await svc.load([])
        a = keyed("t", 0, ["k", "x", "k"], [T0 + 1_000, T0 + 5_000, T0 + 10_000])
        svc.add(a, 1)
        svc.add(keyed("t", 1, ["k"], [T0 - 600_000], first_flat=900), 1)  # backlog: older than A
        clock.now = T0 + HOUR
        await svc.maintain()  # A sealed and uploaded, B created
        svc.add(keyed("t", 0, ["k"], [T0 + HOUR + 500], first_flat=10_000), 1)
        clock.now = T0 + 2 * HOUR
        with pytest.raises(InjectedFault):
            await svc.maintain()  # B sealed, C created, B's upload fails
        svc.add(keyed("t", 2, ["k"], [T0 + 2 * HOUR + 7], first_flat=20_000), 1)
        assert [(f.begin_timestamp, f.status) for f in svc.files()] == [
            (T0, FileStatus.UPLOADED),
            (T0 + HOUR, FileStatus.SEALED),
            (T0 + 2 * HOUR, FileStatus.UNSEALED),
        ]
        everything = await svc.query("t", 1, "k", 10, 0, T0 * 2)
        assert [(h.queue_id, h.flat_offset, h.timestamp) for h in everything] == [
            (2, 20_000, T0 + 2 * HOUR),  # C (7 ms after its begin: that second)
            (0, 10_000, T0 + HOUR),  # B
            (1, 900, T0 - 600_000),  # A, newest item first (the backlog item was added last)
            (0, int(a.flat_offsets[2]), T0 + 10_000),
            (0, 0, T0 + 1_000),
        ]
        # A window that starts after A began still finds A's item: RocketMQ only looks at files
        # whose *begin* lies inside the window (#9233, #10268).
        mid = await svc.query("t", 1, "k", 10, T0 + 9_000, T0 + 11_000)
        assert hits_of(mid) == [(0, int(a.flat_offsets[2]))]
        # The backlog item is older than its file's begin and is found as well.
        assert hits_of(await svc.query("t", 1, "k", 10, T0 - 700_000, T0 - 500_000)) == [(1, 900)]
        # Windows overlapping no file read nothing.
        root.calls.clear()
        assert await svc.query("t", 1, "k", 10, T0 + 3 * HOUR, T0 + 4 * HOUR) == []
        assert await svc.query("t", 1, "k", 10, 0, T0 - 700_000) == []
        assert root.calls_of("read") == []
        # max_count stops before older files are read.
        assert hits_of(await svc.query("t", 1, "k", 2, 0, T0 * 2)) == [(2, 20_000), (0, 10_000)]
        assert root.calls_of("read") == []
        assert len(await svc.query("t", 1, "k", 3, 0, T0 * 2)) == 3
        assert len(root.calls_of("read")) == 2
        await svc.close()

    arun(main())


def test_item_time_is_whole_seconds_and_the_window_is_not_missed(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        svc = make_service(tmp_path, mem, 4, 10, Clock())
        await svc.load([])
        svc.add(keyed("t", 0, ["k"], [T0 + 1_750]), 1)
        for lo, hi, found in [
            (T0 + 1_750, T0 + 1_750, True),  # exact store time (item second = T0+1 s)
            (T0 + 1_700, T0 + 5_000, True),
            (T0 + 1_751, T0 + 5_000, False),  # after the newest store time of the file
            (T0, T0 + 1_000, True),  # conservative: the item's second overlaps
            (T0 + 2_000, T0 + 5_000, False),
            (T0, T0 + 999, False),
        ]:
            assert bool(await svc.query("t", 1, "k", 1, lo, hi)) is found, (lo, hi)
        assert await svc.query("t", 1, "k", 0, 0, T0 * 2) == []
        assert await svc.query("t", 1, "k", 5, T0 * 2, 0) == []
        await svc.close()

    arun(main())


@pytest.mark.parametrize("where", ["local", "uploaded"])
def test_hash_collisions_return_candidates_of_both_keys(tmp_path: Path, mem: MemoryRoot, where: str) -> None:
    """The index matches hashes, not keys: two keys with equal mmh3 hashes return each other's
    messages (the facade drops them by reading the record). Keys that merely share a slot
    (tiny slot count) but hash differently are not returned."""
    a, b = COLLIDING

    async def main() -> None:
        clock = Clock()
        svc = make_service(tmp_path, mem, 1, 50, clock)
        await svc.load([])
        bt = keyed("t", 0, [a, "other", b, "other2"], [T0 + 1_000 * i for i in range(4)])
        svc.add(bt, 1)
        if where == "uploaded":
            clock.now += HOUR
            await svc.maintain()
            assert [f.status for f in svc.files()] == [FileStatus.UPLOADED, FileStatus.UNSEALED]
        off = bt.flat_offsets.tolist()
        for key in (a, b):
            got = await svc.query("t", 1, key, 10, 0, T0 * 2)
            assert hits_of(got) == [(0, off[2]), (0, off[0])]  # both keys' messages, newest first
        assert hits_of(await svc.query("t", 1, "other", 10, 0, T0 * 2)) == [(0, off[1])]
        await svc.close()

    arun(main())


# --------------------------------------------------------------------------- lifecycle
def test_full_files_roll_with_unique_increasing_names(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        svc = make_service(tmp_path, mem, 2, 3, Clock())  # frozen clock
        await svc.load([])
        b = keyed("t", 0, [f"k{i}" for i in range(8)], [T0 + i for i in range(8)])
        assert svc.add(b, 1) == 8
        rows = svc.files()
        assert [r.begin_timestamp for r in rows] == [T0, T0 + 1, T0 + 2]
        assert [r.item_count for r in rows] == [3, 3, 2]
        assert [r.status for r in rows] == [FileStatus.SEALED, FileStatus.SEALED, FileStatus.UNSEALED]
        assert svc.needs_maintenance
        for i in range(8):
            assert hits_of(await svc.query("t", 1, f"k{i}", 5, 0, T0 * 2)) == [(0, int(b.flat_offsets[i]))]
        await svc.maintain()
        assert [r.status for r in svc.files()] == [
            FileStatus.UPLOADED,
            FileStatus.UPLOADED,
            FileStatus.UNSEALED,
        ]
        assert sorted(p.name for p in (tmp_path / "tiered_index").iterdir()) == [str(T0 + 2)]
        await svc.close()

    arun(main())


def test_restart_finds_unsealed_sealed_and_uploaded_files(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        clock = Clock()
        meta = Meta()
        svc = make_service(tmp_path, mem, 4, 4, clock, meta)
        await svc.load([])
        first = keyed("t", 0, ["a", "b", "c", "d"], [T0 + i for i in range(4)])
        svc.add(first, 1)
        clock.now += 10
        await svc.maintain()  # full → sealed → uploaded
        second = keyed(
            "t", 1, ["a", "e", "f", "g", "a", "h"], [T0 + 20 + i for i in range(6)], first_flat=10_000
        )
        svc.add(second, 1)  # 4 items fill file 2 (sealed, not uploaded), 2 go to file 3
        statuses = [r.status for r in svc.files()]
        assert statuses == [FileStatus.UPLOADED, FileStatus.SEALED, FileStatus.UNSEALED]
        before = {k: hits_of(await svc.query("t", 1, k, 10, 0, T0 * 2)) for k in "abcdefghz"}
        assert before["a"] == [(1, int(second.flat_offsets[4])), (1, int(second.flat_offsets[0])), (0, 0)]
        await svc.close()
        with pytest.raises(StoreClosedError):
            await svc.query("t", 1, "a", 1, 0, 1)

        root = FaultyRoot(mem)
        meta2 = Meta()
        meta2.infos = list(meta.infos)
        again = make_service(tmp_path, root, 4, 4, clock, meta2)
        await again.load(meta.infos)
        assert [r.status for r in again.files()] == statuses
        assert len(root.calls_of("read")) == 1  # one header read
        assert again.stats.header_reads == 1
        after = {k: hits_of(await again.query("t", 1, k, 10, 0, T0 * 2)) for k in "abcdefghz"}
        assert after == before
        again.add(keyed("t", 2, ["a"], [T0 + 99], first_flat=20_000), 1)  # the writable file again
        assert [r.item_count for r in again.files()] == [4, 4, 3]
        await again.maintain()
        assert [r.status for r in again.files()] == [
            FileStatus.UPLOADED,
            FileStatus.UPLOADED,
            FileStatus.UNSEALED,
        ]
        assert [i.base_offset for i in meta2.infos] == [r.begin_timestamp for r in again.files()[:2]]
        assert len(await again.query("t", 1, "a", 10, 0, T0 * 2)) == 4
        await again.close()

    arun(main())


def test_crash_during_upload_leaves_no_half_file_in_use(tmp_path: Path, backend: DriverRoot) -> None:
    """The 2nd upload write lands half and fails (a crash mid-upload). Until the next maintain
    queries use the local sealed file and never the half segment; after a restart the same bytes
    are uploaded again — the driver keeps what landed and appends the rest."""

    async def main() -> None:
        clock = Clock()
        meta = Meta()
        plan = FaultPlan().fail_nth("write", 2, Fault.HALF)
        root = FaultyRoot(backend, plan)
        svc = make_service(tmp_path, root, 8, 64, clock, meta, upload_piece=100)
        await svc.load([])
        b = keyed("t", 0, [f"k{i % 20}" for i in range(50)], [T0 + 10 * i for i in range(50)])
        svc.add(b, 1)
        clock.now += HOUR
        expected = compact(local_path(tmp_path, T0).read_bytes(), 8, 64).data.tobytes()
        with pytest.raises(InjectedFault):
            await svc.maintain()
        path = svc.segment_path(T0)
        half, sealed = await stored(backend, path)
        assert 100 < len(half) < 200
        assert not sealed
        assert half == expected[: len(half)]
        assert meta.infos == []
        assert svc.uploaded_infos() == []
        assert [r.status for r in svc.files()] == [FileStatus.SEALED, FileStatus.UNSEALED]
        want = {k: hits_of(await svc.query("t", 1, f"k{k}", 10, 0, T0 * 2)) for k in range(21)}
        assert len(want[3]) == 3  # k3 at records 3, 23, 43
        root.calls.clear()
        for k in range(21):
            await svc.query("t", 1, f"k{k}", 10, 0, T0 * 2)
        assert root.calls == []  # the half segment is never read
        await svc.close()  # crash: nothing more reaches the backend

        again = make_service(tmp_path, root, 8, 64, clock, meta, upload_piece=100)
        await again.load(meta.infos)
        assert [r.status for r in again.files()] == [FileStatus.SEALED, FileStatus.UNSEALED]
        assert {k: hits_of(await again.query("t", 1, f"k{k}", 10, 0, T0 * 2)) for k in range(21)} == want
        root.calls.clear()
        await again.maintain()
        writes = root.calls_of("write")
        assert all(c.outcome == "ok" for c in writes)
        assert await stored(backend, path) == (expected, True)
        assert not local_path(tmp_path, T0).exists()
        assert [i.base_offset for i in meta.infos] == [T0]
        assert {k: hits_of(await again.query("t", 1, f"k{k}", 10, 0, T0 * 2)) for k in range(21)} == want
        await again.close()

    arun(main())


def test_crash_between_upload_and_metadata_reuploads_safely(tmp_path: Path, backend: DriverRoot) -> None:
    """Upload committed and sealed, but on_change (metadata) failed: the local file is kept; a
    restart from the old metadata compacts again, finds the identical sealed segment, keeps it."""

    async def main() -> None:
        clock = Clock()
        meta = Meta()
        meta.fail_next = 1
        svc = make_service(tmp_path, backend, 8, 64, clock, meta)
        await svc.load([])
        b = keyed("t", 0, [f"k{i}" for i in range(30)], [T0 + i for i in range(30)])
        svc.add(b, 1)
        clock.now += HOUR
        with pytest.raises(OSError, match="injected"):
            await svc.maintain()
        assert local_path(tmp_path, T0).exists()  # not deleted: metadata does not record it
        path = svc.segment_path(T0)
        uploaded, sealed = await stored(backend, path)
        assert sealed
        await svc.close()

        root = FaultyRoot(backend)
        again = make_service(tmp_path, root, 8, 64, clock, meta)
        await again.load(meta.infos)  # still []: the metadata write failed
        assert [r.status for r in again.files()] == [FileStatus.SEALED, FileStatus.UNSEALED]
        await again.maintain()
        assert [c.outcome for c in root.calls_of("write")] == ["error:SegmentSealedError"]
        assert [i.base_offset for i in meta.infos] == [T0]
        assert not local_path(tmp_path, T0).exists()
        assert await stored(backend, path) == (uploaded, True)
        for i in (0, 29):
            assert hits_of(await again.query("t", 1, f"k{i}", 5, 0, T0 * 2)) == [(0, int(b.flat_offsets[i]))]
        await again.close()

    arun(main())


def test_local_copy_of_an_uploaded_file_is_dropped_at_load(tmp_path: Path, mem: MemoryRoot) -> None:
    """Crash after the metadata recorded the upload but before the local file was deleted."""

    async def main() -> None:
        clock = Clock()
        meta = Meta()
        svc = make_service(tmp_path, mem, 8, 64, clock, meta)
        await svc.load([])
        svc.add(keyed("t", 0, ["a", "b"], [T0, T0 + 1]), 1)
        clock.now += HOUR
        saved = tmp_path / "copy"
        shutil.copy(local_path(tmp_path, T0), saved)
        await svc.maintain()
        await svc.close()
        shutil.copy(saved, local_path(tmp_path, T0))

        again = make_service(tmp_path, mem, 8, 64, clock, meta)
        await again.load(meta.infos)
        assert not local_path(tmp_path, T0).exists()
        assert [r.status for r in again.files()] == [FileStatus.UPLOADED, FileStatus.UNSEALED]
        assert hits_of(await again.query("t", 1, "b", 5, 0, T0 * 2)) != []
        await again.close()

    arun(main())


def test_a_foreign_segment_at_the_path_is_replaced(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        clock = Clock()
        svc = make_service(tmp_path, mem, 8, 64, clock, Meta())
        await svc.load([])
        svc.add(keyed("t", 0, ["a"], [T0]), 1)
        path = svc.segment_path(T0)
        namespace(mem.name)[path] = StoredSegment(bytearray(b"garbage from an older build"), sealed=True)
        expected = compact(local_path(tmp_path, T0).read_bytes(), 8, 64).data.tobytes()
        clock.now += HOUR
        await svc.maintain()
        assert bytes(namespace(mem.name)[path].data) == expected
        assert namespace(mem.name)[path].sealed
        assert hits_of(await svc.query("t", 1, "a", 5, 0, T0 * 2)) == [(0, 0)]
        await svc.close()

    arun(main())


def test_load_drops_missing_segments_and_refuses_other_geometry(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        clock = Clock()
        meta = Meta()
        svc = make_service(tmp_path, mem, 8, 64, clock, meta)
        await svc.load([])
        svc.add(keyed("t", 0, ["a"], [T0]), 1)
        clock.now += HOUR
        await svc.maintain()
        svc.add(keyed("t", 0, ["b"], [T0 + HOUR]), 1)
        await svc.close()
        infos = list(meta.infos)
        drop_namespace(mem.name)  # the bucket lost the segment

        again = make_service(tmp_path, mem, 8, 64, clock, meta)
        await again.load(infos)
        assert meta.infos == []
        assert meta.calls == 2
        assert [r.status for r in again.files()] == [FileStatus.UNSEALED]
        await again.close()

        other = make_service(tmp_path, mem, 16, 64, clock)
        with pytest.raises(CorruptionError, match="index_slots"):
            await other.load([])
        await other.close()

    arun(main())


def test_torn_newest_file_is_removed_at_load(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        d = tmp_path / "tiered_index"
        d.mkdir()
        (d / str(T0)).write_bytes(b"")
        svc = make_service(tmp_path, mem, 8, 64, Clock(T0 + 5))
        await svc.load([])
        assert svc.files() == []
        svc.add(keyed("t", 0, ["a"], [T0]), 1)
        assert [r.begin_timestamp for r in svc.files()] == [T0 + 5]
        await svc.close()

    arun(main())


def test_expire_deletes_old_uploaded_and_sealed_files_never_the_writable(
    tmp_path: Path, mem: MemoryRoot
) -> None:
    async def main() -> None:
        clock = Clock()
        meta = Meta()
        svc = make_service(tmp_path, mem, 4, 4, clock, meta)
        await svc.load([])
        svc.add(keyed("t", 0, ["a", "a", "a", "a"], [T0 + i for i in range(4)]), 1)  # file 1: full
        clock.now = T0 + HOUR
        await svc.maintain()
        svc.add(keyed("t", 0, ["a"] * 4, [T0 + HOUR + i for i in range(4)], first_flat=1000), 1)  # file 2
        clock.now = T0 + 2 * HOUR
        await svc.maintain()
        svc.add(keyed("t", 0, ["a"] * 5, [T0 + 2 * HOUR + i for i in range(5)], first_flat=2000), 1)
        # file 3 sealed locally (full), file 4 writable with one item
        assert [r.status for r in svc.files()] == [
            FileStatus.UPLOADED,
            FileStatus.UPLOADED,
            FileStatus.SEALED,
            FileStatus.UNSEALED,
        ]
        first_path = svc.segment_path(T0)
        assert await svc.expire(T0 + 10) == 1
        assert first_path not in namespace(mem.name)
        assert [i.base_offset for i in meta.infos] == [T0 + HOUR]
        assert len(await svc.query("t", 1, "a", 100, 0, T0 * 2)) == 9
        assert await svc.expire(T0 + 10 * HOUR) == 2  # file 2 (uploaded), file 3 (sealed local)
        assert meta.infos == []
        assert [r.status for r in svc.files()] == [FileStatus.UNSEALED]
        assert len(await svc.query("t", 1, "a", 100, 0, T0 * 2)) == 1
        assert svc.stats.expired_files == 3
        await svc.close()

    arun(main())


def test_closed_or_unloaded_service_refuses_work(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        svc = make_service(tmp_path, mem, 4, 4, Clock())
        with pytest.raises(StoreClosedError):
            svc.add(keyed("t", 0, ["a"], [T0]), 1)
        await svc.load([])
        await svc.close()
        await svc.close()
        with pytest.raises(StoreClosedError):
            await svc.maintain()

    arun(main())


def test_stats_count_reads_hits_and_files(tmp_path: Path, mem: MemoryRoot) -> None:
    async def main() -> None:
        clock = Clock()
        svc = make_service(tmp_path, mem, 4, 8, clock)
        await svc.load([])
        svc.add(keyed("t", 0, ["a", "b"], [T0, T0]), 1)
        clock.now += HOUR
        await svc.maintain()
        svc.add(keyed("t", 0, ["a"], [T0 + HOUR], first_flat=1000), 1)
        await svc.query("t", 1, "a", 10, 0, T0 * 2)
        s = svc.stats
        assert (s.queries, s.hits, s.files_queried, s.backend_reads) == (1, 2, 2, 2)
        assert (s.local_files, s.uploaded_files, s.uploads, s.compactions, s.items_added) == (1, 1, 1, 1, 3)
        await svc.close()

    arun(main())


def test_a_failing_compaction_changes_nothing(
    tmp_path: Path, mem: MemoryRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        clock = Clock()
        meta = Meta()
        svc = make_service(tmp_path, FaultyRoot(mem), 8, 64, clock, meta)
        await svc.load([])
        svc.add(keyed("t", 0, ["a", "b"], [T0, T0 + 1]), 1)
        clock.now += HOUR

        def broken(*_: Any, **__: Any) -> Any:
            raise MemoryError("injected")

        with monkeypatch.context() as m:
            m.setattr(index_service, "compact", broken)
            with pytest.raises(MemoryError):
                await svc.maintain()
        assert isinstance(svc.root, FaultyRoot)
        assert svc.root.calls == []  # nothing reached the backend
        assert [r.status for r in svc.files()] == [FileStatus.SEALED, FileStatus.UNSEALED]
        assert meta.calls == 0
        await svc.maintain()
        assert [r.status for r in svc.files()] == [FileStatus.UPLOADED, FileStatus.UNSEALED]
        assert hits_of(await svc.query("t", 1, "b", 5, 0, T0 * 2)) != []
        await svc.close()

    arun(main())


def test_close_waits_for_a_compaction_cancelled_midway(
    tmp_path: Path, mem: MemoryRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling maintain() cannot stop the worker thread reading the mapped file, so close()
    waits for it before unmapping; the file is still SEALED and uploads after a restart."""
    started, release = threading.Event(), threading.Event()
    real = compaction.compact

    def slow(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(30)
        return real(*args, **kwargs)

    async def main() -> None:
        clock = Clock()
        meta = Meta()
        svc = make_service(tmp_path, mem, 8, 64, clock, meta)
        await svc.load([])
        svc.add(keyed("t", 0, ["a"], [T0]), 1)
        clock.now += HOUR
        monkeypatch.setattr(index_service, "compact", slow)
        task = asyncio.create_task(svc.maintain())
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        closing = asyncio.create_task(svc.close())
        await asyncio.sleep(0.1)
        assert not closing.done()
        release.set()
        await closing
        monkeypatch.setattr(index_service, "compact", real)
        assert meta.infos == []

        again = make_service(tmp_path, mem, 8, 64, clock, meta)
        await again.load(meta.infos)
        assert [r.status for r in again.files()] == [FileStatus.SEALED, FileStatus.UNSEALED]
        await again.maintain()
        assert [i.base_offset for i in meta.infos] == [T0]
        await again.close()

    arun(main())
