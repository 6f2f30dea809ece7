"""Key extraction: the indexed keys of a committed batch (hashed by :mod:`tierd.format.key_hash`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NamedTuple

import numpy as np

from tierd.format.columns import gather_ranges, record_spans
from tierd.format.properties import KEY_SEPARATOR, PROP_NAME_SEP, PROP_SEP, PROPERTY_KEYS, PROPERTY_UNIQ_KEY

if TYPE_CHECKING:
    import numpy.typing as npt

    from tierd.tiered.flatmessage import CommittedBatch
    from tierd.tiered.index.format import I64Array, U8Array

__all__ = ["batch_keys"]

_KEYS_ITEM: Final = (PROPERTY_KEYS + PROP_NAME_SEP).encode()
_UNIQ_ITEM: Final = (PROPERTY_UNIQ_KEY + PROP_NAME_SEP).encode()
_PROP_SEP: Final = ord(PROP_SEP)
_KEY_SEP: Final = ord(KEY_SEPARATOR)


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
    """Every key of every record of ``batch``: UNIQ_KEY, then each KEYS token (split on
    spaces, blanks dropped) — RocketMQ's IndexService order, as the hot index writes; a key
    repeated within a record once (RocketMQ's key set); a property's last non-empty value wins
    (:func:`~tierd.format.properties.decode_properties`' rule).

    Vectorised over the batch: the properties gathered end to end, the two names found with
    byte compares, the values cut and split with numpy. Works on UTF-8 bytes: splitting on
    0x01/0x02/0x20 bytes is the same as splitting the decoded text, and the hash is of the
    UTF-8 bytes anyway."""
    spans = record_spans(batch.records, np.asarray(batch.sizes, dtype=np.int64))
    buf = np.frombuffer(batch.records, dtype=np.uint8)
    props, at = gather_ranges(buf, spans.properties_start, spans.ends)
    k_vs, k_ve = _last_values(props, at, _KEYS_ITEM)
    u_vs, u_ve = _last_values(props, at, _UNIQ_ITEM)
    tok_s, tok_e = _tokens(props, k_vs, k_ve)
    owners = np.searchsorted(at, tok_s, side="right") - 1
    uniq = np.flatnonzero(u_ve > u_vs)
    if len(uniq):  # RocketMQ's IndexService order: each record's UNIQ_KEY, then its KEYS tokens
        owners = np.concatenate([owners, uniq])
        kind = np.concatenate([np.ones(len(tok_s), dtype=np.int8), np.zeros(len(uniq), dtype=np.int8)])
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
