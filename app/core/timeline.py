"""What happened to one upload: an attachment with every pipeline version's job, each job's timeline.

A job's timeline is read from what PostgreSQL already keeps, in time order:

* ``job_history``: every transition, with who made it. Named by what it
  means: ``created``, ``claimed`` (a worker took attempt N), ``retry_scheduled``
  (a transient error: the code, the reason and when the next attempt is due,
  which is the ``available_at`` of that attempt's outbox message),
  ``lease_expired`` (the scheduler took an attempt back from a worker that died
  or hung), ``reannounced`` (the reconciler sent a lost message again),
  ``replayed`` (an operator, with the reason), ``ready``, ``failed``;
* ``step_runs``: every step, variant and attempt a worker ran, with its start,
  duration, worker and outcome;

and beside it the job's ``now`` (what it is waiting for at this moment:
a retry due at ``next_attempt_at``, a running step's lease, its next
message), its trace id, its derivatives and the operators' audit entries.
"""

from __future__ import annotations

import uuid
from datetime import timedelta, timezone

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from app.adapters.postgres import audit
from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import (
    JobState,
    attachments,
    job_history,
    jobs,
    outbox,
    step_runs,
    variants,
)
from app.core import states
from app.core.operations import job_summary
from app.errors import AttachmentNotFound, JobNotFound
from app.observability.tracing import trace_id


def _iso(value):
    return value.isoformat() if value is not None else None


def attachment_facts(row) -> dict:
    return {"attachment_id": str(row.id), "filename": row.filename, "uploader": row.owner,
            "content_type": row.content_type, "format": row.format, "size": row.size, "sha256": row.sha256,
            "width": row.width, "height": row.height, "created_at": _iso(row.created_at)}


def attachment_overview(engine: Engine, attachment_id: uuid.UUID) -> dict:
    """``{"attachment": facts, "jobs": [job_detail, ...]}``, one job per pipeline version, oldest version first."""
    with transaction(engine) as conn:
        row = conn.execute(select(attachments).where(attachments.c.id == attachment_id)).one_or_none()
        if row is None:
            raise AttachmentNotFound(f"no attachment {attachment_id}")
        now = conn.execute(select(func.now())).scalar_one()
        versions = conn.execute(select(jobs).where(jobs.c.attachment_id == attachment_id)
                                .order_by(jobs.c.pipeline_version)).all()
        return {"attachment": attachment_facts(row), "jobs": [_detail(conn, job, now) for job in versions]}


def job_detail(engine: Engine, job_id: uuid.UUID) -> dict:
    """One job as :func:`attachment_overview` shows it: summary, ``now``, ``timeline``, variants, audit."""
    with transaction(engine) as conn:
        job = states.get(conn, job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id}")
        return _detail(conn, job, conn.execute(select(func.now())).scalar_one())


def _detail(conn, job, now) -> dict:
    history = conn.execute(select(job_history).where(job_history.c.job_id == job.id)
                           .order_by(job_history.c.id)).all()
    runs = conn.execute(select(step_runs).where(step_runs.c.job_id == job.id).order_by(step_runs.c.id)).all()
    due = {int(attempt): available for attempt, available in conn.execute(
        select(outbox.c.payload["attempt"].astext, func.max(outbox.c.available_at))
        .where(outbox.c.job_id == job.id, outbox.c.payload["step"].astext == "inspect")
        .group_by(outbox.c.payload["attempt"].astext))}
    made = conn.execute(select(variants).where(variants.c.job_id == job.id).order_by(variants.c.id)).all()
    return {
        **job_summary(job),
        "trace_id": trace_id(job.traceparent) or None,
        "traceparent": job.traceparent,
        "now": _now(job, now),
        "timeline": _timeline(history, runs, due),
        "variants": [{"variant": v.variant, "content_type": v.content_type, "size": v.size, "width": v.width,
                      "height": v.height, "sha256": v.sha256, "attempt": v.attempt,
                      "recorded_at": _iso(v.created_at), "published_at": _iso(v.published_at),
                      "retired_at": _iso(v.retired_at)} for v in made],
        "audit": audit.for_target(conn, f"job:{job.id}"),
    }


def _clock(value) -> str:
    """A time as people read it in a sentence (the ISO form is in the ``until`` beside it)."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _now(job, now) -> dict:
    """What the job waits for at this moment, in words an operator reads at a glance."""
    if job.state == JobState.QUEUED and job.next_attempt_at is not None and job.next_attempt_at > now:
        return {"kind": "retry_waiting", "until": _iso(job.next_attempt_at),
                "text": f"waiting to retry: attempt {job.attempt + 1} is due at {_clock(job.next_attempt_at)} "
                        f"after {job.error_code}: {job.error_reason}"}
    if job.state == JobState.QUEUED:
        return {"kind": JobState.QUEUED.value, "until": None, "text": f"queued: attempt {job.attempt + 1} waits for a worker"}
    if job.state == JobState.PROCESSING and job.lease_owner is None:
        return {"kind": "between_steps", "until": None,
                "text": f"processing attempt {job.attempt}: between steps, waiting for its next message"}
    if job.state == JobState.PROCESSING and job.lease_expires_at <= now:
        return {"kind": "lease_expired", "until": _iso(job.lease_expires_at),
                "text": f"the lease of {job.lease_owner} expired at {_clock(job.lease_expires_at)}: "
                        "lease recovery will take the attempt back"}
    if job.state == JobState.PROCESSING:
        return {"kind": "running", "until": _iso(job.lease_expires_at),
                "text": f"running attempt {job.attempt}: {job.lease_owner} holds the lease until "
                        f"{_clock(job.lease_expires_at)}"}
    if job.state == JobState.READY:
        return {"kind": JobState.READY.value, "until": None, "text": f"ready since {_clock(job.ready_at)}"}
    return {"kind": JobState.FAILED.value, "until": None, "text": f"failed: {job.error_code}: {job.error_reason}"}


def _kind(row) -> str:
    if row.from_state is None:
        return "created"
    if row.from_state == row.to_state:
        return "reannounced"
    if row.error_code == states.WORKER_LOST and row.from_state == JobState.PROCESSING:
        return "lease_expired"
    if (row.from_state, row.to_state) == (JobState.QUEUED, JobState.PROCESSING):
        return "claimed"
    if (row.from_state, row.to_state) == (JobState.PROCESSING, JobState.QUEUED):
        return "retry_scheduled"
    if (row.from_state, row.to_state) == (JobState.FAILED, JobState.QUEUED):
        return "replayed"
    return row.to_state  # ready, failed


def _timeline(history, runs, due: dict) -> list[dict]:
    events = []
    for row in history:
        kind = _kind(row)
        event = {"at": row.at, "kind": kind, "attempt": row.attempt, "who": row.actor, "from": row.from_state,
                 "to": row.to_state, "error_code": row.error_code, "reason": row.reason}
        if kind == "retry_scheduled":
            event["next_attempt_at"] = _iso(due.get(row.attempt + 1))
        events.append(event)
    for run in runs:
        events.append({"at": run.finished_at - timedelta(seconds=run.seconds), "kind": "step", "attempt": run.attempt,
                       "who": run.worker, "step": run.step, "variant": run.variant, "seconds": run.seconds,
                       "outcome": run.outcome, "finished_at": _iso(run.finished_at)})
    events.sort(key=lambda e: e["at"])  # stable: history before the step runs it ties with
    for event in events:
        event["at"] = _iso(event["at"])
    return events
