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
from tierd.format.message_ext import MessageExt

# The body CRC is zlib's CRC-32 (masked to 31 bits, as RocketMQ stores it). ``crc32`` here is
# ISA-L's (``isal``): the same function, ~0.08 µs per 1 KiB body instead of zlib 1.2's
# ~0.4 µs — one call per message on every write and every read, so it was a fifth of a cold
# read's per-message cost. Every module computing body CRCs imports it from here.

MAGIC_V1: Final = 0xDAA320A7
MAGIC_V2: Final = 0xDAA320AB
BLANK_MAGIC: Final = 0xCBD43194
#: A record needs this many spare bytes after it in its file, else the file ends with a blank marker.
END_FILE_MIN_BLANK: Final = 8

SYSFLAG_COMPRESSED: Final = 0x1
SYSFLAG_MULTI_TAGS: Final = 0x2
SYSFLAG_TRANSACTION_MASK: Final = 0xC
SYSFLAG_TRANSACTION_PREPARED: Final = 0x4
SYSFLAG_TRANSACTION_COMMIT: Final = 0x8
SYSFLAG_TRANSACTION_ROLLBACK: Final = 0xC
SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20

#: Topics longer than this (in characters) are written with the v2 magic (2-byte topic length).
V1_TOPIC_MAX: Final = 127
V2_TOPIC_MAX_BYTES: Final = 32767

# Byte positions that do not depend on host widths.
POS_TOTAL: Final = 0
POS_MAGIC: Final = 4
POS_BODY_CRC: Final = 8
POS_QUEUE_ID: Final = 12
POS_FLAG: Final = 16
POS_QUEUE_OFFSET: Final = 20
POS_PHYSICAL_OFFSET: Final = 28
POS_SYSFLAG: Final = 36
POS_BORN_TIMESTAMP: Final = 40
POS_BORN_HOST: Final = 48
#: Header length with IPv4 hosts, up to and including BODYLENGTH.
HEADER_V4: Final = 88

_INT = struct.Struct(">i")
_SHORT = struct.Struct(">H")
_SIZE_MAGIC = struct.Struct(">iI")


def _header_struct(born_len: int, store_len: int) -> struct.Struct:
    # total, magic, crc, queue id, flag, queue offset, physical offset, sysflag, born ts,
    # born host, store ts, store host, reconsume times, prepared tx offset, body length
    return struct.Struct(f">iIiiiqqiq{born_len}sq{store_len}siqi")


_HEADERS: dict[tuple[int, int], struct.Struct] = {
    (b, s): _header_struct(b, s) for b in (8, 20) for s in (8, 20)
}


def header_struct(born_host_len: int, store_host_len: int) -> struct.Struct:
    """The fixed header up to BODYLENGTH for these host widths (8: IPv4, 20: IPv6), for writers
    that pack it in place (``pack_into``) instead of building the record as bytes first."""
    return _HEADERS[born_host_len, store_host_len]


def topic_field(topic_bytes: bytes) -> tuple[int, bytes]:
    """Magic and length-prefixed topic bytes for a UTF-8 topic (v2 beyond 127 bytes/chars)."""
    if len(topic_bytes) > V1_TOPIC_MAX:
        return MAGIC_V2, len(topic_bytes).to_bytes(2, "big") + topic_bytes
    return MAGIC_V1, bytes((len(topic_bytes),)) + topic_bytes


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
    if len(born_host) == 20:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if len(store_host) == 20:
        sys_flag |= SYSFLAG_STOREHOST_V6
    hdr = _HEADERS[len(born_host), len(store_host)]
    body_len = len(body)
    props_len = len(properties)
    total = hdr.size + body_len + len(topic_part) + 2 + props_len
    crc = (crc32(body) & 0x7FFFFFFF) if body_crc is None else body_crc
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
            _SHORT.pack(props_len),
            properties,
        )
    )


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
    sys_flag = int.from_bytes(buf[pos + POS_SYSFLAG : pos + POS_SYSFLAG + 4], "big")
    at = pos + POS_BORN_HOST + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
    return int.from_bytes(buf[at : at + 8], "big", signed=True)


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
    CRC. Returns the fixed header's fields (see :func:`_header_struct`), the body (a slice of
    ``buf``), and where the topic starts and ends; raises :class:`CorruptRecordError` naming the
    first inconsistency."""
    if limit - pos < HEADER_V4:
        raise record_error(f"{limit - pos} bytes left, a record needs at least {HEADER_V4}", pos)
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise record_error(f"bad magic 0x{magic:08X}", pos)
    if size < HEADER_V4 + 3 or size > limit - pos:
        raise record_error(f"total size {size} does not fit in {limit - pos} bytes", pos)
    sys_flag = _INT.unpack_from(buf, pos + POS_SYSFLAG)[0]
    header = _HEADERS[
        20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8, 20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8
    ]
    if size < header.size + 3:  # else the unpack below could read past the buffer
        raise record_error(f"total size {size} is smaller than its {header.size}-byte header", pos)
    fields = header.unpack_from(buf, pos)
    body_len = fields[14]
    body_start = pos + header.size
    body_end = body_start + body_len
    topic_start = body_end + (2 if magic == MAGIC_V2 else 1)
    rec_end = pos + size
    if body_len < 0 or topic_start > rec_end:
        raise record_error(f"body length {body_len} overruns the record", pos)
    topic_len = int.from_bytes(buf[body_end:topic_start], "big")
    topic_end = topic_start + topic_len
    if topic_end + 2 > rec_end:
        raise record_error(f"topic length {topic_len} overruns the record", pos)
    props_len = int.from_bytes(buf[topic_end : topic_end + 2], "big")
    if topic_end + 2 + props_len != rec_end:
        raise record_error(
            f"field lengths add up to {topic_end + 2 + props_len - pos}, total size says {size}", pos
        )
    body = buf[body_start:body_end]
    if check_crc and (crc32(body) & 0x7FFFFFFF) != fields[2]:
        raise record_error(f"body CRC mismatch (stored {fields[2]})", pos)
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
        raw_props = bytes(buf[topic_end + 2 : pos + size])
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
    size = fields[0]
    try:
        topic = bytes(buf[topic_start:topic_end]).decode()
        props = bytes(buf[topic_end + 2 : pos + size]).decode()
    except UnicodeDecodeError as e:
        raise record_error(f"topic or properties are not UTF-8 ({e.reason})", pos) from e
    view = RecordView(size, fields[3], fields[5], fields[6], fields[7], fields[10], topic, props)
    return size, view


def blank_marker(free_bytes: int) -> bytes:
    """End-of-file marker: the whole free space as an int, then the BLANK magic."""
    return _SIZE_MAGIC.pack(free_bytes, BLANK_MAGIC)
