"""The duration histograms of ``/metrics``, counted as their rows are written.

They were computed at each scrape over the newest 10,000 rows of their
tables: a moving window whose counts went down, which Prometheus takes for
counter resets. Triggers on ``job_history`` and ``step_runs`` (migration
0026) now append each insert's observations, per histogram, label and
bucket, to ``duration_deltas``; :func:`fold` moves them into
``duration_counts`` (the scheduler's ``counter_fold``, as
``transition_counts.py`` moves the transitions), and :func:`histograms`
adds up both tables in one statement, so a scrape is exact whenever a fold
commits and never goes down (a sum too: kept in whole microseconds).

The histograms, each observed when a row is written:

* ``job``: a job's ``ready`` history row, from its upload;
* ``attempt``: a history row after one to ``processing``, from that claim;
* ``step``: a step run, labelled with its step.

The buckets' upper bounds are the database's (``duration_bounds()``,
written once, in the migration).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

_FOLD = text("""
    WITH moved AS (
        DELETE FROM duration_deltas WHERE id IN (
            SELECT id FROM duration_deltas ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED)
        RETURNING histogram, label, le, rows, microseconds
    ), added AS (
        INSERT INTO duration_counts (histogram, label, le, total, microseconds)
        SELECT histogram, label, le, sum(rows), sum(microseconds) FROM moved GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (histogram, label, le) DO UPDATE
        SET total = duration_counts.total + EXCLUDED.total,
            microseconds = duration_counts.microseconds + EXCLUDED.microseconds
    )
    SELECT count(*) FROM moved
""")

_BUCKETS = text("""
    SELECT histogram, label, le, sum(n)::bigint, sum(microseconds)::bigint FROM (
        SELECT histogram, label, le, total AS n, microseconds FROM duration_counts
        UNION ALL
        SELECT histogram, label, le, rows, microseconds FROM duration_deltas
    ) buckets GROUP BY 1, 2, 3
""")


@dataclass(frozen=True)
class Histogram:
    """One series: its cumulative counts per upper bound (the last ``inf``) and the sum of its observations."""

    buckets: tuple[tuple[float, int], ...]
    seconds: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1]


def fold(conn: Connection, *, batch: int) -> int:
    """Move up to ``batch`` delta rows into ``duration_counts``; how many were moved."""
    return conn.execute(_FOLD, {"batch": batch}).scalar()


def histograms(conn: Connection) -> dict[str, dict[str, Histogram]]:
    """Every series observed so far: ``{histogram: {label: Histogram}}`` (a histogram never observed is absent)."""
    bounds = conn.execute(text("SELECT unnest(duration_bounds())")).scalars().all()
    counts: dict[tuple[str, str], dict[float, int]] = {}
    sums: dict[tuple[str, str], int] = {}  # whole microseconds: the same whatever the order they were added in
    for histogram, label, le, n, microseconds in conn.execute(_BUCKETS):
        counts.setdefault((histogram, label), {})[le] = n
        sums[histogram, label] = sums.get((histogram, label), 0) + microseconds
    found: dict[str, dict[str, Histogram]] = {}
    for (histogram, label), per_bound in counts.items():
        running, buckets = 0, []
        for bound in bounds:
            running += per_bound.get(bound, 0)
            buckets.append((bound, running))
        found.setdefault(histogram, {})[label] = Histogram(tuple(buckets), sums[histogram, label] / 1e6)
    return found
