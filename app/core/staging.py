"""The staged original's lock: an upload's transaction and the staging cleanup's delete exclude each other.

The staging cleanup removes a staged object that no attachment row points
at once it is older than ``ATTACHE_STAGING_GRACE_SECONDS`` (window 1: the
web died between staging and COMMIT). A web paused for longer than that
(a frozen VM, a request waiting on another's Idempotency-Key) is not dead:
its uncommitted row is invisible to the cleanup, which removed the bytes,
and the upload was answered ``202`` and failed ``staging_missing`` (an
adversarial review). So both take this lock, a transaction-level advisory
lock on the object's key:

* intake takes it first in the upload's transaction, then checks that the
  staged object is still there (if not, the upload is refused with ``503``
  and nothing is committed), and holds it until COMMIT;
* the cleanup looks for the attachment row under it, and leaves the object
  for a later round if an upload holds it.

A lock is its session's: a PostgreSQL restart, or a cleanup paused past
``idle_in_transaction_session_timeout``, ended the cleanup's session and
freed the lock while the cleanup went on to delete, and a web paused past
the grace period took the lock, found the bytes, committed and answered
``202`` for bytes the delete then removed (an adversarial run). So the
cleanup's decision is committed before its delete (:func:`decide_removal`,
a row of ``staging_removals``), and intake refuses an object that has one
(:func:`usable`); the row is forgotten once the object is gone.
"""

from __future__ import annotations

from sqlalchemy import bindparam, delete, select, text
from sqlalchemy.dialects.postgresql import insert

from app.adapters.postgres.models import staging_removals, variants
from app.core.pipeline import ORIGINAL

#: the first key of the two-key advisory locks of staged objects (a key space of its own in PostgreSQL)
NAMESPACE = 727275

# built once: a statement built per call costs the web its construction and cache key on every upload
_LOCK = text("SELECT pg_advisory_xact_lock(:ns, hashtext(:key))")
_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(:ns, hashtext(:key))")
_REMOVAL_DECIDED = select(staging_removals.c.key).where(staging_removals.c.key == bindparam("b_key"))


def kept_original(attachment_id):
    """The storage key of the attachment's published original (a scalar subquery: ``attachment_id`` may be a
    column of the outer query, so a step reads it with its attachment's row), or NULL before its first publish."""
    return select(variants.c.storage_key).where(
        variants.c.attachment_id == attachment_id, variants.c.variant == ORIGINAL,
        variants.c.published_at.is_not(None)).limit(1).scalar_subquery()


_KEPT_ORIGINAL = select(kept_original(bindparam("b_attachment_id")))


def source_key(conn, attachment_id, staging_key: str) -> str:
    """Where a job reads the original's bytes: staging until the first publish, then the kept original
    (:func:`source_of`)."""
    return source_of(conn.execute(_KEPT_ORIGINAL, {"b_attachment_id": attachment_id}).scalar(), staging_key)


def source_of(kept: str | None, staging_key: str) -> str:
    """Where a job reads the original's bytes, given :func:`kept_original`: staging until the first publish, then
    the kept original.

    A backfill into a new pipeline version runs long after staging was
    removed; it reads the published original (shared by all versions).
    """
    return kept or staging_key


def source_kept(conn, storage, attachment_id, staging_key: str) -> bool:
    """Whether a job of the attachment can still read its original, for an operator's replay: a staged one
    under its lock (held until the transaction ends, so the staging cleanup cannot remove it before the job
    is queued again), and not decided for removal."""
    key = source_key(conn, attachment_id, staging_key)
    if key != staging_key:
        return storage.stat(key) is not None
    lock(conn, key)
    return usable(conn, storage, key)


def lock(conn, key: str) -> None:
    """Wait for the lock of the staged object ``key``, held until the transaction ends."""
    conn.execute(_LOCK, {"ns": NAMESPACE, "key": key})


def try_lock(conn, key: str) -> bool:
    """The lock of the staged object ``key`` if no one holds it (until the transaction ends); else False."""
    return bool(conn.execute(_TRY_LOCK, {"ns": NAMESPACE, "key": key}).scalar())


def usable(conn, storage, key: str) -> bool:
    """Under the object's lock (:func:`lock`): the staged object ``key`` is there, and the cleanup has not decided
    to remove it."""
    if conn.execute(_REMOVAL_DECIDED, {"b_key": key}).first() is not None:
        return False
    return storage.stat(key) is not None


def decide_removal(conn, key: str) -> None:
    """Under the object's lock, in a transaction that commits before the object is deleted."""
    conn.execute(insert(staging_removals).values(key=key).on_conflict_do_nothing())


def removed(conn, key: str) -> None:
    """The object ``key`` is gone: its decision is forgotten."""
    conn.execute(delete(staging_removals).where(staging_removals.c.key == key))
