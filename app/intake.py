"""The durable handoff: an upload becomes work that can no longer be lost.

Order matters and each step is a failure window:

1. the verified bytes are written to ``staging/{attachment_id}``
   (window 1 follows: a crash leaves only an unreferenced staging object,
   invisible, removed by the orphan cleanup);
2. ONE transaction inserts the attachment, the ``queued`` job, its history
   and its outbox message (window 2 follows: the job is durable, the
   scheduler publishes the unmarked row);
3. the message is published with a confirm and the row marked (window 3:
   an unconfirmed publish leaves the row unmarked; a duplicate is harmless);
4. only then does the web answer ``202``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from sqlalchemy import insert
from sqlalchemy.exc import SQLAlchemyError

from app import faults, imaging, pipeline, states
from app.db import transaction
from app.errors import AttacheError, DatabaseUnavailable
from app.models import attachments
from app.services import Services
from app.uploads import Received

log = logging.getLogger("attache.intake")


@dataclass(frozen=True)
class Accepted:
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    pipeline_version: int
    published: bool


def accept(services: Services, received: Received, *, filename: str, owner: str, traceparent: str,
           tracestate: str | None) -> Accepted:
    settings = services.settings
    info = imaging.probe(received.path, services.limits)  # header only; refusals raise PermanentError
    attachment_id = uuid.uuid4()
    key = pipeline.staging_key(attachment_id)
    services.storage.put_file(key, received.path, content_type=info.content_type)
    faults.point("after_staging")
    try:
        with transaction(services.engine) as conn:
            conn.execute(insert(attachments).values(
                id=attachment_id, owner=owner, filename=filename, content_type=info.content_type,
                format=info.format, size=received.size, sha256=received.sha256, width=info.width,
                height=info.height, staging_key=key))
            job_id, outbox_id = states.create_job(
                conn, attachment_id=attachment_id, pipeline_version=settings.pipeline_version,
                max_attempts=settings.max_attempts, traceparent=traceparent, tracestate=tracestate,
                actor=f"web:{owner}")
    except (DatabaseUnavailable, SQLAlchemyError) as exc:
        _forget_staging(services, key)
        if isinstance(exc, DatabaseUnavailable):
            raise
        raise DatabaseUnavailable("the upload could not be recorded") from exc
    faults.point("after_commit")
    try:
        published = services.publisher.publish([outbox_id]) == 1
    except AttacheError as exc:  # the outbox row is durable; the scheduler will publish it
        log.warning("publish after commit failed: %s", exc)
        published = False
    log.info("upload accepted", extra={"attachment_id": str(attachment_id), "job_id": str(job_id),
                                       "size": received.size, "published": published})
    return Accepted(attachment_id, job_id, settings.pipeline_version, published)


def _forget_staging(services: Services, key: str) -> None:
    try:
        services.storage.delete(key)
    except AttacheError:
        log.warning("could not remove staged object %s; the orphan cleanup will", key)
