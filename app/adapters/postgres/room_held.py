"""What the unfinished jobs still write to storage, counted as jobs change: what the room check reads.

Each job carries its need (``jobs.room_bytes``, :func:`app.core.room.need`), and statement triggers on ``jobs``
(migration 0030) append what each statement changed of the unfinished jobs' sum to ``room_deltas``. :func:`fold`
moves the deltas into ``room_total``'s one row (the scheduler's ``counter_fold``); :data:`COUNTED` adds up both, so
the check is exact whenever a job's change commits, and costs what those small tables cost rather than a join of the
backlog to its attachments (0.5-0.6 s for 100,000 unfinished jobs among a million attachments).

Two folds at once take disjoint deltas (``SKIP LOCKED``) and add them to the one total row in turn.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from app.adapters.postgres.row_counts import one_row_fold, one_row_sum

_FOLD = one_row_fold("room_deltas", "bytes", "room_total", "bytes")

#: the need of the jobs the triggers count: the folded total and the deltas not yet folded (an SQL expression)
COUNTED = one_row_sum("room_deltas", "bytes", "room_total", "bytes")


def fold(conn: Connection, *, batch: int) -> int:
    """Move up to ``batch`` delta rows into ``room_total``; how many were moved."""
    return conn.execute(_FOLD, {"batch": batch}).scalar()
