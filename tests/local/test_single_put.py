"""The single-put path against the record encoder and the batch path; gathering writes.

``put`` writes its record in place — the header packed straight into the commitlog mapping,
then the body and the tail (topic, properties) copied after it — and hands the dispatcher one
index key as a plain string when the message has exactly one. What lands in the commitlog must
be byte for byte what :func:`~tierd.format.record.encode_record` makes of the same fields, for
every shape of message and across file rolls, and every key must be queryable. A batch is
written with gathering ``pwritev`` calls that fall back to the mapping; the bytes must come out
the same either way.
"""

from __future__ import annotations

import errno
import gc
import os
from typing import TYPE_CHECKING

import pytest

from tierd import BlockingMessageStore, Message
from tierd.format.compiled import records
from tierd.format.host import encode_host
from tierd.format.record import encode_record, topic_field
from tierd.local import prepare as prepare_module
from tierd.local.dispatch import DispatchBatch
from tierd.local.mapped_file import MappedFile
from tierd.local.validation import build_properties

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tierd.local.dispatch import SingleRecord
    from tierd.message import PutResult

SHAPES = [
    Message(topic="t", body=b"plain"),
    Message(topic="t", body=b"one key", keys=("k1",)),
    Message(topic="t", body=b"", keys=["a", "b"], tags="tagA"),
    Message(topic="t", body=b"uniq", keys=("k2",), properties={"UNIQ_KEY": "u-1", "x": "y"}),
    Message(topic="t", body=b"uniq only", properties={"UNIQ_KEY": "u-2"}),
    Message(topic="x" * 130, body=b"v2 topic", queue_id=3, flag=-7, born_timestamp=12345, keys=("k3",)),
    Message(topic="t", body=b"v6 born host", born_host="[::1]:9876", flag=2**31 - 1),
    Message(topic="t", body=os.urandom(30_000), born_host="10.1.2.3:5", tags="big"),
]


def expected_record(m: Message, res: PutResult, store: BlockingMessageStore) -> bytes:
    """The record the encoder makes of ``m`` at the place and time the store gave it."""
    stored = store.hot.commitlog.read(res.commitlog_offset, check_crc=True)
    magic, topic_part = topic_field(m.topic.encode())
    return encode_record(
        m.body,
        topic_part,
        magic,
        build_properties(m.keys, m.tags, m.properties),
        res.queue_id,
        m.flag,
        res.queue_offset,
        res.commitlog_offset,
        0,
        stored.born_timestamp if m.born_timestamp is None else m.born_timestamp,
        encode_host(m.born_host or stored.store_host),
        stored.store_timestamp,
        store.hot.store_host,
    )


def test_records_are_byte_identical_to_the_encoder_across_file_rolls(store: BlockingMessageStore) -> None:
    """240 records of every shape (~1 MB) through 256 KiB files: rolls, each record intact."""
    results = [(m, store.put(m)) for _ in range(30) for m in SHAPES]
    cl = store.hot.commitlog
    assert len(cl.files.files) >= 3  # the rolls happened
    for m, res in results:
        want = expected_record(m, res, store)
        assert cl.read_bytes(res.commitlog_offset, len(want)) == want
    assert store.hot.wait_dispatched(10)


def test_single_and_batch_puts_write_the_same_bytes(store: BlockingMessageStore) -> None:
    for m in SHAPES:
        one = store.put(m)
        batch = store.put_batch([m])
        a = expected_record(m, one, store)
        b = expected_record(m, batch[0], store)
        assert store.hot.commitlog.read_bytes(one.commitlog_offset, len(a)) == a
        assert store.hot.commitlog.read_bytes(batch[0].commitlog_offset, len(b)) == b


def test_every_key_shape_is_queryable_after_single_puts(store: BlockingMessageStore) -> None:
    """One key (a plain string to the dispatcher), several, none, and a UNIQ_KEY, mixed in one
    dispatch round."""
    results = {i: store.put(m) for i, m in enumerate(SHAPES)}
    assert store.hot.wait_dispatched(10)
    for i, m in enumerate(SHAPES):
        wanted = [*m.keys, *([m.properties["UNIQ_KEY"]] if "UNIQ_KEY" in m.properties else [])]
        for key in wanted:
            found = store.query(m.topic, key)
            assert [x.commitlog_offset for x in found] == [results[i].commitlog_offset], key


def record(hashes: int | tuple[int, ...], at: int) -> SingleRecord:
    return (("t", 0), at, at * 100, 100, 0, 1, hashes, at * 100 + 100)


@pytest.mark.parametrize(
    ("hashes", "index_hashes", "index_messages"),
    [
        ([11, 12, 13], [11, 12, 13], [0, 1, 2]),  # one key each, as ints
        ([11, (), 13], [11, 13], [0, 2]),
        ([11, (12, 2**32 - 1), 13], [11, 12, 2**32 - 1, 13], [0, 1, 1, 2]),
        ([(), ()], [], []),
    ],
)
def test_dispatch_batch_from_single_records_of_each_key_shape(
    hashes: list[int | tuple[int, ...]], index_hashes: list[int], index_messages: list[int]
) -> None:
    batch = DispatchBatch.merge([record(h, i) for i, h in enumerate(hashes)])
    assert batch.index_hashes is not None
    assert batch.index_hashes.tolist() == index_hashes
    assert batch.index_messages == index_messages
    assert batch.queue_offsets.tolist() == list(range(len(hashes)))


def test_round_robin_rotates_over_the_default_queues(store: BlockingMessageStore) -> None:
    queues = store.config.store.default_queues
    got = [store.put(Message(topic="rr", body=b"x")).queue_id for _ in range(2 * queues + 1)]
    assert got == [*range(queues), *range(queues), 0]
    assert store.put(Message(topic="rr2", body=b"x")).queue_id == 0  # a counter per topic


# ----------------------------------------------------------------------------- gathering writes
PIECES = [bytes([i % 251]) * (1 + i % 7) for i in range(3000)]  # > IOV_MAX: several calls


def mapped(tmp_path: Path) -> MappedFile:
    f = MappedFile(tmp_path / "00000000000000000000", 64 * 1024, create=True)
    f.write(b"head")
    return f


def test_write_pieces_gathers_more_pieces_than_one_call_takes(tmp_path: Path) -> None:
    f = mapped(tmp_path)
    f.write_pieces(PIECES)
    assert f.wrote == 4 + sum(map(len, PIECES))
    assert f.read(0, f.wrote) == b"head" + b"".join(PIECES)
    f.close()


@pytest.mark.parametrize("fault", ["short", "error", "no descriptor"])
def test_write_pieces_finishes_through_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """A short ``pwritev``, an I/O error or a file without a descriptor: the rest of the
    pieces still land, in order, through the mapping."""
    f = mapped(tmp_path)
    real = os.pwritev
    calls = []

    def pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
        calls.append(offset)
        if len(calls) == 2:
            if fault == "error":
                raise OSError(errno.EIO, "injected")
            return real(fd, buffers[:5], offset)  # short: the kernel took only these
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    if fault == "no descriptor":
        f.release_fd()
    f.write_pieces(PIECES)
    assert f.read(0, f.wrote) == b"head" + b"".join(PIECES)
    assert len(calls) == (0 if fault == "no descriptor" else 2)
    f.close()


# ---------------------------------------------------------------- the cyclic collector
# A single put's objects that outlive a young collection are promoted, and the count promoted
# is what starts the collector's full pass over the application's whole heap: 0.27 s for the
# 1.5 M objects the shape benchmark holds, which once landed in most single-put rounds of the
# tag + properties + queue id shape (docs/performance.md, "Single put and the collector").


@pytest.fixture
def eager_collector() -> Iterator[list[str]]:
    """Young collections every few allocations, each one promoting its survivors at once; the
    names of the types promoted, for the test to read."""
    promoted: list[str] = []
    before: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 1:
            return
        if phase == "start":
            before[:] = [len(gc.get_objects(2))]
        else:
            grown = gc.get_objects(2)[before[0] :]
            promoted.extend(type(o).__name__ for o in grown)

    old = gc.get_threshold()
    gc.collect()
    gc.set_threshold(50, 1, 1_000_000)
    gc.callbacks.append(watch)
    try:
        yield promoted
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*old)


def test_merging_single_records_promotes_no_object_per_record(eager_collector: list[str]) -> None:
    """The dispatcher turns a run of records into columns without an object per record (with
    ``zip(*run)`` an iterator per record: thousands alive at once, promoted by any young
    collection that runs meanwhile)."""
    run: list[DispatchBatch | SingleRecord] = [record(i, i) for i in range(5000)]
    batch = DispatchBatch.merge(run)
    assert batch.queue_offsets.tolist() == list(range(5000))
    assert batch.end == 4999 * 100 + 100
    per_type = {name: eager_collector.count(name) for name in set(eager_collector)}
    assert all(n < 100 for n in per_type.values()), per_type


def test_a_single_puts_dispatch_record_is_not_tracked(store: BlockingMessageStore) -> None:
    """What the commitlog hands the dispatcher holds numbers and the cached key tuple only: it
    can never be in a reference cycle, so it is kept off the collector's lists."""
    seen: list[DispatchBatch | SingleRecord] = []
    hot = store.hot
    submit = hot.commitlog.on_append

    def spy(r: DispatchBatch | SingleRecord) -> None:
        seen.append(r)
        submit(r)

    hot.commitlog.on_append = spy
    for m in (*SHAPES, Message(topic="t", body=b"q", queue_id=2, properties={"a": "b"})):
        store.put(m)
    assert len(seen) == len(SHAPES) + 1
    assert not any(gc.is_tracked(r) for r in seen)
    assert store.hot.wait_dispatched(10)


def test_untrack_tuple_leaves_tuples_that_could_hold_a_cycle_tracked() -> None:
    assert prepare_module._encoder is not None
    untrack = records.untrack_tuple
    plain = tuple([("t", 1), 2, "x", b"y", None, (3, "z")])
    assert untrack(plain) is plain
    assert not gc.is_tracked(plain)
    for risky in (tuple([[1], 2]), tuple([("t", [1])]), tuple([{"a": 1}]), tuple([((1,),)])):
        assert untrack(risky) is risky
        assert gc.is_tracked(risky)
    with pytest.raises(TypeError):
        untrack([1])
