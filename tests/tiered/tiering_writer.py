"""Writer process for the kill-while-tiering stress test (issue 14, case 4): acknowledged puts
with ``flush = "sync"`` and a ``tier_now()`` every ~100 puts, on small cold segments so rolls
and seals happen all the time. Each durable put is acknowledged on stdout as
``ack topic queue_id queue_offset body_hex``; the test SIGKILLs the process at random moments."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierd import BlockingMessageStore, Message

from .conftest import MIN_SEGMENT, SMALL_BODY_LIMIT, cold_config

if TYPE_CHECKING:
    from tierd import TierdConfig

#: The smallest flat commitlog segments (~68 KiB), 2,000-byte (100-unit) flat consume-queue segments.
SMALL: dict[str, Any] = {
    "max_message_size": SMALL_BODY_LIMIT,
    "commitlog_segment_size": MIN_SEGMENT,
    "consumequeue_segment_size": 2_000,
}
TOPICS = ("ka", "kb")
QUEUES = 3


def writer_config(root: Path) -> TierdConfig:
    return cold_config(root, **SMALL).with_overrides(store={"flush": "sync"})


def body_for(seed: int, i: int) -> bytes:
    return b"%d:%d;" % (seed, i) * (1 + (i * 7919 + seed) % 40)


def main() -> None:
    root, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    with BlockingMessageStore.open(writer_config(root)) as store:
        os.write(1, b"ready\n")
        i = 0
        next_tier = rng.randint(80, 120)
        while True:
            topic = TOPICS[i % len(TOPICS)]
            body = body_for(seed, i)
            r = store.put(Message(topic=topic, body=body, queue_id=(i // len(TOPICS)) % QUEUES))
            os.write(
                1, b"ack %s %d %d %s\n" % (topic.encode(), r.queue_id, r.queue_offset, body.hex().encode())
            )
            i += 1
            if i == next_tier:
                store.tier_now()
                next_tier += rng.randint(80, 120)


if __name__ == "__main__":
    main()
