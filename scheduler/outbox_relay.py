"""Outbox relay: publishes rows no producer managed to publish, and delayed rows when due.

Safe with two schedulers: each batch is claimed (``FOR UPDATE SKIP LOCKED``,
then ``outbox.claimed_until``) and committed before anything is published,
so no row lock is held while RabbitMQ is waited on, and the other relay
skips the claimed rows (:meth:`app.core.outbox.OutboxPublisher.publish_due`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.core.outbox import OutboxPublisher

log = logging.getLogger("attache.scheduler.outbox")


@dataclass(frozen=True)
class OutboxRelayConfig:
    #: a row unmarked for this long is taken to be abandoned by its producer
    publish_after_seconds: float = 10.0
    #: rows per batch; ``run_once`` loops over batches until none is left or the broker fails
    batch: int = 100
    max_batches: int = 50
    #: how long a claimed batch is this relay's alone; a relay that dies mid-batch delays its rows this long
    claim_seconds: float = 60.0


class OutboxRelay:
    name = "outbox_relay"

    def __init__(self, publisher: OutboxPublisher, config: OutboxRelayConfig):
        self.publisher = publisher
        self.config = config

    def run_once(self) -> dict[str, int]:
        totals = {"published": 0, "pending": 0}
        for _ in range(self.config.max_batches):
            counts = self.publisher.publish_due(older_than_seconds=self.config.publish_after_seconds,
                                                batch=self.config.batch, claim_seconds=self.config.claim_seconds)
            totals["published"] += counts["published"]
            totals["pending"] = counts["pending"]
            if counts["pending"] or counts["published"] < self.config.batch:
                break
        if totals["published"] or totals["pending"]:
            log.info("outbox relay published %(published)d, %(pending)d left pending", totals, extra=totals)
        return totals
