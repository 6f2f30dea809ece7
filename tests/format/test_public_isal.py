"""tierd uses isal only through its public Python API: no ctypes lookup of a symbol in isal's
shared object, no private isal name, no C code calling a function pointer handed in from Python.

A private symbol can vanish or change its signature in any isal release (it is not covered by
the ``isal`` pin's promises) and the C extension would then call a wrong function; the measured
gain of doing so was ~1 % of a Spark scan's CPU (docs/performance.md), so it is not done. This
scan is what keeps it that way: it reads tierd's sources, so it fails on the first such use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TIERD = Path(__file__).parents[2] / "tierd"


def _sources(pattern: str) -> list[Path]:
    found = sorted(TIERD.rglob(pattern))
    assert found, f"no {pattern} under {TIERD}"
    return found


def _imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    """Every (module, imported name or None) in one module's syntax tree."""
    got: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            got += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            got += [(node.module, alias.name) for alias in node.names]
    return got


def _violations(text: str, name: str) -> list[str]:
    """What one module (its source ``text``, reported as ``name``) does with isal that it must not."""
    imports = _imports(ast.parse(text, name))
    isal = [(m, n) for m, n in imports if m == "isal" or m.startswith("isal.")]
    found = [
        f"private isal name {m}{'' if n is None else ' ' + n}"
        for m, n in isal
        if any(part.startswith("_") for part in m.split(".")) or (n is not None and n.startswith("_"))
    ]
    if isal and any(m == "ctypes" or m.startswith("ctypes.") for m, _ in imports):
        found.append("ctypes next to isal (a lookup in isal's shared object)")
    return [f"{name}: {v}" for v in found]


def test_tierd_reaches_isal_through_its_public_python_api_only() -> None:
    violations = [
        v
        for path in _sources("*.py")
        for v in _violations(path.read_text(), str(path.relative_to(TIERD.parent)))
    ]
    assert violations == []
    # and something is scanned: the body CRC's import is isal's public one
    assert ("isal.isal_zlib", "crc32") in _imports(ast.parse((TIERD / "format" / "record.py").read_text()))


def test_no_c_source_calls_a_function_address_handed_in_from_python() -> None:
    """The old route: a Python int (a symbol's address) turned into a C function pointer."""
    offending = [
        str(path.relative_to(TIERD.parent))
        for path in _sources("*.[ch]")
        if "PyLong_AsVoidPtr" in path.read_text() or "crc32_gzip" in path.read_text()
    ]
    assert offending == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import ctypes\nfrom isal import isal_zlib\n", "ctypes next to isal"),
        ("from isal._isal import crc32\n", "private isal name isal._isal crc32"),
        ("from isal.isal_zlib import _GzipReader\n", "private isal name isal.isal_zlib _GzipReader"),
    ],
)
def test_the_scan_catches_each_kind(source: str, expected: str) -> None:
    """The scan itself can fail: each kind of use, written out, is reported."""
    (violation,) = _violations(source, "probe.py")
    assert expected in violation
