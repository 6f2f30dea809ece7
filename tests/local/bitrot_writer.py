"""Writer process for the bit-rot recovery test: ``count`` acknowledged puts with ``flush = "sync"``
(two queues, alternating), each acknowledged on stdout as ``queue_id offset commitlog_offset
body_hex`` once durable; then ``done``, and it waits to be SIGKILLed. With ``TIERD_ROT_KEYS=1``
each message carries a key (``key-{i}``), so the index is written too."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tierd import BlockingMessageStore, Message, TierdConfig

from .conftest import small_config


def writer_config(root: Path, tiered: Path | None = None) -> TierdConfig:
    cfg = small_config(root, flush="sync")
    if tiered is None:
        return cfg
    return cfg.with_overrides(
        tiered={"enabled": True, "dispatch_interval": 3600}, backend={"name": "posix", "url": str(tiered)}
    )


def body_for(i: int) -> bytes:
    return b"rot-%05d;" % i * (1 + i % 7)


def main() -> None:
    root, count = Path(sys.argv[1]), int(sys.argv[2])
    tiered = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    keys = os.environ.get("TIERD_ROT_KEYS") == "1"
    with BlockingMessageStore.open(writer_config(root, tiered)) as store:
        for i in range(count):
            body = body_for(i)
            r = store.put(Message(topic="rot", body=body, queue_id=i % 2, keys=[f"key-{i}"] if keys else ()))
            os.write(
                1, b"%d %d %d %s\n" % (r.queue_id, r.queue_offset, r.commitlog_offset, body.hex().encode())
            )
        os.write(1, b"done\n")
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main()
