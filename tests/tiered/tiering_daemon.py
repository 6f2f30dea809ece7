"""Daemon process for the tiering crash test: produces and tiers in a loop, acknowledging on
stdout; the test SIGKILLs it at random moments."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

from tierd import BlockingMessageStore, Message

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config

SMALL: dict[str, Any] = {
    "max_message_size": SMALL_BODY_LIMIT,
    "commitlog_segment_size": MIN_SEGMENT,
    "consumequeue_segment_size": 400,
    "group_commit_count": 7,
}


def main() -> None:
    root, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    with BlockingMessageStore.open(cold_config(root, **SMALL)) as store:
        os.write(1, b"ready\n")
        i = 0
        while True:
            n = rng.randint(1, 30)
            store.put_batch(
                [
                    Message(
                        topic=f"t{(i + j) % 2}",
                        body=b"%d:%d;" % (seed, i + j) * rng.randint(2, 80),  # rolls every ~200 messages
                        queue_id=(i + j) % 3,
                    )
                    for j in range(n)
                ]
            )
            i += n
            store.tier_now()
            os.write(1, b"tiered %d\n" % i)


if __name__ == "__main__":
    main()
