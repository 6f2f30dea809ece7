"""tierd reaches no library's private internals (issue 31, item 4).

A private attribute of botocore or aiobotocore — the client's ``_endpoint`` (and its
``http_session``), ``_request_signer`` and the signer's ``_credentials`` — can change shape in
any patch release without notice; tierd would then sign with the wrong credentials or send on a
session that no longer exists. The S3 driver's lean GET and the Spark reader get the same things
through public API instead (:mod:`tierd.drivers.s3fastget`). This test parses every module of
``tierd/`` and fails on any attribute access or ``getattr`` of those names, so that a new one
cannot slip in unmeasured and unpinned (docs/drivers.md says what a kept one would need).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "tierd"
#: botocore's / aiobotocore's private attributes that tierd once read.
FOREIGN_PRIVATE = frozenset({"_endpoint", "_request_signer", "_credentials"})


def _accesses(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FOREIGN_PRIVATE:
            found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in FOREIGN_PRIVATE
        ):
            found.append((node.lineno, str(node.args[1].value)))
    return found


def test_the_scan_sees_what_it_looks_for() -> None:
    # Guards against a scan that passes vacuously (a rule that can never match).
    code = "c._endpoint.http_session\ngetattr(c, '_request_signer', None)\nx = s._credentials\n"
    assert sorted(_accesses(ast.parse(code))) == [
        (1, "_endpoint"),
        (2, "_request_signer"),
        (3, "_credentials"),
    ]


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_internals_of_botocore(path: Path) -> None:
    found = _accesses(ast.parse(path.read_text(), filename=str(path)))
    assert not found, (
        f"{path.relative_to(ROOT.parent)} reads botocore's private "
        + ", ".join(f"{name} (line {line})" for line, name in found)
        + ": use public API (see tierd/drivers/s3fastget.py), or measure the gain and pin the "
        "version as docs/drivers.md describes"
    )
