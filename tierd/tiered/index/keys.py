"""Key extraction: the indexed keys of a committed batch (hashed by :mod:`tierd.format.key_hash`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NamedTuple

import numpy as np

from tierd.errors import CorruptionError
from tierd.format.layout import (
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    MIN_TAIL,
    PROPERTIES_LENGTH_WIDTH,
    TOPIC_LENGTH_WIDTH,
    field_column,
    gather_at,
    header_length,
    host_widths,
    position,
)
from tierd.format.properties import KEY_SEPARATOR, PROP_NAME_SEP, PROP_SEP, PROPERTY_KEYS, PROPERTY_UNIQ_KEY

if TYPE_CHECKING:
    import numpy.typing as npt

    from tierd.tiered.flatmessage import CommittedBatch
    from tierd.tiered.index.format import I64Array, U8Array

__all__ = ["batch_keys"]

_U2: Final = np.dtype(">u2")
_U4: Final = np.dtype(">u4")


def _property_offsets(records: bytes, sizes: I64Array) -> tuple[I64Array, I64Array]:
    """(start, end) of every record's properties, computed for the whole batch with numpy.

    Only framing is checked (the flat commitlog holds records verified when tiered); a record
    whose fields do not add up is a :class:`CorruptionError`."""
    n = len(sizes)
    buf = np.frombuffer(records, dtype=np.uint8)
    ends = np.cumsum(sizes, dtype=np.int64)
    if n == 0 or int(ends[-1]) != len(records) or int(sizes.min()) < MIN_RECORD_SIZE:
        raise CorruptionError(
            f"record sizes {sizes.tolist()[:8]}... do not frame a batch of {len(records)} bytes",
            size=len(records),
        )
    starts = ends - sizes
    last = len(records) - 1
    magic = field_column(buf, starts, "magic").astype(np.int64)
    born, store = host_widths(field_column(buf, starts, "sys_flag"))
    body_start = starts + header_length(born, store)
    body_len_at = np.minimum(starts + position("body_length", born, store), last - 3)
    body_len = gather_at(buf, body_len_at, _U4).astype(np.int64)
    v2 = magic == MAGIC_V2
    tpos = np.minimum(body_start + body_len, last - 1)
    topic_len = np.where(v2, gather_at(buf, tpos, _U2).astype(np.int64), buf[tpos].astype(np.int64))
    tlen_width = np.where(v2, TOPIC_LENGTH_WIDTH[MAGIC_V2], TOPIC_LENGTH_WIDTH[MAGIC_V1])
    props_start = body_start + body_len + tlen_width + topic_len + PROPERTIES_LENGTH_WIDTH
    props_len = gather_at(buf, np.clip(props_start - PROPERTIES_LENGTH_WIDTH, 0, last - 1), _U2).astype(
        np.int64
    )
    ok = (
        ((magic == MAGIC_V1) | v2)
        & (body_len < 2**31)
        & (body_start + body_len + MIN_TAIL <= ends)
        & (props_start + props_len == ends)
    )
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise CorruptionError(
            f"record {bad} of the batch (at byte {int(starts[bad])}) has inconsistent field lengths",
            index=bad,
        )
    return props_start, ends


_KEYS_ITEM: Final = (PROPERTY_KEYS + PROP_NAME_SEP).encode()
_UNIQ_ITEM: Final = (PROPERTY_UNIQ_KEY + PROP_NAME_SEP).encode()
_PROP_SEP: Final = ord(PROP_SEP)
_KEY_SEP: Final = ord(KEY_SEPARATOR)


def _gather(buf: U8Array, starts: I64Array, ends: I64Array) -> tuple[U8Array, I64Array]:
    """The byte ranges ``[starts, ends)`` of ``buf`` end to end (one fancy index), and where
    each range starts in the result."""
    lens = ends - starts
    at = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=at[1:])
    src = np.arange(int(at[-1]), dtype=np.int64) + np.repeat(starts - at[:-1], lens)
    return buf[src], at


def _last_values(props: U8Array, at: I64Array, item: bytes) -> tuple[I64Array, I64Array]:
    """(start, end) in ``props`` of every record's value of the property ``item`` (its name and
    0x01) — of the last item with a non-empty value, as :func:`decode_properties` keeps; (0, 0)
    for a record without one. An item starts at a record's first byte or after 0x02; its value
    ends at the next 0x02 or at the record's end."""
    n = len(at) - 1
    total = len(props)
    w = len(item)
    vs = np.zeros(n, dtype=np.int64)
    ve = np.zeros(n, dtype=np.int64)
    if total < w:
        return vs, ve
    hit = props[: total - w + 1] == item[0]
    for k in range(1, w):
        hit &= props[k : total - w + 1 + k] == item[k]
    pos = np.flatnonzero(hit)
    if not len(pos):
        return vs, ve
    rec = np.searchsorted(at, pos, side="right") - 1  # the record whose bytes hold pos
    item_start = (pos == at[rec]) | (props[np.maximum(pos - 1, 0)] == _PROP_SEP)
    pos, rec = pos[item_start], rec[item_start]
    rec_end = at[rec + 1]
    seps = np.append(np.flatnonzero(props == _PROP_SEP), total)
    start = pos + w
    end = np.minimum(seps[np.searchsorted(seps, start)], rec_end)
    # An empty value does not replace an earlier one; a name running into the next record's
    # bytes (pos + w > rec_end) is no item either.
    keep = end > start
    rec, start, end = rec[keep], start[keep], end[keep]
    if not len(rec):
        return vs, ve
    last = np.append(rec[1:] != rec[:-1], True)  # positions ascend: the last item of each record
    vs[rec[last]] = start[last]
    ve[rec[last]] = end[last]
    return vs, ve


def _tokens(props: U8Array, vs: I64Array, ve: I64Array) -> tuple[I64Array, I64Array]:
    """(start, end) of every run of non-separator bytes inside the ranges ``[vs, ve)`` (the
    KEYS values: each run is one key; blanks vanish). The ranges never touch (a value is
    preceded by its item's name), so runs cannot join across two of them."""
    some = ve > vs
    marks = np.zeros(len(props) + 1, dtype=np.int8)
    marks[vs[some]] = 1
    marks[ve[some]] = -1
    inside = np.cumsum(marks[:-1], dtype=np.int8).astype(bool) & (props != _KEY_SEP)
    edge = np.diff(inside.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    return np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)


class _KeyRanges(NamedTuple):
    """Where every indexed key of a batch lies in its gathered properties."""

    props: U8Array
    starts: I64Array
    ends: I64Array
    owners: I64Array  # record index of each key, ascending


def _key_ranges(batch: CommittedBatch) -> _KeyRanges:
    """Every key of every record of ``batch``: each KEYS token (split on spaces, blanks
    dropped), then UNIQ_KEY; a key repeated within a record once (RocketMQ's key set); a
    property's last non-empty value wins (:func:`~tierd.format.properties.decode_properties`'
    rule).

    Vectorised over the batch: the properties gathered end to end, the two names found with
    byte compares, the values cut and split with numpy. Works on UTF-8 bytes: splitting on
    0x01/0x02/0x20 bytes is the same as splitting the decoded text, and the hash is of the
    UTF-8 bytes anyway."""
    starts, ends = _property_offsets(batch.records, np.asarray(batch.sizes, dtype=np.int64))
    props, at = _gather(np.frombuffer(batch.records, dtype=np.uint8), starts, ends)
    k_vs, k_ve = _last_values(props, at, _KEYS_ITEM)
    u_vs, u_ve = _last_values(props, at, _UNIQ_ITEM)
    tok_s, tok_e = _tokens(props, k_vs, k_ve)
    owners = np.searchsorted(at, tok_s, side="right") - 1
    uniq = np.flatnonzero(u_ve > u_vs)
    if len(uniq):  # each record's KEYS tokens, then its UNIQ_KEY
        owners = np.concatenate([owners, uniq])
        kind = np.concatenate([np.zeros(len(tok_s), dtype=np.int8), np.ones(len(uniq), dtype=np.int8)])
        tok_s = np.concatenate([tok_s, u_vs[uniq]])
        tok_e = np.concatenate([tok_e, u_ve[uniq]])
        order = np.lexsort((tok_s, kind, owners))
        owners, tok_s, tok_e = owners[order], tok_s[order], tok_e[order]
    several = np.flatnonzero(np.bincount(owners, minlength=len(at) - 1) > 1)
    if len(several):
        keep = _first_occurrences(props, tok_s, tok_e, owners, several)
        owners, tok_s, tok_e = owners[keep], tok_s[keep], tok_e[keep]
    return _KeyRanges(props, tok_s, tok_e, owners)


def _first_occurrences(
    props: U8Array, starts: I64Array, ends: I64Array, owners: I64Array, several: I64Array
) -> npt.NDArray[np.bool_]:
    """Which keys are their record's first of those bytes (``several``: records with more than
    one key, the only ones that can repeat one)."""
    keep = np.ones(len(owners), dtype=bool)
    raw = props.tobytes()
    first = np.searchsorted(owners, several, side="left").tolist()
    stop = np.searchsorted(owners, several, side="right").tolist()
    s, e = starts.tolist(), ends.tolist()
    for a, b in zip(first, stop, strict=True):
        seen: set[bytes] = set()
        for i in range(a, b):
            key = raw[s[i] : e[i]]
            if key in seen:
                keep[i] = False
            seen.add(key)
    return keep


def batch_keys(batch: CommittedBatch) -> tuple[list[bytes], I64Array]:
    """(``topic#key`` as UTF-8 bytes, record index) for every key of every record of ``batch``
    (see :func:`_key_ranges` for which keys)."""
    r = _key_ranges(batch)
    raw = r.props.tobytes()
    prefix = f"{batch.topic}#".encode()
    return [prefix + raw[a:b] for a, b in zip(r.starts.tolist(), r.ends.tolist(), strict=True)], r.owners
