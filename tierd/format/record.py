"""One RocketMQ commitlog record (FORMATS §1.1): layout, byte-identical encoding, strict decoding.

:func:`encode_record` packs one record with a precompiled :class:`struct.Struct` — the single
``put`` path, where numpy's per-call overhead would dominate. Many records at once (the
``put_batch`` path, cold reads) go through :mod:`tierd.format.batch`, built on the same layout.

Decoding never trusts its input: bad magic, lengths that do not add up, and CRC mismatches raise
:class:`~tierd.errors.CorruptRecordError` (or are reported as :data:`INVALID` by the scanner used
for recovery, which must not pay for exceptions in its loop).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

from isal.isal_zlib import crc32 as crc32  # re-exported: see the note above MAGIC_V1

from tierd.errors import CorruptRecordError
from tierd.format.host import decode_host
from tierd.format.layout import (
    BLANK_MAGIC,
    BODY_CRC_MASK,
    END_FILE_MIN_BLANK,
    FIELD_NAMES,
    HEADER_V4,
    HOST_V4,
    HOST_V6,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    POS_BODY_CRC,
    POS_BORN_HOST,
    POS_BORN_TIMESTAMP,
    POS_FLAG,
    POS_MAGIC,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_ID,
    POS_QUEUE_OFFSET,
    POS_SYSFLAG,
    POS_TOTAL,
    PROPERTIES_LENGTH_WIDTH,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_MULTI_TAGS,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    TOPIC_LENGTH_WIDTH,
    V1_TOPIC_MAX,
    V2_TOPIC_MAX_BYTES,
    header_struct,
    host_sys_flag,
    host_widths,
    position,
)
from tierd.format.message_ext import MessageExt

# The body CRC is zlib's CRC-32 (masked to 31 bits, as RocketMQ stores it). ``crc32`` here is
# ISA-L's (``isal``): the same function, ~0.08 µs per 1 KiB body instead of zlib 1.2's
# ~0.4 µs — one call per message on every write and every read, so it was a fifth of a cold
# read's per-message cost. Every module computing body CRCs imports it from here.

# The layout's names the record's users import from here (it is declared in tierd.format.layout).
__all__ = [
    "BLANK",
    "BLANK_MAGIC",
    "BODY_CRC_MASK",
    "END_FILE_MIN_BLANK",
    "HEADER_V4",
    "HOST_V4",
    "HOST_V6",
    "INVALID",
    "MAGIC_V1",
    "MAGIC_V2",
    "MIN_RECORD_SIZE",
    "POS_BODY_CRC",
    "POS_BORN_HOST",
    "POS_BORN_TIMESTAMP",
    "POS_FLAG",
    "POS_MAGIC",
    "POS_PHYSICAL_OFFSET",
    "POS_QUEUE_ID",
    "POS_QUEUE_OFFSET",
    "POS_SYSFLAG",
    "POS_TOTAL",
    "SYSFLAG_BORNHOST_V6",
    "SYSFLAG_COMPRESSED",
    "SYSFLAG_MULTI_TAGS",
    "SYSFLAG_STOREHOST_V6",
    "SYSFLAG_TRANSACTION_COMMIT",
    "SYSFLAG_TRANSACTION_MASK",
    "SYSFLAG_TRANSACTION_PREPARED",
    "SYSFLAG_TRANSACTION_ROLLBACK",
    "V1_TOPIC_MAX",
    "V2_TOPIC_MAX_BYTES",
    "VALID",
    "RecordView",
    "blank_marker",
    "crc32",
    "decode_record",
    "encode_record",
    "header_struct",
    "parse_record_view",
    "place_record",
    "record_error",
    "scan_record",
    "store_timestamp_at",
    "topic_field",
]

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
#: Index of each fixed-header field in an unpacked header tuple.
_F = {name: i for i, name in enumerate(FIELD_NAMES)}
_PL = PROPERTIES_LENGTH_WIDTH
_SIZE_MAGIC = struct.Struct(">iI")


_HEADERS = {(b, st): header_struct(b, st) for b in (HOST_V4, HOST_V6) for st in (HOST_V4, HOST_V6)}


def topic_field(topic_bytes: bytes) -> tuple[int, bytes]:
    """Magic and length-prefixed topic bytes for a UTF-8 topic (v2 beyond 127 bytes/chars)."""
    magic = MAGIC_V2 if len(topic_bytes) > V1_TOPIC_MAX else MAGIC_V1
    return magic, len(topic_bytes).to_bytes(TOPIC_LENGTH_WIDTH[magic], "big") + topic_bytes


# ----------------------------------------------------------------------------- single record
def encode_record(
    body: bytes,
    topic_part: bytes,
    magic: int,
    properties: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: bytes,
    store_timestamp: int,
    store_host: bytes,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    body_crc: int | None = None,
) -> bytes:
    """One record. ``topic_part`` is the length-prefixed topic from :func:`topic_field` (cached by
    callers); host widths set the v6 sysflag bits automatically. Arguments may be passed
    positionally — the single-put path does, since keyword calls cost a microsecond here."""
    sys_flag |= host_sys_flag(len(born_host), len(store_host))
    hdr = _HEADERS[len(born_host), len(store_host)]
    body_len = len(body)
    props_len = len(properties)
    total = hdr.size + body_len + len(topic_part) + PROPERTIES_LENGTH_WIDTH + props_len
    crc = (crc32(body) & BODY_CRC_MASK) if body_crc is None else body_crc
    return b"".join(
        (
            hdr.pack(
                total,
                magic,
                crc,
                queue_id,
                flag,
                queue_offset,
                physical_offset,
                sys_flag,
                born_timestamp,
                born_host,
                store_timestamp,
                store_host,
                reconsume_times,
                prepared_transaction_offset,
                body_len,
            ),
            body,
            topic_part,
            props_len.to_bytes(PROPERTIES_LENGTH_WIDTH, "big"),
            properties,
        )
    )


def place_record(
    buffer: Any,
    position: int,
    record: bytes,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    store_timestamp_at: int,
) -> None:
    """Copy ``record`` — encoded without its placement (queue offset, physical offset and store
    timestamp zero, as :func:`encode_record` makes it with those arguments 0) — into the writable
    ``buffer`` at ``position`` and write where and when it landed; STORETIMESTAMP is at
    ``store_timestamp_at`` within the record (its position moves with the born host's width).
    The C extension's ``place`` does the same in one call; this is its fallback."""
    end = position + len(record)
    if position < 0 or end > len(buffer):
        raise ValueError(f"a record of {len(record)} bytes does not fit at {position} of {len(buffer)} bytes")
    buffer[position:end] = record
    _LONG.pack_into(buffer, position + POS_QUEUE_OFFSET, queue_offset)
    _LONG.pack_into(buffer, position + POS_PHYSICAL_OFFSET, physical_offset)
    _LONG.pack_into(buffer, position + store_timestamp_at, store_timestamp)


@dataclass(frozen=True, slots=True)
class RecordView:
    """The fields the dispatcher and recovery need, parsed without copying the body."""

    size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp: int
    topic: str
    properties: str


def store_timestamp_at(buf: bytes | memoryview, pos: int) -> int:
    """STORETIMESTAMP of the record starting at ``pos``, read from its header alone (it follows
    BORNHOST, whose width the SYSFLAG gives): for scans that need only the time, such as local
    retention, without decoding or checking the record."""
    sys_flag = _INT.unpack_from(buf, pos + POS_SYSFLAG)[0]
    at = pos + position("store_timestamp", *host_widths(sys_flag))
    return int(_LONG.unpack_from(buf, at)[0])


def record_error(reason: str, pos: int) -> CorruptRecordError:
    """The error for a record that is not what its framing claims (one wording for every decoder:
    this module's, :class:`~tierd.format.batch.RecordBatch`'s)."""
    return CorruptRecordError(f"corrupt record at position {pos}: {reason}", position=pos, reason=reason)


def _walk(
    buf: bytes | memoryview, pos: int, limit: int, check_crc: bool
) -> tuple[tuple[Any, ...], bytes | memoryview, int, int]:
    """The one walk over a record, shared by :func:`decode_record` and the scanner.

    Checks the magic; that TOTALSIZE fits in ``limit``; that BODYLENGTH, the topic length and the
    PROPERTIES length each fit and add up to TOTALSIZE exactly; and, with ``check_crc``, the body
    CRC. Returns the fixed header's fields (see :func:`header_struct`), the body (a slice of
    ``buf``), and where the topic starts and ends; raises :class:`CorruptRecordError` naming the
    first inconsistency."""
    if limit - pos < HEADER_V4:
        raise record_error(f"{limit - pos} bytes left, a record needs at least {HEADER_V4}", pos)
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise record_error(f"bad magic 0x{magic:08X}", pos)
    if size < MIN_RECORD_SIZE or size > limit - pos:
        raise record_error(f"total size {size} does not fit in {limit - pos} bytes", pos)
    sys_flag = _INT.unpack_from(buf, pos + POS_SYSFLAG)[0]
    header = _HEADERS[host_widths(sys_flag)]
    if size < header.size + MIN_RECORD_SIZE - HEADER_V4:  # else the unpack below could read past the buffer
        raise record_error(f"total size {size} is smaller than its {header.size}-byte header", pos)
    fields = header.unpack_from(buf, pos)
    body_len = fields[_F["body_length"]]
    body_start = pos + header.size
    body_end = body_start + body_len
    topic_start = body_end + TOPIC_LENGTH_WIDTH[magic]
    rec_end = pos + size
    if body_len < 0 or topic_start > rec_end:
        raise record_error(f"body length {body_len} overruns the record", pos)
    topic_len = int.from_bytes(buf[body_end:topic_start], "big")
    topic_end = topic_start + topic_len
    if topic_end + _PL > rec_end:
        raise record_error(f"topic length {topic_len} overruns the record", pos)
    props_len = int.from_bytes(buf[topic_end : topic_end + _PL], "big")
    if topic_end + _PL + props_len != rec_end:
        raise record_error(
            f"field lengths add up to {topic_end + _PL + props_len - pos}, total size says {size}", pos
        )
    body = buf[body_start:body_end]
    if check_crc and (crc32(body) & BODY_CRC_MASK) != fields[_F["body_crc"]]:
        raise record_error(f"body CRC mismatch (stored {fields[_F['body_crc']]})", pos)
    return fields, body, topic_start, topic_end


def decode_record(
    buf: bytes | memoryview, pos: int = 0, *, limit: int | None = None, check_crc: bool = True
) -> MessageExt:
    """Decode the record at ``pos``; raise :class:`CorruptRecordError` on any inconsistency."""
    fields, body, topic_start, topic_end = _walk(buf, pos, len(buf) if limit is None else limit, check_crc)
    (
        size,
        _,
        crc,
        queue_id,
        flag,
        queue_offset,
        phys,
        sys_flag,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,
        prepared,
        _,
    ) = fields
    try:
        topic = bytes(buf[topic_start:topic_end]).decode()
        raw_props = bytes(buf[topic_end + _PL : pos + size])
        raw_props.decode()  # validate now; parse on first access
    except UnicodeDecodeError as e:
        raise record_error(f"topic or properties are not UTF-8 ({e.reason})", pos) from e
    return MessageExt(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        body=bytes(body),
        raw_properties=raw_props,
        store_timestamp=store_ts,
        born_timestamp=born_ts,
        born_host=decode_host(born_host),
        store_host=decode_host(store_host),
        commitlog_offset=phys,
        size=size,
        flag=flag,
        sys_flag=sys_flag,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body_crc=crc,
    )


#: Scanner outcomes (recovery loops must not pay for exceptions).
VALID: Final = 1
BLANK: Final = 0
INVALID: Final = -1


def scan_record(
    buf: bytes | memoryview, pos: int, limit: int, check_crc: bool
) -> tuple[int, int, RecordView | None]:
    """Check the record at ``pos`` without raising: ``(VALID, size, view)``, ``(BLANK, size, None)``
    for an end-of-file marker, or ``(INVALID, 0, None)`` (torn tail, garbage, zeros)."""
    if limit - pos >= 8:
        size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic == BLANK_MAGIC and size >= 8 and pos + size == limit:
            return BLANK, size, None
    try:
        return VALID, *_view(buf, pos, limit, check_crc)
    except CorruptRecordError:
        return INVALID, 0, None


def parse_record_view(buf: bytes | memoryview, pos: int, limit: int, check_crc: bool = False) -> RecordView:
    """Like :func:`scan_record` for a record known to be there; raises on corruption."""
    return _view(buf, pos, limit, check_crc)[1]


def _view(buf: bytes | memoryview, pos: int, limit: int, check_crc: bool) -> tuple[int, RecordView]:
    fields, _, topic_start, topic_end = _walk(buf, pos, limit, check_crc)
    size = fields[_F["total"]]
    try:
        topic = bytes(buf[topic_start:topic_end]).decode()
        props = bytes(buf[topic_end + _PL : pos + size]).decode()
    except UnicodeDecodeError as e:
        raise record_error(f"topic or properties are not UTF-8 ({e.reason})", pos) from e
    f = _F
    view = RecordView(
        size,
        fields[f["queue_id"]],
        fields[f["queue_offset"]],
        fields[f["physical_offset"]],
        fields[f["sys_flag"]],
        fields[f["store_timestamp"]],
        topic,
        props,
    )
    return size, view


def blank_marker(free_bytes: int) -> bytes:
    """End-of-file marker: the whole free space as an int, then the BLANK magic."""
    return _SIZE_MAGIC.pack(free_bytes, BLANK_MAGIC)
