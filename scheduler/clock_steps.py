"""The wall clock stepping back (an NTP correction, a VM restored) must not stop the sweepers.

APScheduler times its interval jobs on the wall clock: after a step back
of an hour, every job's next run was an hour away, and lease recovery,
the outbox relay, the webhooks and the cleanups all stopped for that hour
(an adversarial run: no round in 40 s after a step of an hour, nor in 70 s
after one of two minutes, and an upload whose web died after its COMMIT
stayed queued meanwhile). A thread compares the wall clock with the
monotonic one and, when the wall clock went back, makes every job due at
once; the intervals go on from there.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable

log = logging.getLogger("attache.scheduler")

#: how often the clocks are compared, and how far back the wall clock must go between two looks to count as a step
CHECK_SECONDS = 1.0
STEP_SECONDS = 2.0


def steps_back(wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep, check_seconds: float = CHECK_SECONDS):
    """Yields, forever, each time the wall clock went back more than :data:`STEP_SECONDS` against the monotonic one:
    how far (seconds)."""
    before_wall, before_monotonic = wall(), monotonic()
    while True:
        sleep(check_seconds)
        now_wall, now_monotonic = wall(), monotonic()
        behind = (now_monotonic - before_monotonic) - (now_wall - before_wall)
        if behind > STEP_SECONDS:
            yield behind
        before_wall, before_monotonic = now_wall, now_monotonic


def follow_clock_steps(scheduler, **clocks) -> threading.Thread:
    """Start the thread that makes every job of ``scheduler`` due at once after the wall clock steps back."""
    def watch():
        for behind in steps_back(**clocks):
            log.warning("the wall clock went back %.0f s: every sweeper runs now", behind,
                        extra={"clock_step_seconds": -behind})
            for job in scheduler.get_jobs():
                job.modify(next_run_time=datetime.now(timezone.utc))

    thread = threading.Thread(target=watch, name="attache-clock-steps", daemon=True)
    thread.start()
    return thread
