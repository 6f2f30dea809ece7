"""The harness that watches a ``tierd serve`` subprocess's log (``TierdProcess``) sees every line.

A daemon often writes several log lines at once and then stays quiet (``cold index loaded`` and
``cold tier ready`` come within a millisecond). A reader that asks ``select`` whether the pipe
has data before each ``readline`` misses the lines already in the file object's buffer: the pipe
is empty, so it waits for output that never comes, and a test waiting for ``cold tier ready``
times out on a healthy daemon — on a loaded machine, where lines arrive together, more often.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from tests.service.conftest import collect_lines

#: Writes two lines in one write, then stays silent (and alive) for a long time.
_TWO_LINES_THEN_QUIET = (
    "import sys, time; sys.stderr.write('first\\nsecond\\n'); sys.stderr.flush(); time.sleep(60)"
)


def test_lines_written_together_are_all_seen() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _TWO_LINES_THEN_QUIET], stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        cond = threading.Condition()
        assert proc.stderr is not None
        threading.Thread(target=collect_lines, args=(proc.stderr, lines, cond), daemon=True).start()
        deadline = time.monotonic() + 30
        with cond:
            while len(lines) < 2 and time.monotonic() < deadline:
                cond.wait(0.5)
            assert lines == ["first\n", "second\n"]
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
