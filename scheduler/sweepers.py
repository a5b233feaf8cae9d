"""Every maintenance service of the scheduler, built from the process's :class:`~app.services.Services`.

The one place their configs are made from :class:`~app.config.Settings`
(and each service's interval): ``python -m scheduler`` runs them all,
``attache gc run`` runs the two storage cleanups once.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core import states
from app.core.retry import RetryPolicy
from app.core.webhooks import Deliverer, DelivererConfig
from app.services import Services
from scheduler import embedded_database
from scheduler.counter_fold import CounterFold
from scheduler.delivery_retention import DeliveryRetention, DeliveryRetentionConfig
from scheduler.lease_recovery import LeaseRecovery, LeaseRecoveryConfig
from scheduler.object_gc import ObjectGc, ObjectGcConfig
from scheduler.outbox_relay import OutboxRelay, OutboxRelayConfig
from scheduler.reconciler import Reconciler, ReconcilerConfig
from scheduler.retirement import Retirement, RetirementConfig
from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig

#: the storage cleanups ``attache gc run`` runs on demand
CLEANUPS = (StagingCleanup.name, ObjectGc.name)


@dataclass(frozen=True)
class Sweeper:
    """A maintenance service (``name``, ``run_once()``) and how often the scheduler runs it."""

    service: object
    interval_seconds: float


def sweepers(services: Services) -> list[Sweeper]:
    settings = services.settings
    engine, storage = services.engine, services.storage
    kept = [Sweeper(embedded_database.EmbeddedDatabase(settings.data_dir), embedded_database.INTERVAL_SECONDS)] \
        if settings.embedded_database else []
    return kept + [
        Sweeper(OutboxRelay(services.publisher,
                            OutboxRelayConfig(publish_after_seconds=settings.outbox_publish_after_seconds)),
                settings.outbox_interval_seconds),
        Sweeper(LeaseRecovery(services.unit_of_work, LeaseRecoveryConfig(
            settle_seconds=states.heartbeat_seconds(settings.lease_seconds),
            interval_seconds=settings.lease_interval_seconds)), settings.lease_interval_seconds),
        Sweeper(Reconciler(services.unit_of_work, services.broker,
                           ReconcilerConfig(after_seconds=settings.reconcile_after_seconds)),
                settings.reconcile_interval_seconds),
        Sweeper(StagingCleanup(engine, storage, StagingCleanupConfig(
            grace_seconds=settings.staging_grace_seconds, failed_retention_seconds=settings.failed_retention_seconds)),
                settings.cleanup_interval_seconds),
        Sweeper(ObjectGc(engine, storage, ObjectGcConfig(
            grace_seconds=settings.object_grace_seconds,
            decision_grace_seconds=settings.object_decision_grace_seconds)), settings.cleanup_interval_seconds),
        Sweeper(Retirement(engine, storage, RetirementConfig(grace_seconds=settings.retire_grace_seconds)),
                settings.cleanup_interval_seconds),
        Sweeper(Deliverer(engine, webhook_config(settings)), settings.webhook_interval_seconds),
        Sweeper(DeliveryRetention(engine, DeliveryRetentionConfig(
            retention_seconds=settings.webhook_delivery_retention_seconds)), settings.cleanup_interval_seconds),
        Sweeper(CounterFold(engine), settings.counter_fold_interval_seconds),
    ]


def webhook_config(settings) -> DelivererConfig:
    """How the ``webhooks`` service delivers (``ATTACHE_WEBHOOK_*``)."""
    return DelivererConfig(
        timeout_seconds=settings.webhook_timeout_seconds, concurrency=settings.webhook_concurrency,
        max_attempts=settings.webhook_max_attempts, allow_private=settings.webhook_allow_private,
        policy=RetryPolicy(initial_interval=settings.webhook_retry_initial_seconds,
                           max_interval=max(settings.webhook_retry_max_seconds, settings.webhook_retry_initial_seconds)))


def cleanups(services: Services) -> list:
    """The storage cleanups, configured as the scheduler runs them."""
    return [sweeper.service for sweeper in sweepers(services) if sweeper.service.name in CLEANUPS]
