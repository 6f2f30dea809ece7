"""Subprocess for the many-queues test: thousands of queues under a small ``RLIMIT_NOFILE``.

``python -m tests.tiered.many_queues ROOT QUEUES NOFILE``: with default settings (posix cold
tier), put one message into each of QUEUES queues (topics of 4 queues), ``tier_now``, close,
reopen under the same limit, read every message back from the cold tier (FORCE) and from the hot
store (DISABLE), close. Prints one JSON line: what was committed and read, the peak number of
open descriptors seen and the resident set after the reopen. Any failure is an exit code 1.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

from tierd import BlockingMessageStore, GetStatus, Message, ReadPolicy, TierdConfig


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    root, queues, nofile = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    cfg = TierdConfig.from_dict({"store": {"dir": str(root / "hot")}, "backend": {"url": str(root / "cold")}})
    keys = [(f"mq-{i // 4}", i % 4) for i in range(queues)]
    peak = 0
    with BlockingMessageStore.open(cfg) as store:
        store.put_batch([Message(topic=t, body=f"{t}/{q}".encode(), queue_id=q) for t, q in keys])
        committed = store.tier_now().committed
        peak = max(peak, open_fds())
    with BlockingMessageStore.open(cfg) as store:
        store.wait_ready(120)
        rss_after_reopen = rss_mib()
        cold = hot = 0
        for t, q in keys:
            for policy in (ReadPolicy.FORCE, ReadPolicy.DISABLE):
                res = store.get(t, q, 0, 1, policy=policy)
                if res.status is not GetStatus.FOUND or res.messages[0].body != f"{t}/{q}".encode():
                    raise AssertionError(f"{t}/{q} {policy.value}: {res.status.name}")
                cold += res.source == "cold"
                hot += res.source == "hot"
            peak = max(peak, open_fds())
    report = {
        "committed": committed,
        "read_cold": cold,
        "read_hot": hot,
        "peak_open_files": peak,
        "rss_after_reopen_mib": rss_after_reopen,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
