"""Backfill: reprocess existing attachments into a pipeline version, through the outbox.

Candidates are attachments with a ``ready`` job at an older version and no
job at the target version. Each batch is one transaction that creates the
jobs (``queued``, history, outbox message) with ``SKIP LOCKED`` on the
attachments it takes; the messages are published after COMMIT like any
other. The one-job-per-``(attachment_id, pipeline_version)`` constraint
makes a second run, or two runs at once, create nothing twice. A run
killed at any instant is resumed by running it again: the query finds
what is left.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import and_, exists, func, select, text
from sqlalchemy.orm import aliased

from app.adapters.postgres import audit
from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import JobState, attachments, jobs
from app.core import pipeline, room, states
from app.core.needs import Database, StoringProducer
from app.errors import StorageUnavailable
from app.observability.tracing import new_traceparent

log = logging.getLogger("attache.backfill")


@dataclass(frozen=True)
class Estimate:
    to_version: int
    candidates: int
    renders: int
    seconds_per_job: float | None

    def as_dict(self) -> dict:
        return {"to_version": self.to_version, "candidates": self.candidates, "renders": self.renders,
                "seconds_per_job": self.seconds_per_job,
                "estimated_worker_seconds": None if self.seconds_per_job is None
                else round(self.candidates * self.seconds_per_job, 1)}


def _candidates(to_version: int):
    older = aliased(jobs)
    target = aliased(jobs)
    return select(attachments.c.id).where(
        exists().where(and_(older.c.attachment_id == attachments.c.id, older.c.state == JobState.READY,
                            older.c.pipeline_version < to_version)),
        ~exists().where(and_(target.c.attachment_id == attachments.c.id, target.c.pipeline_version == to_version)),
    )


def estimate(services: Database, to_version: int) -> Estimate:
    """The dry run: counts and a time estimate; changes nothing."""
    definition = pipeline.get(to_version)
    with transaction(services.engine) as conn:
        count = conn.execute(select(func.count()).select_from(_candidates(to_version).subquery())).scalar()
        average = conn.execute(text(  # the steps' own time: upload to ready would count the wait in the queues
            "SELECT avg(worked) FROM (SELECT sum(r.seconds) AS worked FROM step_runs r WHERE r.job_id IN "
            "(SELECT id FROM jobs WHERE state = :ready ORDER BY ready_at DESC LIMIT 200) GROUP BY r.job_id) recent"
        ), {"ready": JobState.READY.value}).scalar()
    return Estimate(to_version, count, count * len(definition.variants),
                    None if average is None else round(float(average), 3))


def _room_for(conn, services: StoringProducer, version: pipeline.PipelineVersion, ids, created: int) -> dict:
    """:func:`app.core.room.admit` for a batch of jobs reading the kept original (no copy of it to make); what each
    attachment's job needs, by its id."""
    if not ids:
        return {}
    images = conn.execute(select(attachments.c.id, attachments.c.width, attachments.c.height)
                          .where(attachments.c.id.in_(ids))).all()
    needs = {image.id: room.need(version, size=0, pixels=image.width * image.height) for image in images}
    try:
        room.admit(conn, services, version=version, needing=sum(needs.values()), jobs=len(needs))
        return needs
    except StorageUnavailable as exc:
        raise StorageUnavailable(f"{exc.detail}: {created} job(s) of version {version.version} made so far; run the "
                                 "backfill again once there is room (what it made stays)") from None


def run(services: StoringProducer, to_version: int, *, batch: int = 100, actor: str = "backfill",
        reason: str | None = None, progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Create the target version's jobs in batches; returns counts. Safe to rerun and to run twice at once.
    ``reason``: the operator's, kept in the audit log and the jobs' history (else "backfill to version N"). Each
    batch that made jobs writes its audit row in its transaction; a run that made none writes one row, ``jobs: []``.

    A batch is made only where the storage has room for its variants beside the work accepted
    (:mod:`app.core.room`): else :class:`StorageUnavailable`, naming the jobs made so far. A backfill's renders took
    the room counted for the uploads accepted beside it, and they failed ``storage_unavailable`` (a re-attack)."""
    version = pipeline.get(to_version)
    if batch < 1:
        raise ValueError("batch must be >= 1")
    why = (audit.clean(reason) or "").strip() or f"backfill to version {to_version}"
    created = published = 0
    while True:
        with services.unit_of_work.begin() as work:  # the batch's messages are published after its COMMIT
            ids = work.conn.execute(_candidates(to_version).order_by(attachments.c.created_at, attachments.c.id)
                                    .limit(batch).with_for_update(of=attachments, skip_locked=True)).scalars().all()
            needs = _room_for(work.conn, services, version, ids, created)
            made = [states.create_job(work.conn, attachment_id=attachment_id, pipeline_version=to_version,
                                      max_attempts=services.settings.max_attempts, traceparent=new_traceparent(),
                                      tracestate=None, actor=actor, reason=why, room_bytes=needs[attachment_id])
                    for attachment_id in ids]
            jobs_made = [str(job[0]) for job in made if job is not None]
            if jobs_made:  # the audit trail's row, in the transaction that made the jobs
                audit.record(work.conn, actor=actor, action="pipeline.backfill", target=f"pipeline:{to_version}",
                             reason=why, details={"jobs": jobs_made})
        if not ids:
            break
        created += len(jobs_made)
        published += work.published
        if progress is not None:
            progress(len(ids))
        log.info("backfill to v%d: %d job(s) created so far", to_version, created,
                 extra={"to_version": to_version, "jobs_created": created})
    if not created:  # a run that found nothing to make is in the trail too, as a dead-letter requeue of nothing is
        with transaction(services.engine) as conn:
            audit.record(conn, actor=actor, action="pipeline.backfill", target=f"pipeline:{to_version}",
                         reason=why, details={"jobs": []})
    return {"created": created, "published": published}
