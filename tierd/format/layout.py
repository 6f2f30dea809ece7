"""The commitlog record's layout (FORMATS §1.1), declared once: every other statement of it is
derived from :data:`FIELDS` here.

A record is a fixed header — the fields below, in this order, big-endian — then the body, the
topic (length-prefixed: one byte under the v1 magic, two under v2) and the properties (a 2-byte
length, then the text). Only the two host fields change width (IPv4 8 bytes, IPv6 20), as the
SYSFLAG's host bits say; every position after BORNHOST therefore depends on them.

What is derived here, and who uses it:

* ``POS_*`` — each field's byte position with IPv4 hosts, ``HEADER_V4`` — the header's length;
* :func:`header_struct` — the :class:`struct.Struct` packing a header (the single record codec);
* :func:`header_dtype` — the numpy structured dtype of a header (batch encoding and decoding);
* :func:`position`, :func:`host_widths`, :func:`header_length` — positions for any host widths,
  on scalars or on numpy columns of SYSFLAGs (framing many records at once);
* :func:`c_header` — the ``enum`` and ``#define`` block of ``_record_layout.h``, which the C
  extension compiles against; a test regenerates it and fails when the file disagrees
  (``python -m tierd.format.layout`` rewrites the block).

Nothing outside :mod:`tierd.format` states a position, a width, a magic or a flag value: a layer
test greps for them (``tests/test_layers.py``), so a second statement of the layout cannot creep
back in.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeVar, overload

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class Field(NamedTuple):
    """One fixed-header field: its name, its :mod:`struct` code (``s`` for a host, whose width
    the SYSFLAG gives) and whether the host is the born host (``born``) or the store host."""

    name: str
    code: str
    host: str = ""


#: The fixed header, in order (FORMATS §1.1). BODYLENGTH is its last field.
FIELDS: Final = (
    Field("total", "i"),
    Field("magic", "I"),
    Field("body_crc", "I"),
    Field("queue_id", "i"),
    Field("flag", "i"),
    Field("queue_offset", "q"),
    Field("physical_offset", "q"),
    Field("sys_flag", "i"),
    Field("born_timestamp", "q"),
    Field("born_host", "s", "born"),
    Field("store_timestamp", "q"),
    Field("store_host", "s", "store"),
    Field("reconsume_times", "i"),
    Field("prepared_offset", "q"),
    Field("body_length", "i"),
)
FIELD_NAMES: Final = tuple(f.name for f in FIELDS)

#: Width of an IPv4 host field (4-byte address, 4-byte port) and of an IPv6 one (16 + 4).
HOST_V4: Final = 8
HOST_V6: Final = 20

MAGIC_V1: Final = 0xDAA320A7
MAGIC_V2: Final = 0xDAA320AB
BLANK_MAGIC: Final = 0xCBD43194
#: The blank end-of-file marker: the free space as an int, then :data:`BLANK_MAGIC`; a record
#: needs this many spare bytes after it in its file, else the file ends with the marker.
END_FILE_MIN_BLANK: Final = 8

SYSFLAG_COMPRESSED: Final = 0x1
SYSFLAG_MULTI_TAGS: Final = 0x2
SYSFLAG_TRANSACTION_MASK: Final = 0xC
SYSFLAG_TRANSACTION_PREPARED: Final = 0x4
SYSFLAG_TRANSACTION_COMMIT: Final = 0x8
SYSFLAG_TRANSACTION_ROLLBACK: Final = 0xC
SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20
SYSFLAG_HOSTS_V6: Final = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6

#: BODYCRC is zlib's CRC-32 of the body masked to 31 bits, as RocketMQ stores it.
BODY_CRC_MASK: Final = 0x7FFFFFFF

#: Topics longer than this (in bytes) are written with the v2 magic (2-byte topic length).
V1_TOPIC_MAX: Final = 127
V2_TOPIC_MAX_BYTES: Final = 32767
#: Width of the topic's length prefix under each magic, and of the properties' length.
TOPIC_LENGTH_WIDTH: Final = {MAGIC_V1: 1, MAGIC_V2: 2}
PROPERTIES_LENGTH_WIDTH: Final = 2

_WIDTH: Final = {"i": 4, "I": 4, "q": 8}


def width(name: str, born: int = HOST_V4, store: int = HOST_V4) -> int:
    """Bytes of field ``name`` (a host's width is the one given for it)."""
    f = FIELDS[FIELD_NAMES.index(name)]
    if f.host:
        return born if f.host == "born" else store
    return _WIDTH[f.code]


def _positions(born: int, store: int) -> dict[str, int]:
    out: dict[str, int] = {}
    at = 0
    for f in FIELDS:
        out[f.name] = at
        at += width(f.name, born, store)
    out["header_end"] = at
    return out


_V4: Final = _positions(HOST_V4, HOST_V4)

# Byte positions with IPv4 hosts; those up to BORNHOST hold for any host widths.
POS_TOTAL: Final = _V4["total"]
POS_MAGIC: Final = _V4["magic"]
POS_BODY_CRC: Final = _V4["body_crc"]
POS_QUEUE_ID: Final = _V4["queue_id"]
POS_FLAG: Final = _V4["flag"]
POS_QUEUE_OFFSET: Final = _V4["queue_offset"]
POS_PHYSICAL_OFFSET: Final = _V4["physical_offset"]
POS_SYSFLAG: Final = _V4["sys_flag"]
POS_BORN_TIMESTAMP: Final = _V4["born_timestamp"]
POS_BORN_HOST: Final = _V4["born_host"]
POS_STORE_TIMESTAMP: Final = _V4["store_timestamp"]
POS_STORE_HOST: Final = _V4["store_host"]
POS_RECONSUME_TIMES: Final = _V4["reconsume_times"]
POS_PREPARED_OFFSET: Final = _V4["prepared_offset"]
POS_BODY_LENGTH: Final = _V4["body_length"]
#: Header length with IPv4 hosts, up to and including BODYLENGTH.
HEADER_V4: Final = _V4["header_end"]
#: Header bytes besides the two host fields.
HEADER_FIXED: Final = HEADER_V4 - 2 * HOST_V4
#: The smallest record: an IPv4 header, an empty body, a v1 topic length byte (empty topic) and
#: the properties length.
MIN_RECORD_SIZE: Final = HEADER_V4 + TOPIC_LENGTH_WIDTH[MAGIC_V1] + PROPERTIES_LENGTH_WIDTH
#: The fewest bytes after a body: an empty topic's length byte and the properties length.
MIN_TAIL: Final = MIN_RECORD_SIZE - HEADER_V4
#: A record may exceed the body limit by this much (header, topic, properties): a record-format
#: fact, so that readers of stored records size their scans without the hot store.
RECORD_OVERHEAD_LIMIT: Final = 64 * 1024


def max_record_size(max_body: int) -> int:
    """The largest record the store accepts when bodies may be ``max_body`` bytes. The one
    owner of this bound: every file that must be able to hold any record (a hot commitlog file,
    a cold commitlog segment) and every scan that must recognise one is sized from it."""
    return max_body + RECORD_OVERHEAD_LIMIT


_T = TypeVar("_T", int, "npt.NDArray[np.int64]")


@overload
def host_widths(sys_flag: int) -> tuple[int, int]: ...
@overload
def host_widths(sys_flag: npt.NDArray[Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def host_widths(sys_flag: Any) -> Any:
    """(born host width, store host width) for a SYSFLAG, or for a numpy column of them."""
    if isinstance(sys_flag, int):
        return (
            HOST_V6 if sys_flag & SYSFLAG_BORNHOST_V6 else HOST_V4,
            HOST_V6 if sys_flag & SYSFLAG_STOREHOST_V6 else HOST_V4,
        )
    import numpy as np

    flags = np.asarray(sys_flag).astype(np.int64)
    return (
        np.where(flags & SYSFLAG_BORNHOST_V6, HOST_V6, HOST_V4).astype(np.int64),
        np.where(flags & SYSFLAG_STOREHOST_V6, HOST_V6, HOST_V4).astype(np.int64),
    )


def host_sys_flag(born: int, store: int) -> int:
    """The SYSFLAG host bits for host fields of these widths."""
    return (SYSFLAG_BORNHOST_V6 if born == HOST_V6 else 0) | (SYSFLAG_STOREHOST_V6 if store == HOST_V6 else 0)


def header_length(born: _T, store: _T) -> _T:
    """The fixed header's length for these host widths (scalars or numpy columns)."""
    return born + store + HEADER_FIXED


def position(name: str, born: _T, store: _T) -> _T:
    """Field ``name``'s byte position for these host widths (scalars or numpy columns)."""
    at: Any = _V4[name] + 0 * born  # (0 * born: a column in, a column out)
    i = FIELD_NAMES.index(name) if name in FIELD_NAMES else len(FIELD_NAMES)
    if i > FIELD_NAMES.index("born_host"):
        at = at + (born - HOST_V4)
    if i > FIELD_NAMES.index("store_host"):
        at = at + (store - HOST_V4)
    return at  # type: ignore[no-any-return]


def topic_length_width(magic: int) -> int:
    """Bytes of the topic's length prefix under ``magic``."""
    return TOPIC_LENGTH_WIDTH[magic]


def record_size(body: _T, topic: _T, properties: _T, born: int = HOST_V4, store: int = HOST_V4) -> _T:
    """TOTALSIZE of a record with these body, topic and properties byte lengths: the v2 magic
    (a 2-byte topic length) where the topic is longer than :data:`V1_TOPIC_MAX`."""
    prefix: Any
    if isinstance(topic, int):
        prefix = TOPIC_LENGTH_WIDTH[MAGIC_V2 if topic > V1_TOPIC_MAX else MAGIC_V1]
    else:
        import numpy as np

        prefix = np.where(
            topic > V1_TOPIC_MAX, TOPIC_LENGTH_WIDTH[MAGIC_V2], TOPIC_LENGTH_WIDTH[MAGIC_V1]
        ).astype(np.int64)
    return header_length(born, store) + body + prefix + topic + PROPERTIES_LENGTH_WIDTH + properties  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- derived codecs
def _struct_format(born: int, store: int) -> str:
    return ">" + "".join(f"{width(f.name, born, store)}s" if f.host else f.code for f in FIELDS)


_STRUCTS: Final = {
    (b, s): struct.Struct(_struct_format(b, s)) for b in (HOST_V4, HOST_V6) for s in (HOST_V4, HOST_V6)
}


def header_struct(born: int, store: int) -> struct.Struct:
    """The fixed header for these host widths, fields in :data:`FIELDS` order."""
    return _STRUCTS[born, store]


_NUMPY_CODES: Final = {"i": ">i4", "I": ">u4", "q": ">i8"}
_DTYPES: dict[tuple[int, int], Any] = {}


def field_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype of fixed-width field ``name`` as stored (big-endian)."""
    import numpy as np

    return np.dtype(_NUMPY_CODES[FIELDS[FIELD_NAMES.index(name)].code])


def header_dtype(born: int = HOST_V4, store: int = HOST_V4) -> np.dtype[Any]:
    """The fixed header for these host widths as a numpy structured dtype (hosts as opaque
    ``V`` bytes), its names those of :data:`FIELDS`."""
    dt = _DTYPES.get((born, store))
    if dt is None:
        import numpy as np

        dt = _DTYPES[born, store] = np.dtype(
            [(f.name, f"V{width(f.name, born, store)}" if f.host else _NUMPY_CODES[f.code]) for f in FIELDS]
        )
    return dt


def gather_at(
    buf: npt.NDArray[np.uint8], pos: npt.NDArray[np.int64], dtype: np.dtype[Any]
) -> npt.NDArray[Any]:
    """The ``dtype`` value stored at each byte position ``pos`` of ``buf`` (any alignment): one
    fancy index into a view whose element ``i`` is the value starting at byte ``i`` (stride 1),
    rather than gathering ``itemsize`` bytes per value — 2-3x faster per field. Positions must
    leave room for the whole value (else IndexError)."""
    import numpy as np

    view: npt.NDArray[Any] = np.ndarray(
        (max(0, len(buf) - dtype.itemsize + 1),), dtype=dtype, buffer=buf, strides=(1,)
    )
    return view[pos]


def field_column(
    buf: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    name: str,
    sys_flag: npt.NDArray[Any] | None = None,
) -> npt.NDArray[Any]:
    """Field ``name`` of the records starting at ``starts`` in ``buf``. Fields after BORNHOST
    need the records' SYSFLAGs (``sys_flag``), as read with this function; without them the
    hosts are taken to be IPv4 — right only where the caller knows they are."""
    if sys_flag is None or FIELD_NAMES.index(name) <= FIELD_NAMES.index("born_host"):
        at: Any = starts + _V4[name]
    else:
        born, store = host_widths(sys_flag)
        at = starts + position(name, born, store)
    return gather_at(buf, at, field_dtype(name))


def set_field_column(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], name: str, values: npt.NDArray[Any]
) -> None:
    """Write ``values`` into field ``name`` (one before BORNHOST: the same position whatever the
    host widths) of the records starting at ``starts`` in the writable ``buf``."""
    import numpy as np

    if FIELD_NAMES.index(name) > FIELD_NAMES.index("born_host"):
        raise ValueError(f"{name} moves with the host widths: give set_field_column a field before born_host")
    dt = field_dtype(name)
    idx = (starts[:, None] + (_V4[name] + np.arange(dt.itemsize))).ravel()
    buf[idx] = np.asarray(values).astype(dt).view(np.uint8)


# ----------------------------------------------------------------------------- the C header
_C_BEGIN: Final = "/* BEGIN generated by tierd.format.layout (python -m tierd.format.layout) */"
_C_END: Final = "/* END generated */"
#: The names the C code knows the layout by (prefix POS_ for positions).
_C_FLAGS: Final = {
    "MAGIC_V1": MAGIC_V1,
    "MAGIC_V2": MAGIC_V2,
    "BLANK_MAGIC": BLANK_MAGIC,
    "SYSFLAG_BORNHOST_V6": SYSFLAG_BORNHOST_V6,
    "SYSFLAG_STOREHOST_V6": SYSFLAG_STOREHOST_V6,
    "SYSFLAG_HOSTS_V6": SYSFLAG_HOSTS_V6,
    "BODY_CRC_MASK": BODY_CRC_MASK,
    "V1_TOPIC_MAX": V1_TOPIC_MAX,
}
_C_NAMES: Final = {"sys_flag": "SYSFLAG", "prepared_offset": "PREPARED_OFFSET", "total": "TOTAL"}


def c_header() -> str:
    """The generated block of ``_record_layout.h``: positions with IPv4 hosts, widths, magics,
    flags — every number the C code uses, from this module."""
    lines = [
        _C_BEGIN,
        "/* Byte positions in a record with IPv4 hosts (both SYSFLAG host bits clear). */",
        "enum {",
    ]
    for name in FIELD_NAMES:
        lines.append(f"    POS_{_C_NAMES.get(name, name.upper())} = {_V4[name]},")
    lines += [
        f"    HEADER_V4 = {HEADER_V4},",
        f"    HEADER_FIXED = {HEADER_FIXED},",
        f"    HOST_V4 = {HOST_V4},",
        f"    HOST_V6 = {HOST_V6},",
        f"    MIN_RECORD_SIZE = {MIN_RECORD_SIZE},",
        f"    PROPERTIES_LENGTH_WIDTH = {PROPERTIES_LENGTH_WIDTH},",
        "};",
    ]
    lines += [f"#define {name} 0x{value:X}u" for name, value in _C_FLAGS.items()]
    lines.append(_C_END)
    return "\n".join(lines) + "\n"


def c_header_block(text: str) -> str:
    """The generated block as it stands in the header file's ``text`` ('' if absent)."""
    start, end = text.find(_C_BEGIN), text.find(_C_END)
    if start < 0 or end < start:
        return ""
    return text[start : end + len(_C_END)] + "\n"


def _rewrite_c_header() -> None:  # pragma: no cover - a developer's command
    from pathlib import Path

    path = Path(__file__).with_name("_record_layout.h")
    text = path.read_text()
    old = c_header_block(text)
    path.write_text(text.replace(old, c_header()) if old else text)


if __name__ == "__main__":  # pragma: no cover
    _rewrite_c_header()
