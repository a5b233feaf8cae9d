"""Lease recovery: ``processing`` jobs whose lease expired go back to ``queued``.

Their worker died or hangs. The attempt is counted; a job whose attempts
are spent ends ``failed`` with ``worker_lost`` (a file that kills every
worker must not loop). Safe with two schedulers (``SKIP LOCKED``).

A lease also lapses when its heartbeat cannot be written: PostgreSQL
down, read-only or out of disk for longer than the lease. Its step lives
and may go on (``states.held_by``), so after a round that failed, leases
are taken back only once PostgreSQL has let rounds lock the lapsed jobs
for ``settle_seconds`` (the scheduler
passes a third of the lease: the heartbeat's period; a missed beat is tried
again every second). Meanwhile a round counts the lapsed leases it leaves
as ``deferred``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from app.core import states
from app.core.identity import identity
from app.core.unit_of_work import UnitOfWork

log = logging.getLogger("attache.scheduler.leases")


@dataclass(frozen=True)
class LeaseRecoveryConfig:
    batch: int = 100
    #: how long rounds must succeed, after one failed, before a lapsed lease is taken back
    settle_seconds: float = 0.0


class LeaseRecovery:
    name = "lease_recovery"

    def __init__(self, unit_of_work: UnitOfWork, config: LeaseRecoveryConfig):
        self.unit_of_work = unit_of_work
        self.config = config
        self._succeeding_since: float | None = float("-inf")  # None: the last round failed

    def run_once(self) -> dict[str, int]:
        try:
            # the fresh inspect messages are published after COMMIT, not at the next relay tick
            with self.unit_of_work.begin() as work:
                if self._settled():
                    counts = states.recover_expired(work.conn, batch=self.config.batch, actor=identity("scheduler"))
                else:
                    counts = {"requeued": 0, "failed": 0,
                              "deferred": len(states.lapsed(work.conn, batch=self.config.batch))}
        except BaseException:
            self._succeeding_since = None
            raise
        if counts["requeued"] or counts["failed"]:
            log.info("expired leases: %(requeued)d requeued, %(failed)d failed", counts, extra=counts)
        return counts

    def _settled(self) -> bool:
        now = time.monotonic()
        if self._succeeding_since is None:
            self._succeeding_since = now
        return now - self._succeeding_since >= self.config.settle_seconds
