"""Which restrictions a pyarrow filter expression yields for pruning: the terms of a conjunction
of simple comparisons, read back exactly — and nothing at all for any other expression, or for
one whose text does not read back to the same expression (then the scan reads everything and
the filter alone decides the rows)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tierd.arrow.expressions import conjuncts

T = dt.datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def test_a_conjunction_of_comparisons_is_its_terms() -> None:
    expr = (
        (pc.field("topic") == 'or"d\\ers\n')
        & pc.field("queue_id").isin([2, 0])
        & (pc.field("store_timestamp") >= pa.scalar(T, pa.timestamp("us", "UTC")))
        & (pc.field("queue_offset") < -3)
        & pc.field("tags").isin(["a", "b c"])
        & (pc.field("uniq_key") != "u1")
    )
    assert conjuncts(expr) == [
        ("topic", "==", 'or"d\\ers\n'),
        ("queue_id", "in", (2, 0)),
        ("store_timestamp", ">=", T),
        ("queue_offset", "<", -3),
        ("tags", "in", ("a", "b c")),
        ("uniq_key", "!=", "u1"),
    ]


@pytest.mark.parametrize(
    "expr",
    [
        (pc.field("queue_id") == 1) | (pc.field("queue_id") == 2),  # a disjunction
        ~(pc.field("queue_id") == 1),
        (pc.field("queue_id") == 1) & ~(pc.field("tags") == "x"),  # one term is not a comparison
        pc.field("store_timestamp") >= pa.scalar(T, pa.timestamp("ms", "UTC")),  # another unit
        pc.field("tags").isin(['a"']),  # pyarrow prints this value set without escaping the quote
        pc.field("queue_offset") + 1 > 5,
        pc.field("tags").is_null(),
    ],
)
def test_anything_else_yields_nothing(expr: pc.Expression) -> None:
    assert conjuncts(expr) is None
