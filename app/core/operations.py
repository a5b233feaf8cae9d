"""What operators can see and do, shared by ``/v1/ops`` and the ``attache`` command."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import ClassVar

from sqlalchemy import func, select, tuple_, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from app.adapters.postgres import audit, row_counts
from app.adapters.postgres.db import once_reachable, time_limit, transaction
from app.adapters.postgres.models import JobState, attachments, audit_log, job_history, jobs, variants
from app.core import id_prefixes, outbox, pipeline, room, staging, states
from app.core.needs import Database, StoringProducer
from app.errors import (
    AttacheError,
    DatabaseUnavailable,
    JobConflict,
    JobNotFound,
    MadeUnread,
    MissingReason,
    OutcomeUnknown,
)


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


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a list shows; every field optional. ``since``/``until`` bound ``created_at`` (until excluded)."""

    state: str | None = None
    pipeline_version: int | None = None
    uploader: str | None = None
    error_code: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    #: the names of the filters, as query parameters, form fields and (with dashes) CLI options
    FIELDS: ClassVar[tuple[str, ...]] = ("state", "pipeline_version", "uploader", "error_code", "since", "until")

    @classmethod
    def parse(cls, values) -> JobFilter:
        """From text (a query string, a form, the command line): blank means unset; ValueError names the field."""
        text = {name: (values.get(name) or "").strip() or None for name in cls.FIELDS}
        for name, value in text.items():
            if value is not None and not value.isprintable():
                raise ValueError(f"{name} must be printable text, without control characters")
        if text["state"] is not None and text["state"] not in set(JobState):
            raise ValueError(f"state must be one of {', '.join(JobState)}")
        version = None
        if text["pipeline_version"] is not None:
            try:
                version = int(text["pipeline_version"])
            except ValueError:
                raise ValueError("pipeline_version must be an integer") from None
        return cls(state=text["state"], pipeline_version=version, uploader=text["uploader"],
                   error_code=text["error_code"], since=_instant(text["since"], "since"),
                   until=_instant(text["until"], "until"))

    def as_params(self) -> dict[str, str]:
        """The set filters as text again (for the next page's link)."""
        out = {}
        for name in self.FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.isoformat() if isinstance(value, datetime) else str(value)
        return out


def _instant(text: str | None, name: str) -> datetime | None:
    """An ISO 8601 date or time, in UTC; one without a zone is UTC (PostgreSQL takes offsets up to ±15:59 only)."""
    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text)
        return parsed.astimezone(timezone.utc) if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError):
        raise ValueError(f"{name} must be an ISO 8601 date or time, like 2026-12-01T09:30:00Z") from None


def _cursor(row) -> str:
    """Where the next page starts: the last row's ``(created_at, id)``, opaque to callers."""
    return base64.urlsafe_b64encode(f"{row.created_at.isoformat()}|{row.id}".encode()).decode().rstrip("=")


def _after(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The page boundary a cursor names, its time in UTC: a forged one's offset PostgreSQL does not take (past
    ±15:59, or with seconds) answered 500 (an adversarial run), as ``_instant`` once did."""
    try:
        created, job_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().split("|")
        position = datetime.fromisoformat(created), uuid.UUID(job_id)
        if position[0].tzinfo is None:
            raise ValueError("no zone")
        return position[0].astimezone(timezone.utc), position[1]
    except (ValueError, OverflowError):  # binascii.Error and UnicodeDecodeError are ValueErrors too
        raise ValueError("cursor is not one this server gave out") from None


def find_jobs(engine: Engine, filters: JobFilter = JobFilter(), *, cursor: str | None = None,
              limit: int = 100) -> dict:
    """A page of jobs, newest first: ``{"jobs": [...], "next_cursor": ... or None}``.

    The one query behind ``/v1/ops/jobs``, ``attache jobs list`` and the
    console's job list. Newest means created last: ``created_at`` never
    changes, so a page boundary ``(created_at, id)`` stays put while jobs
    move on, and the next page starts right after it (keyset pagination,
    never ``OFFSET``: page 1000 costs what page 1 does). Indexes:
    ``jobs_created_idx``, ``jobs_state_created_idx``, ``jobs_error_code_idx``
    (migration 0011), ``jobs_owner_created_idx`` (0014: the job's own copy
    of its uploader; a join on the attachment's read the whole table for an
    uploader with few jobs).
    """
    limit = max(1, min(limit, 1000))
    with transaction(engine) as conn:
        rows = conn.execute(jobs_query(filters, cursor=cursor, limit=limit)).all()
    page = rows[:limit]
    return {"jobs": [job_summary(row) for row in page],
            "next_cursor": _cursor(page[-1]) if len(rows) > limit else None}


def jobs_query(filters: JobFilter, *, cursor: str | None, limit: int):
    """:func:`find_jobs`'s query: a page of ``limit`` jobs and one more (whether a next page exists)."""
    query = select(jobs)
    for column, value in ((jobs.c.owner, filters.uploader), (jobs.c.state, filters.state),
                          (jobs.c.pipeline_version, filters.pipeline_version), (jobs.c.error_code, filters.error_code)):
        if value is not None:
            query = query.where(column == value)
    if filters.since is not None:
        query = query.where(jobs.c.created_at >= filters.since)
    if filters.until is not None:
        query = query.where(jobs.c.created_at < filters.until)
    if cursor:
        query = query.where(tuple_(jobs.c.created_at, jobs.c.id) < tuple_(*_after(cursor)))
    return query.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit + 1)


def list_jobs(services: Database, *, state: str | None = None, pipeline_version: int | None = None,
              limit: int = 100) -> list[dict]:
    """The first page of :func:`find_jobs` for a state and a version, as a list."""
    if state is not None and state not in set(JobState):
        raise ValueError(f"state must be one of {', '.join(JobState)}")
    return find_jobs(services.engine, JobFilter(state=state, pipeline_version=pipeline_version), limit=limit)["jobs"]


def resolve_job_id(services: Database, typed: str) -> uuid.UUID:
    """The job whose id is ``typed`` or starts with it (:mod:`app.core.id_prefixes`); JobNotFound if none.

    Raises :class:`~app.errors.AmbiguousId` if ``typed`` starts
    several job ids, ValueError if it is no id prefix.
    """
    with transaction(services.engine) as conn:
        found = id_prefixes.unique_uuid(conn, jobs.c.id, typed, what="job")
    if found is None:
        low, high = id_prefixes.uuid_bounds(typed)
        raise JobNotFound(f"no job {low}" if low == high else f"no job id starts with {typed}")
    return found


def show_job(services: Database, job_id: uuid.UUID) -> dict:
    with transaction(services.engine) as conn:
        row = states.get(conn, job_id)
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        history = conn.execute(select(job_history).where(job_history.c.job_id == job_id)
                               .order_by(job_history.c.id)).all()
        audits = audit.for_target(conn, f"job:{job_id}")
        recorded = conn.execute(select(variants).where(variants.c.job_id == job_id).order_by(variants.c.id)).all()
    return {
        **job_summary(row),
        "trace": {"traceparent": row.traceparent, "tracestate": row.tracestate},
        "history": [{"at": _iso(h.at), "from": h.from_state, "to": h.to_state, "attempt": h.attempt,
                     "who": h.actor, "error_code": h.error_code, "reason": h.reason} for h in history],
        "audit": audits,
        "variants": [{"variant": v.variant, "published": v.published_at is not None, "content_type": v.content_type,
                      "width": v.width, "height": v.height, "size": v.size, "sha256": v.sha256,
                      "provenance": v.provenance} for v in recorded],
    }


#: how long a replay that committed reads its job back while PostgreSQL does not answer, before it says so
READ_BACK_SECONDS = 10.0


def replay(services: StoringProducer, job_id: uuid.UUID, *, operator: str, reason: str | None) -> dict:
    """failed -> queued with a fresh attempt budget; the audit entry names the operator and the reason.

    A job whose original is gone (its staged original removed once the failed job's retention passed, or decided
    for removal) is refused: its replay was accepted and audited, and failed ``staging_missing`` at once, again
    each time it was replayed (an adversarial run).

    A replay whose COMMIT's answer was lost is looked for by its audit row; one not found is
    :class:`OutcomeUnknown` (it may have landed). One that committed is read back for up to
    :data:`READ_BACK_SECONDS`, and if PostgreSQL still does not answer the error says the replay was made. Both
    answered ``503 database_unavailable``, "retry later", for replays that had been made (an adversarial run: 8 of
    30 replays with PostgreSQL cut for 0.7 s)."""
    reason = (audit.clean(reason) or "").strip()
    if not reason:
        raise MissingReason("a replay needs a reason")
    audited: list[int] = []

    def landed(error: Exception) -> bool:
        if audited and _audit_row_exists(services, audited[0]):
            return True
        raise OutcomeUnknown(f"the replay of job {job_id} got no answer to its COMMIT: it may have been made; look "
                             "at the job before replaying it again") from error

    with services.unit_of_work.begin(landed=landed) as work:  # the fresh inspect message is published after COMMIT
        conn = work.conn
        current = states.get(conn, job_id, lock=True)
        if current is None:
            raise JobNotFound(f"no job {job_id}")
        needing = _can_run_again(conn, services, current) if current.state == JobState.FAILED else None
        row = states.replay(conn, job_id, actor=f"operator:{operator}", reason=reason[:1000],
                            budget=services.settings.max_attempts)
        if row is None:
            raise JobConflict(f"job {job_id} is {current.state}, only a failed job can be replayed")
        if row.room_bytes is None:  # made before migration 0030: counted by the room check's triggers from now on
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(room_bytes=needing))
        audited.append(audit.record(conn, actor=f"operator:{operator}", action="job.replay", target=f"job:{job_id}",
                                    reason=reason[:1000], details={"previous_error_code": current.error_code,
                                                                   "attempt": current.attempt}))
    try:
        return once_reachable(services.engine, READ_BACK_SECONDS, lambda: show_job(services, job_id), interval=0.5)
    except DatabaseUnavailable as exc:
        raise MadeUnread(f"job {job_id} was replayed, and audited; reading it back failed ({exc}): look at it once "
                         "PostgreSQL answers, without replaying it again") from exc


def _audit_row_exists(services: Database, audit_id: int) -> bool:
    try:
        with transaction(services.engine) as conn:
            return conn.execute(select(audit_log.c.id).where(audit_log.c.id == audit_id)).first() is not None
    except (AttacheError, SQLAlchemyError):
        return False


def _can_run_again(conn, services: StoringProducer, job) -> int:
    """A failed job's original is still there (:class:`JobConflict`), and the storage has room for what it will
    write beside the work not yet done (:class:`StorageUnavailable`, :mod:`app.core.room`: replays took the room
    counted for uploads accepted beside them, and those failed ``storage_unavailable``, a re-attack). Returns what
    it will write (:func:`app.core.room.need`)."""
    image = conn.execute(select(attachments.c.staging_key, attachments.c.size, attachments.c.width,
                                attachments.c.height).where(attachments.c.id == job.attachment_id)).one()
    if not staging.source_kept(conn, services.storage, job.attachment_id, image.staging_key):
        raise JobConflict(f"job {job.id} cannot be replayed: its original is gone (a failed job's is kept "
                          "for ATTACHE_FAILED_RETENTION_SECONDS); the uploader must upload the file again")
    try:
        version = pipeline.get(job.pipeline_version)
    except LookupError:  # a newer release made it (a rollback): it answered 500 (an adversarial run)
        raise JobConflict(f"job {job.id} cannot be replayed here: its pipeline version {job.pipeline_version} is not "
                          "registered in this release; replay it from a release that registers it") from None
    needing = room.need(version, size=image.size, pixels=image.width * image.height)
    room.admit(conn, services, version=version, needing=needing)
    return needing


def outbox_status(services: Database) -> dict:
    with transaction(services.engine) as conn:
        return outbox.status(conn)


def lease_status(services: Database) -> dict:
    with transaction(services.engine) as conn:
        row = conn.execute(select(
            func.count().label("processing"),
            func.count().filter(states.expired()).label("expired"),
            func.min(jobs.c.lease_expires_at).filter(jobs.c.lease_owner.is_not(None)).label("next_expiry"),
        ).where(jobs.c.state == JobState.PROCESSING)).one()
    return {"processing": row.processing, "expired": row.expired, "next_expiry": _iso(row.next_expiry)}


#: how long the dashboard's jobs per state may take (they are read from kept counts: milliseconds)
COUNTS_TIME_LIMIT_SECONDS = 5.0


def counts_by_state(services: Database) -> list[dict]:
    """The jobs per pipeline version and state (none counted 0), by version then state: the counts the triggers keep
    (:func:`app.adapters.postgres.row_counts.jobs`, what ``/metrics`` says as ``attache_jobs``), under a time limit.
    A ``GROUP BY`` of every job was 30 ms at 200,000 jobs on each dashboard load, growing with the table, with no
    time limit (an adversarial review)."""
    with transaction(services.engine) as conn, time_limit(conn, COUNTS_TIME_LIMIT_SECONDS):
        rows = row_counts.jobs(conn)
    return [{"pipeline_version": v, "state": s, "count": c} for s, v, c in sorted(rows, key=lambda r: (r[1], r[0]))]
