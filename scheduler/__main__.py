"""The ``scheduler`` process: APScheduler running one maintenance service per concern.

Run with ``python -m scheduler``. SIGTERM stops it after the running job.
"""

from __future__ import annotations

import logging
import signal
import sys
from datetime import datetime, timezone

from apscheduler.schedulers.blocking import BlockingScheduler

from app.errors import AttacheError
from app.observability import logs
from app.services import Services, settings_or_exit
from scheduler.sweepers import sweepers

log = logging.getLogger("attache.scheduler")


def guarded(service):
    def run():
        try:
            service.run_once()
        except AttacheError as exc:
            log.warning("%s skipped a round: %s", service.name, exc, extra={"service": service.name})
        except Exception:
            log.exception("%s failed", service.name, extra={"service": service.name})

    return run


def main() -> int:
    settings = settings_or_exit("scheduler")
    logs.configure("scheduler")
    services = Services(settings, pool_size=2)
    scheduler = BlockingScheduler(timezone="UTC")
    for sweeper in sweepers(services):
        scheduler.add_job(guarded(sweeper.service), "interval", seconds=sweeper.interval_seconds,
                          id=sweeper.service.name, max_instances=1, coalesce=True,
                          next_run_time=datetime.now(timezone.utc))

    def stop(signum, frame):
        log.info("scheduler stopping")
        scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    log.info("scheduler started")
    scheduler.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
