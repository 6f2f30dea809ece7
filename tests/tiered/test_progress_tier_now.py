"""``tier_now`` while producers outrun the cold tier (issue 29, case 2).

With ``tiered.upload_rate_limit`` the cold tier accepts fewer bytes a second than producers
write. A tier call used to chase the new messages and never answer; it must commit what was
pending when it was called and return, leaving later messages to later rounds.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from tierd import BlockingMessageStore, Message

from .conftest import cold_config

if TYPE_CHECKING:
    from pathlib import Path

    from tierd.tiered.dispatcher import TierReport

#: Upload cap (bytes/s) and what the producer writes per step: it outruns the cap tenfold.
RATE = 20_000
BODY = 1_000
STEP = 20
#: The producer writes a step every this many seconds (200 KB/s against 20 KB/s uploaded).
PACE = 0.1
#: How long the test waits for tier_now before calling it stuck.
DEADLINE = 60.0


def test_tier_now_commits_what_was_pending_and_returns_while_producers_outrun_the_cold_tier(
    tmp_path: Path,
) -> None:
    cfg = cold_config(tmp_path, upload_rate_limit=RATE)
    store = BlockingMessageStore.open(cfg)
    try:
        store.wait_ready()
        store.put_batch([Message(topic="t", body=b"a" * BODY, queue_id=0) for _ in range(STEP)])
        stop = threading.Event()
        produced = [STEP]

        def produce() -> None:
            while not stop.is_set():  # paced: its rate is the point, not a synchronisation
                store.put_batch([Message(topic="t", body=b"b" * BODY, queue_id=0) for _ in range(STEP)])
                produced[0] += STEP
                stop.wait(PACE)

        producer = threading.Thread(target=produce, name="test-producer", daemon=True)
        producer.start()
        outcome: list[TierReport | BaseException] = []
        before: list[int] = []

        def tier() -> None:
            before.append(store.max_offset("t", 0))  # acknowledged before the call
            try:
                outcome.append(store.tier_now())
            except BaseException as e:  # reported by the assertion below
                outcome.append(e)

        caller = threading.Thread(target=tier, name="test-tier-now", daemon=True)
        try:
            # Wait until the producer has outrun the cap, then call.
            deadline = time.monotonic() + DEADLINE
            while produced[0] < 5 * STEP and time.monotonic() < deadline:
                stop.wait(PACE)
            caller.start()
            caller.join(DEADLINE)
            assert not caller.is_alive(), f"tier_now did not return within {DEADLINE} s"
        finally:
            stop.set()
            producer.join(30)
        [report] = outcome
        assert not isinstance(report, BaseException), report
        assert store.tiering is not None
        ff = store.tiering.flat.get("t", 0)
        assert ff is not None
        # Everything acknowledged before the call is cold; the round did not chase the rest.
        assert ff.max_offset >= before[0]
        assert report.committed >= before[0]
        assert store.max_offset("t", 0) == produced[0]
    finally:
        store.close(grace=0)  # the producer's backlog is not this test's: no final round
