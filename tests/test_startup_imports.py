"""What the default open + put path imports and builds (issue 31: ``import tierd``, open and the
first ``put`` in a new process within 0.5 s).

Verify, restore and the read-only bucket stack are imported by the calls that use them, and the
manifest and consumer-offset validators are built on first use; a fresh store that opens and
puts one message needs none of them. These tests run that path in a fresh interpreter and look
at ``sys.modules`` and pydantic's build flags afterwards: a module list, not a stopwatch, so
the machine's load cannot decide them (docs/performance.md, "Start-up", has the times).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

#: Modules the open + put path must not import: each is loaded by the call that needs it.
LAZY = ("tierd.verify", "tierd.tiered.restore", "tierd.tiered.readonly")
#: Models whose validators that path must not build (``module:Class``).
DEFERRED = (
    "tierd.inventory:SegmentRow",
    "tierd.consumption.offsets:OffsetTable",
    "tierd.tiered.manifest:QueueManifest",
    "tierd.tiered.manifest:TopicEntry",
    "tierd.tiered.manifest:BrokerManifest",
    "tierd.tiered.manifest:IndexCoverage",
    "tierd.tiered.manifest:IndexManifest",
)

#: Opens a default store (hot directory, posix bucket) in argv[1], puts one message, closes,
#: then prints the lazy modules that were imported and the deferred models that were built.
_PROBE = """
import importlib, json, sys
from tierd import BlockingMessageStore, Message, TierdConfig
root, lazy, deferred = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
cfg = TierdConfig.from_dict({"store": {"dir": root + "/hot"}, "backend": {"url": root + "/cold"}})
with BlockingMessageStore.open(cfg) as store:
    result = store.put(Message(topic="startup", body=b"x", keys=("k",)))
built = []
for name in deferred:
    module, cls = name.split(":")
    if getattr(importlib.import_module(module), cls).__pydantic_complete__:
        built.append(name)
print(json.dumps({
    "queue_offset": result.queue_offset,
    "imported": [m for m in lazy if m in sys.modules],
    "built": built,
}))
"""


def _probe(root: Path, code: str = _PROBE) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", code, str(root), ",".join(LAZY), ",".join(DEFERRED)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_open_and_put_import_no_verify_restore_or_readonly(tmp_path: Path) -> None:
    got = _probe(tmp_path)
    assert got["queue_offset"] == 0  # the put landed: the path ran to its end
    assert got["imported"] == []


def test_open_and_put_build_no_manifest_or_offset_validator(tmp_path: Path) -> None:
    got = _probe(tmp_path)
    assert got["built"] == []


def test_the_lazy_names_still_resolve_where_they_are_used(tmp_path: Path) -> None:
    """``tierd.store.RestoreReport`` (the HTTP layer's seam) and a deferred model validate as
    before: laziness moved the import, not the name or the checks."""
    code = """
import json, sys
from pydantic import ValidationError
from tierd.store import RestoreReport
from tierd.tiered.manifest import QueueManifest
doc = {"cluster": "c", "broker": "b", "topic": "t", "queue-id": 0, "min-offset": 0,
       "max-offset": 0, "segments": [], "written-at": 1}
ok = QueueManifest.model_validate(doc)
try:
    QueueManifest.model_validate({**doc, "unknown-key": 1})
    refused = False
except ValidationError:
    refused = True
print(json.dumps({"report": RestoreReport.__module__, "topic": ok.topic, "refused": refused,
                  "imported": [], "built": []}))
"""
    got = _probe(tmp_path, code)
    assert got["report"] == "tierd.tiered.restore"
    assert got["topic"] == "t"
    assert got["refused"] is True
