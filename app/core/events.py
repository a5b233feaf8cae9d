"""Completion events: written with the transition they tell of, numbered in commit order, read by a cursor.

:func:`emit` is called by :mod:`app.core.states` inside the transaction that
moves a job to ``ready`` or ``failed``, so an event exists if and only if
its transition committed. It

* takes the next number of the one ``event_counter`` row (``UPDATE ...
  RETURNING``): the row stays locked until COMMIT, so events are numbered
  gapless and in the order their transactions commit, and a reader
  paging by ``sequence`` can never pass one that commits later with a
  smaller number (a plain sequence could);
* writes the event's document, the JSON that webhooks deliver (as
  :func:`body`) and ``GET /v1/events`` returns (as PostgreSQL keeps it:
  :func:`page`);
* creates a delivery for every subscription that wants it
  (:func:`app.core.webhooks.fan_out`), numbered per subscription the same way.

Kinds: ``attachment.ready`` (the attachment's first job is ready),
``version.ready`` (a later job of it, a backfill, is ready) and
``attachment.failed`` (any of its jobs failed).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

from sqlalchemy import Text, and_, cast, select, update
from sqlalchemy.engine import Connection

from app.adapters.postgres.db import idle_at_most
from app.adapters.postgres.models import event_counter, events, jobs

ATTACHMENT_READY = "attachment.ready"
ATTACHMENT_FAILED = "attachment.failed"
VERSION_READY = "version.ready"
TYPES = (ATTACHMENT_READY, ATTACHMENT_FAILED, VERSION_READY)
MAX_PAGE = 1000


def body(document: dict) -> str:
    """The one serialization of an event: keys sorted, no spaces (what is signed and delivered)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


#: the longest a transaction that took the counter may sit idle: every job's move to ``ready`` or ``failed``, in
#: every process, waits for the counter until it commits. A worker paused right after taking it (SIGSTOP, a frozen
#: VM) held every completion of the deployment for its whole bound, a lease (60 s; an adversarial run). A few
#: statements follow it before COMMIT (the event, its deliveries, the transition's last writes)
COUNTER_IDLE_SECONDS = 5.0


def _next_sequence(conn: Connection) -> int:
    idle_at_most(conn, COUNTER_IDLE_SECONDS)
    return conn.execute(update(event_counter).where(event_counter.c.id == 1)
                        .values(last_sequence=event_counter.c.last_sequence + 1)
                        .returning(event_counter.c.last_sequence)).scalar_one()


def ready_type(conn: Connection, job) -> str:
    """``version.ready`` when an earlier job of the attachment exists (a backfill), else ``attachment.ready``."""
    earlier = conn.execute(select(jobs.c.id).where(
        jobs.c.attachment_id == job.attachment_id, jobs.c.id != job.id,
        jobs.c.created_at <= job.created_at).limit(1)).first()
    return VERSION_READY if earlier is not None else ATTACHMENT_READY


def emit(conn: Connection, job, kind: str) -> int:
    """Write the event of ``job``'s transition (its row after the UPDATE) and its deliveries; returns its sequence."""
    from app.core import webhooks

    owner = job.owner  # the attachment's, copied to its job when it is made (it never changes)
    sequence = _next_sequence(conn)
    event_id = uuid.uuid4()
    document = {
        "id": f"evt_{event_id.hex}",
        "sequence": sequence,
        "type": kind,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "data": {
            "attachment_id": str(job.attachment_id),
            "job_id": str(job.id),
            "pipeline_version": job.pipeline_version,
            "state": job.state,
            "error_code": job.error_code,
            "uploader": owner,
            "attachment_url": f"/v1/attachments/{job.attachment_id}?version={job.pipeline_version}",
        },
    }
    conn.execute(events.insert().values(sequence=sequence, id=event_id, type=kind, attachment_id=job.attachment_id,
                                        job_id=job.id, owner=owner, document=document))
    webhooks.fan_out(conn, sequence, kind, owner)
    return sequence


def page(conn: Connection, *, after: int, limit: int, owner: str | None) -> dict:
    """Events with ``sequence > after``, oldest first; ``owner``: only that uploader's. ``next_after`` resumes.

    ``events`` are the documents' JSON texts as PostgreSQL keeps them (``jsonb``'s: its keys in its own order, with
    spaces; the same JSON a webhook delivers): read as objects and written again, through the API's models, a page
    of 1000 cost the web 25-33 ms of CPU, and one uploader's 600 such requests in 3 s took 19 s of a process's CPU
    while honest uploads waited seconds for their ``202`` (an adversarial run); written again as :func:`body`, 7 ms
    (a dict decoded and encoded per event), as PostgreSQL keeps them some 2 ms."""
    limit = max(1, min(limit, MAX_PAGE))
    conditions = [events.c.sequence > after]
    if owner is not None:
        conditions.append(events.c.owner == owner)
    rows = conn.execute(select(events.c.sequence, cast(events.c.document, Text).label("text"))
                        .where(and_(*conditions)).order_by(events.c.sequence).limit(limit)).all()
    return {"events": [row.text for row in rows],
            "next_after": rows[-1].sequence if rows else after,
            "more": len(rows) == limit}
