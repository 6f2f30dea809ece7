"""Producer process for the crash test: writes with ``sync`` flush and acknowledges each durable
message on stdout as ``queue_id offset topic body_hex``. The test SIGKILLs it at random moments."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from tierd import BlockingMessageStore, Message

from .conftest import small_config

TOPICS = ("crash-a", "crash-b", "T" * 140)  # the last one is written as v2 records


def body_for(seed: int, i: int) -> bytes:
    return (b"%d:%d:" % (seed, i)) * (1 + (i * 7919 + seed) % 300)


def main() -> None:
    root, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    cfg = small_config(root, flush="sync", default_queues=3)
    with BlockingMessageStore.open(cfg) as store:
        os.write(1, b"ready\n")
        i = 0
        while True:
            n = rng.choice((1, 1, 1, rng.randint(2, 40)))
            msgs = [
                Message(topic=TOPICS[(i + j) % 3], body=body_for(seed, i + j), keys=[f"k{seed}-{i + j}"])
                for j in range(n)
            ]
            results = store.put_batch(msgs) if n > 1 else [store.put(msgs[0])]
            lines = b"".join(
                b"%d %d %s %s\n" % (r.queue_id, r.queue_offset, m.topic.encode(), m.body.hex().encode())
                for r, m in zip(results, msgs, strict=True)
            )
            os.write(1, lines)
            i += n


if __name__ == "__main__":
    main()
