"""The record layout's one declaration (``tierd.format.layout``) and everything derived from it:
the C header, the struct formats, the numpy dtypes and the column readers agree with it, and with
records the single-record codec writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tierd.format import layout
from tierd.format.host import encode_host
from tierd.format.record import encode_record, topic_field

HEADER_FILE = Path(layout.__file__).with_name("_record_layout.h")
WIDTHS = [(b, s) for b in (layout.HOST_V4, layout.HOST_V6) for s in (layout.HOST_V4, layout.HOST_V6)]


def test_the_c_header_is_generated_from_the_declaration() -> None:
    block = layout.c_header_block(HEADER_FILE.read_text())
    assert block, f"{HEADER_FILE} has no generated block"
    assert block == layout.c_header(), "run: python -m tierd.format.layout"


def test_the_c_header_check_fails_on_a_changed_position() -> None:
    # The check above can fail: a header stating one position differently does not match.
    text = HEADER_FILE.read_text().replace("POS_SYSFLAG = 36,", "POS_SYSFLAG = 37,")
    assert layout.c_header_block(text) != layout.c_header()


@pytest.mark.parametrize(("born", "store"), WIDTHS)
def test_struct_and_dtype_follow_the_declared_positions(born: int, store: int) -> None:
    st = layout.header_struct(born, store)
    dt = layout.header_dtype(born, store)
    assert st.size == dt.itemsize == layout.header_length(born, store)
    assert dt.names == layout.FIELD_NAMES
    for name in layout.FIELD_NAMES:
        assert dt.fields is not None
        assert dt.fields[name][1] == layout.position(name, born, store), name
        assert dt.fields[name][0].itemsize == layout.width(name, born, store), name


@pytest.mark.parametrize(
    ("born_addr", "store_addr"),
    [
        ("10.0.0.1:1", "10.0.0.2:2"),
        ("[::1]:7", "10.0.0.2:2"),
        ("10.0.0.1:1", "[fe80::1]:9"),
        ("[::1]:7", "[::2]:8"),
    ],
)
def test_fields_are_where_the_declaration_says_in_records_the_codec_writes(
    born_addr: str, store_addr: str
) -> None:
    values = {
        "queue_id": 3,
        "flag": -5,
        "queue_offset": 1 << 40,
        "physical_offset": (1 << 41) + 7,
        "born_timestamp": 1_700_000_000_123,
        "store_timestamp": 1_700_000_000_456,
    }
    magic, part = topic_field(b"T" * 130)
    rec = encode_record(
        b"body!",
        part,
        magic,
        b"a\x01b\x02",
        values["queue_id"],
        values["flag"],
        values["queue_offset"],
        values["physical_offset"],
        layout.SYSFLAG_TRANSACTION_COMMIT,
        values["born_timestamp"],
        encode_host(born_addr),
        values["store_timestamp"],
        encode_host(store_addr),
    )
    records = rec * 3
    starts = np.arange(3, dtype=np.int64) * len(rec)
    buf = np.frombuffer(records, np.uint8)
    sys_flag = layout.field_column(buf, starts, "sys_flag")
    born, store = layout.host_widths(int(sys_flag[0]))
    assert (born, store) == (len(encode_host(born_addr)), len(encode_host(store_addr)))
    assert int(sys_flag[0]) & layout.SYSFLAG_TRANSACTION_MASK == layout.SYSFLAG_TRANSACTION_COMMIT
    for name, value in values.items():
        assert layout.field_column(buf, starts, name, sys_flag).tolist() == [value] * 3, name
    assert layout.field_column(buf, starts, "body_length", sys_flag).tolist() == [5] * 3
    assert layout.field_column(buf, starts, "magic").tolist() == [layout.MAGIC_V2] * 3
    assert layout.field_column(buf, starts, "total").tolist() == [len(rec)] * 3
    assert len(rec) == layout.record_size(5, 130, 4, born, store)
    at = layout.position("store_host", born, store)
    assert rec[at : at + store] == encode_host(store_addr)
    body_at = layout.header_length(born, store)
    assert rec[body_at : body_at + 5] == b"body!"


def test_set_field_column_writes_only_that_field() -> None:
    magic, part = topic_field(b"t")
    rec = encode_record(
        b"x", part, magic, b"", 0, 0, 0, 0, 0, 1, encode_host("1.2.3.4:5"), 2, encode_host("1.2.3.4:5")
    )
    buf = np.frombuffer(bytearray(rec * 2), np.uint8)
    starts = np.array([0, len(rec)], np.int64)
    layout.set_field_column(buf, starts, "physical_offset", np.array([7, 1 << 33]))
    assert layout.field_column(buf, starts, "physical_offset").tolist() == [7, 1 << 33]
    patched = buf.tobytes()
    at = layout.POS_PHYSICAL_OFFSET
    assert patched[:at] == rec[:at]
    assert patched[at + 8 : len(rec)] == rec[at + 8 :]
    with pytest.raises(ValueError, match="store_timestamp"):
        layout.set_field_column(buf, starts, "store_timestamp", np.array([1, 2]))
