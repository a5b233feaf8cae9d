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

from app.config import Settings
from app.errors import AttacheError, ConfigError
from app.observability import logs
from app.services import Services
from scheduler.lease_recovery import LeaseRecovery, LeaseRecoveryConfig
from scheduler.object_gc import ObjectGc, ObjectGcConfig
from scheduler.outbox_relay import OutboxRelay, OutboxRelayConfig
from scheduler.reconciler import Reconciler, ReconcilerConfig
from scheduler.retirement import Retirement, RetirementConfig
from scheduler.runs import SweeperRuns
from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig

log = logging.getLogger("attache.scheduler")


def build(services: Services) -> list[tuple[object, float]]:
    settings = services.settings
    return [
        (OutboxRelay(services, OutboxRelayConfig(publish_after_seconds=settings.outbox_publish_after_seconds)),
         settings.outbox_interval_seconds),
        (LeaseRecovery(services, LeaseRecoveryConfig()), settings.lease_interval_seconds),
        (Reconciler(services, ReconcilerConfig(after_seconds=settings.reconcile_after_seconds)),
         settings.reconcile_interval_seconds),
        (StagingCleanup(services, StagingCleanupConfig(grace_seconds=settings.staging_grace_seconds,
                                                       failed_retention_seconds=settings.failed_retention_seconds)),
         settings.cleanup_interval_seconds),
        (ObjectGc(services, ObjectGcConfig(grace_seconds=settings.object_grace_seconds)),
         settings.cleanup_interval_seconds),
        (Retirement(services, RetirementConfig(grace_seconds=settings.retire_grace_seconds)),
         settings.cleanup_interval_seconds),
    ]


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
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"attache scheduler: configuration error: {exc}", file=sys.stderr)
        return 2
    logs.configure("scheduler")
    services = Services(settings, pool_size=2)
    scheduler = BlockingScheduler(timezone="UTC")
    runs = SweeperRuns(services.engine)
    for service, interval in build(services):
        scheduler.add_job(guarded(service, interval, runs), "interval", seconds=interval, id=service.name,
                          max_instances=1, coalesce=True, next_run_time=datetime.now(timezone.utc))

    def stop(signum, frame):
        log.info("scheduler stopping")
        scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    log.info("scheduler started")
    scheduler.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
