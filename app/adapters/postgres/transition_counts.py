"""The transitions of ``job_history``, counted as they are written: what ``/metrics`` reads of it.

``job_history`` grows with every transition for ever, and counting it at
each scrape cost a whole-table ``GROUP BY`` (0.3 s at a million uploads).
A statement trigger on it (migration 0019) appends each insert's count per
kind of transition to ``transition_deltas``; :func:`fold` moves the deltas
into ``transition_counts`` (the scheduler's ``counter_fold``), and
:func:`transitions` adds both up in one statement, so a scrape is exact
whenever a fold commits. A kind of transition is ``(from_state, to_state,
worker_lost)``: ``from_state`` is ``none`` for a job's first row, and
``worker_lost`` says a lease recovery wrote it.

Two folds at once take disjoint deltas (``SKIP LOCKED``) and update
the totals in one order (no deadlock); the deltas appended while one runs
wait for the next.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

_FOLD = text("""
    WITH moved AS (
        DELETE FROM transition_deltas WHERE id IN (
            SELECT id FROM transition_deltas ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED)
        RETURNING from_state, to_state, worker_lost, rows
    ), added AS (
        INSERT INTO transition_counts (from_state, to_state, worker_lost, total)
        SELECT from_state, to_state, worker_lost, sum(rows) FROM moved GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (from_state, to_state, worker_lost) DO UPDATE SET total = transition_counts.total + EXCLUDED.total
    )
    SELECT count(*) FROM moved
""")

_TRANSITIONS = text("""
    SELECT from_state, to_state, worker_lost, sum(n)::bigint FROM (
        SELECT from_state, to_state, worker_lost, total AS n FROM transition_counts
        UNION ALL
        SELECT from_state, to_state, worker_lost, rows FROM transition_deltas
    ) kinds GROUP BY 1, 2, 3
""")


def fold(conn: Connection, *, batch: int) -> int:
    """Move up to ``batch`` delta rows into ``transition_counts``; how many were moved."""
    return conn.execute(_FOLD, {"batch": batch}).scalar()


def transitions(conn: Connection) -> list[tuple[str, str, bool, int]]:
    """Every kind of transition written so far, with its count: ``(from_state, to_state, worker_lost, count)``."""
    return [tuple(row) for row in conn.execute(_TRANSITIONS)]
