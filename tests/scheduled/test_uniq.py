"""Client ids the store gives scheduled messages that came without one (tierd.scheduled.timing)."""

from __future__ import annotations

import os
import re
import threading

from tierd.scheduled.timing import new_uniq_key


def test_keys_are_distinct_across_threads_and_rocketmq_shaped() -> None:
    """Four threads drawing at once never get the same key: the counter is the only shared state."""
    out: list[list[str]] = [[] for _ in range(4)]

    def draw(into: list[str]) -> None:
        into.extend(new_uniq_key() for _ in range(20_000))

    threads = [threading.Thread(target=draw, args=(o,)) for o in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a key-drawing thread did not finish in 60 s"
    keys = [k for o in out for k in o]
    assert len(set(keys)) == len(keys)
    assert all(re.fullmatch(r"[0-9A-F]{32}", k) for k in keys)


def test_forked_child_does_not_repeat_the_parents_keys() -> None:
    """A forked process (a pre-fork server, a test runner) draws from its own prefix, not a copy
    of the parent's: without the reseed the child's next key would equal the parent's."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report one key and leave without running the parent's cleanup
        os.write(w, new_uniq_key().encode())
        os._exit(0)
    os.close(w)
    parent = new_uniq_key()
    with os.fdopen(r, "rb") as f:
        child = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(child) == 32
    assert child[:20] != parent[:20]
    assert child != parent
