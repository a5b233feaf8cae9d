"""The durable handoff: an upload becomes work that can no longer be lost.

Order matters and each step is a failure window:

1. the verified bytes are written to ``staging/{attachment_id}`` (the
   filesystem store moves the fsynced spool file in: the bytes are not
   written twice; :meth:`~app.adapters.storage.Storage.adopt_file`)
   (window 1 follows: a crash leaves only an unreferenced staging object,
   invisible, removed by the orphan cleanup);
2. ONE transaction takes the staged object's lock (:mod:`app.core.staging`),
   checks the object is still there, and inserts the attachment, the
   ``queued`` job, its history and its outbox message, then asks whether the
   client still waits for its answer: one that closed its connection (gave
   up while storage or the database was slow) is not committed for, since no
   ``202`` could reach it (window 2 follows: the job is durable, the
   scheduler publishes the unmarked row). An error before COMMIT is a
   clear rollback and the staged object is removed; an error raised by
   COMMIT itself (the connection dropped after sending it) is ambiguous:
   the staged object stays, and the web answers ``202`` if a fresh
   connection sees the rows, else ``503`` (a retry with the same
   Idempotency-Key returns the attachment if it did commit; the staging
   cleanup removes the bytes only if no row ever points at them);
3. the message is published with a confirm and the row marked (window 3:
   an unconfirmed publish leaves the row unmarked; a duplicate is harmless);
   2 and 3 are one :class:`~app.core.unit_of_work.UnitOfWork`, which asks
   :func:`committed_after_all` when the COMMIT's outcome is unknown. The
   web's unit of work hands the row to its background publisher
   (:mod:`app.core.background_publisher`) and returns at COMMIT: nothing
   after the COMMIT is needed for the work to survive;
4. the web answers ``202``, once the COMMIT has landed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import SQLAlchemyError

from app import faults
from app.adapters import imaging
from app.adapters.postgres.db import interval, transaction
from app.adapters.postgres.models import attachments, idempotency_keys, jobs
from app.core import pending, pipeline, room, staging, states
from app.core.needs import Database, ImageProducer, Producer
from app.errors import (
    AttacheError,
    ClientGone,
    DatabaseUnavailable,
    IdempotencyKeyReused,
    OutcomeUnknown,
    SpoolUnavailable,
    StorageError,
    StorageUnavailable,
)

log = logging.getLogger("attache.intake")
#: the upload's row (built once: a statement built per upload cost the web its construction and cache key)
_ATTACHMENT = insert(attachments)


@dataclass(frozen=True)
class Received:
    """An upload received in full: a spool file and what was computed while it arrived."""

    path: Path
    size: int
    sha256: str
    #: the MD5 digest, computed only when the request asked for it to be checked (``Content-MD5``)
    md5: bytes | None
    head: bytes

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Accepted:
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    pipeline_version: int
    replayed: bool = False


class LostRace(Exception):
    """Another request with the same Idempotency-Key committed first."""


def earlier(services: Producer, owner: str, idempotency_key: str, sha256: str) -> Accepted | None:
    """The attachment an unexpired key already made, or None; a key reused for other bytes is refused."""
    ttl = interval(services.settings.idempotency_ttl_seconds)
    with transaction(services.engine) as conn:
        row = conn.execute(select(idempotency_keys, jobs.c.id.label("job_id"), jobs.c.pipeline_version)
                           .join(jobs, jobs.c.attachment_id == idempotency_keys.c.attachment_id)
                           .where(idempotency_keys.c.principal == owner, idempotency_keys.c.key == idempotency_key,
                                  idempotency_keys.c.created_at > func.now() - ttl)
                           .order_by(jobs.c.pipeline_version).limit(1)).one_or_none()
    if row is None:
        return None
    if row.request_sha256 != sha256:
        raise IdempotencyKeyReused("this Idempotency-Key was used for different content")
    return Accepted(row.attachment_id, row.job_id, row.pipeline_version, replayed=True)


def _claim_key(conn, services: Producer, owner: str, idempotency_key: str, sha256: str, attachment_id) -> None:
    """Take the key in the upload's transaction; an expired key is taken over."""
    ttl = interval(services.settings.idempotency_ttl_seconds)
    statement = pg_insert(idempotency_keys).values(principal=owner, key=idempotency_key, request_sha256=sha256,
                                                   attachment_id=attachment_id)
    statement = statement.on_conflict_do_update(
        index_elements=["principal", "key"],
        set_={"request_sha256": statement.excluded.request_sha256,
              "attachment_id": statement.excluded.attachment_id, "created_at": func.now()},
        where=idempotency_keys.c.created_at <= func.now() - ttl,
    ).returning(idempotency_keys.c.principal)
    if conn.execute(statement).first() is None:
        raise LostRace()


@dataclass(frozen=True)
class Staged:
    """An upload's bytes staged (step 1), under the id its attachment will have."""

    attachment_id: uuid.UUID
    key: str
    info: imaging.ImageInfo


#: what a request whose spool another process removed (a sweep of spools it took for abandoned) is told
SPOOL_REMOVED = "the upload's temporary file was removed while the request waited; retry"


def stage(services: ImageProducer, received: Received) -> Staged:
    """Step 1: probe the header (refusals raise PermanentError), then stage the bytes (the spool was fsynced).

    A spool removed meanwhile by another web process's sweep (this one was paused long enough for it to look
    abandoned, and the sweep had looked at its age before :meth:`~app.web.spool.HashingSpool.finish` checked it) is
    a ``503`` to retry, as one removed before the check is: it answered ``500`` at the probe's open or the move
    into staging (an adversarial run: SIGSTOP and SIGCONT of the web, 14 of 2,589 uploads)."""
    try:
        info = imaging.probe(received.path, services.limits)  # header only
    except FileNotFoundError:
        raise SpoolUnavailable(SPOOL_REMOVED) from None
    attachment_id = uuid.uuid4()
    key = pipeline.staging_key(attachment_id)
    adopt_spool(services.storage, key, received, content_type=info.content_type)
    faults.point("after_staging")
    return Staged(attachment_id, key, info)


def adopt_spool(storage, key: str, received: Received, *, content_type: str | None = None) -> None:
    """Move a received spool into storage under ``key``; one another process removed meanwhile is
    :class:`SpoolUnavailable` (see :func:`stage`)."""
    try:
        storage.adopt_file(key, received.path, content_type=content_type)
    except StorageError:
        if not received.path.exists():
            raise SpoolUnavailable(SPOOL_REMOVED) from None
        raise


def record(conn, services: ImageProducer, staged: Staged, received: Received, *, filename: str, owner: str,
           traceparent: str, tracestate: str | None, idempotency_key: str | None) -> uuid.UUID:
    """Step 2, in the caller's transaction: the attachment, its key, its ``queued`` job and outbox message; the
    job's id. Raises :class:`LostRace` when another transaction holds the Idempotency-Key."""
    settings = services.settings
    staging.lock(conn, staged.key)  # the staging cleanup cannot remove the bytes from here to COMMIT
    if not staging.usable(conn, services.storage, staged.key):  # it did, or decided to, while this request was
        raise StorageUnavailable("the staged upload was removed while the request waited; retry")  # paused
    info = staged.info
    conn.execute(_ATTACHMENT, dict(
        id=staged.attachment_id, owner=owner, filename=filename, content_type=info.content_type,
        format=info.format, size=received.size, sha256=received.sha256, width=info.width,
        height=info.height, staging_key=staged.key))
    if idempotency_key is not None:
        _claim_key(conn, services, owner, idempotency_key, received.sha256, staged.attachment_id)
    # 429 when the uploader has its fill; after the key, so a request that lost the race for it returns the
    # winner's attachment rather than a refusal the winner's COMMIT caused
    pending.admit(conn, owner, settings.max_pending_per_uploader)
    version = pipeline.get(settings.pipeline_version)
    needing = room.need(version, size=received.size, pixels=staged.info.width * staged.info.height)
    room.admit(conn, services, version=version, needing=needing)
    job_id, _ = states.create_job(
        conn, attachment_id=staged.attachment_id, pipeline_version=settings.pipeline_version,
        max_attempts=settings.max_attempts, traceparent=traceparent, tracestate=tracestate,
        actor=f"web:{owner}", room_bytes=needing)
    return job_id


def accept(services: ImageProducer, received: Received, *, filename: str, owner: str, traceparent: str,
           tracestate: str | None, idempotency_key: str | None = None,
           client_waits: Callable[[], bool] = lambda: True) -> Accepted:
    """Stage, then record in one transaction, then publish. See the module docstring.

    ``client_waits`` is asked just before the COMMIT; when it says no, the
    transaction is rolled back and :class:`~app.errors.ClientGone` raised.

    With an ``idempotency_key``, a retry of the same content by the same
    principal returns the first attachment (no second job, no second staged
    object); two concurrent requests race on the key's primary key inside
    the upload transaction, and the loser returns the winner's attachment.
    """
    settings = services.settings
    if idempotency_key is not None:
        found = earlier(services, owner, idempotency_key, received.sha256)
        if found is not None:
            return found
    staged = stage(services, received)
    committing = False

    def landed(error: Exception) -> bool:
        return committed_after_all(services, staged, error)

    try:
        with services.unit_of_work.begin(after_commit=window_2, landed=landed, behind=True) as work:
            job_id = record(work.conn, services, staged, received, filename=filename, owner=owner,
                            traceparent=traceparent, tracestate=tracestate, idempotency_key=idempotency_key)
            faults.point("before_upload_commit")
            if not client_waits():
                log.warning("upload not committed: its client is gone", extra={
                    "attachment_id": str(staged.attachment_id), "error_code": ClientGone.error_code})
                raise ClientGone("the client closed its connection before the upload was committed; nothing was kept")
            committing = True  # every statement succeeded: an error from here on is the COMMIT's own
    except LostRace:
        forget_staging(services, staged.key)
        found = earlier(services, owner, idempotency_key, received.sha256)
        if found is None:  # pragma: no cover - the winner committed before we looked
            raise DatabaseUnavailable("the upload could not be recorded; retry")
        return found
    except Exception as exc:
        error = unrecorded(services, staged, exc, committing)
        if error is exc:
            raise
        raise error from exc
    except BaseException:  # interrupted: an interrupted COMMIT may have landed, so staging stays then
        if not committing:
            forget_staging(services, staged.key)
        raise
    log.info("upload accepted", extra={"attachment_id": str(staged.attachment_id), "job_id": str(job_id),
                                       "size": received.size})
    return Accepted(staged.attachment_id, job_id, settings.pipeline_version)


def unrecorded(services: ImageProducer, staged: Staged, exc: Exception, committing: bool) -> Exception:
    """The error to raise for an upload whose transaction failed; its staged bytes removed if no row can point at
    them. ``committing``: every statement had succeeded, so the error is the COMMIT's own."""
    if committing:  # the COMMIT failed and no row is to be seen: never remove bytes a row may point at
        return OutcomeUnknown("the upload's COMMIT reached the database and its answer was lost: it may have been "
                              "accepted. Retry with the same Idempotency-Key (the first attachment is answered if "
                              "it was); without one, a retry may make a second attachment")
    forget_staging(services, staged.key)  # a clear rollback: no row was committed, so the staged bytes go too
    if isinstance(exc, SQLAlchemyError):
        return DatabaseUnavailable("the upload could not be recorded")
    return exc


def window_2() -> None:
    """Between the upload's COMMIT and its publish: the fault points of window 2."""
    faults.point("during_commit")  # raises, as a COMMIT whose answer was lost
    faults.point("after_commit")  # kills: committed, nothing published


def committed_after_all(services: Database, staged: Staged, error: BaseException) -> bool:
    """After an error raised by COMMIT, look whether the rows landed; the staged object stays either way.

    True only when a fresh connection sees the attachment row (the handoff
    is then as durable as after a clean COMMIT). Otherwise the outcome is
    unknown: the COMMIT may still land, so the staged object is left to
    the staging cleanup, which removes it only when no row points at it
    after its grace period.
    """
    log.warning("the upload's COMMIT failed with an unknown outcome (%s); staged object %s left to the "
                "staging cleanup", error, staged.key, extra={"attachment_id": str(staged.attachment_id)})
    try:
        with transaction(services.engine) as conn:
            return conn.execute(select(attachments.c.id).where(attachments.c.id == staged.attachment_id)
                                ).first() is not None
    except (AttacheError, SQLAlchemyError):
        return False


def forget_staging(services: ImageProducer, key: str) -> None:
    try:
        services.storage.delete(key)
    except AttacheError:
        log.warning("could not remove staged object %s; the orphan cleanup will", key)
