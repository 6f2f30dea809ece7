"""The batch preparer's column-wise path for plain batches against its general loop.

``Preparer.prepare`` takes a fast path (C-level passes over whole columns) for the usual batch —
one topic, keys, nothing else — and the general per-message loop for everything else. The fast
path must produce exactly what the loop produces (so records are byte-identical), and must hand
every batch it is not sure of to the loop, which raises the precise error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierd import Message
from tierd.errors import InvalidArgumentError, InvalidPropertiesError, MessageTooLargeError
from tierd.format.host import encode_host
from tierd.format.key_hash import key_hash
from tierd.local import prepare as prepare_module
from tierd.local.prepare import EncodedBatch, PreparedBatch, Preparer

MAX_BODY = 4096


def preparer(store_host: str = "127.0.0.1:10911") -> Preparer:
    return Preparer(max_body=MAX_BODY, max_queues=64, default_queues=4, store_host=encode_host(store_host))


def columns(b: PreparedBatch) -> dict[str, Any]:
    """Every field, arrays as lists and group index arrays as lists (comparable with ==)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(b):
        v = getattr(b, f.name)
        if isinstance(v, np.ndarray):
            v = (str(v.dtype), v.tolist())
        elif f.name == "groups":
            v = [(k, idx.tolist()) for k, idx in v]
        out[f.name] = v
    return out


def both(messages: list[Message]) -> tuple[PreparedBatch | None, PreparedBatch]:
    """The fast path's result (None: declined) and the general loop's, from twin preparers in
    the same round-robin state."""
    fast, general = preparer(), preparer()
    return fast._prepare_plain(messages, 1234), general._prepare_general(messages, 1234)


KEY = st.text(
    alphabet=st.characters(exclude_characters=" \x01\x02", exclude_categories=["Cs"]),
    min_size=1,
    max_size=12,
)


@st.composite
def keyed_batches(draw: st.DrawFn, max_body: int) -> list[Message]:
    """Batches of one topic whose messages all carry 1-3 keys (non-ASCII included), in lists or
    tuples, with bodies up to ``max_body`` bytes (empty included)."""
    keys = draw(st.lists(st.lists(KEY, min_size=1, max_size=3), min_size=1, max_size=40))
    bodies = draw(st.lists(st.binary(max_size=max_body), min_size=1, max_size=40))
    as_list = draw(st.booleans())
    n = min(len(keys), len(bodies))
    return [
        Message(topic="orders", body=bodies[i], keys=keys[i] if as_list else tuple(keys[i])) for i in range(n)
    ]


@given(msgs=keyed_batches(max_body=64))
def test_plain_batches_with_keys_match_the_general_loop(msgs: list[Message]) -> None:
    fast, general = both(msgs)
    assert fast is not None
    assert columns(fast) == columns(general)


@pytest.mark.parametrize("n", [1, 2, 1000])
def test_plain_batches_without_keys_match_the_general_loop(n: int) -> None:
    msgs = [Message(topic="t", body=b"%d" % i) for i in range(n)]
    fast, general = both(msgs)
    assert fast is not None
    assert columns(fast) == columns(general)


def test_one_key_each_the_benchmarked_shape() -> None:
    msgs = [Message(topic="bench", body=bytes(1024), keys=(f"key-{i}",)) for i in range(1000)]
    fast, general = both(msgs)
    assert fast is not None
    assert columns(fast) == columns(general)
    assert fast.index_keys[:2] == ["bench#key-0", "bench#key-1"]
    assert fast.tails[0] == b"\x05bench\x00\x0bKEYS\x01key-0\x02"


OK = Message(topic="t", body=b"x", keys=("k",))


@pytest.mark.parametrize(
    "other",
    [
        Message(topic="u", body=b"x", keys=("k",)),  # a second topic
        Message(topic="t", body=b"x"),  # keys on some messages only
        Message(topic="t", body=b"x", keys=("k",), queue_id=1),
        Message(topic="t", body=b"x", keys=("k",), tags="a"),
        Message(topic="t", body=b"x", keys=("k",), properties={"p": "v"}),
        Message(topic="t", body=b"x", keys=("k",), flag=3),
        Message(topic="t", body=b"x", keys=("k",), born_host="10.0.0.1:1"),
        Message(topic="t", body=b"x", keys=("k",), born_timestamp=5),
        Message(topic="t", body=bytearray(b"x"), keys=("k",)),  # type: ignore[arg-type]
    ],
)
def test_other_shapes_take_the_general_loop_and_agree(other: Message) -> None:
    fast, general = both([OK, other, OK])
    assert fast is None
    assert general is not None  # valid input: the loop handles it


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (Message(topic="t", body=b"x", keys=("has space",)), InvalidPropertiesError, "has space"),
        (Message(topic="t", body=b"x", keys=("",)), InvalidPropertiesError, "non-empty"),
        (Message(topic="t", body=b"x", keys=("a\x01",)), InvalidPropertiesError, "0x01"),
        (Message(topic="t", body=b"x", keys=("a\x02",)), InvalidPropertiesError, "0x01"),
        (Message(topic="t", body=b"x", keys=(7,)), InvalidPropertiesError, "strings"),  # type: ignore[arg-type]
        (Message(topic="t", body=b"x", keys="abc"), InvalidArgumentError, "sequence"),
        (Message(topic="t", body=b"x", keys=("k" * 40000,)), InvalidPropertiesError, "32767"),
        (Message(topic="t", body=bytes(MAX_BODY + 1), keys=("k",)), MessageTooLargeError, "max_message_size"),
    ],
)
def test_batches_a_rule_rejects_are_left_to_the_general_loop(
    bad: Message, error: type[Exception], match: str
) -> None:
    """Whole batches of one bad shape (no mixing to push them off the fast path): the fast
    path declines, and ``prepare`` raises the general loop's precise error."""
    assert preparer()._prepare_plain([bad, bad], 0) is None
    with pytest.raises(error, match=match):
        preparer().prepare([bad, bad], 0)


def test_ipv6_store_host_takes_the_c_encoder_or_the_general_loop() -> None:
    """The Python plain path is for IPv4 store hosts; the C encoder takes IPv6 ones too, and
    without it the general loop does."""
    p = preparer("[::1]:10911")
    assert p._prepare_plain([OK, OK], 0) is None
    assert isinstance(p.prepare([OK, OK], 0), EncodedBatch if prepare_module.ACCELERATED else PreparedBatch)
    batch = p._prepare_general([OK, OK], 0)
    assert not batch.uniform_v4


def test_round_robin_moves_on_per_batch_on_both_paths() -> None:
    p = preparer()
    plain = [OK, OK]
    general = [OK, Message(topic="t", body=b"x", keys=("k",), tags="a")]
    qids = [int(p.prepare(b, 0).queue_ids[0]) for b in (plain, general, plain, general, plain)]
    assert qids == [0, 1, 2, 3, 0]


@pytest.mark.parametrize("keys", [{"k"}, frozenset({"k"})])
def test_keys_in_other_collections_are_still_accepted(keys: frozenset[str]) -> None:
    """Sets are outside the declared type but were always accepted at run time; the one-key
    shortcuts index tuples and lists only, so a set still takes the general path (it has no
    ``[0]``)."""
    p = preparer()
    one = p.prepare_one(Message(topic="t", body=b"x", keys=keys), 0)  # type: ignore[arg-type]
    record, index_hashes = one[1], one[3]
    assert record.endswith(b"KEYS\x01k\x02")
    assert index_hashes == key_hash("t#k")
    batch = p.prepare([Message(topic="t", body=b"x", keys=keys)] * 2, 0)  # type: ignore[arg-type]
    assert isinstance(batch, PreparedBatch)  # not the C encoder's: a set is not a tuple or list
    assert batch.index_keys == ["t#k", "t#k"]
    assert batch.tails[0].endswith(b"KEYS\x01k\x02")
