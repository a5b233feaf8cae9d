"""Reconciler: a job whose message was lost is announced again.

The outbox guarantees a message reaches RabbitMQ; it cannot guarantee the
message is ever *consumed*. A message can leave the broker without moving
its job: Dramatiq dead-letters it to ``.XQ`` when PostgreSQL stays down
longer than the retry budget, an operator purges a queue, a broker loses
its data. Lease recovery covers a step that dies or hangs while it runs
(its lease runs out); nothing else covers a ``queued`` job whose
announcement is gone, or a ``processing`` job waiting between steps for a
render or publish message that is gone.

This service finds every such job with no live path forward (no
unpublished outbox row, no step holding the lease, nothing announced for
``ATTACHE_RECONCILE_AFTER_SECONDS`` doubling with each re-announcement)
and writes a fresh inspect message to the outbox for it, with a
self-loop history row, then publishes it. It acts only while the step
queues hold no ready message: during a backlog a job's message may simply
be waiting, and a duplicate would only lengthen the backlog (each
re-announced inspect announces the job's unrecorded renders again). A
stranded job is therefore re-announced once the backlog has drained. See
:func:`app.core.states.reannounce_stranded`. Safe with two schedulers
(``SKIP LOCKED``). ``/metrics`` counts the re-announcements as
``attache_reconciler_reannounced_total``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.core import states
from app.core.identity import identity
from app.core.steps import Step
from app.core.unit_of_work import UnitOfWork
from app.errors import BrokerUnavailable

log = logging.getLogger("attache.scheduler.reconciler")


@dataclass(frozen=True)
class ReconcilerConfig:
    #: a job with nothing announced and no activity for this long may be stranded
    #: (keep it longer than Dramatiq's retry budget)
    after_seconds: float = 300.0
    #: the threshold doubles with each re-announcement of the same attempt, at most this many times
    max_doublings: int = 6
    #: jobs per batch; ``run_once`` loops over batches until none is left
    batch: int = 500
    max_batches: int = 20

    def __post_init__(self) -> None:
        if self.after_seconds < 0 or self.max_doublings < 0 or self.batch < 1 or self.max_batches < 1:
            raise ValueError(f"invalid reconciler config: {self}")


class Reconciler:
    name = "reconciler"

    def __init__(self, unit_of_work: UnitOfWork, broker, config: ReconcilerConfig):
        self.unit_of_work = unit_of_work
        self.broker = broker
        self.config = config

    def run_once(self) -> dict[str, int]:
        counts = {"reannounced": 0, "published": 0, "backlog": 0, "skipped": 0}
        try:
            counts["backlog"] = self._backlog()
        except BrokerUnavailable as exc:  # nothing could be published anyway
            log.info("reconciler skipped a round: %s", exc)
            counts["skipped"] = 1
            return counts
        if counts["backlog"]:
            # a message waiting in a queue is not lost: announcing again would only add to the backlog
            return counts
        for _ in range(self.config.max_batches):
            with self.unit_of_work.begin() as work:  # published after COMMIT
                ids = states.reannounce_stranded(work.conn, after_seconds=self.config.after_seconds,
                                                 max_doublings=self.config.max_doublings,
                                                 batch=self.config.batch, actor=identity("scheduler"))
            counts["reannounced"] += len(ids)
            counts["published"] += work.published
            if len(ids) < self.config.batch:
                break
        if counts["reannounced"]:
            log.warning("re-announced %(reannounced)d stranded job(s); %(published)d published now",
                        counts, extra=counts)
        return counts

    def _backlog(self) -> int:
        """Messages ready in the step queues (not yet delivered to any worker)."""
        return sum(self.broker.queue_depth(step.queue) or 0 for step in Step)
