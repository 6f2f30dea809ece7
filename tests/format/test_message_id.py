"""The offset message id: one layout, and every form of it (template, one id, a numpy column)
giving the same characters."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tierd.format.host import encode_host
from tierd.format.message_id import (
    OFFSET_MASK,
    offset_msg_id,
    offset_msg_id_template,
    offset_msg_ids,
    parse_offset_msg_id,
)

V4 = encode_host("10.0.0.2:10911")
V6 = encode_host("[2001:db8::7]:10911")

hosts = st.sampled_from([V4, V6, encode_host("127.0.0.1:0"), encode_host("[::1]:65535")])
offsets = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _column(rows: list[tuple[bytes, int]]) -> list[str]:
    """offset_msg_ids over ``rows``, split back into one string per row."""
    raw = np.zeros((len(rows), 20), np.uint8)
    for i, (host, _) in enumerate(rows):
        raw[i, : len(host)] = np.frombuffer(host, np.uint8)
    v6 = np.array([len(h) == 20 for h, _ in rows], np.bool_)
    phys = np.array([o for _, o in rows], np.int64)
    data, starts = offset_msg_ids(raw, v6, phys)
    text = data.decode("ascii")
    return [text[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)]


def test_ids_are_the_hex_of_store_host_and_offset() -> None:
    assert offset_msg_id(V4, 123456789) == "0A00000200002A9F00000000075BCD15"
    assert offset_msg_id(V6, 1) == V6.hex().upper() + "0000000000000001"
    assert offset_msg_id(V4, -1) == "0A00000200002A9F" + "F" * 16  # two's complement, as Java's
    assert offset_msg_id_template(V4) % 255 == "0A00000200002A9F00000000000000FF"


@settings(max_examples=200, deadline=None)
@given(host=hosts, offset=offsets)
def test_template_and_single_id_agree_and_round_trip(host: bytes, offset: int) -> None:
    mid = offset_msg_id(host, offset)
    assert offset_msg_id_template(host) % (offset & OFFSET_MASK) == mid
    assert len(mid) == 2 * len(host) + 16
    assert parse_offset_msg_id(mid)[1] == offset


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(hosts, offsets), min_size=1, max_size=30))
def test_the_column_form_gives_the_same_ids(rows: list[tuple[bytes, int]]) -> None:
    # Both numpy branches: IPv4 only (one hex call) and mixed widths (lookup table).
    assert _column(rows) == [offset_msg_id(h, o) for h, o in rows]
    v4_rows = [(V4, o) for _, o in rows]
    assert _column(v4_rows) == [offset_msg_id(V4, o) for _, o in v4_rows]
