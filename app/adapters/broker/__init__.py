"""The broker of the deployment, chosen by ``BROKER_URL``: RabbitMQ (``amqp://``) or PostgreSQL.

:func:`broker_from_settings` and :func:`dead_letters_from_settings` are the
only places that choose; everything above them (the outbox, the actors,
the reconciler, ``/readyz``, ``attache dlq``, ``/v1/ops/dlq``, the console)
uses what they return through one interface: a Dramatiq broker with
``enqueue`` (raising :class:`~app.errors.BrokerUnavailable`),
``queue_depth`` and ``ping``, and dead-letter tools with ``queues``,
``messages``, ``listing``, ``requeue`` and ``purge``.
"""

from __future__ import annotations

from typing import Iterable


def broker_from_settings(settings, url: str, *, middleware: list | None = None,
                         answer_deadline: tuple[float, str] | None = None):
    """The Dramatiq broker of ``settings.broker_kind`` at ``url`` (the resolved ``BROKER_URL``).
    ``answer_deadline``: the seconds a PostgreSQL broker's connection waits at most for an answer, and the setting
    that says so (None: no deadline)."""
    if settings.broker_kind == "rabbitmq":
        from app.adapters.broker.rabbitmq import AttacheBroker

        return AttacheBroker(url=url, delivery_limit=settings.broker_delivery_limit,
                             socket_timeout=settings.publish_timeout_seconds, middleware=middleware or [])
    from app.adapters.broker.postgres import PostgresBroker
    from app.adapters.postgres.liveness import AnswerWatch

    answer = None if answer_deadline is None else AnswerWatch(None, *answer_deadline)
    return PostgresBroker(url=url, delivery_limit=settings.broker_delivery_limit,
                          socket_timeout=settings.publish_timeout_seconds, middleware=middleware or [],
                          answer=answer)


def dead_letters_from_settings(settings, url: str, engine, *, queues: Iterable[str]):
    """The dead-letter tools of the broker ``broker_from_settings`` makes."""
    if settings.broker_kind == "rabbitmq":
        from app.adapters.broker.dead_letter_tools import RabbitDeadLetters

        return RabbitDeadLetters(url, engine, queues=queues, socket_timeout=settings.publish_timeout_seconds)
    from app.adapters.broker.postgres_dead_letters import PostgresDeadLetters

    return PostgresDeadLetters(url, engine, queues=queues, socket_timeout=settings.publish_timeout_seconds)
