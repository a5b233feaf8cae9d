"""The uploads and the jobs per state, counted as their rows change: what ``/metrics`` reads of ``attachments`` and
``jobs``.

A scrape counted both tables whole (``count(*)`` of ``attachments``, a ``GROUP BY`` of ``jobs``), and both grow
with every upload for ever: some 0.3 s at a million rows, toward Prometheus's 10 s scrape timeout. Triggers
(migration 0031) now append what each change adds: to ``upload_deltas`` the attachments each insert statement
made; to ``job_deltas``, per ``(state, pipeline_version)``, the jobs each insert statement made (+), each delete
statement removed (-) and each job a state change moved (- from where it was, + to where it is).
:func:`fold_uploads` and :func:`fold_jobs` move the deltas into ``upload_total``'s one row and ``job_counts``
(the scheduler's ``counter_fold``, as ``transition_counts.py`` moves the transitions), and :func:`uploads` and
:func:`jobs` each add up a total and its deltas in one statement, so a scrape is exact whenever a fold commits.

``attache_uploads_total`` is a counter of accepted uploads: nothing counts an attachment's deletion (attache
deletes none), so it never goes down. ``attache_jobs`` is a gauge: a ``(state, pipeline_version)`` with no job
left is left out, as the ``GROUP BY`` left it out.

Two folds at once take disjoint deltas (``SKIP LOCKED``) and update the totals in one order (no deadlock).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection


def one_row_fold(deltas: str, delta: str, totals: str, total: str):
    """The statement that moves up to ``:batch`` rows of ``deltas`` (their ``delta`` column) into the one row of
    ``totals`` (its ``total``, ``id = 1``), returning how many it moved: the uploads' fold here, the room's in
    ``room_held.py``."""
    return text(f"""
        WITH moved AS (
            DELETE FROM {deltas} WHERE id IN (
                SELECT id FROM {deltas} ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED)
            RETURNING {delta}
        ), added AS (
            UPDATE {totals} SET {total} = {total} + (SELECT coalesce(sum({delta}), 0) FROM moved) WHERE id = 1
        )
        SELECT count(*) FROM moved
    """)


def one_row_sum(deltas: str, delta: str, totals: str, total: str) -> str:
    """An SQL expression: the one-row total and the deltas not yet folded into it, added up."""
    return f"((SELECT coalesce(sum({total}), 0) FROM {totals}) + (SELECT coalesce(sum({delta}), 0) FROM {deltas}))"


_FOLD_UPLOADS = one_row_fold("upload_deltas", "rows", "upload_total", "total")

_FOLD_JOBS = text("""
    WITH moved AS (
        DELETE FROM job_deltas WHERE id IN (
            SELECT id FROM job_deltas ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED)
        RETURNING state, pipeline_version, rows
    ), added AS (
        INSERT INTO job_counts (state, pipeline_version, total)
        SELECT state, pipeline_version, sum(rows) FROM moved GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (state, pipeline_version) DO UPDATE SET total = job_counts.total + EXCLUDED.total
    )
    SELECT count(*) FROM moved
""")

_UPLOADS = text("SELECT " + one_row_sum("upload_deltas", "rows", "upload_total", "total"))

#: the jobs per state and version; a pair whose jobs all moved on adds up to 0 and is left out
_JOBS = text("""
    SELECT state, pipeline_version, sum(n)::bigint FROM (
        SELECT state, pipeline_version, total AS n FROM job_counts
        UNION ALL
        SELECT state, pipeline_version, rows FROM job_deltas
    ) counted GROUP BY 1, 2 HAVING sum(n) <> 0 ORDER BY 1, 2
""")


def fold_uploads(conn: Connection, *, batch: int) -> int:
    """Move up to ``batch`` delta rows into ``upload_total``; how many were moved."""
    return conn.execute(_FOLD_UPLOADS, {"batch": batch}).scalar()


def fold_jobs(conn: Connection, *, batch: int) -> int:
    """Move up to ``batch`` delta rows into ``job_counts``; how many were moved."""
    return conn.execute(_FOLD_JOBS, {"batch": batch}).scalar()


def uploads(conn: Connection) -> int:
    """Every attachment ever inserted."""
    return int(conn.execute(_UPLOADS).scalar())


def jobs(conn: Connection) -> list[tuple[str, int, int]]:
    """The jobs there are now: ``(state, pipeline_version, count)``, none with a count of 0."""
    return [tuple(row) for row in conn.execute(_JOBS)]
