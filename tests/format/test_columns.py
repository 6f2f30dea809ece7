"""The columnar framing API (tierd/format/columns.py) against the one-record decoder.

Framing (the TOTALSIZE chain, in C where built and in Python), every record's parts located at
once, and the store timestamps of a batch must agree with :func:`decode_record` of each record
for every shape — IPv4/IPv6 born and store hosts, v1/v2 topics, bodies and properties of any
length — and a batch whose lengths do not add up is refused, naming its first bad record.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierd.errors import CorruptionError, CorruptRecordError
from tierd.format import columns, compiled
from tierd.format.host import encode_host
from tierd.format.layout import MIN_RECORD_SIZE, position
from tierd.format.properties import encode_properties
from tierd.format.record import decode_record, encode_record, topic_field

HOSTS = ["10.0.0.1:1", "[2001:db8::7]:10911"]


@st.composite
def records(draw: st.DrawFn) -> list[bytes]:
    out = []
    for i in range(draw(st.integers(1, 8))):
        topic = draw(st.sampled_from(["t", "тема", "v" * 200]))
        magic, topic_part = topic_field(topic.encode())
        props = draw(
            st.dictionaries(st.sampled_from(["KEYS", "TAGS", "p"]), st.text("abc ", min_size=1), max_size=3)
        )
        out.append(
            encode_record(
                draw(st.binary(max_size=300)),
                topic_part,
                magic,
                encode_properties(props),
                draw(st.integers(0, 7)),
                0,
                i,
                1000 + i,
                0,
                draw(st.integers(0, 2**40)),
                encode_host(draw(st.sampled_from(HOSTS))),
                draw(st.integers(0, 2**40)),
                encode_host(draw(st.sampled_from(HOSTS))),
            )
        )
    return out


def small(body: bytes) -> bytes:
    magic, topic_part = topic_field(b"t")
    return encode_record(body, topic_part, magic, b"", 0, 0, 0, 0, 0, 0, bytes(8), 0, bytes(8))


def fail(pos: int, why: str) -> CorruptRecordError:
    return CorruptRecordError(f"at {pos}: {why}", position=pos)


@given(recs=records(), cut=st.integers(0, 40))
def test_framing_in_c_and_in_python_agree_with_the_records(recs: list[bytes], cut: int) -> None:
    data = b"".join(recs)
    data = data[: max(0, len(data) - cut)]  # the last record may be cut by the read
    starts = np.cumsum([0, *map(len, recs)])[:-1]
    whole = [s for s, r in zip(starts.tolist(), recs, strict=True) if s + len(r) <= len(data)]
    got = columns.frame(data, fail, 1 << 20)
    assert got.starts.tolist() == whole
    assert got.consumed == (whole[-1] + len(recs[len(whole) - 1]) if whole else 0)
    assert compiled.records is not None  # the C chain ran above
    with pytest.MonkeyPatch.context() as m:
        m.setattr(columns, "_compiled", None)
        py = columns.frame(data, fail, 1 << 20)
    assert (py.starts.tolist(), py.consumed) == (got.starts.tolist(), got.consumed)


def test_a_total_size_that_cannot_be_a_record_is_corruption(monkeypatch: pytest.MonkeyPatch) -> None:
    good = small(b"x")
    bad = (MIN_RECORD_SIZE - 1).to_bytes(4, "big") + good[4:]
    for in_c in (True, False):
        with monkeypatch.context() as m:
            if not in_c:
                m.setattr(columns, "_compiled", None)
            with pytest.raises(CorruptRecordError, match=f"at {len(good)}: total size {MIN_RECORD_SIZE - 1}"):
                columns.frame(good + bad, fail, 1 << 20)


@given(recs=records())
def test_record_spans_locate_every_part(recs: list[bytes]) -> None:
    data = b"".join(recs)
    spans = columns.record_spans(data, np.array(list(map(len, recs)), np.int64))
    stamps = columns.store_timestamps(data, spans.starts)
    for i, r in enumerate(recs):
        m = decode_record(data, int(spans.starts[i]))
        b0, blen = int(spans.body_start[i]), int(spans.body_length[i])
        assert data[b0 : b0 + blen] == m.body
        assert data[int(spans.topic_start[i]) : int(spans.topic_end[i])].decode() == m.topic
        assert data[int(spans.properties_start[i]) : int(spans.ends[i])] == m.raw_properties
        assert int(stamps[i]) == m.store_timestamp
        assert int(spans.ends[i]) - int(spans.starts[i]) == len(r)


def test_record_spans_refuse_lengths_that_do_not_add_up() -> None:
    rec = small(b"body")
    bad = bytearray(rec)
    at = position("body_length", 8, 8)
    bad[at : at + 4] = (5).to_bytes(4, "big")  # one byte more body than the record holds
    with pytest.raises(CorruptionError, match="record 1 of the batch"):
        columns.record_spans(rec + bytes(bad) + rec, np.array([len(rec)] * 3, np.int64))
    with pytest.raises(CorruptionError, match="do not frame"):
        columns.record_spans(rec, np.array([len(rec) - 1], np.int64))


@given(recs=records())
def test_a_field_before_the_born_host_is_read_alone(recs: list[bytes]) -> None:
    """A segment's first QUEUEOFFSET, read with one ranged read, whatever the host widths."""
    at, end = columns.field_span("queue_offset")
    for r in recs:
        assert columns.decode_field("queue_offset", r[at:end]) == decode_record(r, 0).queue_offset
    with pytest.raises(ValueError, match="born host"):
        columns.field_span("store_timestamp")
