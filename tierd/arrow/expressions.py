"""Reading pushable restrictions out of a ``pyarrow.compute.Expression``.

Polars (``pl.scan_pyarrow_dataset``) and pyarrow-style callers hand a scan its row filter as a
pyarrow expression, and pyarrow offers no public way to take one apart. What it does offer is
the expression's text and structural equality, so :func:`conjuncts` parses the text of the
shapes a read can prune by — a conjunction of ``column <op> literal`` and
``is_in(column, ...)`` — rebuilds the expression from what it parsed, and trusts the parse only
if the rebuilt expression :meth:`~pyarrow.compute.Expression.equals` the original. A text it
misreads (an unusual escape, a truncated value list, another timestamp unit) therefore never
prunes anything: the scan reads everything and the filter is still applied to every decoded
row, which is what makes the rows right in any case. Pruning only decides how much is read.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Conjunct", "conjuncts"]

#: ``(column, op, value)``: ``op`` one of ``== != < <= > >= in`` (``in``: a tuple of values).
Conjunct = tuple[str, str, object]

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OP: Final = re.compile(r" (==|!=|<=|>=|<|>) ")
_INT: Final = re.compile(r"-?\d+")
#: How pyarrow prints a microsecond UTC timestamp (the unit of ``store_timestamp``).
_TS: Final = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})Z")
_ESCAPES: Final = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
_TS_TYPE: Final = pa.timestamp("us", tz="UTC")
_SET_TYPES: Final = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string()}
_OPS: Final[dict[str, Any]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


@dataclass(frozen=True, slots=True)
class _And:
    left: _Node
    right: _Node


#: A parsed expression: a conjunction, or one term (``in``: ``(type name, values)``).
_Node = _And | Conjunct


class _NoParse(Exception):
    """The text is not one of the shapes parsed here (nothing is pruned then)."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def expect(self, s: str) -> None:
        if not self.text.startswith(s, self.pos):
            raise _NoParse(self.pos)
        self.pos += len(s)

    def match(self, pattern: re.Pattern[str]) -> re.Match[str]:
        m = pattern.match(self.text, self.pos)
        if m is None:
            raise _NoParse(self.pos)
        self.pos = m.end()
        return m

    def expression(self) -> _Node:
        if self.text.startswith("is_in(", self.pos):
            return self.is_in()
        self.expect("(")
        if self.text.startswith(("(", "is_in("), self.pos):
            left = self.expression()
            self.expect(" and ")
            right = self.expression()
            self.expect(")")
            return _And(left, right)
        name = self.match(_NAME).group()
        op = self.match(_OP).group(1)
        value = self.literal()
        self.expect(")")
        return (name, op, value)

    def literal(self) -> object:
        if self.text.startswith('"', self.pos):
            return self.string()
        ts = _TS.match(self.text, self.pos)
        if ts is not None:
            self.pos = ts.end()
            return dt.datetime.fromisoformat(ts.group(1)).replace(tzinfo=dt.UTC)
        return int(self.match(_INT).group())

    def string(self) -> str:
        self.expect('"')
        out: list[str] = []
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            self.pos += 1
            if ch == '"':
                return "".join(out)
            if ch == "\\":
                nxt = self.text[self.pos : self.pos + 1]
                if nxt not in _ESCAPES:
                    raise _NoParse(self.pos)
                out.append(_ESCAPES[nxt])
                self.pos += 1
            else:
                out.append(ch)
        raise _NoParse(self.pos)

    def is_in(self) -> Conjunct:
        self.expect("is_in(")
        name = self.match(_NAME).group()
        self.expect(", {value_set=")
        type_name = self.match(_NAME).group()
        if type_name not in _SET_TYPES:
            raise _NoParse(self.pos)
        self.expect(":[")
        values: list[object] = []
        while True:
            self.match(re.compile(r"\s*"))
            if self.text.startswith("]", self.pos):
                break
            values.append(self.string() if type_name == "string" else int(self.match(_INT).group()))
            self.match(re.compile(r",?"))
        self.expect("], null_matching_behavior=MATCH})")
        return (name, "in", (type_name, tuple(values)))


def _rebuild(node: _Node) -> pc.Expression:
    """The expression ``node`` was parsed from, built with pyarrow's own constructors."""
    if isinstance(node, _And):
        return _rebuild(node.left) & _rebuild(node.right)
    name, op, value = node
    field = pc.field(name)
    if op == "in":
        assert isinstance(value, tuple)
        return field.isin(pa.array(value[1], _SET_TYPES[value[0]]))
    literal = pa.scalar(value, _TS_TYPE) if isinstance(value, dt.datetime) else value
    return _OPS[op](field, literal)


def _flatten(node: _Node) -> list[Conjunct]:
    if isinstance(node, _And):
        return _flatten(node.left) + _flatten(node.right)
    name, op, value = node
    return [(name, op, value[1] if op == "in" else value)]  # type: ignore[index]


def conjuncts(expr: pc.Expression) -> list[Conjunct] | None:
    """The ``column <op> value`` terms whose conjunction ``expr`` is, or None when ``expr`` is
    anything else (or its text could not be read back exactly). ``in`` values are plain tuples;
    timestamps are aware datetimes (UTC)."""
    text = str(expr)
    try:
        p = _Parser(text)
        tree = p.expression()
        if p.pos != len(text) or not _rebuild(tree).equals(expr):
            return None
    except (_NoParse, ValueError, TypeError, KeyError, pa.ArrowException):
        return None
    return _flatten(tree)
