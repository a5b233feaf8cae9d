"""The transactional outbox: every message is born as a row.

:func:`announce` builds a job's next message and :func:`add` writes it in
the caller's transaction (the one that makes the state change the message
announces). A :class:`~app.core.unit_of_work.UnitOfWork` collects the rows
written in its transaction (:func:`collecting`, as :class:`Written`) and,
after COMMIT, hands them to :meth:`OutboxPublisher.publish_written`, which
sends them together without reading them back; a row is marked
``published_at`` only once RabbitMQ confirmed it. Rows left unmarked (the
broker was down, the process died between COMMIT and confirm) and rows whose
``available_at`` lies in the future (managed retries) are published by the
scheduler's outbox relay (:meth:`OutboxPublisher.publish_due`). Publishing
a row twice is possible and harmless: consumers are idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Iterator

from dramatiq.message import Message
from sqlalchemy import bindparam, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Engine

from app.adapters.postgres.db import interval, transaction
from app.adapters.postgres.models import outbox
from app.core import messages
from app.core.steps import Step
from app.observability import telemetry
from app.observability.tracing import child_of

log = logging.getLogger("attache.outbox")


@dataclass(frozen=True)
class Written:
    """An outbox row as its transaction wrote it, so its producer publishes it after COMMIT without reading it back."""

    id: int
    message_id: uuid.UUID
    queue_name: str
    actor_name: str
    payload: dict
    #: ``False`` for a row with a future ``available_at`` (a managed retry): the relay publishes it when due
    due: bool
    #: a row the producer wrote is not claimed by a relay (the rows a relay claims have their claim's end here)
    claimed_until: None = None


#: the transaction a unit of work has open in this thread, and the outbox rows written in it so far
_written: ContextVar[tuple[Connection, list[Written]] | None] = ContextVar("attache_outbox_written", default=None)


@contextlib.contextmanager
def collecting(conn: Connection) -> Iterator[list[Written]]:
    """The outbox rows :func:`add` writes in ``conn``'s transaction while the block runs."""
    written: list[Written] = []
    token = _written.set((conn, written))
    try:
        yield written
    finally:
        _written.reset(token)


#: built once (see app.core.states): the statements every step runs
_INSERT = insert(outbox).returning(outbox.c.id)
_UNSENT = select(outbox).where(outbox.c.id.in_(bindparam("b_ids", expanding=True)), outbox.c.published_at.is_(None),
                               outbox.c.available_at <= func.now(),
                               or_(outbox.c.claimed_until.is_(None), outbox.c.claimed_until <= func.now())
                               ).order_by(outbox.c.id)
#: a row another producer (the relay) published meanwhile keeps its first publication, and its claim
_MARKED = outbox.c.id.in_(bindparam("b_ids", expanding=True)) & outbox.c.published_at.is_(None)
_MARK_PUBLISHED = update(outbox).where(_MARKED).values(
    publish_attempts=outbox.c.publish_attempts + 1, claimed_until=None, published_at=func.now(), last_error=None)
_MARK_FAILED = update(outbox).where(_MARKED).values(
    publish_attempts=outbox.c.publish_attempts + 1, last_error=bindparam("b_error"))


def add(conn: Connection, payload: dict, *, available_at: datetime | None = None) -> int:
    """Write one message to the outbox in the current transaction; returns its row id."""
    return _insert(conn, messages.validate(payload), available_at)


def _insert(conn: Connection, payload: dict, available_at: datetime | None) -> int:
    step = Step(payload["step"])
    values = dict(job_id=uuid.UUID(payload["job_id"]), message_id=uuid.uuid4(), queue_name=step.queue,
                  actor_name=step.actor, payload=payload)
    if available_at is not None:
        values["available_at"] = available_at
    row_id = conn.execute(_INSERT, values).scalar_one()
    collector = _written.get()
    if collector is not None and collector[0] is conn:
        due = available_at is None  # a delayed message is the relay's, which compares on the database's clock
        collector[1].append(Written(row_id, values["message_id"], step.queue, step.actor, payload, due))
    return row_id


def announce(conn: Connection, job: Any, attempt: int, step: Step, *, variant: str | None = None,
             available_at: datetime | None = None) -> int:
    """The one message builder: ``job``'s message for ``step`` of ``attempt``, written to the outbox.

    ``job`` is a row of ``jobs`` (``id``, ``attachment_id``, ``pipeline_version``,
    ``traceparent``, ``tracestate``); the message continues the job's trace.
    Returns the outbox row id.
    """
    payload = messages.build(job_id=job.id, attachment_id=job.attachment_id, pipeline_version=job.pipeline_version,
                             attempt=attempt, step=step, variant=variant, traceparent=child_of(job.traceparent),
                             tracestate=job.tracestate)
    return _insert(conn, payload, available_at)  # messages.build validated it


def to_message(row) -> Message:
    return Message(queue_name=row.queue_name, actor_name=row.actor_name, args=(row.payload,), kwargs={},
                   options={}, message_id=str(row.message_id))


class OutboxPublisher:
    def __init__(self, engine: Engine, broker):
        self.engine = engine
        self.broker = broker

    def publish(self, ids: Iterable[int]) -> int:
        """Publish the rows ``ids`` that are still unpublished, due and unclaimed, read back first.

        Rows not yet due are left to the scheduler; so are rows the relay
        published or claimed meanwhile. A broker failure is logged and left
        for the scheduler too: the work is already safe. Returns how many
        rows were confirmed.
        """
        return self.send(self.unsent(ids))

    def unsent(self, ids: Iterable[int]) -> list:
        """The rows ``ids`` still unpublished, due and unclaimed, read back."""
        ids = list(ids)
        if not ids:
            return []
        with transaction(self.engine) as conn:
            return conn.execute(_UNSENT, {"b_ids": ids}).all()

    def publish_written(self, rows: list[Written]) -> int:
        """Publish the rows a unit of work wrote, right after its COMMIT, as it wrote them (not read back).

        A row not yet due is left to the relay. Returns how many were confirmed.
        """
        return self.send([row for row in rows if row.due])

    def publish_due(self, *, older_than_seconds: float, batch: int = 100,
                    claim_seconds: float = 60.0) -> dict[str, int]:
        """Scheduler: publish unmarked rows older than the threshold, and delayed rows now due.

        No row lock is held while RabbitMQ is waited on. The batch is claimed
        in a short transaction (rows taken ``FOR UPDATE SKIP LOCKED``, their
        ``claimed_until`` set ``claim_seconds`` ahead) that commits before
        the first publish; each row is then marked after its own confirm.
        Another relay skips a claimed row until the claim lapses, so a relay
        that dies mid-batch delays its rows by ``claim_seconds`` at most, and
        a broker failure releases the claims of the rows it did not send.
        """
        due = select(outbox.c.id).where(
            outbox.c.published_at.is_(None),
            outbox.c.available_at <= func.now(),
            or_(outbox.c.claimed_until.is_(None), outbox.c.claimed_until <= func.now()),
            or_(outbox.c.available_at > outbox.c.created_at,
                outbox.c.created_at <= func.now() - interval(older_than_seconds)),
        ).order_by(outbox.c.available_at, outbox.c.id).limit(batch).with_for_update(skip_locked=True)
        with transaction(self.engine) as conn:
            rows = conn.execute(update(outbox).where(outbox.c.id.in_(due.scalar_subquery()))
                                .values(claimed_until=func.now() + interval(claim_seconds)).returning(outbox)).all()
        published = self.send(sorted(rows, key=lambda row: (row.available_at, row.id)))
        return {"published": published, "pending": len(rows) - published}

    def send(self, rows) -> int:
        """Publish ``rows`` together and wait for their confirms together; the rows after a failure are not sent.

        The broker confirms the batch in order up to its first failure
        (``enqueue_many``). The confirmed rows are marked together in one
        transaction (:meth:`_mark`): one commit for a step's whole fan-out,
        not one per message. The first row not confirmed gets the error; the
        claims of the rows after it are released.
        """
        if not rows:
            return 0
        with contextlib.ExitStack() as spans:
            for row in rows:
                spans.enter_context(telemetry.producing(row.payload, row.queue_name, str(row.message_id)))
            sent, error = self.broker.enqueue_many([to_message(row) for row in rows])
        self._mark([row.id for row in rows[:sent]])
        if error is not None:
            failed = rows[sent]
            log.warning("outbox row %s not published: %s", failed.id, error, extra={"outbox_id": failed.id})
            self._mark([failed.id], error=str(error))
            self._release([row.id for row in rows[sent:] if row.claimed_until is not None])
        return sent

    def _mark(self, row_ids: list[int], *, error: str | None = None) -> None:
        """One publish attempt of each unpublished row: published (confirmed; its claim ends) or its error.

        The commit does not wait for the WAL flush (``synchronous_commit =
        off``): a mark lost in a PostgreSQL crash leaves its row unmarked, and
        the relay publishes it again, which consumers take as a duplicate.
        Nothing else is written in this transaction.
        """
        if not row_ids:
            return
        with transaction(self.engine) as conn:
            conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            if error is None:
                conn.execute(_MARK_PUBLISHED, {"b_ids": row_ids})
            else:
                conn.execute(_MARK_FAILED, {"b_ids": row_ids, "b_error": error[:500]})

    def _release(self, row_ids: list[int]) -> None:
        """Claimed rows not sent: due again at the relay's next round."""
        if row_ids:
            with transaction(self.engine) as conn:
                conn.execute(update(outbox).where(outbox.c.id.in_(row_ids)).values(claimed_until=None))


def status(conn: Connection) -> dict:
    row = conn.execute(select(
        func.count().label("pending"),
        func.min(outbox.c.created_at).label("oldest"),
        func.extract("epoch", func.now() - func.min(outbox.c.created_at)).label("oldest_age_seconds"),
    ).where(outbox.c.published_at.is_(None))).one()
    return {"pending": row.pending, "oldest_created_at": row.oldest.isoformat() if row.oldest else None,
            "oldest_age_seconds": float(row.oldest_age_seconds or 0.0)}
