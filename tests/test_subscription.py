"""Tag subscription expressions: RocketMQ's grammar, the two matching stages, and what a bad
expression gets (a clear error naming the problem, never "no messages")."""

from __future__ import annotations

import numpy as np
import pytest

from tierd.consumption.subscription import ALL, MAX_TAGS, parse_tags
from tierd.errors import InvalidArgumentError, InvalidSubscriptionError
from tierd.format.cq_unit import java_string_hash, tags_code


@pytest.mark.parametrize("expression", [None, "", "   ", "*", " * "])
def test_star_empty_and_none_subscribe_to_everything(expression: str | None) -> None:
    flt = parse_tags(expression)
    assert flt is ALL
    assert flt.matches_all
    assert flt.expression == "*"
    assert flt.unit_mask(np.array([0, 1, -5], np.int64)).tolist() == [True, True, True]
    assert flt.matches_tag(None)
    assert flt.matches_tag("anything")


def test_tags_are_trimmed_deduplicated_and_canonical() -> None:
    flt = parse_tags("  refunded ||paid|| refunded  ")
    assert flt.tags == {"paid", "refunded"}
    assert flt.expression == "paid || refunded"
    assert parse_tags(flt) is flt
    assert sorted(flt.codes.tolist()) == sorted([java_string_hash("paid"), java_string_hash("refunded")])
    assert parse_tags("order created").tags == {"order created"}  # spaces inside a tag are kept


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("paid ||", "tag 2 of 'paid ||' is empty"),
        ("|| paid", "tag 1 of '|| paid' is empty"),
        ("paid |||| refunded", "tag 2 of 'paid |||| refunded' is empty"),
        ("paid | refunded", "a single '|' is not an operator"),
        ("paid ||| refunded", "a single '|' is not an operator"),
        ("* || paid", "'*' subscribes to every message on its own"),
        ("pay*", "no wildcard inside a tag"),
        ("paid || a\x01b", "0x01 or 0x02"),
        ("x" * 4097, "4097 characters, the limit is 4096"),
        (" || ".join(f"t{i}" for i in range(MAX_TAGS + 1)), f"the limit is {MAX_TAGS}"),
    ],
)
def test_bad_expressions_are_refused_saying_why(expression: str, message: str) -> None:
    with pytest.raises(InvalidSubscriptionError, match=message.replace("|", r"\|").replace("*", r"\*")) as e:
        parse_tags(expression)
    assert (e.value.code, e.value.http_status) == ("invalid_subscription", 400)
    assert isinstance(e.value, InvalidArgumentError | ValueError)


def test_a_non_string_is_refused() -> None:
    with pytest.raises(InvalidSubscriptionError, match="got list"):
        parse_tags(["paid"])  # type: ignore[arg-type]


def test_hash_stage_compares_the_low_32_bits_as_rocketmq_does() -> None:
    """RocketMQ compares ``tagsCode.intValue()``: a code stored sign-extended (tierd, RocketMQ)
    and one stored as its unsigned 32-bit value match alike; other codes do not."""
    flt = parse_tags("paid")
    code = tags_code("paid")
    assert code == java_string_hash("paid") == 3433164  # Java: "paid".hashCode()
    negative = java_string_hash("refunded")
    assert negative < 0  # exercises the sign extension
    flt2 = parse_tags("refunded")
    codes = np.array([code, negative, negative & 0xFFFFFFFF, 0, code + 1], np.int64)
    assert flt.unit_mask(codes).tolist() == [True, False, False, False, False]
    assert flt2.unit_mask(codes).tolist() == [False, True, True, False, False]


def test_colliding_tags_pass_the_hash_stage_but_not_the_string_stage() -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")  # the classic Java collision
    flt = parse_tags("Aa")
    assert flt.unit_mask(np.array([tags_code("BB")], np.int64)).tolist() == [True]
    assert [flt.matches_tag(t) for t in ("Aa", "BB", None)] == [True, False, False]
