"""What operators can see and do, shared by ``/v1/ops`` and the ``attache`` command."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select

from app.adapters.postgres import audit
from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import JobState, job_history, jobs
from app.adapters.postgres.models import outbox as outbox_table
from app.core import outbox, states
from app.errors import AttacheError, JobConflict, JobNotFound, MissingReason
from app.services import Services


def _iso(value):
    return value.isoformat() if value is not None else None


def job_summary(row) -> dict:
    return {
        "job_id": str(row.id), "attachment_id": str(row.attachment_id), "pipeline_version": row.pipeline_version,
        "state": row.state, "attempt": row.attempt, "max_attempts": row.max_attempts,
        "error_code": row.error_code, "error_reason": row.error_reason, "lease_owner": row.lease_owner,
        "lease_expires_at": _iso(row.lease_expires_at), "next_attempt_at": _iso(row.next_attempt_at),
        "created_at": _iso(row.created_at), "updated_at": _iso(row.updated_at), "ready_at": _iso(row.ready_at),
    }


def list_jobs(services: Services, *, state: str | None = None, pipeline_version: int | None = None,
              limit: int = 100) -> list[dict]:
    if state is not None and state not in set(JobState):
        raise ValueError(f"state must be one of {', '.join(JobState)}")
    query = select(jobs).order_by(jobs.c.updated_at.desc()).limit(max(1, min(limit, 1000)))
    if state is not None:
        query = query.where(jobs.c.state == state)
    if pipeline_version is not None:
        query = query.where(jobs.c.pipeline_version == pipeline_version)
    with transaction(services.engine) as conn:
        return [job_summary(row) for row in conn.execute(query)]


def show_job(services: Services, job_id: uuid.UUID) -> dict:
    with transaction(services.engine) as conn:
        row = states.get(conn, job_id)
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        history = conn.execute(select(job_history).where(job_history.c.job_id == job_id)
                               .order_by(job_history.c.id)).all()
        audits = audit.for_target(conn, f"job:{job_id}")
    return {
        **job_summary(row),
        "trace": {"traceparent": row.traceparent, "tracestate": row.tracestate},
        "history": [{"at": _iso(h.at), "from": h.from_state, "to": h.to_state, "attempt": h.attempt,
                     "who": h.actor, "error_code": h.error_code, "reason": h.reason} for h in history],
        "audit": audits,
    }


def replay(services: Services, job_id: uuid.UUID, *, operator: str, reason: str | None) -> dict:
    """failed -> queued with a fresh attempt budget; the audit entry names the operator and the reason."""
    reason = (audit.clean(reason) or "").strip()
    if not reason:
        raise MissingReason("a replay needs a reason")
    with transaction(services.engine) as conn:
        current = states.get(conn, job_id, lock=True)
        if current is None:
            raise JobNotFound(f"no job {job_id}")
        row = states.replay(conn, job_id, actor=f"operator:{operator}", reason=reason[:1000],
                            budget=services.settings.max_attempts)
        if row is None:
            raise JobConflict(f"job {job_id} is {current.state}, only a failed job can be replayed")
        audit.record(conn, actor=f"operator:{operator}", action="job.replay", target=f"job:{job_id}",
                     reason=reason[:1000], details={"previous_error_code": current.error_code,
                                                    "attempt": current.attempt})
        pending = conn.execute(select(outbox_table.c.id).where(
            outbox_table.c.job_id == job_id, outbox_table.c.published_at.is_(None))).scalars().all()
    try:
        services.publisher.publish(pending)
    except AttacheError:
        pass  # the scheduler publishes it
    return show_job(services, job_id)


def outbox_status(services: Services) -> dict:
    with transaction(services.engine) as conn:
        return outbox.status(conn)


def lease_status(services: Services) -> dict:
    with transaction(services.engine) as conn:
        row = conn.execute(select(
            func.count().label("processing"),
            func.count().filter(states.expired()).label("expired"),
            func.min(jobs.c.lease_expires_at).filter(jobs.c.lease_owner.is_not(None)).label("next_expiry"),
        ).where(jobs.c.state == JobState.PROCESSING)).one()
    return {"processing": row.processing, "expired": row.expired, "next_expiry": _iso(row.next_expiry)}


def counts_by_state(services: Services) -> list[dict]:
    with transaction(services.engine) as conn:
        rows = conn.execute(select(jobs.c.pipeline_version, jobs.c.state, func.count())
                            .group_by(jobs.c.pipeline_version, jobs.c.state)
                            .order_by(jobs.c.pipeline_version, jobs.c.state)).all()
    return [{"pipeline_version": v, "state": s, "count": c} for v, s, c in rows]
