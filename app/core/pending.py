"""Each uploader's uploads not yet ready or failed, and the limit on them.

``ATTACHE_MAX_PENDING_PER_UPLOADER`` bounds the work one uploader can put
ahead of everyone else's: the queues are first come, first served, so
without it a thousand costly images from one uploader held every other
uploader's photo behind them. The upload's transaction asks :func:`admit`
before it commits, as does a tus creation's; an uploader
refused lately is refused before its next body is read
(:func:`admit_before_the_body`). Counting reads at most ``limit`` rows of one uploader's index
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

import time

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection, Engine

from app.adapters.postgres.models import pending_uploads
from app.errors import TooManyPending

_SOME = (select(pending_uploads.c.job_id).where(pending_uploads.c.owner == bindparam("b_owner"))
         .limit(bindparam("b_up_to")).subquery())
_COUNT = select(func.count()).select_from(_SOME)  # built once, as every upload asks it


def count(conn: Connection, owner: str, *, up_to: int) -> int:
    """How many of ``owner``'s uploads are pending, counting no further than ``up_to``."""
    return conn.execute(_COUNT, {"b_owner": owner, "b_up_to": up_to}).scalar_one()


#: how long an uploader refused for its pending uploads is refused again before its next body is read, without a
#: query (the ``Retry-After`` of a ``429``): a query before every body cost each large upload 2-4 ms of the web
#: (an adversarial run), and ingest 0.68 -> 0.55 of raw streaming in a bench run
REFUSED_SECONDS = 5.0
#: uploaders refused lately, in this process: (database, owner) -> when
_refused: dict[tuple[str, str], float] = {}


def _refusal(limit: int) -> TooManyPending:
    return TooManyPending(f"{limit} of your uploads are still being processed, the most one uploader may have "
                          "waiting; retry once some are ready")


def admit(conn: Connection, owner: str, limit: int) -> None:
    """Raise :class:`TooManyPending` when ``owner`` has ``limit`` uploads pending (``limit`` 0: no limit)."""
    if limit and count(conn, owner, up_to=limit) >= limit:
        if len(_refused) > 10_000:
            _refused.clear()
        _refused[(conn.engine.url.render_as_string(), owner)] = time.monotonic()
        raise _refusal(limit)


def admit_before_the_body(engine: Engine, owner: str, limit: int) -> None:
    """Raise :class:`TooManyPending` for an uploader :func:`admit` refused in this process in the last
    :data:`REFUSED_SECONDS`, before its body is read; nothing is asked of PostgreSQL."""
    if not (limit and _refused):  # nobody refused lately: the usual case, at no cost
        return
    key = (engine.url.render_as_string(), owner)
    when = _refused.get(key)
    if when is not None:
        if time.monotonic() - when < REFUSED_SECONDS:
            raise _refusal(limit)
        _refused.pop(key, None)
