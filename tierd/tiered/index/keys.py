"""Key extraction: the indexed keys of a committed batch (hashed by :mod:`tierd.format.key_hash`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np

from tierd.errors import CorruptionError
from tierd.format.batch import gather_at
from tierd.format.properties import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from tierd.format.record import HEADER_V4, MAGIC_V1, MAGIC_V2, POS_MAGIC, POS_SYSFLAG

if TYPE_CHECKING:
    from tierd.tiered.flatmessage import CommittedBatch
    from tierd.tiered.index.format import I64Array

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
    if n == 0 or int(ends[-1]) != len(records) or int(sizes.min()) < HEADER_V4 + 3:
        raise CorruptionError(
            f"record sizes {sizes.tolist()[:8]}... do not frame a batch of {len(records)} bytes",
            size=len(records),
        )
    starts = ends - sizes
    last = len(records) - 1
    magic = gather_at(buf, starts + POS_MAGIC, _U4).astype(np.int64)
    sysflag = gather_at(buf, starts + POS_SYSFLAG, _U4).astype(np.int64)
    hosts = np.where(sysflag & 0x10, 20, 8) + np.where(sysflag & 0x20, 20, 8)
    body_start = starts + (HEADER_V4 - 16) + hosts  # fixed header bytes besides the two hosts
    body_len = gather_at(buf, np.minimum(body_start - 4, last - 3), _U4).astype(np.int64)
    v2 = magic == MAGIC_V2
    tpos = np.minimum(body_start + body_len, last - 1)
    topic_len = np.where(v2, gather_at(buf, tpos, _U2).astype(np.int64), buf[tpos].astype(np.int64))
    props_start = body_start + body_len + np.where(v2, 2, 1) + topic_len + 2
    props_len = gather_at(buf, np.clip(props_start - 2, 0, last - 1), _U2).astype(np.int64)
    ok = (
        ((magic == MAGIC_V1) | v2)
        & (body_len < 2**31)
        & (body_start + body_len + 3 <= ends)
        & (props_start + props_len == ends)
    )
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise CorruptionError(
            f"record {bad} of the batch (at byte {int(starts[bad])}) has inconsistent field lengths",
            index=bad,
        )
    return props_start, ends


_KEYS_NAME = PROPERTY_KEYS.encode()
_UNIQ_NAME = PROPERTY_UNIQ_KEY.encode()
_SEP = KEY_SEPARATOR.encode()


def _record_keys(props: bytes) -> list[bytes]:
    """Indexed keys of one record: each KEYS token, then UNIQ_KEY; blanks dropped, duplicates
    once (RocketMQ's key set). Works on UTF-8 bytes: splitting on 0x01/0x02/0x20 bytes is the
    same as splitting the decoded text, and the hash is of the UTF-8 bytes anyway."""
    keys = uniq = b""
    for item in props.split(b"\x02"):
        name, sep, value = item.partition(b"\x01")
        if sep and value:  # decode_properties' rule: last value of a name wins
            if name == _KEYS_NAME:
                keys = value
            elif name == _UNIQ_NAME:
                uniq = value
    found = [k for k in keys.split(_SEP) if k] if keys else []
    if uniq:
        found.append(uniq)
    return list(dict.fromkeys(found)) if len(found) > 1 else found


def batch_keys(batch: CommittedBatch) -> tuple[list[bytes], list[int]]:
    """(``topic#key`` as UTF-8 bytes, record index) for every key of every record of ``batch``."""
    starts, ends = _property_offsets(batch.records, np.asarray(batch.sizes, dtype=np.int64))
    records = batch.records
    prefix = f"{batch.topic}#".encode()
    keys: list[bytes] = []
    owners: list[int] = []
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if a == b:
            continue
        props = records[a:b]
        if _KEYS_NAME + b"\x01" not in props and _UNIQ_NAME + b"\x01" not in props:
            continue
        for k in _record_keys(props):
            keys.append(prefix + k)
            owners.append(i)
    return keys, owners
