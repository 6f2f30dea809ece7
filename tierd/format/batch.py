"""Many records at once, column-wise with numpy (FORMATS §1.1).

* :func:`encode_batch` builds every fixed-size header of a batch at once in a numpy structured
  array and lists the records' pieces for one gathering write — the ``put_batch`` path. The only
  per-message Python work left is what cannot be vectorised: the body CRC and the pieces list.
* :class:`RecordBatch` decodes the records of one buffer: framing checked for all of them at
  once, per message only the body slice, its CRC and the object remain — the cold read path.

The layout and the single-record codec these must agree with are in :mod:`tierd.format.record`.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from tierd.format.host import decode_host
from tierd.format.layout import (
    BODY_CRC_MASK,
    HOST_V4,
    MIN_RECORD_SIZE,
    POS_BODY_LENGTH,
    POS_PREPARED_OFFSET,
    POS_RECONSUME_TIMES,
    POS_STORE_HOST,
    POS_STORE_TIMESTAMP,
    PROPERTIES_LENGTH_WIDTH,
    TOPIC_LENGTH_WIDTH,
    gather_at,
    header_dtype,
)
from tierd.format.message_ext import MessageExt
from tierd.format.record import (
    HEADER_V4,
    MAGIC_V1,
    MAGIC_V2,
    POS_BODY_CRC,
    POS_BORN_HOST,
    POS_BORN_TIMESTAMP,
    POS_FLAG,
    POS_MAGIC,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_ID,
    POS_QUEUE_OFFSET,
    POS_SYSFLAG,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    crc32,
    decode_record,
    record_error,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- batch encoding
_HEADER_V4_DTYPE = header_dtype(HOST_V4, HOST_V4)


def encode_batch(
    *,
    bodies: Sequence[bytes],
    tails: Sequence[bytes],
    magics: npt.NDArray[np.uint32] | int,
    crcs: npt.NDArray[np.uint32],
    queue_ids: npt.NDArray[np.int32],
    flags: npt.NDArray[np.int32] | int,
    queue_offsets: npt.NDArray[np.int64],
    physical_offsets: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    body_lengths: npt.NDArray[np.int64],
    born_timestamps: npt.NDArray[np.int64] | int,
    born_host: bytes,
    store_timestamp: int,
    store_host: bytes,
) -> list[bytes]:
    """Encode a batch of IPv4-host records with one numpy header build: the records' pieces in
    order (header, body, tail each), for one ``bytes.join`` or one gathering write.

    ``tails`` are each record's ``topic field + properties length + properties`` (everything after
    the body); ``sizes`` the precomputed total sizes. Callers route records with IPv6 hosts
    through :func:`encode_record` instead (the header width differs)."""
    n = len(bodies)
    h = np.empty(n, _HEADER_V4_DTYPE)
    h["total"] = sizes
    h["magic"] = magics
    h["body_crc"] = crcs
    h["queue_id"] = queue_ids
    h["flag"] = flags
    h["queue_offset"] = queue_offsets
    h["physical_offset"] = physical_offsets
    h["sys_flag"] = 0
    h["born_timestamp"] = born_timestamps
    h["born_host"] = np.frombuffer(born_host, "V8")[0]
    h["store_timestamp"] = store_timestamp
    h["store_host"] = np.frombuffer(store_host, "V8")[0]
    h["reconsume_times"] = 0
    h["prepared_offset"] = 0
    h["body_length"] = body_lengths
    raw = h.tobytes()
    parts: list[bytes] = [b""] * (3 * n)
    parts[0::3] = [raw[i : i + HEADER_V4] for i in range(0, n * HEADER_V4, HEADER_V4)]
    parts[1::3] = bodies
    parts[2::3] = tails
    return parts


# ----------------------------------------------------------------------------- batch decoding
_U2 = np.dtype(">u2")
_I4 = np.dtype(">i4")
_U4 = np.dtype(">u4")
_I8 = np.dtype(">i8")
_U8 = np.dtype(">u8")


def _host_column(raw: npt.NDArray[np.uint64]) -> list[str]:
    """The ``"ip:port"`` of each stored 8-byte IPv4 host. A batch's records nearly always share
    one born and one store host: that case is one decode and a repeated list, not a name
    looked up per message."""
    if len(raw) == 0:
        return []
    if bool((raw == raw[0]).all()):
        return [decode_host(int(raw[0]).to_bytes(8, "big"))] * len(raw)
    values = raw.tolist()
    names = {v: decode_host(v.to_bytes(8, "big")) for v in set(values)}
    return list(map(names.__getitem__, values))


def _bind_decoder() -> tuple[Callable[..., bool], Callable[..., list[MessageExt] | None]] | None:
    """The C decoder (:mod:`tierd.format.compiled`'s extension, whose body CRC is bound there)
    bound to :class:`MessageExt`, or None where it is not built (no compiler at install time:
    the extension is optional) or refuses the class.

    It fills the instances' slots directly, without ``__init__``: it checks that every field
    is a writable slot of a plain class and that there is no other slot; the class must not
    grow a ``__post_init__`` either. It also takes the messages out of the cyclic garbage
    collector's care (``untrack``): their fields are ``str``, ``bytes``, ``int``, ``None`` and
    the lazily cached read-only mapping of ``str`` — nothing that can form a cycle — and the
    collector's young pass after each batch scanned all 4,096 of them for nothing. The cost:
    a message a caller puts into a cycle by storing a container in one of its fields (for
    instance ``m.topic = [m]``) is freed only when the cycle is broken by hand."""
    from tierd.format.compiled import records

    if records is None:
        return None  # (compiled says so once)
    if hasattr(MessageExt, "__post_init__"):
        log.warning("MessageExt has a __post_init__: the C batch decoder is not used")
        return None
    try:
        records.bind_decoder(MessageExt, True)
    except TypeError as e:
        log.warning("the C batch decoder does not fit MessageExt (%s): cold batches are decoded in Python", e)
        return None
    return records.check_queue, records.decode_queue


_accel = _bind_decoder()
#: Whether cold batches are decoded by the C extension (else by the Python decoder: the same
#: messages for 5-7x the CPU: ~1.5 µs per 1 KiB message against ~0.2 µs).
ACCELERATED: Final = _accel is not None


class RecordBatch:
    """Many records of one buffer decoded column-wise: framing checked for all of them with
    numpy at once; per message only the body slice, its CRC and the object remain (the cold
    read path's "parse lazily, check CRC in bulk"). Records with IPv6 hosts fall back to
    :func:`decode_record`."""

    __slots__ = ("_cols", "_identity", "_queue_checked", "data", "sizes", "starts")

    def __init__(
        self, data: bytes | memoryview, starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
    ) -> None:
        #: The records: ``bytes``, or a view of a reused receive buffer (the cold read path);
        #: what leaves this object is always ``bytes`` copied out of it.
        self.data = data
        self.starts = starts
        self.sizes = sizes
        self._cols: list[npt.NDArray[np.int64]] | None = None
        self._queue_checked: tuple[str, int, int] | None = None
        #: Queue id, queue offset, topic start and end of every record (for :meth:`_is_queue`).
        self._identity: tuple[npt.NDArray[Any], ...] | None = None

    def _columns(self) -> list[npt.NDArray[np.int64]] | None:
        if self._cols is not None:
            return self._cols
        buf = np.frombuffer(self.data, np.uint8)
        s = self.starts
        if len(s) == 0 or int(s[-1] + self.sizes[-1]) > len(buf):
            return None
        sysflag = gather_at(buf, s + POS_SYSFLAG, _I4).astype(np.int64)
        if np.any(sysflag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)):
            return None
        total = gather_at(buf, s, _I4).astype(np.int64)
        magic = gather_at(buf, s + POS_MAGIC, _U4).astype(np.int64)
        body_len = gather_at(buf, s + POS_BODY_LENGTH, _I4).astype(np.int64)
        v2 = magic == MAGIC_V2
        if (
            np.any(total != self.sizes)
            or np.any((magic != MAGIC_V1) & ~v2)
            or np.any(body_len < 0)
            or np.any(MIN_RECORD_SIZE + body_len > total)
        ):
            return None
        body_end = s + HEADER_V4 + body_len
        hi = buf[body_end].astype(np.int64)
        lo = buf[np.minimum(body_end + 1, len(buf) - 1)].astype(np.int64)
        topic_len = np.where(v2, hi * 256 + lo, hi)
        topic_start = body_end + np.where(v2, TOPIC_LENGTH_WIDTH[MAGIC_V2], TOPIC_LENGTH_WIDTH[MAGIC_V1])
        topic_end = topic_start + topic_len
        if np.any(topic_end + PROPERTIES_LENGTH_WIDTH > s + total):
            return None
        props_len = gather_at(buf, topic_end, _U2).astype(np.int64)
        if np.any(topic_end + PROPERTIES_LENGTH_WIDTH + props_len != s + total):
            return None
        queue_ids = gather_at(buf, s + POS_QUEUE_ID, _I4).astype(np.int64)
        queue_offsets = gather_at(buf, s + POS_QUEUE_OFFSET, _I8)
        self._identity = (queue_ids, queue_offsets, topic_start, topic_end)
        # Columns stay numpy until a slice of messages is built (see _rows): Python ints and
        # row tuples kept for the batch's life in the cache would be scanned by the cyclic GC.
        self._cols = [
            gather_at(buf, s + POS_BODY_CRC, _U4).astype(np.int64),
            queue_ids,
            gather_at(buf, s + POS_FLAG, _I4).astype(np.int64),
            queue_offsets,
            gather_at(buf, s + POS_PHYSICAL_OFFSET, _I8),
            sysflag,
            gather_at(buf, s + POS_BORN_TIMESTAMP, _I8),
            gather_at(buf, s + POS_STORE_TIMESTAMP, _I8),
            gather_at(buf, s + POS_RECONSUME_TIMES, _I4).astype(np.int64),
            gather_at(buf, s + POS_PREPARED_OFFSET, _I8),
            s + HEADER_V4,
            body_end,
            topic_start,
            topic_end,
            s + total,
        ]
        return self._cols

    def queue_messages(
        self, start: int, stop: int, topic: str, queue_id: int, first_queue_offset: int
    ) -> list[MessageExt] | None:
        """Records ``[start, stop)`` of a batch that must be consecutive messages of one queue,
        record ``i`` having queue offset ``first_queue_offset + i``, each CRC-checked. What is
        the same for every record (topic, queue id, offsets) is checked once per batch, not
        per message. None when anything differs from that shape (IPv6 hosts, a
        foreign record, a bad CRC...): the caller then decodes message by message and reports
        the precise problem. The C decoder does it when it is built (:data:`ACCELERATED`),
        else :meth:`python_queue_messages`; both give the same."""
        if _accel is None:
            return self.python_queue_messages(start, stop, topic, queue_id, first_queue_offset)
        check_queue, decode_queue = _accel
        key = (topic, queue_id, first_queue_offset)
        topic_utf8 = topic.encode()
        starts = np.ascontiguousarray(self.starts, np.int64)
        sizes = np.ascontiguousarray(self.sizes, np.int64)
        if self._queue_checked != key:
            # What _columns and _is_queue check, in one C pass without building the columns.
            if not check_queue(self.data, starts, sizes, topic_utf8, queue_id, first_queue_offset):
                return None
            self._queue_checked = key
        return decode_queue(
            self.data, starts, sizes, start, stop, topic, topic_utf8, queue_id, first_queue_offset
        )

    def python_queue_messages(
        self, start: int, stop: int, topic: str, queue_id: int, first_queue_offset: int
    ) -> list[MessageExt] | None:
        """:meth:`queue_messages` in Python (numpy columns and C-level ``map`` passes): the
        decoder where the C one is not built, and the reference the tests hold it to."""
        cols = self._columns()
        if cols is None or not self._is_queue(topic, queue_id, first_queue_offset):
            return None
        n = stop - start
        (crc, _, flag, offsets, phys, sysflag, born_ts, store_ts, reconsume, prepared) = (
            c[start:stop] for c in cols[:10]
        )
        body_start, body_end, _, topic_end, end = (c[start:stop] for c in cols[10:])
        # Column by column, each step a C loop (map over slices, crc32, the constructor): a
        # Python loop body per message cost twice as much (~1.6 µs against ~0.8 µs).
        cut = self._cutter()
        bodies = cut(body_start, body_end)
        crcs = np.fromiter(map(crc32, bodies), np.int64, n)
        if not np.array_equal(crcs & BODY_CRC_MASK, crc):
            return None
        props = cut(topic_end + PROPERTIES_LENGTH_WIDTH, end)
        try:
            # One check for all: a byte below 0x80 between them cannot complete or start a
            # multi-byte sequence, so the whole is valid UTF-8 exactly when each part is.
            b"\n".join(props).decode()
        except UnicodeDecodeError:
            return None
        buf = np.frombuffer(self.data, np.uint8)
        s = self.starts[start:stop]
        born = _host_column(gather_at(buf, s + POS_BORN_HOST, _U8))
        store = _host_column(gather_at(buf, s + POS_STORE_HOST, _U8))
        return list(
            map(
                MessageExt,
                itertools.repeat(topic, n),
                itertools.repeat(queue_id, n),
                offsets.tolist(),
                bodies,
                props,
                store_ts.tolist(),
                born_ts.tolist(),
                born,
                store,
                phys.tolist(),
                (end - body_start + HEADER_V4).tolist(),
                flag.tolist(),
                sysflag.tolist(),
                reconsume.tolist(),
                prepared.tolist(),
                crc.tolist(),
            )
        )

    def _cutter(self) -> Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], list[bytes]]:
        """``cut(starts, ends)``: the ``bytes`` of each range of :attr:`data` (C loops: ``map``
        over slices; a view's slices are copied out with ``tobytes``, ~0.05 µs more each)."""
        data = self.data
        if isinstance(data, bytes):

            def cut(starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> list[bytes]:
                return list(map(data.__getitem__, map(slice, starts.tolist(), ends.tolist())))

            return cut
        view = data

        def cut_view(starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> list[bytes]:
            return list(
                map(memoryview.tobytes, map(view.__getitem__, map(slice, starts.tolist(), ends.tolist())))
            )

        return cut_view

    def _bytes(self) -> bytes:
        """:attr:`data` as ``bytes``. Record by record is the rare path (a damaged batch, IPv6
        hosts): it works on a copy of a viewed batch, made once, rather than teach every
        decoder about views."""
        if not isinstance(self.data, bytes):
            self.data = bytes(self.data)
        return self.data

    def _is_queue(self, topic: str, queue_id: int, first_queue_offset: int) -> bool:
        """Whether every record belongs to ``topic``/``queue_id`` at consecutive offsets from
        ``first_queue_offset`` (checked once, with numpy)."""
        key = (topic, queue_id, first_queue_offset)
        if self._queue_checked == key:
            return True
        buf = np.frombuffer(self.data, np.uint8)
        s = self.starts
        n = len(s)
        expected = topic.encode()
        assert self._identity is not None
        queue_ids, offsets, topic_start, topic_end = self._identity
        topic_len = topic_end - topic_start
        if (
            np.any(queue_ids != queue_id)
            or np.any(offsets != first_queue_offset + np.arange(n))
            or np.any(topic_len != len(expected))
        ):
            return False
        if expected:
            got = buf[topic_start[:, None] + np.arange(len(expected))]
            if not (got == np.frombuffer(expected, np.uint8)).all():
                return False
        self._queue_checked = key
        return True

    def message(self, i: int) -> MessageExt:
        """Record ``i``, CRC-checked; raises :class:`CorruptRecordError` if it is not valid."""
        data = self._bytes()
        cols = self._columns()
        if cols is None:
            start = int(self.starts[i])
            return decode_record(data, start, limit=start + int(self.sizes[i]), check_crc=True)
        row = [int(c[i]) for c in cols]
        start = row[10] - HEADER_V4
        try:
            topic = data[row[12] : row[13]].decode()
        except UnicodeDecodeError as e:
            raise record_error(f"topic is not UTF-8 ({e.reason})", start) from e
        born = decode_host(data[start + 48 : start + 56])
        store = decode_host(data[start + 64 : start + 72])
        return self._build((*row, born, store), topic)

    def _build(self, row: tuple[Any, ...], topic: str) -> MessageExt:
        """The message of one row (the 15 columns, then born and store host): body CRC and
        property encoding checked here."""
        (
            crc,
            queue_id,
            flag,
            queue_offset,
            phys,
            sysflag,
            born_ts,
            store_ts,
            reconsume,
            prepared,
            body_start,
            body_end,
            _,
            topic_end,
            end,
            born_host,
            store_host,
        ) = row
        data = self._bytes()
        body = data[body_start:body_end]
        if (crc32(body) & BODY_CRC_MASK) != crc:
            raise record_error(f"body CRC mismatch (stored {crc})", body_start - HEADER_V4)
        raw_props = data[topic_end + PROPERTIES_LENGTH_WIDTH : end]
        try:
            raw_props.decode()
        except UnicodeDecodeError as e:
            raise record_error(f"properties are not UTF-8 ({e.reason})", body_start - HEADER_V4) from e
        return MessageExt(
            topic,
            queue_id,
            queue_offset,
            body,
            raw_props,
            store_ts,
            born_ts,
            born_host,
            store_host,
            phys,
            end - body_start + HEADER_V4,
            flag,
            sysflag,
            reconsume,
            prepared,
            crc,
        )
