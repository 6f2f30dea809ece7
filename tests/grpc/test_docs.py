"""The Python example of docs/grpc.md, as pasted (only the endpoint changes: the test daemon
listens on a free port), run by a real interpreter against a real ``tierd serve``."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from tests.grpc.conftest import GrpcTierd

DOC = Path(__file__).resolve().parents[2] / "docs" / "grpc.md"


def _example() -> str:
    text = DOC.read_text()
    section = text[text.index("## Example") :]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m is not None, "docs/grpc.md lost its Python example"
    return m.group(1)


def test_the_documented_example_works(tierd: GrpcTierd) -> None:
    code = _example()
    assert '"127.0.0.1:8081"' in code  # the documented endpoint, replaced by the test's own
    run = subprocess.run(
        [sys.executable, "-c", code.replace('"127.0.0.1:8081"', f'"{tierd.endpoint}"')],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 2, run.stdout
    message_id = lines[0]
    assert message_id
    assert lines[1] == "b'hello' paid {'order-1'} {'region': 'eu'} 1"
    # Acked: the group's committed offsets (over HTTP) move past the one message (within the
    # lazy commit's delay, tierd.consumption.inflight.COMMIT_DELAY).
    deadline = time.monotonic() + 30
    while True:
        offsets = httpx.get(f"{tierd.url}/v1/groups/billing/offsets", timeout=30).json()["offsets"]
        if sum(o["offset"] for o in offsets) == 1:
            break
        assert time.monotonic() < deadline, f"committed offsets not moved in 30 s: {offsets}"
        time.sleep(0.05)
