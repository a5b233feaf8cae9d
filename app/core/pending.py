"""Each uploader's uploads not yet ready or failed, and the limit on them.

``ATTACHE_MAX_PENDING_PER_UPLOADER`` bounds the work one uploader can put
ahead of everyone else's: the queues are first come, first served, so
without it a thousand costly images from one uploader held every other
uploader's photo behind them. The upload's transaction asks :func:`admit`
before it commits (and the web asks :func:`admit_now` before it reads a
large body). Counting reads at most ``limit`` rows of one uploader's index
entries in ``pending_uploads``, whatever the size of ``jobs``.

``pending_uploads`` follows ``jobs`` by trigger (migration 0021): a job
inserted in its attachment's own transaction (an upload's: a backfill's
job comes later) is added, and its move to ``ready`` or ``failed``
removes it, whichever code makes the move. The previous release's
workers, still running while a release migrates, knew nothing of the
table: rows left by them refused an uploader for good (an adversarial
run). Replays (``failed -> queued``) and backfills are the operators'
work, never counted.

The limit is not taken under a lock: uploads of one uploader committing at
the same moment each count the others as not there yet, so the uploader can
pass it by as many uploads as it has in flight at once (a lock would
serialize an uploader's uploads for a bound that needs no such precision).
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine

from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import pending_uploads
from app.errors import TooManyPending


def count(conn: Connection, owner: str, *, up_to: int) -> int:
    """How many of ``owner``'s uploads are pending, counting no further than ``up_to``."""
    some = select(pending_uploads.c.job_id).where(pending_uploads.c.owner == owner).limit(up_to).subquery()
    return conn.execute(select(func.count()).select_from(some)).scalar_one()


def admit(conn: Connection, owner: str, limit: int) -> None:
    """Raise :class:`TooManyPending` when ``owner`` has ``limit`` uploads pending (``limit`` 0: no limit)."""
    if limit and count(conn, owner, up_to=limit) >= limit:
        raise TooManyPending(f"{limit} of your uploads are still being processed, the most one uploader may have "
                             "waiting; retry once some are ready")


def admit_now(engine: Engine, owner: str, limit: int) -> None:
    """:func:`admit` in a transaction of its own: a refusal before an upload's body is read."""
    if limit:
        with transaction(engine) as conn:
            admit(conn, owner, limit)
