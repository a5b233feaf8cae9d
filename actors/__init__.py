"""Dramatiq actors: one per pipeline step, each a one-line hand-off to :class:`Workflow`.

Run with ``dramatiq actors`` (the Procfile's ``worker``). Importing this
module builds the broker from the environment and registers the actors.

Dramatiq's own retries (the ``Retries`` middleware, bounded by
``ATTACHE_BROKER_RETRIES``) are used only when a step could not record its
outcome at all, i.e. PostgreSQL was unreachable; after that the message is
dead-lettered to ``<queue>.XQ``. Errors whose class is not retryable
(poison messages, missing effects) are the actors' ``throws`` and go to
``.XQ`` at once, unprocessed.
"""

from __future__ import annotations

import sys

import dramatiq
from dramatiq.middleware import (
    CurrentMessage,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

from app.adapters.broker.dead_letter_recorder import DeadLetterRecorder
from app.adapters.broker.rabbitmq import AttacheBroker
from app.config import Settings
from app.core.steps import Step
from app.core.workflow import Workflow
from app.errors import NOT_RETRYABLE, ConfigError
from app.observability import logs
from app.services import Services

try:
    settings = Settings.from_env()
except ConfigError as exc:
    print(f"attache worker: configuration error: {exc}", file=sys.stderr)
    raise SystemExit(2)

logs.configure("worker")

services = Services(settings, pool_size=8)
broker = AttacheBroker(
    url=settings.broker_url,
    delivery_limit=settings.broker_delivery_limit,
    socket_timeout=settings.publish_timeout_seconds,
    middleware=[
        TimeLimit(time_limit=10 * 60 * 1000),
        ShutdownNotifications(),
        CurrentMessage(),
        # Dramatiq runs after_* hooks in reverse order: listed before Retries,
        # the recorder runs after it and sees its verdict (message.failed).
        DeadLetterRecorder(services.engine),
        Retries(max_retries=settings.broker_retries, min_backoff=settings.broker_min_backoff_ms,
                max_backoff=60_000),
    ],
)
services.__dict__["broker"] = broker  # the worker publishes follow-up messages through the same broker
dramatiq.set_broker(broker)
workflow = Workflow(services)



def _actor(step: Step):
    def run(payload):
        workflow.handle(payload, step=step)

    run.__name__ = step.actor
    return dramatiq.actor(run, actor_name=step.actor, queue_name=step.queue, throws=NOT_RETRYABLE)


inspect = _actor(Step.INSPECT)
render = _actor(Step.RENDER)
publish = _actor(Step.PUBLISH)
