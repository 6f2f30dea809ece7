"""Hot store behaviour through the public facade, on real files.

producer ──put──▶ commitlog ──reput──▶ consume queue / key index ──get/query──▶ consumer
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tierd import BlockingMessageStore, GetStatus, Message, MessageStore, TierdConfig
from tierd.errors import (
    ConfigError,
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidQueueError,
    InvalidTopicError,
    MessageTooLargeError,
    StoreClosedError,
    StoreFullError,
    StoreLockedError,
    TierdError,
)
from tierd.format.cq_unit import UNIT_SIZE, decode_units
from tierd.format.record import BLANK_MAGIC

from .conftest import small_config


def assert_queues_agree_with_commitlog(store: BlockingMessageStore) -> int:
    """Every consume-queue unit points at a valid record of its own topic/queue/offset."""
    hot = store.hot
    assert hot.wait_dispatched(10)
    checked = 0
    for (topic, qid), cq in hot.cqs.items():
        units = cq.read_units(cq.min_offset, 10**9)
        offset = cq.min_offset
        while offset < cq.max_offset:
            units = cq.read_units(offset, cq.max_offset - offset)
            for phys, size in zip(units["offset"].tolist(), units["size"].tolist(), strict=True):
                m = hot.commitlog.read(phys, check_crc=True)
                assert (m.topic, m.queue_id, m.queue_offset, m.size) == (topic, qid, offset, size)
                offset += 1
                checked += 1
    return checked


def simulate_crash(root: Path) -> None:
    """Leave the store as a crash would before anything was dispatched: abort marker present,
    checkpoint's dispatched offset (tierd's long at byte 40) rewound, consume queues gone."""
    shutil.rmtree(root / "consumequeue", ignore_errors=True)
    (root / "abort").write_text("crashed")
    ck = (root / "checkpoint").read_bytes()
    (root / "checkpoint").write_bytes(ck[:40] + bytes(8) + ck[48:])


# ----------------------------------------------------------------------------- writes and reads
def test_put_then_get_returns_the_same_message(store: BlockingMessageStore) -> None:
    r = store.put(
        Message(
            topic="orders",
            body=b"paid-1",
            keys=["o-1", "c-9"],
            tags="paid",
            properties={"region": "eu"},
            flag=5,
        )
    )
    res = store.get("orders", r.queue_id, r.queue_offset)
    assert res.status is GetStatus.FOUND
    assert res.source == "hot"
    (m,) = res.messages
    assert (m.body, m.keys, m.tags, m.properties["region"], m.flag) == (
        b"paid-1",
        ("o-1", "c-9"),
        "paid",
        "eu",
        5,
    )
    assert m.msg_id == r.msg_id
    assert m.commitlog_offset == r.commitlog_offset
    assert res.next_offset == r.queue_offset + 1


def test_offsets_are_contiguous_per_queue_across_put_and_put_batch(store: BlockingMessageStore) -> None:
    singles = [store.put(Message(topic="t", body=b"s%d" % i, queue_id=i % 2)) for i in range(10)]
    batch = store.put_batch([Message(topic="t", body=b"b%d" % i, queue_id=i % 2) for i in range(10)])
    offsets: dict[int, list[int]] = {0: [], 1: []}
    for r in [*singles, *batch]:
        offsets[r.queue_id].append(r.queue_offset)
    assert offsets == {0: list(range(10)), 1: list(range(10))}
    assert [m.body for m in store.get("t", 1, 0, 100).messages] == [
        b"s1",
        b"s3",
        b"s5",
        b"s7",
        b"s9",
        b"b1",
        b"b3",
        b"b5",
        b"b7",
        b"b9",
    ]


def test_batch_without_queue_ids_lands_in_one_queue_and_rotates(store: BlockingMessageStore) -> None:
    first = store.put_batch([Message(topic="rr", body=b"x")] * 5)
    second = store.put_batch([Message(topic="rr", body=b"y")] * 5)
    assert len({r.queue_id for r in first}) == 1
    assert len({r.queue_id for r in second}) == 1
    assert first[0].queue_id != second[0].queue_id
    assert [r.queue_offset for r in first] == [0, 1, 2, 3, 4]


def test_mixed_topics_and_queues_in_one_batch(store: BlockingMessageStore) -> None:
    msgs = [Message(topic=f"t{i % 3}", body=bytes([i]), queue_id=i % 2, keys=[f"k{i}"]) for i in range(30)]
    res = store.put_batch(msgs)
    for m, r in zip(msgs, res, strict=True):
        got = store.get(m.topic, r.queue_id, r.queue_offset, 1).messages[0]
        assert (got.topic, got.body, got.keys) == (m.topic, m.body, tuple(m.keys))
    assert assert_queues_agree_with_commitlog(store) == 30


def test_messages_roll_across_commitlog_files_with_blank_markers(store: BlockingMessageStore) -> None:
    body = os.urandom(10_000)
    res = store.put_batch([Message(topic="big", body=body, queue_id=0) for _ in range(40)])
    res2 = [store.put(Message(topic="big", body=body, queue_id=0)) for _ in range(40)]
    files = store.hot.commitlog.files.files
    assert len(files) >= 3
    assert all(len(f.path.name) == 20 and int(f.path.name) == f.file_from_offset for f in files)
    # every full file ends in a blank marker right after its last record
    for f in files[:-1]:
        last_end = max(
            r.commitlog_offset
            for r in [*res, *res2]
            if f.file_from_offset <= r.commitlog_offset < f.file_from_offset + f.size
        )
        at = last_end - f.file_from_offset + (91 + 10_000 + 3)
        assert int.from_bytes(f.mm[at + 4 : at + 8], "big") == BLANK_MAGIC
    got = store.get("big", 0, 0, 1000)
    assert len(got.messages) == 80
    assert all(m.body == body for m in got.messages)


def test_long_topic_uses_v2_and_ipv6_born_host(store: BlockingMessageStore) -> None:
    topic = "T" * 200
    r = store.put(Message(topic=topic, body=b"v2", born_host="[2001:db8::7]:4242"))
    r2 = store.put_batch([Message(topic=topic, body=b"v2b", born_host="[::1]:1")])[0]
    for res, body, host in ((r, b"v2", "[2001:db8::7]:4242"), (r2, b"v2b", "[::1]:1")):
        m = store.get(topic, res.queue_id, res.queue_offset, 1).messages[0]
        assert (m.topic, m.body, m.born_host) == (topic, body, host)
    raw = store.hot.commitlog.read_bytes(r.commitlog_offset, 8)
    assert raw[4:8] == bytes.fromhex("DAA320AB")


# ----------------------------------------------------------------------------- statuses
def test_get_status_table(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "s")
    (tmp_path / "s" / "consumequeue" / "empty" / "0").mkdir(parents=True)
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="q", body=b"m%d" % i, queue_id=0) for i in range(5)])
        assert store.get("nope", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        assert store.get("empty", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
        r = store.get("q", 0, 5)
        assert (r.status, r.next_offset, r.min_offset, r.max_offset) == (
            GetStatus.OFFSET_OVERFLOW_ONE,
            5,
            0,
            5,
        )
        r = store.get("q", 0, 9)
        assert (r.status, r.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 5)
        r = store.get("q", 0, 3, 10)
        assert (r.status, [m.body for m in r.messages], r.next_offset) == (GetStatus.FOUND, [b"m3", b"m4"], 5)


def test_offset_too_small_after_retention_and_found_null_on_corruption(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "s", file_reserved_time=1.0)
    with BlockingMessageStore.open(cfg) as store:
        hot = store.hot
        hot.commitlog.clock = lambda: 1_000
        store.put_batch([Message(topic="old", body=b"o" * 1000, queue_id=0) for _ in range(300)])
        hot.commitlog.clock = lambda: 10_000_000
        store.put_batch([Message(topic="old", body=b"n" * 1000, queue_id=0) for _ in range(300)])
        assert hot.wait_dispatched(10)
        deleted = hot.apply_retention(now_ms=10_000_000 + 2_000)
        assert deleted >= 1
        lo = store.min_offset("old", 0)
        assert 0 < lo <= 300
        r = store.get("old", 0, 0)
        assert (r.status, r.next_offset) == (GetStatus.OFFSET_TOO_SMALL, lo)
        assert store.get("old", 0, lo).messages[0].queue_offset == lo
        # corrupt the body of the newest record: never returned, and never stepped over
        last = store.get("old", 0, 599).messages[0]
        f = hot.commitlog.files.find(last.commitlog_offset)
        assert f is not None
        at = last.commitlog_offset - f.file_from_offset + 88
        f.mm[at] ^= 0xFF
        r = store.get("old", 0, 599)
        assert (r.status, r.messages, r.next_offset) == (GetStatus.OFFSET_FOUND_NULL, (), 599)


# ----------------------------------------------------------------------------- time lookups
def test_offset_for_time_table(store: BlockingMessageStore) -> None:
    clock = iter([*range(1, 11), 40, 50, 50, 50, 60, 60, 70])
    store.hot.commitlog.clock = lambda: next(clock)
    for i in range(17):
        store.put(Message(topic="time", body=b"%d" % i, queue_id=0))
    table = {
        (35, "lower"): 10,
        (45, "lower"): 11,
        (50, "lower"): 11,
        (50, "upper"): 13,
        (60, "lower"): 14,
        (75, "lower"): 17,
        (0, "lower"): 0,
    }
    for (ts, boundary), expected in table.items():
        assert store.offset_for_time("time", 0, ts, boundary) == expected, (ts, boundary)
    assert store.earliest_time("time", 0) == 1
    with pytest.raises(InvalidArgumentError, match="boundary"):
        store.offset_for_time("time", 0, 5, "middle")


def test_the_store_time_of_a_message_the_hot_store_lacks_is_none(store: BlockingMessageStore) -> None:
    store.put(Message(topic="time", body=b"x", queue_id=0))
    hot = store.hot
    first = hot.earliest_time("time", 0)  # waits until the message is dispatched (visible)
    assert first is not None
    assert hot.store_timestamp("time", 0, 0) == first > 0
    assert hot.store_timestamp("time", 0, 1) is None  # not written yet
    assert hot.store_timestamp("time", 1, 0) is None  # no such queue
    assert hot.earliest_time("nothing", 0) is None
    assert store.earliest_time("time", 1) == -1  # the facade keeps RocketMQ's -1 for "none"


# ----------------------------------------------------------------------------- key index
def test_query_returns_only_true_matches_despite_hash_collisions(tmp_path: Path) -> None:
    # 4 slots: every key collides with many others.
    cfg = small_config(tmp_path / "s", index_slots=4, index_items=200)
    with BlockingMessageStore.open(cfg) as store:
        for i in range(120):
            store.put(
                Message(
                    topic="k",
                    body=b"%d" % i,
                    keys=[f"key-{i % 40}", f"all-{i % 2}"],
                    properties={"UNIQ_KEY": f"U{i}"},
                )
            )
        hits = store.query("k", "key-7", max_count=100)
        assert sorted(int(m.body) for m in hits) == [7, 47, 87]
        assert all("key-7" in m.keys for m in hits)
        assert [int(m.body) for m in store.query("k", "U77")] == [77]
        assert store.query("k", "key-999") == []
        assert store.query("other", "key-7") == []
        assert len(store.query("k", "all-1", max_count=1000)) == 60  # spans several index files
        assert len(store.query("k", "all-1", max_count=5)) == 5


def test_query_respects_time_range(store: BlockingMessageStore) -> None:
    clock = iter([1_000, 2_000, 3_000])
    store.hot.commitlog.clock = lambda: next(clock)
    for i in range(3):
        store.put(Message(topic="tr", body=b"%d" % i, keys=["same"]))
    assert sorted(int(m.body) for m in store.query("tr", "same", begin=1_500, end=3_000)) == [1, 2]
    with pytest.raises(InvalidArgumentError):
        store.query("tr", "same", begin=5, end=1)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("message", "error", "match"),
    [
        (Message(topic="", body=b"x"), InvalidTopicError, "invalid"),
        (Message(topic="bad topic", body=b"x"), InvalidTopicError, "A-Z"),
        (Message(topic="x" * 256, body=b"x"), InvalidTopicError, "1-255"),
        (Message(topic="rmq_sys_INDEX", body=b"x"), InvalidTopicError, "reserved"),
        (Message(topic="t", body="text"), InvalidArgumentError, "bytes"),  # type: ignore[arg-type]
        (Message(topic="t", body=b"x" * (64 * 1024 + 1)), MessageTooLargeError, "max_message_size"),
        (Message(topic="t", body=b"x", properties={"a": "b\x01"}), InvalidPropertiesError, "separator"),
        (Message(topic="t", body=b"x", properties={"a": ""}), InvalidPropertiesError, "non-empty"),
        (Message(topic="t", body=b"x", properties={"p": "v" * 40000}), InvalidPropertiesError, "32767"),
        (Message(topic="t", body=b"x", keys=["has space"]), InvalidPropertiesError, "has space"),
        (Message(topic="t", body=b"x", keys=[""]), InvalidPropertiesError, "non-empty"),
        (Message(topic="t", body=b"x", keys="abc"), InvalidArgumentError, "sequence"),
        (Message(topic="t", body=b"x", keys=["a"], properties={"KEYS": "b"}), InvalidPropertiesError, "both"),
        (Message(topic="t", body=b"x", tags="a\x02"), InvalidPropertiesError, "tags"),
        (Message(topic="t", body=b"x", queue_id=-1), InvalidQueueError, "queue_id"),
        (Message(topic="t", body=b"x", queue_id=1024), InvalidQueueError, r"\[0, 1024\)"),
        (Message(topic="t", body=b"x", queue_id=True), InvalidQueueError, "queue_id"),
        (Message(topic="t", body=b"x", born_host="nowhere"), InvalidArgumentError, "host"),
        # FLAG is an int32 and BORNTIMESTAMP a non-negative int64: out-of-range values used to
        # escape as struct.error / OverflowError from the encoder instead of a typed error.
        (Message(topic="t", body=b"x", flag=2**31), InvalidArgumentError, "flag must be an int32"),
        (Message(topic="t", body=b"x", flag=-(2**31) - 1), InvalidArgumentError, "int32"),
        (Message(topic="t", body=b"x", flag=1.5), InvalidArgumentError, "int32"),  # type: ignore[arg-type]
        (Message(topic="t", body=b"x", flag="7"), InvalidArgumentError, "int32"),  # type: ignore[arg-type]
        (Message(topic="t", body=b"x", born_timestamp=2**63), InvalidArgumentError, "born_timestamp"),
        (Message(topic="t", body=b"x", born_timestamp=-1), InvalidArgumentError, "born_timestamp"),
        (Message(topic="t", body=b"x", born_timestamp="1"), InvalidArgumentError, "born_timestamp"),  # type: ignore[arg-type]
        # A lone surrogate (JSON's "\\udcff" decodes to one) has no UTF-8 form: it used to escape
        # every put path as an untyped UnicodeEncodeError.
        (Message(topic="t", body=b"x", keys=["\udcff"]), InvalidPropertiesError, "surrogate.*udcff"),
        (Message(topic="t", body=b"x", keys=("ok", "a\ud800b")), InvalidPropertiesError, "surrogate.*ud800"),
        (Message(topic="t", body=b"x", tags="\udcff"), InvalidPropertiesError, "surrogate"),
        (Message(topic="t", body=b"x", properties={"p": "\udcff"}), InvalidPropertiesError, "surrogate"),
    ],
)
def test_bad_input_gets_a_typed_error_and_writes_nothing(
    store: BlockingMessageStore, message: Message, error: type[TierdError], match: str
) -> None:
    with pytest.raises(error, match=match):
        store.put(message)
    with pytest.raises(error, match=match):
        store.put_batch([Message(topic="t", body=b"ok"), message])
    with pytest.raises(error, match=match):  # a batch of one shape (the column-wise path)
        store.put_batch([message, message])
    assert store.hot.commitlog.max_offset == 0
    assert isinstance(error("x"), ValueError)


LOOKUP_OF_A_LONE_SURROGATE = """
import sys
from tierd import BlockingMessageStore, Message
from tierd.errors import InvalidArgumentError
from tierd.format.key_hash import key_hash, key_hashes
from tests.local.conftest import small_config

with BlockingMessageStore.open(small_config(__import__("pathlib").Path(sys.argv[1]))) as store:
    store.put(Message(topic="t", body=b"x", keys=("ok",)))
    lookups = (lambda: store.query("t", "\\udcff"), lambda: store.hot.query("t", "a\\udcffb", 8, 0, 2**62))
    for lookup in lookups:
        try:
            lookup()
        except InvalidArgumentError as e:
            print(type(e).__name__, "surrogate" in str(e))
    for hashing in (lambda: key_hash("t#\\udcff"), lambda: key_hashes(["t#a", "t#\\udcff"])):
        try:
            hashing()
        except UnicodeEncodeError as e:
            print(type(e).__name__)
    print("found", len(store.query("t", "ok")))
"""


def test_a_lookup_of_a_key_utf8_cannot_encode_is_a_typed_error(tmp_path: Path) -> None:
    """mmh3's C code crashed the process (SIGSEGV) hashing a string with a lone surrogate, so a
    lookup of such a key took the whole store down. The lookups run in a child process so that,
    without the checks, this test fails instead of killing pytest."""
    r = subprocess.run(
        [sys.executable, "-c", LOOKUP_OF_A_LONE_SURROGATE, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "InvalidArgumentError True",
        "InvalidArgumentError True",
        "UnicodeEncodeError",
        "UnicodeEncodeError",
        "found 1",
    ]


def test_other_argument_errors(store: BlockingMessageStore) -> None:
    with pytest.raises(InvalidArgumentError, match="at least one"):
        store.put_batch([])
    with pytest.raises(InvalidArgumentError, match="Message"):
        store.put("nope")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="offset"):
        store.get("t", 0, -1)
    with pytest.raises(InvalidArgumentError, match="max_count"):
        store.get("t", 0, 0, 0)
    with pytest.raises(InvalidArgumentError, match="policy"):
        store.get("t", 0, 0, 1, policy="SOMETIMES")
    with pytest.raises(InvalidTopicError):
        store.get("bad topic", 0, 0)


def test_closed_store_refuses_everything(cfg: TierdConfig) -> None:
    store = BlockingMessageStore.open(cfg)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosedError):
        store.put(Message(topic="t", body=b"x"))
    with pytest.raises(StoreClosedError):
        store.get("t", 0, 0)


def test_commitlog_file_must_hold_the_largest_record(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="commitlog_file_size"):
        BlockingMessageStore.open(small_config(tmp_path, commitlog_file_size=128 * 1024))


# ----------------------------------------------------------------------------- lock
def test_second_opener_gets_a_clear_error(cfg: TierdConfig, store: BlockingMessageStore) -> None:
    with pytest.raises(StoreLockedError, match="in use by another process"):
        BlockingMessageStore.open(cfg)
    code = (
        "import sys\nfrom tierd import BlockingMessageStore, TierdConfig\n"
        "from tierd.errors import StoreLockedError\n"
        f"cfg = TierdConfig.from_dict({{'store': {{'dir': {str(cfg.store.dir)!r}}}}})\n"
        "try:\n    BlockingMessageStore.open(cfg)\nexcept StoreLockedError as e:\n"
        "    print(e)\n    sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "in use by another process" in proc.stdout


# ----------------------------------------------------------------------------- recovery
def test_reopen_after_clean_close_keeps_everything(cfg: TierdConfig) -> None:
    with BlockingMessageStore.open(cfg) as store:
        res = store.put_batch(
            [Message(topic="p", body=os.urandom(500), keys=[f"k{i}"], queue_id=i % 3) for i in range(900)]
        )
        bodies = {
            (r.queue_id, r.queue_offset): store.get("p", r.queue_id, r.queue_offset, 1).messages[0].body
            for r in res
        }
    with BlockingMessageStore.open(cfg) as store:
        assert store.hot.last_exit_ok
        assert not store.hot.recovery_truncated
        for (qid, off), body in bodies.items():
            assert store.get("p", qid, off, 1).messages[0].body == body
        assert [int(m.body == bodies[(m.queue_id, m.queue_offset)]) for m in store.query("p", "k5")] == [1]
        r = store.put(Message(topic="p", body=b"after", queue_id=0))
        assert r.queue_offset == 300
        assert assert_queues_agree_with_commitlog(store) == 901


@pytest.mark.parametrize(
    "garbage",
    [
        os.urandom(3000),
        bytes(20) + os.urandom(50),
        (500).to_bytes(4, "big") + bytes.fromhex("DAA320A7") + os.urandom(492),
    ],
    # Names, not the random bytes: parallel workers must collect the same test ids.
    ids=["random", "zeros-then-random", "header-then-random"],
)
def test_garbage_after_the_last_record_is_truncated_not_served(cfg: TierdConfig, garbage: bytes) -> None:
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="g", body=b"good%d" % i, queue_id=0) for i in range(50)])
        end = store.hot.commitlog.max_offset
    path = Path(cfg.store.dir) / "commitlog" / f"{0:020d}"
    with path.open("r+b") as fh:
        fh.seek(end)
        fh.write(garbage)
    with BlockingMessageStore.open(cfg) as store:
        assert store.hot.recovery_truncated == any(garbage[:64])
        assert store.hot.commitlog.max_offset == end
        r = store.get("g", 0, 0, 100)
        assert [m.body for m in r.messages] == [b"good%d" % i for i in range(50)]
        store.put(Message(topic="g", body=b"next", queue_id=0))
        assert store.get("g", 0, 50).messages[0].body == b"next"
    with path.open("rb") as fh:
        fh.seek(end)
        data = fh.read(len(garbage) + 200)
    # The new record overwrote the start; the rest of the garbage was erased.
    assert data[91 + 4 + 3 :].count(0) == len(data) - (91 + 4 + 3)


def test_abnormal_exit_rebuilds_queues_and_index_from_the_commitlog(cfg: TierdConfig) -> None:
    """Consume queues and index rebuilt by recovery equal the ones built live (same bytes)."""
    with BlockingMessageStore.open(cfg) as store:
        for i in range(300):
            store.put(
                Message(
                    topic=f"t{i % 3}", body=os.urandom(i), keys=[f"k{i}"], tags=f"tag{i % 5}", queue_id=i % 4
                )
            )
        store.put_batch(
            [Message(topic="t0", body=b"b%d" % i, keys=[f"bk{i}"], tags="bt") for i in range(300)]
        )
    root = Path(cfg.store.dir)
    live_cq = {
        p.relative_to(root): p.read_bytes() for p in (root / "consumequeue").rglob("0*") if p.is_file()
    }
    live_index = [p.read_bytes() for p in sorted((root / "index").iterdir())]
    shutil.rmtree(root / "index")
    simulate_crash(root)
    with BlockingMessageStore.open(cfg) as store:
        assert not store.hot.last_exit_ok
        assert store.query("t1", "k7")[0].body == store.get("t1", 3, 0).messages[0].body
    rebuilt_cq = {
        p.relative_to(root): p.read_bytes() for p in (root / "consumequeue").rglob("0*") if p.is_file()
    }
    rebuilt_index = [p.read_bytes() for p in sorted((root / "index").iterdir())]
    assert rebuilt_cq == live_cq
    assert rebuilt_index == live_index


def test_index_files_dropped_after_a_crash_are_rebuilt_from_their_first_entry(cfg: TierdConfig) -> None:
    """After an abnormal exit, index files written within the checkpoint's safety margin are
    destroyed as possibly torn; recovery must re-dispatch from the first entry they held, not
    only from the checkpoint (which now follows the durable end closely) — else key queries
    miss acknowledged messages."""
    with BlockingMessageStore.open(cfg) as store:
        for i in range(150):  # several index files (400 items each)
            store.put(Message(topic="ix", body=b"m%d" % i, keys=[f"k{i}", f"x{i}"], queue_id=0))
    (Path(cfg.store.dir) / "abort").write_text("crashed")  # killed right after a checkpoint
    with BlockingMessageStore.open(cfg) as store:
        assert not store.hot.last_exit_ok
        assert store.hot.index.rebuild_from is not None
        for i in range(150):
            assert [m.body for m in store.query("ix", f"k{i}")] == [b"m%d" % i], i


def test_torn_consume_queue_unit_is_repaired(cfg: TierdConfig) -> None:
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic="cq", body=b"x%d" % i, queue_id=0) for i in range(10)])
    cq_file = Path(cfg.store.dir) / "consumequeue" / "cq" / "0" / f"{0:020d}"
    raw = bytearray(cq_file.read_bytes())
    raw[9 * UNIT_SIZE + 8 : 10 * UNIT_SIZE] = bytes(12)  # last unit half written
    cq_file.write_bytes(bytes(raw))
    (Path(cfg.store.dir) / "abort").write_text("crashed")
    with BlockingMessageStore.open(cfg) as store:
        assert [m.body for m in store.get("cq", 0, 0, 20).messages] == [b"x%d" % i for i in range(10)]
        assert assert_queues_agree_with_commitlog(store) == 10
    units = decode_units(cq_file.read_bytes()[: 10 * UNIT_SIZE])
    assert (units["size"] > 0).all()


# ----------------------------------------------------------------------------- retention and disk
def test_retention_waits_for_the_delete_guard_and_disk_full_refuses_writes(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "s", file_reserved_time=1.0, disk_max_used_ratio=0.5)
    with BlockingMessageStore.open(cfg) as store:
        hot = store.hot
        hot.commitlog.clock = lambda: 1_000
        store.put_batch([Message(topic="r", body=b"z" * 1000, queue_id=0) for _ in range(600)])
        assert hot.wait_dispatched(10)
        files_before = len(hot.commitlog.files.files)
        allowed = 0
        hot.delete_guard = lambda offset: offset <= allowed
        hot.disk_usage = lambda path: 0.9
        assert hot.apply_retention(now_ms=10**12) == 0
        assert len(hot.commitlog.files.files) == files_before
        with pytest.raises(StoreFullError, match="disk_max_used_ratio"):
            store.put(Message(topic="r", body=b"refused"))
        with pytest.raises(StoreFullError):
            store.put_batch([Message(topic="r", body=b"refused")])
        allowed = hot.commitlog.files.files[1].file_from_offset
        hot.disk_usage = lambda path: 0.1
        assert hot.apply_retention(now_ms=10**12) == 1
        assert store.min_offset("r", 0) > 0
        store.put(Message(topic="r", body=b"accepted"))  # writes resume


# ----------------------------------------------------------------------------- concurrency & flush
@pytest.mark.parametrize("flush", ["async", "sync"])
def test_concurrent_producers_get_gap_free_offsets(tmp_path: Path, flush: str) -> None:
    cfg = small_config(tmp_path / "s", flush=flush, default_queues=3)
    per_thread = 400
    with BlockingMessageStore.open(cfg) as store:
        results: list[list[tuple[int, int, bytes]]] = [[] for _ in range(4)]

        def produce(t: int) -> None:
            for i in range(per_thread):
                body = b"%d-%d" % (t, i)
                if i % 10 == 0:
                    rs = list(store.put_batch([Message(topic="c", body=body)]))
                else:
                    rs = [store.put(Message(topic="c", body=body))]
                results[t].extend((r.queue_id, r.queue_offset, body) for r in rs)

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        by_queue: dict[int, list[int]] = {}
        for qid, off, _ in itertools.chain.from_iterable(results):
            by_queue.setdefault(qid, []).append(off)
        for offs in by_queue.values():
            assert sorted(offs) == list(range(len(offs)))
        for qid, off, body in itertools.chain.from_iterable(results):
            assert store.get("c", qid, off, 1).messages[0].body == body
        # each thread's messages stay in its own order within a queue
        for t in range(4):
            per_q: dict[int, list[int]] = {}
            for qid, off, _ in results[t]:
                per_q.setdefault(qid, []).append(off)
            assert all(v == sorted(v) for v in per_q.values())
        if flush == "sync":
            fl = store.hot.flusher
            assert fl.requests_served >= 4 * per_thread * 0.9
            assert fl.flushed_offset >= store.hot.commitlog.max_offset


def test_sync_put_returns_only_after_its_bytes_are_durable(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "s", flush="sync", flush_interval_ms=60_000)
    with BlockingMessageStore.open(cfg) as store:
        for i in range(20):
            r = store.put(Message(topic="d", body=b"%d" % i))
            assert store.hot.flusher.flushed_offset > r.commitlog_offset


def test_async_facade(cfg: TierdConfig) -> None:
    async def scenario() -> None:
        async with MessageStore.open(cfg) as store:
            r = await store.put(Message(topic="a", body=b"1", keys=["k"]))
            rs = await store.put_batch([Message(topic="a", body=b"2", queue_id=r.queue_id)])
            got = await store.get("a", r.queue_id, 0, 10)
            assert [m.body for m in got.messages] == [b"1", b"2"]
            assert rs[0].queue_offset == 1
            assert [m.body for m in await store.query("a", "k")] == [b"1"]
            assert store.max_offset("a", r.queue_id) == 2
            assert store.topics() == {"a": [r.queue_id]}
        store2 = await MessageStore.open(cfg)
        assert (await store2.get("a", r.queue_id, 1)).messages[0].body == b"2"
        await store2.close()

    asyncio.run(scenario())


def test_put_batch_result_is_a_lazy_sequence(store: BlockingMessageStore) -> None:
    res = store.put_batch([Message(topic="l", body=b"%d" % i, queue_id=0) for i in range(5)])
    assert len(res) == 5
    assert res[-1].queue_offset == 4
    assert [r.queue_offset for r in res[1:3]] == [1, 2]
    assert isinstance(res.queue_offsets, np.ndarray)
    assert "5 messages" in repr(res)


def test_full_rescan_crosses_every_file_end_whatever_the_blank_size(cfg: TierdConfig) -> None:
    """Recovery walks blank end-of-file markers of any size (8 bytes up) into the next file."""
    rng = np.random.default_rng(7)
    sizes = np.where(rng.random(3000) < 0.9, rng.integers(0, 60, 3000), rng.integers(2_000, 20_000, 3000))
    with BlockingMessageStore.open(cfg) as store:
        for i, n in enumerate(sizes):
            store.put(Message(topic="scan", body=bytes([i % 251]) * int(n), queue_id=0))
        files = store.hot.commitlog.files.files
        blanks = []
        for f in files[:-1]:
            pos = 0
            while True:
                size = int.from_bytes(f.mm[pos : pos + 4], "big")
                if int.from_bytes(f.mm[pos + 4 : pos + 8], "big") == BLANK_MAGIC:
                    blanks.append(size)
                    break
                pos += size
    assert min(blanks) < 88 <= max(blanks)  # both short and long markers occur
    simulate_crash(Path(cfg.store.dir))
    with BlockingMessageStore.open(cfg) as store:
        got = store.get("scan", 0, 0, 4096).messages
        assert len(store.hot.commitlog.files.files) == len(files)
        assert [len(m.body) for m in got] == sizes.tolist()


@pytest.mark.parametrize("single", [True, False])
def test_torn_first_record_of_a_new_file_is_dropped_and_writing_resumes(
    cfg: TierdConfig, single: bool
) -> None:
    body = b"q" * 9_000
    with BlockingMessageStore.open(cfg) as store:
        res = [store.put(Message(topic="edge", body=body, queue_id=0)) for _ in range(30)]
        second_file = store.hot.commitlog.files.files[1].file_from_offset
        first_in_second = next(r for r in res if r.commitlog_offset == second_file)
        keep = [r for r in res if r.commitlog_offset < second_file]
    path = Path(cfg.store.dir) / "commitlog" / f"{second_file:020d}"
    with path.open("r+b") as fh:  # tear the first record of file 2 and everything after it
        fh.seek(100)
        fh.write(bytes(os.path.getsize(path) - 100))
    simulate_crash(Path(cfg.store.dir))
    with BlockingMessageStore.open(cfg) as store:
        assert store.hot.recovery_truncated
        assert len(store.hot.commitlog.files.files) == 1
        assert store.max_offset("edge", 0) == len(keep) == first_in_second.queue_offset
        r = (
            store.put(Message(topic="edge", body=b"after"))
            if single
            else store.put_batch([Message(topic="edge", body=b"after")])[0]
        )
        assert r.commitlog_offset == second_file
        assert store.get("edge", 0, len(keep)).messages[0].body == b"after"


def test_no_space_for_a_new_file_is_a_clean_store_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os as os_module

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def no_space_to_write(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with BlockingMessageStore.open(small_config(tmp_path / "s")) as store:
        store.put(Message(topic="f", body=b"before", queue_id=0))
        assert store.hot.wait_dispatched(10)
        # The commitlog reserves blocks (fallocate) before writing through its mapping; consume
        # queues are written with pwrite, which reports a full disk itself.
        monkeypatch.setattr(os_module, "posix_fallocate", no_space)
        monkeypatch.setattr(os_module, "pwrite", no_space_to_write)
        with pytest.raises(StoreFullError, match="no disk space"):
            store.put_batch([Message(topic="f", body=b"x" * 60_000, queue_id=0) for _ in range(10)])
        # nothing of the failed batch was written or counted
        assert store.max_offset("f", 0) == 1
        assert len(store.hot.commitlog.files.files) == 1
        # a new queue needs a consume-queue file: dispatch fails, keeps retrying, never drops it
        r = store.put(Message(topic="g", body=b"waits", queue_id=0))
        assert not store.hot.wait_dispatched(0.3)
        assert store.hot.reput.last_error is not None
        monkeypatch.undo()
        assert store.hot.wait_dispatched(10)
        assert store.hot.reput.last_error is None
        assert store.get("g", 0, r.queue_offset).messages[0].body == b"waits"
        assert store.get("f", 0, 0).messages[0].body == b"before"
        r = store.put_batch([Message(topic="f", body=b"x" * 60_000, queue_id=0) for _ in range(10)])[0]
        assert r.queue_offset == 1
        assert store.get("f", 0, 1).messages[0].body == b"x" * 60_000


def test_seeded_queue_continues_at_its_floor_across_restarts(cfg: TierdConfig) -> None:
    with BlockingMessageStore.open(cfg) as store:
        store.hot.seed_queue("restored", 1, 1234)
        assert (store.min_offset("restored", 1), store.max_offset("restored", 1)) == (1234, 1234)
    with BlockingMessageStore.open(cfg) as store:  # the floor survives a restart with no message yet
        assert store.max_offset("restored", 1) == 1234
        r = store.put(Message(topic="restored", body=b"next", queue_id=1))
        assert r.queue_offset == 1234
        assert store.get("restored", 1, 1000).status is GetStatus.OFFSET_TOO_SMALL
    simulate_crash(Path(cfg.store.dir))
    with BlockingMessageStore.open(cfg) as store:  # and recovery keeps units after a floor
        assert store.min_offset("restored", 1) == 1234
        r2 = store.put(Message(topic="restored", body=b"then", queue_id=1))
        assert r2.queue_offset == 1235
        assert [m.body for m in store.get("restored", 1, 1234, 10).messages] == [b"next", b"then"]
        store.hot.seed_queue("restored", 1, 10)  # never moves a queue backwards
        assert store.max_offset("restored", 1) == 1236


def test_a_missing_c_extension_is_said_once_at_open(
    cfg: TierdConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tierd.local.store

    said_once = tierd.local.store.note_python_fallbacks
    said_once.cache_clear()
    with caplog.at_level("WARNING", logger="tierd.local.store"), BlockingMessageStore.open(cfg):
        pass
    assert not [r for r in caplog.records if "C extension" in r.getMessage()]  # both built here

    said_once.cache_clear()
    monkeypatch.setattr(tierd.local.store, "PREPARE_ACCELERATED", False)
    try:
        for _ in range(2):
            with caplog.at_level("WARNING", logger="tierd.local.store"), BlockingMessageStore.open(cfg):
                pass
    finally:
        said_once.cache_clear()
    said = [r.getMessage() for r in caplog.records if "C extension" in r.getMessage()]
    assert len(said) == 1, said
    assert "put and put_batch encoder (tierd.format._records)" in said[0]
    assert "cold-read decoder" not in said[0]
