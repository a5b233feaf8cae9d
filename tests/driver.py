"""Drive the pipeline steps in-process: deliver outbox messages to :class:`Workflow` by hand.

What a worker does, without RabbitMQ in between, so tests can run each step
in an exact order against the real PostgreSQL and storage.
"""

from __future__ import annotations

from sqlalchemy import func, select, update

from app.adapters.postgres.models import jobs, outbox
from app.core import intake
from app.web.spool import HashingSpool


def upload(services, path):
    spool = HashingSpool(10**9)
    spool.write(path.read_bytes())
    received = spool.finish()
    try:
        return intake.accept(services, received, filename=path.name, owner="t",
                             traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01", tracestate=None)
    finally:
        received.discard()


def take_messages(engine, job_id):
    """Unpublished, due outbox rows of a job, marked as published (we deliver them ourselves)."""
    with engine.begin() as conn:
        rows = conn.execute(select(outbox).where(outbox.c.job_id == job_id, outbox.c.published_at.is_(None),
                                                 outbox.c.available_at <= func.now()).order_by(outbox.c.id)).all()
        conn.execute(update(outbox).where(outbox.c.id.in_([r.id for r in rows])).values(published_at=func.now()))
    return [r.payload for r in rows]


def run(workflow, engine, job_id, limit=20):
    outcomes = []
    for _ in range(limit):
        payloads = take_messages(engine, job_id)
        if not payloads:
            break
        outcomes += [workflow.handle(p, step=p["step"]).status for p in payloads]
    return outcomes


def job(engine, job_id):
    with engine.connect() as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
