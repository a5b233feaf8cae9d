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
* the cleanup looks for the attachment row and deletes while holding it,
  and leaves the object for a later round if an upload holds it.
"""

from __future__ import annotations

from sqlalchemy import text

#: the first key of the two-key advisory locks of staged objects (a key space of its own in PostgreSQL)
NAMESPACE = 727275


def lock(conn, key: str) -> None:
    """Wait for the lock of the staged object ``key``, held until the transaction ends."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:ns, hashtext(:key))"), {"ns": NAMESPACE, "key": key})


def try_lock(conn, key: str) -> bool:
    """The lock of the staged object ``key`` if no one holds it (until the transaction ends); else False."""
    return bool(conn.execute(text("SELECT pg_try_advisory_xact_lock(:ns, hashtext(:key))"),
                             {"ns": NAMESPACE, "key": key}).scalar())
