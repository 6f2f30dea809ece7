"""Record codec: golden bytes built by hand from FORMATS §1.1, round trips, strict rejection."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierd.errors import CorruptRecordError, InvalidArgumentError
from tierd.format import record as codec
from tierd.format.batch import encode_batch
from tierd.format.cq_unit import java_string_hash, tags_code
from tierd.format.host import encode_host
from tierd.format.message_id import offset_msg_id, parse_offset_msg_id
from tierd.format.properties import decode_properties, encode_properties
from tierd.format.record import (
    BLANK,
    INVALID,
    MAGIC_V2,
    VALID,
    decode_record,
    encode_record,
    scan_record,
    topic_field,
)

STORE = encode_host("10.0.0.2:10911")
BORN = encode_host("192.168.1.7:5555")


def golden_v1() -> bytes:
    """A v1 record with IPv4 hosts written field by field with struct — not via the encoder."""
    body = b"hello tierd"
    topic = b"orders"
    props = b"KEYS\x01o-1 o-2\x02TAGS\x01paid\x02"
    total = (
        4
        + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + 8
        + 8
        + 8
        + 4
        + 8
        + 4
        + len(body)
        + 1
        + len(topic)
        + 2
        + len(props)
    )
    out = b""
    out += struct.pack(">i", total)
    out += struct.pack(">I", 0xDAA320A7)
    out += struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF)
    out += struct.pack(">i", 3)  # queue id
    out += struct.pack(">i", 7)  # flag
    out += struct.pack(">q", 42)  # queue offset
    out += struct.pack(">q", 4096)  # physical offset
    out += struct.pack(">i", 0)  # sysflag
    out += struct.pack(">q", 1_700_000_000_000)  # born ts
    out += bytes([192, 168, 1, 7]) + struct.pack(">i", 5555)
    out += struct.pack(">q", 1_700_000_000_123)  # store ts
    out += bytes([10, 0, 0, 2]) + struct.pack(">i", 10911)
    out += struct.pack(">i", 0)  # reconsume
    out += struct.pack(">q", 0)  # prepared tx offset
    out += struct.pack(">i", len(body)) + body
    out += bytes([len(topic)]) + topic
    out += struct.pack(">h", len(props)) + props
    return out


def _encode_like_golden(**overrides: object) -> bytes:
    magic, topic_part = topic_field(b"orders")
    args: dict[str, object] = dict(
        body=b"hello tierd",
        topic_part=topic_part,
        magic=magic,
        properties=b"KEYS\x01o-1 o-2\x02TAGS\x01paid\x02",
        queue_id=3,
        flag=7,
        queue_offset=42,
        physical_offset=4096,
        sys_flag=0,
        born_timestamp=1_700_000_000_000,
        born_host=BORN,
        store_timestamp=1_700_000_000_123,
        store_host=STORE,
    )
    args.update(overrides)
    return encode_record(**args)  # type: ignore[arg-type]


def test_encode_matches_hand_built_golden_bytes() -> None:
    assert _encode_like_golden() == golden_v1()


@settings(max_examples=200)
@given(st.binary(max_size=5000))
def test_body_crc_function_is_zlibs_crc32(data: bytes) -> None:
    """The fast CRC (ISA-L) must be exactly zlib's CRC-32 for every input type we pass it."""
    want = zlib.crc32(data)
    assert codec.crc32(data) == want
    assert codec.crc32(memoryview(data)) == want
    assert codec.crc32(bytearray(data)) == want


def test_fixed_overhead_is_91_bytes_v1_and_92_v2() -> None:
    empty_v1 = _encode_like_golden(body=b"", topic_part=b"\x00", properties=b"")
    assert len(empty_v1) == 91
    empty_v2 = _encode_like_golden(body=b"", topic_part=b"\x00\x00", magic=MAGIC_V2, properties=b"")
    assert len(empty_v2) == 92


def test_decode_golden() -> None:
    m = decode_record(golden_v1())
    assert (m.topic, m.queue_id, m.flag, m.queue_offset, m.commitlog_offset) == ("orders", 3, 7, 42, 4096)
    assert m.body == b"hello tierd"
    assert m.keys == ("o-1", "o-2")
    assert m.tags == "paid"
    assert m.born_host == "192.168.1.7:5555"
    assert m.store_host == "10.0.0.2:10911"
    assert m.store_timestamp == 1_700_000_000_123
    assert m.msg_id == "0A00000200002A9F0000000000001000"


def test_properties_are_the_raw_field_parsed_once_and_read_only() -> None:
    m = decode_record(golden_v1())
    assert m.raw_properties == b"KEYS\x01o-1 o-2\x02TAGS\x01paid\x02"
    props = m.properties
    assert dict(props) == {"KEYS": "o-1 o-2", "TAGS": "paid"}
    assert m.properties is props  # parsed on first access only
    with pytest.raises(TypeError):
        props["TAGS"] = "other"  # type: ignore[index]
    bare = decode_record(_encode_like_golden(properties=b""))
    assert bare.raw_properties == b""
    assert dict(bare.properties) == {}
    assert bare.keys == ()
    assert bare.tags is None
    assert decode_record(golden_v1()) == m  # the parsed cache takes no part in equality


def test_v2_record_has_two_byte_topic_length_and_v2_magic() -> None:
    topic = ("t" * 200).encode()
    magic, part = topic_field(topic)
    assert magic == MAGIC_V2
    assert part[:2] == struct.pack(">h", 200)
    rec = _encode_like_golden(topic_part=part, magic=magic)
    assert struct.unpack_from(">I", rec, 4)[0] == 0xDAA320AB
    assert decode_record(rec).topic == "t" * 200


def test_ipv6_hosts_set_sysflag_bits_and_shift_fields() -> None:
    born6 = encode_host("[2001:db8::1]:9876")
    store6 = encode_host("[::1]:10911")
    rec = _encode_like_golden(born_host=born6, store_host=store6)
    sysflag = struct.unpack_from(">i", rec, 36)[0]
    assert sysflag & 0x10
    assert sysflag & 0x20
    # born host 16+4 at 48, store timestamp right after it
    assert rec[48:64] == bytes.fromhex("20010db8000000000000000000000001")
    assert struct.unpack_from(">q", rec, 68)[0] == 1_700_000_000_123
    m = decode_record(rec)
    assert m.born_host == "[2001:db8::1]:9876"
    assert m.store_host == "[::1]:10911"
    assert len(m.msg_id) == 56
    assert parse_offset_msg_id(m.msg_id) == ("[::1]:10911", 4096)


@pytest.mark.parametrize("born", ["1.2.3.4:5", "[2001:db8::1]:9876"])
def test_store_timestamp_is_read_from_the_header_alone(born: str) -> None:
    rec = _encode_like_golden(born_host=encode_host(born), store_timestamp=1_700_000_000_777)
    buf = b"\0" * 7 + rec  # at any position in a file
    assert codec.store_timestamp_at(buf, 7) == decode_record(rec).store_timestamp == 1_700_000_000_777


def test_java_string_hash_vectors() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("TopicTest#MessageKey") == 638347386
    # Overflow wraps to a negative 32-bit value, like Java.
    assert java_string_hash("polygenelubricants") == -2147483648
    # Non-BMP characters hash as two UTF-16 code units.
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00
    assert tags_code(None) == 0
    assert tags_code("TagA") == java_string_hash("TagA")


def test_properties_round_trip_and_ignore_malformed_pieces() -> None:
    props = {"KEYS": "a b", "TAGS": "t", "custom": "v=1"}
    assert decode_properties(encode_properties(props)) == props
    assert decode_properties(b"x\x01\x02\x01y\x02ok\x011\x02") == {"ok": "1"}


def test_offset_msg_id_round_trip_and_errors() -> None:
    mid = offset_msg_id(STORE, 123456789)
    assert mid == "0A00000200002A9F00000000075BCD15"
    assert parse_offset_msg_id(mid) == ("10.0.0.2:10911", 123456789)
    with pytest.raises(InvalidArgumentError):
        parse_offset_msg_id("zz")
    with pytest.raises(InvalidArgumentError):
        parse_offset_msg_id("00")


@pytest.mark.parametrize("host", ["nohost", "1.2.3.4", "1.2.3.4:99999", "[::1", "300.1.1.1:1"])
def test_bad_hosts_rejected(host: str) -> None:
    with pytest.raises(InvalidArgumentError, match="host"):
        encode_host(host)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: r[:4] + b"\x00\x00\x00\x00" + r[8:], "bad magic"),
        (lambda r: struct.pack(">i", len(r) + 10) + r[4:], "does not fit"),
        (lambda r: struct.pack(">i", 50) + r[4:], "does not fit"),
        (lambda r: r[:-1] + bytes([r[-1] ^ 0xFF]), "UTF-8|CRC|lengths"),
        (lambda r: r[:90] + bytes([r[90] ^ 1]) + r[91:], "CRC"),
        (lambda r: r[:84] + struct.pack(">i", 5000) + r[88:], "overruns"),
        (lambda r: r[:-30], "does not fit"),
    ],
)
def test_decode_rejects_corruption(mutate: object, reason: str) -> None:
    bad = mutate(golden_v1())  # type: ignore[operator]
    with pytest.raises(CorruptRecordError, match=reason):
        decode_record(bad)
    assert scan_record(bad, 0, len(bad), True)[0] == INVALID


def test_scan_reports_blank_marker() -> None:
    buf = golden_v1() + codec.blank_marker(40) + bytes(32)
    status, size, view = scan_record(buf, 0, len(buf), True)
    assert status == VALID
    assert view is not None
    assert view.topic == "orders"
    assert scan_record(buf, size, len(buf), True)[:2] == (BLANK, 40)


hosts = st.sampled_from(["127.0.0.1:1", "10.1.2.3:65535", "[::1]:9", "[fe80::1:2]:10911"])
prop_text = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), min_size=1, max_size=20
)


@settings(max_examples=150, deadline=None)
@given(
    body=st.binary(max_size=2000),
    topic=st.from_regex(r"[A-Za-z0-9_%|-]{1,255}", fullmatch=True),
    props=st.dictionaries(prop_text, prop_text, max_size=5),
    born=hosts,
    store=hosts,
    qid=st.integers(0, 2**31 - 1),
    qoff=st.integers(0, 2**63 - 1),
    phys=st.integers(0, 2**63 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    ts=st.integers(0, 2**62),
)
def test_round_trip(
    body: bytes,
    topic: str,
    props: dict[str, str],
    born: str,
    store: str,
    qid: int,
    qoff: int,
    phys: int,
    flag: int,
    ts: int,
) -> None:
    magic, part = topic_field(topic.encode())
    assert (magic == MAGIC_V2) == (len(topic) > 127)
    rec = encode_record(
        body=body,
        topic_part=part,
        magic=magic,
        properties=encode_properties(props),
        queue_id=qid,
        flag=flag,
        queue_offset=qoff,
        physical_offset=phys,
        sys_flag=0,
        born_timestamp=ts,
        born_host=encode_host(born),
        store_timestamp=ts + 1,
        store_host=encode_host(store),
    )
    m = decode_record(rec)
    assert (m.topic, m.body, dict(m.properties), m.queue_id, m.queue_offset) == (
        topic,
        body,
        props,
        qid,
        qoff,
    )
    assert (m.commitlog_offset, m.flag, m.born_timestamp, m.store_timestamp) == (phys, flag, ts, ts + 1)
    assert m.size == len(rec)
    assert (m.born_host, m.store_host) == (born, store)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=300),
            st.sampled_from(["a", "topic-b", "x" * 130]),
            st.binary(max_size=40).map(lambda b: b.replace(b"\x01", b"").replace(b"\x02", b"")),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_batch_encoder_equals_single_encoder(items: list[tuple[bytes, str, bytes]]) -> None:
    n = len(items)
    fields = [topic_field(t.encode()) for _, t, _ in items]
    tails = [part + len(p).to_bytes(2, "big") + p for (_, _, p), (_, part) in zip(items, fields, strict=True)]
    bodies = [b for b, _, _ in items]
    body_lengths = np.array([len(b) for b in bodies], np.int64)
    sizes = body_lengths + np.array([len(t) for t in tails]) + 88
    phys = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    qoffs = np.arange(100, 100 + n, dtype=np.int64)
    crcs = np.array([zlib.crc32(b) & 0x7FFFFFFF for b in bodies], np.uint32)
    batch = b"".join(
        encode_batch(
            bodies=bodies,
            tails=tails,
            magics=np.array([m for m, _ in fields], np.uint32),
            crcs=crcs,
            queue_ids=np.full(n, 2, np.int32),
            flags=np.zeros(n, np.int32),
            queue_offsets=qoffs,
            physical_offsets=phys,
            sizes=sizes,
            body_lengths=body_lengths,
            born_timestamps=np.full(n, 5, np.int64),
            born_host=BORN,
            store_timestamp=9,
            store_host=STORE,
        )
    )
    singles = b"".join(
        encode_record(
            body=b,
            topic_part=part,
            magic=magic,
            properties=p,
            queue_id=2,
            flag=0,
            queue_offset=100 + i,
            physical_offset=int(phys[i]),
            sys_flag=0,
            born_timestamp=5,
            born_host=BORN,
            store_timestamp=9,
            store_host=STORE,
        )
        for i, ((b, _, p), (magic, part)) in enumerate(zip(items, fields, strict=True))
    )
    assert batch == singles


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=300),
            st.sampled_from(["a", "topic-b", "x" * 130]),
            st.dictionaries(prop_text, prop_text, max_size=3),
            st.booleans(),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_batch_decoder_equals_record_decoder(items: list[tuple[bytes, str, dict[str, str], bool]]) -> None:
    from tierd.format.batch import RecordBatch

    records: list[bytes] = []
    for i, (body, topic, props, v6) in enumerate(items):
        magic, part = topic_field(topic.encode())
        records.append(
            encode_record(
                body=body,
                topic_part=part,
                magic=magic,
                properties=encode_properties(props),
                queue_id=i % 3,
                flag=i,
                queue_offset=100 + i,
                physical_offset=sum(map(len, records)),
                sys_flag=0,
                born_timestamp=7,
                born_host=encode_host("[::1]:5" if v6 else "1.2.3.4:5"),
                store_timestamp=9,
                store_host=STORE,
            )
        )
    data = b"".join(records)
    sizes = np.array([len(r) for r in records], np.int64)
    batch = RecordBatch(data, np.cumsum(sizes) - sizes, sizes)
    for i in range(len(records)):
        fast, slow = (
            batch.message(i),
            decode_record(data, int(batch.starts[i]), limit=int(batch.starts[i] + sizes[i])),
        )
        assert fast == slow


def test_batch_decoder_rejects_corruption() -> None:
    from tierd.format.batch import RecordBatch

    rec = golden_v1()
    data = bytearray(rec * 3)
    data[len(rec) + 90] ^= 0xFF  # body of the second record
    sizes = np.array([len(rec)] * 3, np.int64)
    batch = RecordBatch(bytes(data), np.array([0, len(rec), 2 * len(rec)], np.int64), sizes)
    assert batch.message(0).body == b"hello tierd"
    with pytest.raises(CorruptRecordError, match="CRC"):
        batch.message(1)
    assert batch.message(2).body == b"hello tierd"
    bad = bytearray(rec)
    bad[84:88] = (5000).to_bytes(4, "big")  # body length overruns the record: framing is checked
    broken = RecordBatch(bytes(bad), np.array([0], np.int64), np.array([len(rec)], np.int64))
    with pytest.raises(CorruptRecordError, match="overruns"):
        broken.message(0)


def _queue_records(props: list[bytes], topic: bytes = b"tq", first: int = 40) -> tuple[bytes, np.ndarray]:
    """Records of one queue at consecutive offsets from ``first``, with raw PROPERTIES fields."""
    magic, part = topic_field(topic)
    records: list[bytes] = []
    for i, raw in enumerate(props):
        records.append(
            encode_record(
                body=bytes([i % 251]) * (i * 37 % 300),
                topic_part=part,
                magic=magic,
                properties=raw,
                queue_id=3,
                flag=i,
                queue_offset=first + i,
                physical_offset=sum(map(len, records)),
                sys_flag=0,
                born_timestamp=7 + i,
                born_host=encode_host("1.2.3.4:5"),
                store_timestamp=9 + i,
                store_host=STORE,
            )
        )
    return b"".join(records), np.array([len(r) for r in records], np.int64)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.dictionaries(prop_text, prop_text, max_size=3), min_size=1, max_size=30),
    st.data(),
)
def test_queue_messages_equal_record_decoder(props: list[dict[str, str]], data: st.DataObject) -> None:
    """The column-wise queue decoder returns exactly what the record decoder does, for any
    slice of the batch."""
    from tierd.format.batch import RecordBatch

    raw, sizes = _queue_records([encode_properties(p) for p in props])
    starts = np.cumsum(sizes) - sizes
    batch = RecordBatch(raw, starts, sizes)
    a = data.draw(st.integers(0, len(props) - 1))
    b = data.draw(st.integers(a + 1, len(props)))
    got = batch.queue_messages(a, b, "tq", 3, 40)
    assert got == [decode_record(raw, int(starts[i]), limit=int(starts[i] + sizes[i])) for i in range(a, b)]


@pytest.mark.parametrize(
    "damage",
    ["body", "props_invalid", "props_split_sequence"],
)
def test_queue_messages_refuse_a_batch_with_one_bad_record(damage: str) -> None:
    """One bad record among good ones makes the column-wise decoder give up (None), so the
    caller decodes message by message and names it. ``props_split_sequence``: record 4's
    properties end with the first byte of "é" and record 5's start with the second — each is
    invalid UTF-8 although the two side by side are valid, so a check of all properties at
    once must not glue them together."""
    from tierd.format.batch import RecordBatch

    props = [b"KEYS\x01k\x02"] * 8
    if damage == "props_invalid":
        props[5] = b"KEYS\x01\xff\x02"
    elif damage == "props_split_sequence":
        props[4], props[5] = b"KEYS\x01k\xc3", b"\xa9\x01v\x02"
    raw, sizes = _queue_records(props)
    starts = np.cumsum(sizes) - sizes
    data = bytearray(raw)
    if damage == "body":
        assert RecordBatch(raw, starts, sizes).queue_messages(0, 8, "tq", 3, 40) is not None
        data[int(starts[5]) + codec.HEADER_V4] ^= 0x01  # the first byte of record 5's body
    batch = RecordBatch(bytes(data), starts, sizes)
    assert batch.queue_messages(0, 8, "tq", 3, 40) is None
    assert batch.queue_messages(0, 4, "tq", 3, 40) is not None  # the records before them are fine
    with pytest.raises(CorruptRecordError):
        batch.message(5)


def test_a_size_too_small_for_ipv6_hosts_is_corruption_not_a_crash() -> None:
    # 100 bytes whose SYSFLAG claims two IPv6 hosts: the header alone would need 112. Recovery
    # scans garbage like this at a file's tail and must see INVALID, not a struct.error.
    buf = bytearray(100)
    struct.pack_into(">iI", buf, 0, 95, codec.MAGIC_V1)
    struct.pack_into(">i", buf, codec.POS_SYSFLAG, codec.SYSFLAG_BORNHOST_V6 | codec.SYSFLAG_STOREHOST_V6)
    assert scan_record(memoryview(buf), 0, len(buf), True) == (INVALID, 0, None)
    with pytest.raises(CorruptRecordError, match="smaller than its 112-byte header"):
        decode_record(bytes(buf), 0)
