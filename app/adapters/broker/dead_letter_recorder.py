"""Recording why a message was dead-lettered, in PostgreSQL.

Dramatiq's dead letters carry no failure details. When Dramatiq gives up on
a message (a poison message in ``throws``, or its bounded retries spent
while PostgreSQL was down) this middleware writes what an operator needs:
the message id, queue, actor, job, error code and a sanitized reason. If
PostgreSQL is still unreachable the record is logged instead; the message
itself is in ``<queue>.XQ`` either way.
"""

from __future__ import annotations

import logging
import uuid

from dramatiq.brokers.rabbitmq import q_name
from dramatiq.middleware import Middleware
from sqlalchemy import insert

from app.adapters.postgres import audit
from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import dead_letters
from app.errors import error_code, sanitized_reason

log = logging.getLogger("attache.dead_letters")


def job_id_of(body) -> uuid.UUID | None:
    """The job a message body names, if it names one."""
    try:
        return uuid.UUID(str(body["job_id"]))
    except (KeyError, TypeError, ValueError):
        return None


def _storable(value):
    """A JSON value as JSONB can hold it (:func:`~app.adapters.postgres.audit.storable` on every string)."""
    if isinstance(value, str):
        return audit.storable(value)
    if isinstance(value, list):
        return [_storable(item) for item in value]
    if isinstance(value, dict):
        return {audit.storable(str(key)): _storable(item) for key, item in value.items()}
    return value


class DeadLetterRecorder(Middleware):
    """Must run its ``after_process_message`` after ``Retries`` decided the message failed.

    Dramatiq calls ``after_*`` hooks in reverse list order, so list it
    *before* ``Retries``.
    """

    def __init__(self, engine):
        self.engine = engine

    def after_process_message(self, broker, message, *, result=None, exception=None):
        if exception is None or not message.failed:
            return
        body = message.args[0] if message.args else None
        record = dict(  # the id and body as anyone may have published them: a NUL in either lost the record
            message_id=audit.storable(str(message.message_id), printable=True), queue_name=message.queue_name,
            actor_name=message.actor_name, job_id=job_id_of(body), error_code=error_code(exception),
            reason=sanitized_reason(exception), retries=message.options.get("retries", 0),
            body=_storable(body) if isinstance(body, (dict, list, str, int, float)) else None,
        )
        _keep_its_xq(broker, message.queue_name)
        try:
            with transaction(self.engine) as conn:
                conn.execute(insert(dead_letters).values(**record))
        except Exception:
            log.error("dead letter not recorded in PostgreSQL", extra={k: str(v) for k, v in record.items()
                                                                       if k != "body"})
            return
        log.warning("message dead-lettered: %s", record["reason"],
                    extra={"message_id": record["message_id"], "error_code": record["error_code"]})


def _keep_its_xq(broker, queue_name: str) -> None:
    """Declare the dead-letter queue the message is about to be rejected to, on RabbitMQ, where the worker rejects
    it next (``queue_declare`` of a queue that exists changes nothing). Declared only with its queue, at a
    process's start, an ``<queue>.XQ`` deleted under running workers (by an operator, or lost with a node) was
    gone until they restarted: RabbitMQ dropped every message rejected to it, while its ``dead_letters`` row was
    written and the dead-letter list said the queue held 0 (an adversarial run). One round trip a dead letter."""
    declare = getattr(broker, "_declare_xq_queue", None)  # RabbitMQ's; the PostgreSQL broker keeps its own rows
    if declare is None:
        return
    try:
        declare(q_name(queue_name))
    except Exception as exc:  # RabbitMQ unreachable: the reject fails too, and the message comes back
        log.warning("could not declare the dead-letter queue of %s: %s", queue_name, exc)
