"""The transactional outbox: every message is born as a row.

:func:`add` writes a row in the caller's transaction (the one that makes
the state change the message announces). After COMMIT the producer calls
:meth:`OutboxPublisher.publish` for the rows it wrote; a row is marked
``published_at`` only once RabbitMQ confirmed it. Rows left unmarked (the
broker was down, the process died between COMMIT and confirm) and rows
whose ``available_at`` lies in the future (managed retries) are published
by the scheduler's outbox relay (:meth:`OutboxPublisher.publish_due`).
Publishing a row twice is possible and harmless: consumers are idempotent.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Iterable

from dramatiq.message import Message
from sqlalchemy import func, insert, or_, select, text, update
from sqlalchemy.engine import Connection, Engine

from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import outbox
from app.core import messages
from app.core.steps import Step
from app.errors import BrokerUnavailable
from app.observability import telemetry

log = logging.getLogger("attache.outbox")


def add(conn: Connection, payload: dict, *, available_at: datetime | None = None) -> int:
    """Write one message to the outbox in the current transaction; returns its row id."""
    messages.validate(payload)
    step = Step(payload["step"])
    values = dict(job_id=uuid.UUID(payload["job_id"]), message_id=uuid.uuid4(), queue_name=step.queue,
                  actor_name=step.actor, payload=payload)
    if available_at is not None:
        values["available_at"] = available_at
    return conn.execute(insert(outbox).values(**values).returning(outbox.c.id)).scalar_one()


def to_message(row) -> Message:
    return Message(queue_name=row.queue_name, actor_name=row.actor_name, args=(row.payload,), kwargs={},
                   options={}, message_id=str(row.message_id))


class OutboxPublisher:
    def __init__(self, engine: Engine, broker):
        self.engine = engine
        self.broker = broker

    def publish(self, ids: Iterable[int]) -> int:
        """Publish rows written by this producer right after its COMMIT.

        Rows not yet due are left to the scheduler. A broker failure is
        logged and left for the scheduler too: the work is already safe.
        Returns how many rows were confirmed.
        """
        ids = list(ids)
        if not ids:
            return 0
        with transaction(self.engine) as conn:
            rows = conn.execute(select(outbox).where(
                outbox.c.id.in_(ids), outbox.c.published_at.is_(None), outbox.c.available_at <= func.now(),
            ).order_by(outbox.c.id)).all()
        return self._send(rows)

    def publish_due(self, *, older_than_seconds: float, batch: int = 100) -> dict[str, int]:
        """Scheduler: publish unmarked rows older than the threshold, and delayed rows now due."""
        with transaction(self.engine) as conn:
            rows = conn.execute(
                select(outbox).where(
                    outbox.c.published_at.is_(None),
                    outbox.c.available_at <= func.now(),
                    or_(outbox.c.available_at > outbox.c.created_at,
                        outbox.c.created_at <= func.now() - text(f"interval '{float(older_than_seconds):.3f} seconds'")),
                ).order_by(outbox.c.available_at, outbox.c.id).limit(batch).with_for_update(skip_locked=True)
            ).all()
            published = self._send(rows, conn=conn)
        return {"published": published, "pending": len(rows) - published}

    def _send(self, rows, conn: Connection | None = None) -> int:
        published = 0
        for row in rows:
            try:
                with telemetry.producing(row.payload, row.queue_name, str(row.message_id)):
                    self.broker.enqueue(to_message(row))
            except BrokerUnavailable as exc:
                log.warning("outbox row %s not published: %s", row.id, exc, extra={"outbox_id": row.id})
                self._mark(conn, row.id, error=str(exc))
                break
            self._mark(conn, row.id)
            published += 1
        return published

    def _mark(self, conn: Connection | None, row_id: int, *, error: str | None = None) -> None:
        values = {"publish_attempts": outbox.c.publish_attempts + 1}
        if error is None:
            values["published_at"] = func.now()
            values["last_error"] = None
        else:
            values["last_error"] = error[:500]
        statement = update(outbox).where(outbox.c.id == row_id).values(**values)
        if conn is not None:
            conn.execute(statement)
        else:
            with transaction(self.engine) as own:
                own.execute(statement)


def status(conn: Connection) -> dict:
    row = conn.execute(select(
        func.count().label("pending"),
        func.min(outbox.c.created_at).label("oldest"),
        func.extract("epoch", func.now() - func.min(outbox.c.created_at)).label("oldest_age_seconds"),
    ).where(outbox.c.published_at.is_(None))).one()
    return {"pending": row.pending, "oldest_created_at": row.oldest.isoformat() if row.oldest else None,
            "oldest_age_seconds": float(row.oldest_age_seconds or 0.0)}
