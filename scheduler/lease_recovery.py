"""Lease recovery: ``processing`` jobs whose lease expired go back to ``queued``.

Their worker died or hangs. The attempt is counted; a job whose attempts
are spent ends ``failed`` with ``worker_lost`` (a file that kills every
worker must not loop). Safe with two schedulers (``SKIP LOCKED``).

A lease also lapses when its heartbeat cannot be written: PostgreSQL
down, read-only, frozen or out of disk for longer than the lease. Its
step lives and may go on (``states.held_by``), so leases are taken back
only by a scheduler that has watched PostgreSQL take its batches without
a break for ``settle_seconds`` (the scheduler passes a third of the lease:
the heartbeat's period; a missed beat is tried again every second). A
break is a batch that failed, a batch that took longer than that (a
frozen server answers late: the batch hangs, then succeeds), a gap
between rounds longer than that and than one and a half of the
scheduler's intervals (the scheduler itself paused), or a scheduler just
started. Meanwhile a round counts the lapsed leases it leaves as
``deferred``.
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
    #: leases a transaction takes back; ``run_once`` goes on with the next batch while a batch was full, up to
    #: ``max_batches`` (one batch a round took 2,000 lapsed leases back in 223 s, ten a second, while the workers
    #: stood idle: an adversarial run)
    batch: int = 100
    max_batches: int = 50
    #: how long this scheduler must have watched PostgreSQL take its batches without a break before it takes a
    #: lapsed lease back (0: at once)
    settle_seconds: float = 0.0
    #: the scheduler's interval between rounds: a gap between rounds is a break only past the longer of it and
    #: the settle time, with half of it to spare (an interval longer than the settle time made every gap a break,
    #: and no lease was ever taken back: an adversarial run)
    interval_seconds: float = 0.0


class LeaseRecovery:
    name = "lease_recovery"

    def __init__(self, unit_of_work: UnitOfWork, config: LeaseRecoveryConfig):
        self.unit_of_work = unit_of_work
        self.config = config
        self._last_round: float | None = None  # when the last round committed; None: none yet, or it failed
        self._watching_since = 0.0

    def run_once(self) -> dict[str, int]:
        counts = {"requeued": 0, "failed": 0}
        try:
            for _ in range(self.config.max_batches):
                # each batch is watched on its own: a round of many quick batches counted as one that took long,
                # a break, and waited out the settle time again (a re-attack); the fresh inspect messages are
                # published after each batch's COMMIT, not at the next relay tick
                began = time.monotonic()
                with self.unit_of_work.begin() as work:
                    lost = states.lapsed(work.conn, batch=self.config.batch)
                    watched = self._watched(began)
                    if watched:
                        for outcome, n in states.take_back(work.conn, lost, actor=identity("scheduler")).items():
                            counts[outcome] += n
                    else:
                        counts["deferred"] = len(lost)
                self._last_round = time.monotonic()
                if not watched or len(lost) < self.config.batch:
                    break
        except BaseException:
            self._last_round = None
            raise
        if counts["requeued"] or counts["failed"]:
            log.info("expired leases: %(requeued)d requeued, %(failed)d failed", counts, extra=counts)
        return counts

    def _watched(self, began: float) -> bool:
        """Whether batches have succeeded without a break for ``settle_seconds``, this one included so far."""
        now, settle = time.monotonic(), self.config.settle_seconds
        gap = max(settle, 1.5 * self.config.interval_seconds)
        if self._last_round is None or began - self._last_round > gap or now - began > settle:
            self._watching_since = now
        return now - self._watching_since >= settle
