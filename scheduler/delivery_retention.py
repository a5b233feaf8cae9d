"""Delivery retention: delivered webhook deliveries, deleted some time after they were delivered.

``webhook_deliveries`` gets a row per event and subscription that wants it
(about 390 bytes; 0.8 MB an event at 2,000 subscriptions), and had kept
every one for ever. A delivered one is deleted
``ATTACHE_WEBHOOK_DELIVERY_RETENTION_SECONDS`` (7 days by default) after it
was delivered, oldest first (``webhook_deliveries_delivered_idx``).
Pending deliveries are the deliverer's and failed ones the operator's (to
redeliver): both are kept. What a receiver sees does not change: a
subscription's sequence is its own counter (``last_sequence``), never
counted from these rows, and an event stays in ``events`` for the replay
cursor. Safe with two schedulers: each deletes rows it could lock
(``SKIP LOCKED``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.engine import Engine

from app.adapters.postgres.db import interval, transaction
from app.adapters.postgres.models import webhook_deliveries, webhook_subscriptions
from app.core.webhooks import DELIVERED

log = logging.getLogger("attache.scheduler.delivery_retention")


def expired_query(retention_seconds: float, batch: int):
    """Up to ``batch`` deliveries delivered more than ``retention_seconds`` ago, oldest first (locked, skipping
    locked ones). Not those of a disabled subscription's events after the counter its disable read: ``enable``
    makes a delivery for each such event that has none, and an event's delivery sent just before its disable
    committed (the disable read the counter before the event's COMMIT) was deleted here and sent again under a
    new sequence (a re-attack)."""
    subscription = webhook_subscriptions
    kept_for_enable = (select(subscription.c.id)
                       .where(subscription.c.id == webhook_deliveries.c.subscription_id,
                              subscription.c.disabled_at.is_not(None),
                              webhook_deliveries.c.event_sequence > subscription.c.disabled_after_event)
                       .exists())
    return (select(webhook_deliveries.c.id)
            .where(webhook_deliveries.c.state == DELIVERED,
                   webhook_deliveries.c.delivered_at < func.now() - interval(retention_seconds),
                   ~kept_for_enable)
            .order_by(webhook_deliveries.c.delivered_at).limit(batch)
            .with_for_update(of=webhook_deliveries, skip_locked=True))


@dataclass(frozen=True)
class DeliveryRetentionConfig:
    retention_seconds: float = 7 * 24 * 3600.0
    #: rows deleted a transaction; a round goes on while batches come back full, up to ``max_batches``
    batch: int = 1_000
    max_batches: int = 100


class DeliveryRetention:
    name = "delivery_retention"

    def __init__(self, engine: Engine, config: DeliveryRetentionConfig = DeliveryRetentionConfig()):
        self.engine = engine
        self.config = config

    def run_once(self) -> dict[str, int]:
        deleted = 0
        for _ in range(self.config.max_batches):
            with transaction(self.engine) as conn:
                gone = conn.execute(delete(webhook_deliveries).where(webhook_deliveries.c.id.in_(
                    expired_query(self.config.retention_seconds, self.config.batch).scalar_subquery()))).rowcount
            deleted += gone
            if gone < self.config.batch:
                break
        if deleted:
            log.info("deleted %(deleted)d webhook deliveries delivered past their retention", {"deleted": deleted},
                     extra={"deleted": deleted})
        return {"deleted": deleted}
