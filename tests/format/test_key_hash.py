"""The key hash: one function for one key, one for many, as str or UTF-8 bytes, all agreeing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tierd.format.key_hash import index_key, key_hash, key_hashes


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.text(min_size=1, max_size=40), max_size=20))
def test_many_keys_hash_as_each_one_does_from_str_or_bytes(keys: list[str]) -> None:
    indexed = [index_key("T", k) for k in keys]
    one_by_one = [key_hash(k) for k in indexed]
    assert key_hashes(indexed).tolist() == one_by_one
    assert key_hashes([k.encode() for k in indexed]).tolist() == one_by_one


def test_known_value() -> None:
    # RocketMQ's quick-start key, as the cold index tests pin it.
    assert key_hash("TopicTest#MessageKey") == 2917063644
    assert key_hashes([b"TopicTest#MessageKey"]).tolist() == [2917063644]
