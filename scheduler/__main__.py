"""The ``scheduler`` process: APScheduler running one maintenance service per concern.

Run with ``python -m scheduler``. SIGTERM stops it after the running job.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from datetime import datetime, timezone

from apscheduler.schedulers.blocking import BlockingScheduler

from app.errors import AttacheError
from app.observability import logs
from app.services import Services, settings_or_exit
from scheduler.clock_steps import follow_clock_steps
from scheduler.runs import SweeperRuns
from scheduler.sweepers import sweepers

log = logging.getLogger("attache.scheduler")


def guarded(service, interval: float, runs: SweeperRuns):
    """One round of ``service`` that never raises, recorded in ``runs`` (``scheduler/runs.py``)."""
    def run():
        started = time.monotonic()
        counts = None
        try:
            counts = service.run_once()
        except AttacheError as exc:
            log.warning("%s skipped a round: %s", service.name, exc, extra={"service": service.name})
        except Exception:
            log.exception("%s failed", service.name, extra={"service": service.name})
        runs.record(service.name, interval, counts, time.monotonic() - started)

    return run


def main() -> int:
    settings = settings_or_exit("scheduler")
    logs.configure("scheduler")
    services = Services(settings, pool_size=2, process="scheduler")
    scheduler = BlockingScheduler(timezone="UTC")
    runs = SweeperRuns(services.engine)
    for sweeper in sweepers(services):
        scheduler.add_job(guarded(sweeper.service, sweeper.interval_seconds, runs), "interval",
                          seconds=sweeper.interval_seconds, id=sweeper.service.name, max_instances=1,
                          coalesce=True, next_run_time=datetime.now(timezone.utc))

    def stop(signum, frame):
        log.info("scheduler stopping")
        scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    log.info("scheduler started")
    follow_clock_steps(scheduler)  # a wall clock stepped back would hold every job for the step
    scheduler.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
