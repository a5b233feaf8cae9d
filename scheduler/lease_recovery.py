"""Lease recovery: ``processing`` jobs whose lease expired go back to ``queued``.

Their worker died or hangs. The attempt is counted; a job whose attempts
are spent ends ``failed`` with ``worker_lost`` (a file that kills every
worker must not loop). Safe with two schedulers (``SKIP LOCKED``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.adapters.postgres.db import transaction
from app.core import states
from app.core.identity import identity
from app.services import Services

log = logging.getLogger("attache.scheduler.leases")


@dataclass(frozen=True)
class LeaseRecoveryConfig:
    batch: int = 100


class LeaseRecovery:
    name = "lease_recovery"

    def __init__(self, services: Services, config: LeaseRecoveryConfig):
        self.services = services
        self.config = config

    def run_once(self) -> dict[str, int]:
        with transaction(self.services.engine) as conn:
            counts = states.recover_expired(conn, batch=self.config.batch, actor=identity("scheduler"))
        if counts["requeued"] or counts["failed"]:
            log.info("expired leases: %(requeued)d requeued, %(failed)d failed", counts, extra=counts)
            # publish the fresh inspect messages now rather than at the next relay tick
            self.services.publisher.publish_due(older_than_seconds=0, batch=self.config.batch)
        return counts
