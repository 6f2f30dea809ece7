"""Scheduled messages: put throughput of delayed vs normal messages (target ≥ 0.5×), and the
delivery lateness p99 with scheduled messages falling due at 10 k/s (docs/scheduled.md).

Put rates are measured A/B interleaved (normal, delayed, normal, … ``ROUNDS`` times each, in one
store, the user's path with default settings: ``BlockingMessageStore.put`` / ``.schedule`` with
the scheduler running) and reported as the median of the per-round ratios (each delayed round
next to its normal one), so a load change on the shared machine hits both sides of a ratio. A
round puts for ``ROUND_SECONDS`` — a sustained rate: the scheduler takes in what delayed puts
told it at least once a second, so a round that short of that would leave its work out. After a
delayed round the bench waits, off the clock, until the scheduler has taken in everything, so
that work never lands in the next (normal) round. Lateness is measured where a consumer sees it:
the delivered copy's store time minus its delivery time (``TIMER_DELIVER_MS``). The machine is
shared: figures are what this run saw.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tierd import BlockingMessageStore, TierdConfig
from tierd.message import GetStatus, Message
from tierd.scheduled.timing import SCHEDULE_TOPIC

ROUND_SECONDS = 2.0
RATE = 10_000  # scheduled messages falling due per second
SECONDS = 3
ROUNDS = 5


def config(root: Path, *, scheduler: bool = True) -> TierdConfig:
    return TierdConfig.from_dict(
        {
            "store": {"dir": str(root), "commitlog_file_size": 256 << 20},
            "tiered": {"enabled": False},
            "scheduled": {"enabled": scheduler},
        }
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def put_rate(store: BlockingMessageStore, scheduled: bool) -> float:
    """Puts per second over ROUND_SECONDS (the clock is read every 256 puts)."""
    body = b"x" * 256
    n = 0
    start = time.perf_counter()
    stop = start + ROUND_SECONDS
    if scheduled:
        due = now_ms() + 3_600_000  # not due during the run: only the put is measured
        while time.perf_counter() < stop:
            for _ in range(256):
                store.schedule(Message(topic="bench", body=body, queue_id=0), deliver_at=due)
            n += 256
    else:
        while time.perf_counter() < stop:
            for _ in range(256):
                store.put(Message(topic="bench", body=body, queue_id=0))
            n += 256
    rate = n / (time.perf_counter() - start)
    if scheduled:
        taken_in(store)
    return rate


def taken_in(store: BlockingMessageStore) -> None:
    """Return once the scheduler has taken in every scheduled message put so far."""
    if not store.config.scheduled.enabled:
        return  # --scheduler-off: nothing takes them in
    end = store.router.max_offset(SCHEDULE_TOPIC, 0)
    deadline = time.monotonic() + 60
    while store.scheduler.scanned < end:
        if time.monotonic() > deadline:
            raise SystemExit(f"the scheduler took in {store.scheduler.scanned} of {end} in 60 s")
        time.sleep(0.002)  # polling interval (small against a round); the deadline bounds it


def lateness(store: BlockingMessageStore) -> list[int]:
    """Schedule RATE × SECONDS messages due evenly over SECONDS (starting 2 s from now)."""
    total = RATE * SECONDS
    first = now_ms() + 2000
    for i in range(total):
        store.schedule(Message(topic="late", body=b"y", queue_id=0), deliver_at=first + i * 1000 // RATE)
    out: list[int] = []
    offset = 0
    deadline = time.monotonic() + 120
    while len(out) < total:
        r = store.get("late", 0, offset, 4096)
        if r.status is GetStatus.FOUND:
            out.extend(m.store_timestamp - int(m.properties["TIMER_DELIVER_MS"]) for m in r.messages)
            offset = r.next_offset
        elif time.monotonic() > deadline:
            raise SystemExit(f"only {len(out)} of {total} delivered in 120 s")
        else:
            time.sleep(0.05)  # polling interval; the deadline bounds it
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Delayed vs normal put throughput (target >= 0.5x) and delivery lateness of "
        f"scheduled messages (~{ROUNDS * 2 * ROUND_SECONDS + SECONDS + 10:.0f} s)."
    )
    parser.add_argument(
        "--scheduler-off",
        action="store_true",
        help="the put rates only, with no scheduler (for scale: the put path's own cost, the "
        "ceiling of what the scheduler's side can reach)",
    )
    scheduler = not parser.parse_args().scheduler_off
    with tempfile.TemporaryDirectory() as tmp:
        with BlockingMessageStore.open(config(Path(tmp) / "a", scheduler=scheduler)) as store:
            normals: list[float] = []
            delayeds: list[float] = []
            for _ in range(ROUNDS):
                normals.append(put_rate(store, scheduled=False))
                delayeds.append(put_rate(store, scheduled=True))
            normal, delayed = statistics.median(normals), statistics.median(delayeds)
            ratio = statistics.median(d / n for n, d in zip(normals, delayeds, strict=True))
        if scheduler:
            with BlockingMessageStore.open(config(Path(tmp) / "b")) as store:
                late = sorted(lateness(store))
    ratios = ", ".join(f"{d / n:.2f}" for n, d in zip(normals, delayeds, strict=True))
    print(
        f"put, 256-byte bodies, {ROUND_SECONDS:g} s rounds, {ROUNDS} interleaved"
        f"{'' if scheduler else ', scheduler off'}: "
        f"delayed/normal median {ratio:.2f}x (target >= 0.5x; per round {ratios}); "
        f"median rates normal {normal:,.0f}/s, delayed {delayed:,.0f}/s"
    )
    print(f"1-minute load average at the end: {os.getloadavg()[0]:.1f}")
    if not scheduler:
        return
    p50, p99 = late[len(late) // 2], late[int(len(late) * 0.99)]
    print(
        f"delivery lateness at {RATE}/s for {SECONDS} s ({len(late)} messages): "
        f"p50 {p50} ms, p99 {p99} ms, max {late[-1]} ms, mean {statistics.fmean(late):.1f} ms"
    )
    if min(late) < 0:
        print("ERROR: a message was visible before its delivery time", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
