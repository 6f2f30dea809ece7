"""The table's columns, and the optional JSON decoding of bodies into declared columns.

The columns are the Arrow reader's (:data:`tierd.arrow.SCHEMA`, the Spark source's meaning) —
derived, not restated — followed by the topic's declared body columns, always nullable: a
body without the field, and every row written before the column was declared, reads as null.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import pyarrow as pa

from tierd.arrow import SCHEMA
from tierd.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ARROW_TYPES", "DEAD_LETTER_SCHEMA", "Decoded", "decode_bodies", "table_schema"]

#: The Arrow type of each type a body column can be declared with (``[topics.<n>] body_columns``).
ARROW_TYPES: Final[Mapping[str, pa.DataType]] = {
    "string": pa.string(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}
#: Python values each declared type accepts from JSON (``bool`` is an ``int`` in Python: refused
#: for ``long``; an integer is a valid ``double``).
_ACCEPTS: Final[Mapping[str, tuple[type, ...]]] = {
    "string": (str,),
    "long": (int,),
    "double": (int, float),
    "boolean": (bool,),
}
#: A dead-letter row: the message as the source has it, and why its body did not decode.
DEAD_LETTER_SCHEMA: Final = SCHEMA.append(pa.field("error", pa.string(), nullable=False))


def table_schema(body_columns: Mapping[str, str]) -> pa.Schema:
    """The source's columns and then the declared body columns (nullable), in declared order."""
    clash = sorted(set(body_columns) & set(SCHEMA.names))
    if clash:
        raise ConfigError(
            f"body_columns {clash} clash with the source's columns {SCHEMA.names}; rename them",
            body_columns=clash,
        )
    return pa.schema([*SCHEMA, *(pa.field(n, ARROW_TYPES[t]) for n, t in body_columns.items())])


class Decoded:
    """One batch decoded: ``good`` rows with the body columns filled, ``bad`` rows as dead
    letters (the source columns and the error)."""

    def __init__(self, good: pa.Table, bad: pa.Table) -> None:
        self.good = good
        self.bad = bad


def _decode_one(body: bytes, columns: Mapping[str, str]) -> dict[str, object]:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"body is a JSON {type(doc).__name__}, not an object")  # noqa: TRY004
    out: dict[str, object] = {}
    for name, kind in columns.items():
        value = doc.get(name)
        if value is not None and (
            not isinstance(value, _ACCEPTS[kind]) or (kind != "boolean" and isinstance(value, bool))
        ):
            raise ValueError(f"field {name!r} is {value!r}, not a {kind}")
        out[name] = float(value) if kind == "double" and isinstance(value, int | float) else value
    return out


def decode_bodies(rows: pa.Table, columns: Mapping[str, str], schema: pa.Schema) -> Decoded:
    """Split ``rows`` (source columns) into rows of ``schema`` and dead letters. Without declared
    columns (``body_format = "binary"``) every row is good: the body stays binary."""
    if not columns:
        return Decoded(rows.cast(schema), DEAD_LETTER_SCHEMA.empty_table())
    values: dict[str, list[object]] = {n: [] for n in columns}
    good: list[int] = []
    bad: list[int] = []
    errors: list[str] = []
    for i, body in enumerate(rows.column("body").to_pylist()):
        try:
            decoded = _decode_one(body, columns)
        except ValueError as e:
            bad.append(i)
            errors.append(str(e))
            continue
        good.append(i)
        for name, value in decoded.items():
            values[name].append(value)
    ok = rows.take(pa.array(good, pa.int64()))
    for name, kind in columns.items():
        ok = ok.append_column(pa.field(name, ARROW_TYPES[kind]), pa.array(values[name], ARROW_TYPES[kind]))
    dead = rows.take(pa.array(bad, pa.int64())).append_column(
        DEAD_LETTER_SCHEMA.field("error"), pa.array(errors, pa.string())
    )
    return Decoded(ok.cast(schema), dead.cast(DEAD_LETTER_SCHEMA))
