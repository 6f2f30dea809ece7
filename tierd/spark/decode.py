"""Commitlog bytes → Arrow record batches, column-wise (FORMATS §1.1).

A Spark task spends its time per row, so nothing here builds a Python object per record. Where
the C extension is built (:data:`COMPILED`), the TOTALSIZE chain, every record's checks and body
CRC, its fixed fields and the body column are one C pass each (``frame_records``,
``spark_check`` in ``tierd/format/_decode.c``); a batch that pass does not take whole
(IPv6 hosts, any damage) is decoded by the Python path below, which names the bad record. That
path's only per-record Python objects are one memoryview slice and one ``crc32`` call per body
(the CRC check is not optional). Everything else is numpy over the whole buffer (fixed header fields
gathered at per-record positions, so IPv4 and IPv6 hosts mix freely) or pyarrow compute
(properties split into the map column, KEYS into the array column, TAGS looked up). Hosts are
decoded once per distinct value, message ids by :func:`tierd.format.message_id.offset_msg_ids`.

Validation is the codec's, in bulk: magic, field lengths that must add up to TOTALSIZE, body CRC,
UTF-8 of topic and properties — plus what only the cold layout promises: PHYSICALOFFSET equals
the record's flat commitlog offset, and topic and queue id are the queue's. The first bad record
raises :class:`~tierd.errors.CorruptRecordError` naming the object, the position in it and the
flat offset; the codec's own decoder is asked for the precise reason. Nothing is skipped.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierd.errors import CorruptRecordError
from tierd.format.columns import Framing, total_size_at
from tierd.format.columns import frame as _frame
from tierd.format.compiled import SparkFunctions, spark_functions
from tierd.format.host import decode_host
from tierd.format.layout import (
    BODY_CRC_MASK,
    HEADER_V4,
    HOST_V4,
    MAGIC_V1,
    MAGIC_V2,
    MIN_TAIL,
    POS_BORN_HOST,
    PROPERTIES_LENGTH_WIDTH,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_HOSTS_V6,
    SYSFLAG_STOREHOST_V6,
    TOPIC_LENGTH_WIDTH,
    field_dtype,
    gather_at,
    header_length,
    host_widths,
    position,
)
from tierd.format.layout import MIN_RECORD_SIZE as MIN_RECORD_SIZE
from tierd.format.message_id import offset_msg_ids
from tierd.format.properties import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from tierd.format.record import crc32, decode_record
from tierd.spark.filters import property_mask, row_mask

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import numpy.typing as npt

    from tierd.spark.filters import Constraints
    from tierd.spark.plan import SegmentRange
    from tierd.spark.storage import ColdStorage, SegmentSource

__all__ = [
    "ARROW_SCHEMA",
    "COMPILED",
    "MAX_RECORD_SIZE",
    "MIN_RECORD_SIZE",
    "Framing",
    "decode_records",
    "frame",
    "read_range",
]

#: The columns of DESIGN's Spark interface, as Spark's ``to_arrow_schema`` renders them. Only
#: ``tags`` and ``uniq_key`` can be null (a message without them); every other column is declared
#: non-nullable, which spares Spark a null check per value when it copies rows out of the batches
#: (~15 % of its CPU for a full scan). Array elements and map values keep Spark's default.
ARROW_SCHEMA: Final = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue_id", pa.int32(), nullable=False),
        pa.field("queue_offset", pa.int64(), nullable=False),
        pa.field("physical_offset", pa.int64(), nullable=False),
        pa.field("store_timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("born_timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.list_(pa.field("element", pa.string())), nullable=False),
        pa.field("msg_id", pa.string(), nullable=False),
        pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("sys_flag", pa.int32(), nullable=False),
        pa.field("reconsume_times", pa.int32(), nullable=False),
        pa.field("born_host", pa.string(), nullable=False),
        pa.field("store_host", pa.string(), nullable=False),
        pa.field("uniq_key", pa.string()),
    ]
)
#: Smallest valid record: IPv4 header, empty body, empty topic length byte, properties length.
#: Sanity bound on TOTALSIZE (the store allows max_message_size + 64 KiB; this leaves room for
#: stores configured far above the 4 MiB default while still catching garbage sizes).
MAX_RECORD_SIZE: Final = 256 * 1024 * 1024

_U2 = np.dtype(">u2")
_I4 = np.dtype(">i4")
_U4 = np.dtype(">u4")
_I8 = np.dtype(">i8")
_U8 = np.dtype(">u8")
_EMPTY_INDEX = np.zeros(0, np.int64)
#: A record's header with IPv4 hosts — bytes ``[0, HEADER_V4)``, up to and including BODYLENGTH
#: — as one numpy item. The fields before BORNHOST are where they are whatever the host widths;
#: the others only where both hosts are IPv4 (SYSFLAG says). Decoding gathers every record's
#: header at once (two cache lines per record) instead of one field at a time: a 16 MiB piece
#: does not stay in the CPU cache, so each per-field gather missed it once per record.
#: (Column name here, field name in :mod:`tierd.format.layout`.)
_HEAD_FIELDS: Final = (
    ("magic", "magic"),
    ("body_crc", "body_crc"),
    ("queue_id", "queue_id"),
    ("queue_offset", "queue_offset"),
    ("physical_offset", "physical_offset"),
    ("sysflag", "sys_flag"),
    ("born_timestamp", "born_timestamp"),
    ("born_host", "born_host"),
    ("store_timestamp", "store_timestamp"),
    ("store_host", "store_host"),
    ("reconsume_times", "reconsume_times"),
    ("body_len", "body_length"),
)
_HEAD_V4: Final = np.dtype(
    {
        "names": [name for name, _ in _HEAD_FIELDS],
        # Hosts as one big-endian integer of their 8 bytes (see _hosts).
        "formats": [_U8 if field.endswith("host") else field_dtype(field) for _, field in _HEAD_FIELDS],
        "offsets": [position(field, HOST_V4, HOST_V4) for _, field in _HEAD_FIELDS],
        "itemsize": HEADER_V4,
    }
)
#: The same bytes as an opaque item, which numpy gathers with one copy per record.
_HEAD_BYTES: Final = np.dtype((np.void, HEADER_V4))
_V6_FLAGS: Final = SYSFLAG_HOSTS_V6
#: One row of the compiled check's output (``SparkRow`` in ``_decode.c``): the fields the
#: columns are built from, native-endian but for the hosts (their stored bytes, as ``_HEAD_V4``
#: has them). Named as ``_HEAD_V4``'s fields, so the column code takes either.
_ROW: Final = np.dtype(
    {
        "names": [
            "queue_offset",
            "physical_offset",
            "born_timestamp",
            "store_timestamp",
            "born_host",
            "store_host",
            "props_start",
            "sysflag",
            "reconsume_times",
        ],
        "formats": ["=i8", "=i8", "=i8", "=i8", _U8, _U8, "=i8", "=i4", "=i4"],
        "offsets": [0, 8, 16, 24, 32, 40, 48, 56, 60],
        "itemsize": 64,
    }
)

_COMPILED: SparkFunctions | None = spark_functions()
#: Whether framing, record checks and the body column are done in C (``_decode.c``); else
#: in Python, with the same results.
COMPILED: Final = _COMPILED is not None


def frame(data: bytes, fail: Callable[[int, str], CorruptRecordError]) -> Framing:
    """Starts of the complete records at the head of ``data`` (:func:`tierd.format.columns.frame`
    with this reader's bound on TOTALSIZE, :data:`MAX_RECORD_SIZE`)."""
    return _frame(data, fail, MAX_RECORD_SIZE)


def _offsets(lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    out = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


def _strings(
    values: bytes | npt.NDArray[np.uint8], offsets: npt.NDArray[np.int32], binary: bool = False
) -> pa.Array:
    n = len(offsets) - 1
    typ = pa.binary() if binary else pa.string()
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(values)])


def _spans(
    data: pa.Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], typ: pa.DataType
) -> pa.Array:
    """Bytes ``[starts[i], ends[i])`` of ``data`` as an Arrow column, copied by Arrow in C.

    The ranges are in order and do not overlap, so ``starts[0], ends[0], starts[1], ...`` is a
    valid offsets buffer over ``data`` itself: element ``2i`` is range ``i``, element ``2i + 1``
    the gap to the next one. Taking the even elements compacts the ranges — no Python object
    per row."""
    n = len(starts)
    if n == 0:
        return pa.array([], typ)
    offsets = np.empty(2 * n + 1, np.int32)
    offsets[0 : 2 * n : 2] = starts
    offsets[1 : 2 * n : 2] = ends
    offsets[2 * n] = ends[-1]
    interleaved = pa.Array.from_buffers(typ, 2 * n, [None, pa.py_buffer(offsets), data])
    return interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


def _hosts(
    buf: npt.NDArray[np.uint8],
    pos: npt.NDArray[np.int64],
    v6: npt.NDArray[np.bool_],
    v4_values: npt.NDArray[np.uint64] | None = None,
) -> tuple[pa.Array, npt.NDArray[np.uint8]]:
    """Host strings (decoded once per distinct value) and the raw 20-byte padded host bytes.
    ``v4_values``: the 8-byte values at ``pos``, when the caller has them already."""
    if not v6.any():  # IPv4 only (the usual case): 8-byte values, unique as integers
        values = gather_at(buf, pos, _U8) if v4_values is None else np.ascontiguousarray(v4_values)
        raw = np.zeros((len(pos), 20), np.uint8)
        raw[:, :8] = values.view(np.uint8).reshape(-1, 8)
        if len(values) and (values == values[0]).all():  # one host (a broker's store host)
            name = decode_host(int(values[0]).to_bytes(8, "big"))
            return pa.repeat(pa.scalar(name, pa.string()), len(values)), raw
        uniq, inverse = np.unique(values, return_inverse=True)
        names = [decode_host(int(u).to_bytes(8, "big")) for u in uniq.tolist()]
        return pa.array(names, pa.string()).take(pa.array(inverse.astype(np.int32))), raw
    raw = buf[(pos[:, None] + np.arange(20)).clip(max=len(buf) - 1)]
    raw[~v6, 8:] = 0
    keyed = np.empty((len(pos), 21), np.uint8)
    keyed[:, 0] = v6
    keyed[:, 1:] = raw
    flat = np.ascontiguousarray(keyed).view(np.dtype((np.void, 21))).ravel()
    uniq, inverse = np.unique(flat, return_inverse=True)
    names = []
    for u in uniq:
        b = bytes(u)
        names.append(decode_host(b[1:21] if b[0] else b[1:9]))
    return pa.array(names, pa.string()).take(pa.array(inverse.astype(np.int32))), raw


def _lookup(names: pa.Array, values: pa.Array, rows: npt.NDArray[np.int64], n: int, key: str) -> pa.Array:
    """Per row, the value of property ``key`` (the last one if repeated) or null."""
    hit = np.flatnonzero(pc.equal(names, key).to_numpy(zero_copy_only=False))
    idx = np.full(n, -1, np.int64)
    idx[rows[hit]] = hit
    return values.take(pa.array(idx, mask=idx < 0))


#: Per property name, where its value is in every row (value starts, value ends).
_Columns = dict[str, tuple["npt.NDArray[np.int64]", "npt.NDArray[np.int64]"]]


def _uniform_pairs(
    props: pa.Array, n: int
) -> tuple[pa.Array, pa.Array, npt.NDArray[np.int64], npt.NDArray[np.int32], _Columns | None] | None:
    """The usual batch — every row ``k`` whole ``name 0x01 value 0x02`` items, names and values
    non-empty — split by separator positions alone: (names, values, row of each pair, map
    offsets, and :func:`_same_names`'s value columns). None when the batch is not like that (the
    general split handles it)."""
    bufs = props.buffers()
    if n == 0 or bufs[2] is None:
        return None
    o = np.frombuffer(bufs[1], np.int32, n + 1, props.offset * 4).astype(np.int64)
    region = np.frombuffer(bufs[2], np.uint8)[o[0] : o[-1]]
    p2 = np.flatnonzero(region == 2)
    if len(p2) == 0 or len(p2) % n:
        return None
    p1 = np.flatnonzero(region == 1)
    if len(p1) != len(p2):
        return None
    k = len(p2) // n
    p2 = p2.reshape(n, k) + o[0]
    p1 = p1.reshape(n, k) + o[0]
    if not (p2[:, -1] == o[1:] - 1).all():  # row r's k-th 0x02 ends row r: k items per row
        return None
    start = np.empty((n, k), np.int64)
    start[:, 0] = o[:-1]
    start[:, 1:] = p2[:, :-1] + 1
    # One 0x01 inside each item (the counts match and each item holds the one paired with it),
    # with a name before it and a value after it.
    if not ((start < p1) & (p1 + 1 < p2)).all():
        return None
    names = _spans(bufs[2], start.ravel(), p1.ravel(), pa.string())
    values = _spans(bufs[2], p1.ravel() + 1, p2.ravel(), pa.string())
    rows = np.repeat(np.arange(n, dtype=np.int64), k)
    columns = _same_names(bufs[2], start, p1, p2)
    return names, values, rows, np.arange(0, k * n + 1, k, dtype=np.int32), columns


def _same_names(
    data: pa.Buffer, start: npt.NDArray[np.int64], p1: npt.NDArray[np.int64], p2: npt.NDArray[np.int64]
) -> _Columns | None:
    """When item ``j`` of every row has the same name (a producer writes its properties in one
    order: the usual batch), each name's values are one column of positions — TAGS, KEYS and
    UNIQ_KEY are then cut out directly instead of looked up among all the pairs. None when the
    names differ between rows. A repeated name keeps its last item, as the codec does."""
    raw = np.frombuffer(data, np.uint8)
    columns: _Columns = {}
    for j in range(start.shape[1]):
        first, length = int(start[0, j]), int(p1[0, j] - start[0, j])
        if ((p1[:, j] - start[:, j]) != length).any():
            return None
        name = gather_at(raw, start[:, j], np.dtype((np.void, length)))
        if not (name == name[0]).all():
            return None
        columns[bytes(raw[first : first + length]).decode()] = (p1[:, j] + 1, p2[:, j])
    return columns


def _split_pairs(
    props: pa.Array, n: int
) -> tuple[pa.Array, pa.Array, npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Any batch: split on 0x02, then on the first 0x01 (pyarrow compute); pieces without a name
    or a value are dropped. Same result as :func:`_uniform_pairs` where that applies."""
    items = pc.split_pattern(props, "\x02")
    per_row = pc.list_value_length(items).to_numpy(zero_copy_only=False).astype(np.int64)
    rows = np.repeat(np.arange(n, dtype=np.int64), per_row)
    kv = pc.split_pattern(items.flatten(), "\x01", max_splits=1)
    kv_len = pc.list_value_length(kv).to_numpy(zero_copy_only=False)
    parts = kv.flatten()
    first = kv.offsets.to_numpy()[:-1].astype(np.int64)
    ok = kv_len == 2
    name_idx = first[ok]
    names = parts.take(pa.array(name_idx))
    values = parts.take(pa.array(name_idx + 1))
    nonempty = pc.and_(
        pc.greater(pc.binary_length(names), 0), pc.greater(pc.binary_length(values), 0)
    ).to_numpy(zero_copy_only=False)
    rows = rows[ok][nonempty]
    names = names.filter(pa.array(nonempty))
    values = values.filter(pa.array(nonempty))
    return names, values, rows, _offsets(np.bincount(rows, minlength=n).astype(np.int64))


def _properties(props: pa.Array, n: int) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """``name 0x01 value 0x02`` strings → (map column, tags column, keys column, uniq_key column).
    Pieces without a name or a value are dropped, as RocketMQ (and
    :func:`tierd.format.properties.decode_properties`) do."""
    pairs = _uniform_pairs(props, n)
    names, values, rows, offsets, columns = pairs if pairs is not None else (*_split_pairs(props, n), None)
    props_map = pa.MapArray.from_arrays(
        pa.array(offsets), names, values, type=ARROW_SCHEMA.field("properties").type
    )
    if columns is not None:
        data = props.buffers()[2]

        def column(name: str) -> pa.Array:
            spans = columns.get(name)
            return pa.nulls(n, pa.string()) if spans is None else _spans(data, *spans, pa.string())

        tags, uniq, keys_raw = column(PROPERTY_TAGS), column(PROPERTY_UNIQ_KEY), column(PROPERTY_KEYS)
    else:
        tags = _lookup(names, values, rows, n, PROPERTY_TAGS)
        uniq = _lookup(names, values, rows, n, PROPERTY_UNIQ_KEY)
        keys_raw = _lookup(names, values, rows, n, PROPERTY_KEYS)
    keys = _single_keys(keys_raw, n)
    return props_map, tags, keys if keys is not None else _split_keys(keys_raw, n), uniq


def _single_keys(keys_raw: pa.Array, n: int) -> pa.Array | None:
    """The keys column when every row has one key (a KEYS value, not empty, without a
    separator) or no row has any: the KEYS column itself is then the lists' values. None
    otherwise (:func:`_split_keys`)."""
    typ = ARROW_SCHEMA.field("keys").type
    if keys_raw.null_count == n:
        return pa.ListArray.from_arrays(
            pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()), type=typ
        )
    bufs = keys_raw.buffers()
    if keys_raw.null_count or bufs[2] is None:
        return None
    o = np.frombuffer(bufs[1], np.int32, n + 1, keys_raw.offset * 4)
    if (o[1:] == o[:-1]).any() or (
        np.frombuffer(bufs[2], np.uint8)[o[0] : o[-1]] == ord(KEY_SEPARATOR)
    ).any():
        return None
    return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), keys_raw, type=typ)


def _split_keys(keys_raw: pa.Array, n: int) -> pa.Array:
    """Any KEYS column (null where a row has none) split into the keys column; empty tokens
    dropped."""
    split = pc.split_pattern(keys_raw, KEY_SEPARATOR)
    counts = pc.fill_null(pc.list_value_length(split), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    tokens = split.flatten()
    token_rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    keep = pc.greater(pc.binary_length(tokens), 0).to_numpy(zero_copy_only=False)
    tokens = tokens.filter(pa.array(keep))
    key_offsets = _offsets(np.bincount(token_rows[keep], minlength=n).astype(np.int64))
    return pa.ListArray.from_arrays(pa.array(key_offsets), tokens, type=ARROW_SCHEMA.field("keys").type)


def decode_records(
    data: bytes,
    starts: npt.NDArray[np.int64],
    end: int,
    *,
    flat_base: int,
    topic: str,
    queue_id: int,
    fail: Callable[[int, str], CorruptRecordError],
    select: Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], npt.NDArray[np.bool_] | None]
    | None = None,
    select_properties: Callable[[pa.Array, pa.Array, pa.Array], npt.NDArray[np.bool_]] | None = None,
    schema: pa.Schema = ARROW_SCHEMA,
) -> pa.RecordBatch:
    """Decode the records starting at ``starts`` (the last one ends at ``end``) of ``data``, whose
    byte 0 is flat commitlog offset ``flat_base``. Every record is validated and CRC-checked;
    ``select(queue_offsets, store_ms)`` may then drop rows (pushed filters), and
    ``select_properties(tags, keys, uniq_key)`` after the properties are split (tag and key
    filters). Only the columns of ``schema`` (a selection of :data:`ARROW_SCHEMA`'s, any order)
    are built."""
    n = len(starts)
    buf = np.frombuffer(data, np.uint8)
    s = starts
    ends = np.empty(n, np.int64)
    ends[:-1] = s[1:]
    if n:
        ends[-1] = end
    checked = _compiled_check(data, s, end, flat_base, topic, queue_id) if _COMPILED is not None else None
    body_col: pa.Array | None = None
    if checked is not None:  # every record good, IPv4 hosts: the usual batch
        head, body_col = checked
        v4 = True
        sysflag = head["sysflag"].astype(np.int64)
        born_v6 = store_v6 = np.zeros(n, np.bool_)
        born_len = store_len = np.full(n, 8, np.int64)
        phys = head["physical_offset"]
        topic_end = head["props_start"] - PROPERTIES_LENGTH_WIDTH
        body_len = np.diff(np.frombuffer(body_col.buffers()[1], np.int32, n + 1)).astype(np.int64)
    else:  # checked here, and the first bad record named
        sizes = ends - s
        # Framing yields records of MIN_RECORD_SIZE or more, so every header is inside ``buf``.
        head = gather_at(buf, s, _HEAD_BYTES).view(_HEAD_V4)
        magic = head["magic"]
        sysflag = head["sysflag"].astype(np.int64)
        #: Both hosts of every record are IPv4 (the usual case): every field is in ``head``.
        v4 = not (sysflag & _V6_FLAGS).any()
        born_v6 = (sysflag & SYSFLAG_BORNHOST_V6) != 0
        store_v6 = (sysflag & SYSFLAG_STOREHOST_V6) != 0
        born_len, store_len = host_widths(sysflag)
        header = header_length(born_len, store_len)
        bad = ((magic != MAGIC_V1) & (magic != MAGIC_V2)) | (sizes < header + MIN_TAIL)
        safe = np.where(
            bad, s, s + position("body_length", born_len, store_len)
        )  # keep gathers in bounds until the record is judged
        body_len = (head["body_len"] if v4 else gather_at(buf, safe, _I4)).astype(np.int64)
        body_start = s + header
        body_end = body_start + body_len
        v2 = magic == MAGIC_V2
        tlen_width = np.where(v2, TOPIC_LENGTH_WIDTH[MAGIC_V2], TOPIC_LENGTH_WIDTH[MAGIC_V1])
        bad |= (body_len < 0) | (body_end + tlen_width + PROPERTIES_LENGTH_WIDTH > ends)
        phys = head["physical_offset"]
        expected_phys = flat_base + s
        qids = head["queue_id"]
        topic_b = topic.encode()
        tails_ok = not bad.any() and _tails_match(buf, body_end, ends, topic_b, v2)
        if tails_ok:
            topic_end = body_end + TOPIC_LENGTH_WIDTH[MAGIC_V1] + len(topic_b)
        else:
            body_end_safe = np.where(bad, s, body_end)
            topic_len = np.where(
                v2, gather_at(buf, body_end_safe, _U2).astype(np.int64), buf[body_end_safe].astype(np.int64)
            )
            topic_start = body_end + tlen_width
            topic_end = topic_start + topic_len
            bad |= topic_end + PROPERTIES_LENGTH_WIDTH > ends
            props_len = gather_at(buf, np.where(bad, s, topic_end), _U2).astype(np.int64)
            bad |= topic_end + PROPERTIES_LENGTH_WIDTH + props_len != ends
            if bad.any():
                _raise_first(data, s, ends, bad, fail)
            bad |= topic_len != len(topic_b)
        bad |= phys != expected_phys
        bad |= qids != queue_id
        if bad.any():
            _raise_first(data, s, ends, bad, fail, flat_base=flat_base, topic=topic, queue_id=queue_id)
        if topic_b and n and not tails_ok:
            if n * len(topic_b) <= 64 * 1024 * 1024:
                got = buf[topic_start[:, None] + np.arange(len(topic_b))]
                bad = ~(got == np.frombuffer(topic_b, np.uint8)).all(axis=1)
            else:
                bad = np.array([data[a : a + len(topic_b)] != topic_b for a in topic_start.tolist()])
            if bad.any():
                _raise_first(data, s, ends, bad, fail, flat_base=flat_base, topic=topic, queue_id=queue_id)
        mv = memoryview(data)
        bodies = map(mv.__getitem__, map(slice, body_start.tolist(), body_end.tolist()))  # no list
        crc = np.fromiter(map(crc32, bodies), np.int64, n) & BODY_CRC_MASK
        stored = head["body_crc"].astype(np.int64)
        bad = crc != stored
        if bad.any():
            _raise_first(data, s, ends, bad, fail)
    queue_offsets = head["queue_offset"].astype(np.int64)
    store_ms = (
        head["store_timestamp"]
        if v4
        else gather_at(buf, s + position("store_timestamp", born_len, store_len), _I8)
    ).astype(np.int64)
    keep = select(queue_offsets, store_ms) if select is not None else None
    if keep is not None:
        idx = np.flatnonzero(keep)
        body_col = body_col.take(pa.array(idx)) if body_col is not None else None
        s, ends, body_len, head = s[idx], ends[idx], body_len[idx], head[idx]
        sysflag, born_v6, store_v6, born_len, store_len = (
            sysflag[idx],
            born_v6[idx],
            store_v6[idx],
            born_len[idx],
            store_len[idx],
        )
        topic_end, phys, queue_offsets, store_ms = (
            topic_end[idx],
            phys[idx],
            queue_offsets[idx],
            store_ms[idx],
        )
        n = len(idx)
    whole = pa.py_buffer(data)
    body_start = s + header_length(born_len, store_len)
    props_start = topic_end + PROPERTIES_LENGTH_WIDTH
    props = _spans(whole, props_start, ends, pa.string())
    try:
        if body_col is None:  # the compiled check has validated every row's UTF-8
            props.validate(full=True)
    except pa.ArrowInvalid:
        bad_rows = np.array(
            [
                not _utf8(memoryview(data)[a:b])
                for a, b in zip(props_start.tolist(), ends.tolist(), strict=True)
            ]
        )
        _raise_first(data, s, ends, bad_rows, fail)
    # Only the wanted columns are built (a user schema may select some; validation above is
    # the same whatever is selected). Columns derived together are built together.
    wanted = set(schema.names)
    made: dict[str, pa.Array] = {}
    if select_properties is not None or wanted & {"properties", "tags", "keys", "uniq_key"}:
        made["properties"], made["tags"], made["keys"], made["uniq_key"] = _properties(props, n)
    if select_properties is not None:
        keep = select_properties(made["tags"], made["keys"], made["uniq_key"])
        if not keep.all():
            idx = np.flatnonzero(keep)
            body_col = body_col.take(pa.array(idx)) if body_col is not None else None
            s, ends, body_len, head = s[idx], ends[idx], body_len[idx], head[idx]
            sysflag, born_v6, store_v6, born_len, store_len = (
                sysflag[idx],
                born_v6[idx],
                store_v6[idx],
                born_len[idx],
                store_len[idx],
            )
            phys, queue_offsets, store_ms = phys[idx], queue_offsets[idx], store_ms[idx]
            body_start = body_start[idx]
            taken = pa.array(idx)
            made = {name: col.take(taken) for name, col in made.items()}
            n = len(idx)
    store_host_pos = s + position("store_host", born_len, store_len)
    if wanted & {"store_host", "msg_id"}:
        made["store_host"], store_raw = _hosts(
            buf, store_host_pos, store_v6, head["store_host"] if v4 else None
        )
        if "msg_id" in wanted:
            made["msg_id"] = _strings(*offset_msg_ids(store_raw, store_v6, phys.astype(np.int64)))
    ts = ARROW_SCHEMA.field("store_timestamp").type
    build: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), n),
        "queue_id": lambda: pa.array(np.full(n, queue_id, np.int32)),
        "queue_offset": lambda: pa.array(queue_offsets),
        "physical_offset": lambda: pa.array(phys.astype(np.int64)),
        "store_timestamp": lambda: pa.array(store_ms * 1000, ts),
        "born_timestamp": lambda: pa.array(head["born_timestamp"].astype(np.int64) * 1000, ts),
        "body": lambda: (
            body_col
            if body_col is not None
            else _spans(whole, body_start, body_start + body_len, pa.binary())
        ),
        "sys_flag": lambda: pa.array(sysflag.astype(np.int32)),
        "reconsume_times": lambda: pa.array(
            (
                head["reconsume_times"]
                if v4
                else gather_at(buf, s + position("reconsume_times", born_len, store_len), _I4)
            ).astype(np.int32)
        ),
        "born_host": lambda: _hosts(buf, s + POS_BORN_HOST, born_v6, head["born_host"] if v4 else None)[0],
    }
    columns = [made[name] if name in made else build[name]() for name in schema.names]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _compiled_check(
    data: bytes, starts: npt.NDArray[np.int64], end: int, flat_base: int, topic: str, queue_id: int
) -> tuple[npt.NDArray[np.void], pa.Array] | None:
    """Every record checked in C as :func:`decode_records` checks it, and its fields and the body
    column built on the way: (rows of ``_ROW``, body column), or None when any record is not a
    good one of this queue with IPv4 hosts — the caller then checks in Python, which names the
    first bad record. The body column's buffers come from Arrow's memory pool, whose pages a
    steady scan reuses (a fresh 16 MiB allocation per batch was page faults all along)."""
    assert _COMPILED is not None
    n = len(starts)
    if n == 0:
        return None
    rows = np.empty(n, _ROW)
    offsets = pa.allocate_buffer(4 * (n + 1))
    bodies = pa.allocate_buffer(max(0, end - n * MIN_RECORD_SIZE))
    bad = _COMPILED.spark_check(
        data,
        np.ascontiguousarray(starts, np.int64),
        end,
        flat_base,
        topic.encode(),
        queue_id,
        rows,
        offsets,
        bodies,
    )
    if bad >= 0:
        return None
    return rows, pa.Array.from_buffers(pa.binary(), n, [None, offsets, bodies])


def _tails_match(
    buf: npt.NDArray[np.uint8],
    body_end: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    topic: bytes,
    v2: npt.NDArray[np.bool_],
) -> bool:
    """Does every record end as a record of this queue does — a one-byte topic length (v1), the
    queue's topic, a properties length that fills the record? One gather of each record's tail
    instead of three (length byte, topic, properties length), each of which missed the CPU cache
    once per record. False when any record differs: the caller then checks field by field and
    names the first bad record."""
    lw = TOPIC_LENGTH_WIDTH[MAGIC_V1]
    w = len(topic) + MIN_TAIL
    if not len(body_end) or len(topic) >= 1 << (8 * lw) or v2.any() or (body_end + w > ends).any():
        return False
    tails = gather_at(buf, body_end, np.dtype((np.void, w))).view(np.uint8).reshape(-1, w)
    expected = len(topic).to_bytes(lw, "big") + topic
    if not (tails[:, : len(expected)] == np.frombuffer(expected, np.uint8)).all():
        return False
    props_len = np.zeros(len(tails), np.int64)
    for i in range(len(expected), w):  # the big-endian properties length
        props_len = (props_len << 8) | tails[:, i]
    return bool((body_end + w + props_len == ends).all())


def _utf8(b: memoryview) -> bool:
    try:
        str(b, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _raise_first(
    data: bytes,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    bad: npt.NDArray[np.bool_],
    fail: Callable[[int, str], CorruptRecordError],
    *,
    flat_base: int | None = None,
    topic: str | None = None,
    queue_id: int | None = None,
) -> None:
    """Raise for the first bad record, with the codec's reason when it has one."""
    i = int(np.flatnonzero(bad)[0])
    start, end = int(starts[i]), int(ends[i])
    try:
        rec = decode_record(data, start, limit=end, check_crc=True)
    except CorruptRecordError as e:
        raise fail(start, str(e.detail.get("reason", e))) from e
    if end - start != rec.size:
        raise fail(start, f"total size says {rec.size}, the next record starts after {end - start} bytes")
    if flat_base is not None and rec.commitlog_offset != flat_base + start:
        raise fail(
            start,
            f"PHYSICALOFFSET {rec.commitlog_offset} is not the record's flat offset {flat_base + start}",
        )
    if topic is not None and rec.topic != topic:
        raise fail(start, f"topic {rec.topic!r} does not belong in the flat file of topic {topic!r}")
    if queue_id is not None and rec.queue_id != queue_id:
        raise fail(start, f"queue id {rec.queue_id} does not belong in the flat file of queue {queue_id}")
    raise fail(start, "record does not validate")


#: Bytes fetched per ranged read of a segment; one Arrow batch is decoded from each piece.
READ_PIECE: Final = 16 * 1024 * 1024


def read_range(
    storage: ColdStorage,
    r: SegmentRange,
    constraints: Constraints | None = None,
    *,
    piece: int = READ_PIECE,
    schema: pa.Schema = ARROW_SCHEMA,
    source: SegmentSource | None = None,
) -> Iterator[pa.RecordBatch]:
    """Decode range ``r`` piece by piece (memory stays ~3 pieces whatever the range size), into
    the columns of ``schema`` (a selection of :data:`ARROW_SCHEMA`'s).

    Sealed ranges must end exactly on a record boundary. The unbounded tail of an open segment
    is read to the end stored now; there, bytes past the size the manifest promised that do not
    form a whole record are a commit still being written and end the read — anything short of
    the promised size is corruption.
    """
    # A sealed segment is what its manifest says (a missing or shorter object fails the read);
    # anything else is listed as it is stored now.
    # ``source``: the segment already opened by the caller (several ranges of one segment).
    src = source
    if src is None:
        src = (
            storage.sealed_segment(r.path, r.end)
            if r.sealed and r.end is not None
            else storage.segment(r.path)
        )
    end = src.size if r.end is None else r.end
    promised = max(end, r.promised_end)
    if promised > src.size:
        raise CorruptRecordError(
            f"{src.url}: the manifest promises {promised} bytes, the segment holds {src.size}",
            path=src.url,
            position=src.size,
        )

    def fail_at(base: int) -> Callable[[int, str], CorruptRecordError]:
        def fail(pos: int, reason: str) -> CorruptRecordError:
            at = base + pos
            return CorruptRecordError(
                f"corrupt record in {src.url} at position {at} (flat commitlog offset "
                f"{r.base_offset + at}): {reason}",
                path=src.url,
                position=at,
                offset=r.base_offset + at,
                reason=reason,
            )

        return fail

    select = None
    limit = r.max_offset
    c = constraints if constraints is not None and constraints.row_filters else None
    if c is not None or limit is not None:

        def select(qo: npt.NDArray[np.int64], ms: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_] | None:
            mask = row_mask(c, qo, ms) if c is not None else None
            if limit is not None:
                mask = qo <= limit if mask is None else mask & (qo <= limit)
            return mask

    select_properties = None
    if c is not None and c.property_filters:
        pc_ = c

        def select_properties(tags: pa.Array, keys: pa.Array, uniq: pa.Array) -> npt.NDArray[np.bool_]:
            return property_mask(pc_, tags, keys, uniq)

    # The next piece is read in a background thread while this one is decoded: socket reads
    # release the GIL, so the backend's latency hides behind the decoding.
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tierd-spark-read")
    try:
        yield from _read_pieces(src, r, end, piece, pool, fail_at, select, select_properties, schema)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _read_pieces(
    src: SegmentSource,
    r: SegmentRange,
    end: int,
    piece: int,
    pool: concurrent.futures.ThreadPoolExecutor,
    fail_at: Callable[[int], Callable[[int, str], CorruptRecordError]],
    select: Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], npt.NDArray[np.bool_] | None] | None,
    select_properties: Callable[[pa.Array, pa.Array, pa.Array], npt.NDArray[np.bool_]] | None,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """Every read starts on a record boundary: the first at the range's start, each next one
    where the whole records of the previous one end. That position is known once the read is
    framed — before it is decoded — so the next read is in flight during the decode, and no
    bytes are ever carried over and concatenated (a 16 MiB copy per read): a record cut by a
    read's end is simply read again, whole, by the next one. Open segments are read chunk by
    chunk (:meth:`SegmentSource.read_end`), whose ends are record boundaries anyway."""
    pos = r.start
    ahead = pool.submit(src.read, pos, src.read_end(pos, piece, end), records=True) if pos < end else None
    while ahead is not None:
        data = ahead.result()
        ahead = None
        read_end = pos + len(data)
        fail = fail_at(pos)
        framing = frame(data, fail)
        nxt = pos + framing.consumed
        if read_end < end:
            if framing.consumed:
                ahead = pool.submit(src.read, nxt, src.read_end(nxt, piece, end), records=True)
            else:  # one record longer than the read: read it whole
                need = total_size_at(data, 0) if len(data) >= 4 else 4
                ahead = pool.submit(src.read, pos, min(end, pos + max(need, len(data) + 1)), records=True)
        if framing.consumed:
            yield decode_records(
                data,
                framing.starts,
                framing.consumed,
                flat_base=r.base_offset + pos,
                topic=r.topic,
                queue_id=r.queue_id,
                fail=fail,
                select=select,
                select_properties=select_properties,
                schema=schema,
            )
        if read_end >= end and nxt < read_end:
            if r.end is None and nxt >= r.promised_end:
                return  # an open segment's commit in flight past the manifest's size
            left = read_end - nxt
            said = total_size_at(data, framing.consumed) if left >= 4 else None
            raise fail(
                framing.consumed,
                f"record cut off: {left} bytes left before the end of the range at {end}"
                + (f", total size says {said}" if said is not None else ""),
            )
        pos = nxt
