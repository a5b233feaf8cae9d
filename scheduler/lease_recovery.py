"""Lease recovery: ``processing`` jobs whose lease expired go back to ``queued``.

Their worker died or hangs. The attempt is counted; a job whose attempts
are spent ends ``failed`` with ``worker_lost`` (a file that kills every
worker must not loop). Safe with two schedulers (``SKIP LOCKED``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.core import states
from app.core.identity import identity
from app.core.unit_of_work import UnitOfWork

log = logging.getLogger("attache.scheduler.leases")


@dataclass(frozen=True)
class LeaseRecoveryConfig:
    batch: int = 100


class LeaseRecovery:
    name = "lease_recovery"

    def __init__(self, unit_of_work: UnitOfWork, config: LeaseRecoveryConfig):
        self.unit_of_work = unit_of_work
        self.config = config

    def run_once(self) -> dict[str, int]:
        # the fresh inspect messages are published after COMMIT, not at the next relay tick
        with self.unit_of_work.begin() as work:
            counts = states.recover_expired(work.conn, batch=self.config.batch, actor=identity("scheduler"))
        if counts["requeued"] or counts["failed"]:
            log.info("expired leases: %(requeued)d requeued, %(failed)d failed", counts, extra=counts)
        return counts
