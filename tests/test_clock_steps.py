"""The scheduler's sweepers go on when the wall clock steps back (``scheduler/clock_steps.py``)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

from apscheduler.schedulers.background import BackgroundScheduler

from scheduler.clock_steps import follow_clock_steps, steps_back


def test_only_a_step_back_of_the_wall_clock_is_told():
    wall, monotonic = [1000.0, 1001.0, 1002.0, 1003.5, 1500.0, 900.0, 901.0], iter([0.0, 1, 2, 3, 4, 5, 6])
    seen = steps_back(wall=lambda: wall.pop(0), monotonic=lambda: next(monotonic), sleep=lambda s: None)
    assert round(next(seen)) == 601, "forward by 0, 0.5, 496 s: nothing; back by 600 (+1 s gone by): told"


def test_a_wall_clock_stepped_back_makes_every_job_due_at_once():
    """An adversarial run: after an NTP step of an hour back (and of two minutes), APScheduler's jobs, timed on the
    wall clock, waited for the step: no lease recovery, relay, webhook or cleanup round, and an upload whose web
    died after its COMMIT stayed queued."""
    ran = threading.Event()
    scheduler = BackgroundScheduler(timezone="UTC")
    # where an interval job stands right after the wall clock went back an hour
    scheduler.add_job(ran.set, "interval", seconds=3600, next_run_time=datetime.now(timezone.utc) + timedelta(hours=1))
    scheduler.start()
    offset = [0.0]
    try:
        follow_clock_steps(scheduler, wall=lambda: time.time() + offset[0], check_seconds=0.05)
        assert not ran.wait(0.3)
        offset[0] = -3600.0  # the step
        assert ran.wait(5), "the job did not run after the step back"
    finally:
        scheduler.shutdown(wait=False)
