"""The layer rules of ``docs/design.md``, enforced on the source.

Every ``import`` and ``from … import`` in ``tierd/`` — at module level, inside
functions and under ``TYPE_CHECKING`` alike (a type is knowledge of a layer too) — is parsed with
:mod:`ast` into a module graph, and each rule is checked against it. Where today's tree still
breaks a rule, the edge sits in an allow-list below next to the issue item that removes it, so the
test fails on any *new* violation and on an allow-listed edge that has gone (keep the list exact).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Collection

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tierd",)

# The driver contract: what a third-party driver imports (docs/drivers.md).
CONTRACT = {"tierd.drivers.segment", "tierd.drivers.paths"}
ERRORS = "tierd.errors"
# The record format every layer shares: a leaf below the hot store, the tiering engine and Spark.
FORMAT = "tierd.format"
# The facade and the modules only it (and the access layers) use.
FACADE = {
    "tierd.store",
    "tierd.router",
    "tierd.inventory",
    "tierd.verify",
    "tierd.consumption.groups",
    "tierd.consumption.longpoll",
    "tierd.consumption.inflight",
    "tierd.consumption.pull",
    "tierd.topics",
    "tierd.transactions",
    "tierd.transactions.coordinator",
}
# The consumption package's leaves: tag filters and committed offsets, which the hot store and
# the tiering engine use too. The rest of tierd.consumption is in FACADE.
CONSUMPTION_LEAVES = {"tierd.consumption", "tierd.consumption.subscription", "tierd.consumption.offsets"}
# tierd.transactions.names and tierd.scheduled.timing are leaves (names, the errors): the
# system-topic rule (tierd.systopics) reads them, and so may a bucket reader.
ACCESS = ("tierd.service", "tierd.grpc", "tierd.cli", "tierd.spark", "tierd.arrow", "tierd.table")
# Bucket readers: a Spark job or an Arrow scan in a notebook has the bucket URL and nothing else.
# The Iceberg table writer too: it reads the bucket through tierd.arrow, never the tiering engine.
BUCKET_READERS = ("tierd.spark", "tierd.arrow", "tierd.table")
# What a Spark job must never need: a running daemon (facade, engine, hot store) or local metadata.
SPARK_FORBIDDEN = FACADE | {
    "tierd.local.store",
    "tierd.tiered.dispatcher",
    "tierd.tiered.fetcher",
    "tierd.tiered.flatstore",
    "tierd.tiered.index.service",
    "tierd.tiered.manifestwriter",
    "tierd.tiered.metadata",
    "tierd.tiered.ownership",
    "tierd.tiered.restore",
    "tierd.tiered.service",
}
# Offline CLI commands (inspect a bucket, parse a backend URL) open a cold root without a store.
CLI_COLD_ALLOWED = {"tierd.tiered.roots", "tierd.tiered.guard", *CONTRACT}

# Known violations: (importer, imported) → the issue item that removes the edge.
ALLOWED: dict[tuple[str, str], str] = {}
# Edges a Spark job follows without needing what they lead to (none left: the bucket manifests'
# reader, tierd.tiered.manifest, is apart from their writer, tierd.tiered.manifestwriter).
SPARK_ALLOWED: dict[tuple[str, str], str] = {}
# Private names imported from another module: (importer, "module.name") → the item that removes it.
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


SOURCES = _sources()


def _imports(name: str, path: Path) -> set[tuple[str, str]]:
    """``(module, imported name or None)`` for every import statement in ``path``, anywhere."""
    found: set[tuple[str, str]] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.update((module, alias.name) for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    """Module → the tierd modules it imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    graph: dict[str, set[str]] = {}
    for name, path in SOURCES.items():
        targets = set()
        for module, imported in _imports(name, path):
            full = f"{module}.{imported}" if imported else module
            target = full if full in SOURCES else module
            if target.split(".")[0] in PACKAGES:
                targets.add(target)
        graph[name] = targets - {name}
    return graph


GRAPH = _graph()


def _closure(start: str, skip: Collection[tuple[str, str]] = ()) -> set[str]:
    """Every module reachable from ``start``, not following the edges in ``skip``."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        here = todo.pop()
        for nxt in GRAPH.get(here, set()):
            if nxt not in seen and (here, nxt) not in skip:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations() -> set[tuple[str, str]]:
    bad: set[tuple[str, str]] = set()
    for importer, targets in GRAPH.items():
        for target in targets:
            if _under(importer, "tierd.drivers"):
                # Drivers: only the contract, the errors and their own package.
                if not (target == ERRORS or _under(target, "tierd.drivers")):
                    bad.add((importer, target))
            elif _under(importer, FORMAT):
                # The record format: only the errors and itself (no layer above it, no cycle).
                if not (target == ERRORS or _under(target, FORMAT)):
                    bad.add((importer, target))
            elif _under(importer, "tierd.local"):
                # The hot store knows nothing of the cold tier nor of anything above it.
                if _under(target, "tierd.tiered", "tierd.drivers", *ACCESS) or target in FACADE:
                    bad.add((importer, target))
            elif _under(importer, "tierd.tiered"):
                # The tiering layer never calls up into the facade or the access layers.
                if _under(target, *ACCESS) or target in FACADE:
                    bad.add((importer, target))
            elif _under(importer, "tierd.service", "tierd.grpc"):
                # HTTP and gRPC are thin: they reach the store through the facade only.
                if _under(target, "tierd.local", "tierd.tiered", "tierd.drivers"):
                    bad.add((importer, target))
            elif _under(importer, "tierd.cli"):
                # The CLI too; offline bucket commands may open a cold root, nothing more.
                if _under(target, "tierd.local") or (
                    _under(target, "tierd.tiered", "tierd.drivers") and target not in CLI_COLD_ALLOWED
                ):
                    bad.add((importer, target))
            elif importer in FACADE and _under(target, *ACCESS):
                bad.add((importer, target))
    return bad


def test_the_source_tree_is_parsed() -> None:
    # Guards the rules below against passing vacuously on an empty or misparsed graph.
    assert {"tierd.store", "tierd.local.store", "tierd.drivers.segment", "tierd.drivers.s3"} <= set(GRAPH)
    assert "tierd.drivers.segment" in GRAPH["tierd.drivers.posix"]
    assert "tierd.local.store" in GRAPH["tierd.store"]  # a function-level or TYPE_CHECKING import counts


def test_no_new_layer_violations() -> None:
    new = sorted(_violations() - set(ALLOWED))
    assert not new, "layer rule broken (see docs/design.md): " + ", ".join(f"{a} -> {b}" for a, b in new)


def test_allow_list_is_exact() -> None:
    # An allow-listed edge that no longer exists must leave the list, so it cannot come back unseen.
    gone = sorted(set(ALLOWED) - _violations())
    assert not gone, f"fixed, remove from ALLOWED: {gone}"


def test_the_driver_contract_reaches_only_the_errors() -> None:
    for module in CONTRACT:
        assert _closure(module) <= CONTRACT | {ERRORS}, module


def test_the_record_format_reaches_only_itself_and_the_errors() -> None:
    # Transitive, and over function-level imports too: the format used to import tierd.message,
    # which imported the codec back inside its functions.
    modules = [m for m in GRAPH if _under(m, FORMAT)]
    assert {"tierd.format.record", "tierd.format.batch", "tierd.format.message_ext"} <= set(modules)
    for module in modules:
        assert {m for m in _closure(module) if not _under(m, FORMAT)} <= {ERRORS}, module


def test_the_hot_store_knows_nothing_of_the_cold_tier() -> None:
    # Transitive: no chain of imports from tierd/local/ ends in the cold tier.
    for module in (m for m in GRAPH if _under(m, "tierd.local")):
        cold = {m for m in _closure(module) if _under(m, "tierd.tiered", "tierd.drivers")}
        assert not cold, f"{module} reaches {sorted(cold)}"


def test_spark_needs_no_daemon_and_no_local_metadata() -> None:
    assert any(_under(m, "tierd.arrow") for m in GRAPH)
    for module in (m for m in GRAPH if _under(m, *BUCKET_READERS)):
        # Not the hot store either: the record format Spark decodes is tierd.format's, not tierd/local/'s.
        reached = {
            m
            for m in _closure(module, skip=SPARK_ALLOWED)
            if m in SPARK_FORBIDDEN or _under(m, "tierd.local")
        }
        assert not reached, f"{module} reaches {sorted(reached)}"
    assert set(SPARK_ALLOWED) <= {(a, b) for a, targets in GRAPH.items() for b in targets}


def test_the_consumption_package_is_one_place_split_by_layer() -> None:
    # Subscriptions, offsets, groups, long polling and receive/ack live in tierd.consumption
    # (issue 30); nothing of it stays at the top level, every module is either a leaf or the
    # facade's, and the leaves reach nothing of the facade's level.
    package = {m for m in GRAPH if _under(m, "tierd.consumption")}
    assert package == CONSUMPTION_LEAVES | {m for m in FACADE if _under(m, "tierd.consumption")}
    assert not {f"tierd.{m}" for m in ("subscription", "offsets", "groups", "longpoll")} & set(GRAPH)
    for leaf in CONSUMPTION_LEAVES:
        assert not (_closure(leaf) & FACADE), leaf


def test_private_names_stay_in_their_package() -> None:
    # ``from x import _name`` reaches into another module's internals; a ``_module`` is private to
    # its own package.
    found = set()
    for name, path in SOURCES.items():
        own_package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for module, imported in _imports(name, path):
            if imported.startswith("_") and not imported.startswith("__"):
                found.add((name, f"{module}.{imported}"))
            private = [p for p in module.split(".") if p.startswith("_") and not p.startswith("__")]
            if private and not (own_package + ".").startswith(module.rsplit(".", 1)[0] + "."):
                found.add((name, module))
    assert sorted(found - set(PRIVATE_ALLOWED)) == []
    assert sorted(set(PRIVATE_ALLOWED) - found) == []  # fixed: remove from PRIVATE_ALLOWED


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; before = set(sys.modules); {statement}; print(*sorted(set(sys.modules) - before))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


@pytest.mark.parametrize("heavy", ["numpy", "pydantic", "mmh3", "tierd.store", "tierd.config"])
def test_importing_the_driver_contract_loads_only_the_contract(heavy: str) -> None:
    loaded = _loaded_after("import tierd.drivers.segment, tierd.drivers.paths")
    assert heavy not in loaded
    assert {m for m in loaded if _under(m, "tierd")} == {
        "tierd",
        "tierd.errors",
        "tierd.drivers",
        "tierd.drivers.paths",
        "tierd.drivers.segment",
    }


def test_importing_tierd_is_lazy_and_its_names_still_resolve() -> None:
    assert {m for m in _loaded_after("import tierd") if _under(m, "tierd")} == {"tierd"}
    loaded = _loaded_after("from tierd import BlockingMessageStore, Message, TierdError, __version__")
    assert {"tierd.store", "tierd.message", "tierd.errors"} <= loaded


def test_the_arrow_reader_loads_no_pyspark() -> None:
    # tierd.arrow reuses the Spark source's planning and decoder, which must stay pyspark-free.
    loaded = _loaded_after("import tierd.arrow")
    assert "tierd.spark.decode" in loaded
    assert not {m for m in loaded if _under(m, "pyspark", "tierd.spark.source", "tierd.spark.stream")}


def test_the_cold_index_package_is_lazy_for_spark_lookups() -> None:
    # Spark's key lookups use the I/O-free steps in tierd.tiered.index.reading; the package's
    # re-exports (tierd/tiered/index/__init__.py) load the service, manifests and flat files only
    # when one of its names is used.
    loaded = _loaded_after("import tierd.tiered.index.reading")
    assert {m for m in loaded if _under(m, "tierd.tiered")} == {
        "tierd.tiered",
        "tierd.tiered.index",
        "tierd.tiered.index.format",
        "tierd.tiered.index.reading",
        "tierd.tiered.index.results",
    }
    assert "tierd.tiered.index.service" in _loaded_after("from tierd.tiered.index import ColdIndexService")


# ----------------------------------------------------------------------------- the record layout
# The record layout is declared once, in tierd/format/layout.py (issue 31 item 1). Outside
# tierd/format nothing may restate it: no arithmetic of a layout name with a number (``POS_X + 8``,
# ``HEADER_V4 - 16``), no layout constant defined, no SYSFLAG tested against a literal, no magic
# number, no host-width pair (``20, 8``). Where a module outside the owner's reach still does, the
# finding sits here with the item that removes it (none left).
LAYOUT_ALLOWED: dict[tuple[str, str], str] = {}
_LAYOUT_NAME = ("POS_", "HEADER_V4", "HEADER_FIXED", "SYSFLAG_", "MAGIC_V", "BLANK_MAGIC")
_MAGICS = {0xDAA320A7, 0xDAA320AB, 0xCBD43194}


def _layout_findings(tree: ast.AST) -> set[str]:
    def layout_name(node: ast.AST) -> str | None:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        return name if name is not None and name.startswith(_LAYOUT_NAME) else None

    def number(node: ast.AST) -> int | None:
        ok = isinstance(node, ast.Constant) and type(node.value) is int
        return node.value if ok else None  # type: ignore[attr-defined]

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                name, n = layout_name(a), number(b)
                if name is not None and n is not None:
                    found.add(f"{name} {'+' if isinstance(node.op, ast.Add) else '-'} {n}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                text = ast.unparse(a).lower()
                if ("sysflag" in text or "sys_flag" in text) and number(b) is not None:
                    found.add(f"sysflag & {number(b)}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                name = layout_name(t)
                if name is not None:
                    found.add(f"defines {name}")
        elif isinstance(node, ast.Constant) and node.value in _MAGICS and type(node.value) is int:
            found.add(f"magic {node.value:#x}")
        elif isinstance(node, ast.Call):
            args = {number(a) for a in node.args}
            if {20, 8} <= args:
                found.add("host widths 20, 8")
    return found


def _layout_violations() -> set[tuple[str, str]]:
    return {
        (name, finding)
        for name, path in SOURCES.items()
        if not _under(name, FORMAT)
        for finding in _layout_findings(ast.parse(path.read_text(), str(path)))
    }


def test_the_layout_check_finds_restatements() -> None:
    # The rule below must be able to fail: each kind of restatement it looks for is found.
    code = (
        "a = buf[POS_SYSFLAG + 4]\nb = HEADER_V4 - 16\nc = sysflag & 0x10\nSYSFLAG_X = 1\n"
        "d = 0xDAA320A7\ne = np.where(v6, 20, 8)\nf = layout.POS_BORN_HOST + 8\n"
    )
    assert _layout_findings(ast.parse(code)) == {
        "POS_SYSFLAG + 4",
        "HEADER_V4 - 16",
        "sysflag & 16",
        "defines SYSFLAG_X",
        f"magic {0xDAA320A7:#x}",
        "host widths 20, 8",
        "POS_BORN_HOST + 8",
    }
    assert not _layout_findings(ast.parse("a = position('store_timestamp', born, store)\nb = x + 8\n"))


def test_no_module_outside_the_format_restates_the_record_layout() -> None:
    new = sorted(_layout_violations() - set(LAYOUT_ALLOWED))
    assert not new, "record layout restated outside tierd/format (use tierd.format.layout): " + ", ".join(
        f"{a}: {b}" for a, b in new
    )
    gone = sorted(set(LAYOUT_ALLOWED) - _layout_violations())
    assert not gone, f"fixed, remove from LAYOUT_ALLOWED: {gone}"
