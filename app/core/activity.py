"""The system at a glance: an hour or a day of activity, per minute (or per quarter hour), from PostgreSQL.

The numbers behind the console's charts, computed from the rows attache
keeps anyway, so every web process draws the same charts and nothing is
lost on a restart:

* uploads accepted (``attachments.created_at``), jobs ready (``jobs.ready_at``)
  and jobs failed (``job_history`` rows into ``failed``) per bucket;
* upload → ready, p50 and p99 of the jobs that became ready in each bucket
  (``ready_at - created_at``, as ``attache_job_duration_seconds``);
* the outbox backlog at the end of each bucket, counted back from the
  backlog now: going back over a bucket adds the rows published in it and
  removes the rows created in it (outbox rows are kept, see
  ``operations.md``);
* dead letters recorded per queue per bucket (``dead_letters``: what the
  worker's recorder wrote, so not those dead-lettered while PostgreSQL was
  down);
* failures and retries by error code over the whole window.

Buckets are aligned to the clock (``date_bin``); the last one is the
current, partial one. Every query reads an index made for it (migration
0011) and the whole runs in one read-only snapshot, its queries under a
:data:`TIME_LIMIT_SECONDS` limit on them all (``time_limit``:
:class:`~app.errors.QueryTimeout`). The console's dashboards asked for the
same window at once share one call (``app/web/console.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import text
from sqlalchemy.engine import Engine

from app.adapters.postgres.db import time_limit, transaction
from app.adapters.postgres.models import JobState

#: how long the window's queries may take together (``time_limit`` bounds the block, not each statement)
TIME_LIMIT_SECONDS = 10.0
_ORIGIN = datetime(2000, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Window:
    name: str
    span: timedelta
    bucket: timedelta
    #: how a bucket is named in a chart's axis ("per minute")
    per: str

    @property
    def buckets(self) -> int:
        return int(self.span / self.bucket)


WINDOWS = {
    "hour": Window("hour", timedelta(hours=1), timedelta(minutes=1), "per minute"),
    "day": Window("day", timedelta(days=1), timedelta(minutes=15), "per 15 minutes"),
}


def _bucketed(conn, sql: str, params: dict) -> dict[datetime, tuple]:
    """``{bucket start: the rest of the row}`` for a query whose first column is the bucket."""
    return {row[0]: tuple(row[1:]) for row in conn.execute(text(sql), params)}


def activity(engine: Engine, window_name: str = "hour") -> dict:
    """The charts' numbers for the last hour or day; ValueError for another window name.

    ``times`` are the buckets' starts; every per-bucket list has one value a
    bucket (``None`` where a percentile has no job to be taken from).
    """
    if window_name not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}")
    window = WINDOWS[window_name]
    with transaction(engine) as conn:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        with time_limit(conn, TIME_LIMIT_SECONDS):
            now = conn.execute(text("SELECT now()")).scalar_one()
            end = conn.execute(text("SELECT date_bin(:step, now(), :origin) + :step"),
                               {"step": window.bucket, "origin": _ORIGIN}).scalar_one()
            start = end - window.span
            params = {"step": window.bucket, "origin": _ORIGIN, "start": start, "failed": JobState.FAILED.value,
                      "processing": JobState.PROCESSING.value, "queued": JobState.QUEUED.value}
            uploads = _bucketed(conn, "SELECT date_bin(:step, created_at, :origin), count(*) FROM attachments "
                                      "WHERE created_at >= :start GROUP BY 1", params)
            ready = _bucketed(conn, """
                SELECT date_bin(:step, ready_at, :origin), count(*),
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM ready_at - created_at)),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM ready_at - created_at))
                FROM jobs WHERE ready_at >= :start GROUP BY 1""", params)
            failed = _bucketed(conn, "SELECT date_bin(:step, at, :origin), count(*) FROM job_history "
                                     "WHERE error_code IS NOT NULL AND to_state = :failed AND at >= :start "
                                     "GROUP BY 1", params)
            by_code = conn.execute(text("""
                SELECT error_code, count(*) FILTER (WHERE to_state = :failed) AS failed,
                       count(*) FILTER (WHERE from_state = :processing AND to_state = :queued) AS retried
                FROM job_history WHERE error_code IS NOT NULL AND at >= :start
                GROUP BY 1 ORDER BY 2 DESC, 3 DESC, 1"""), params).all()
            pending = conn.execute(text("SELECT count(*) FROM outbox WHERE published_at IS NULL")).scalar_one()
            created = _bucketed(conn, "SELECT date_bin(:step, created_at, :origin), count(*) FROM outbox "
                                      "WHERE (published_at IS NULL OR published_at >= :start) "
                                      "AND created_at >= :start GROUP BY 1", params)
            published = _bucketed(conn, "SELECT date_bin(:step, published_at, :origin), count(*) FROM outbox "
                                        "WHERE published_at >= :start GROUP BY 1", params)
            dead = conn.execute(text("SELECT queue_name, date_bin(:step, recorded_at, :origin), count(*) "
                                     "FROM dead_letters WHERE recorded_at >= :start GROUP BY 1, 2 ORDER BY 1"),
                                params).all()
    times = [start + i * window.bucket for i in range(window.buckets)]
    backlog = [0] * len(times)
    level = pending
    for index in range(len(times) - 1, -1, -1):  # the end of the last bucket is now
        backlog[index] = level
        level += published.get(times[index], (0,))[0] - created.get(times[index], (0,))[0]
    position = {t: index for index, t in enumerate(times)}
    queues: dict[str, list[int]] = {}
    for queue, bucket, count in dead:
        if bucket in position:
            queues.setdefault(queue, [0] * len(times))[position[bucket]] = count
    return {
        "window": window.name, "per": window.per, "bucket_seconds": window.bucket.total_seconds(),
        "start": start.isoformat(), "end": end.isoformat(), "now": now.isoformat(),
        "times": [t.isoformat() for t in times],
        "uploads": [uploads.get(t, (0,))[0] for t in times],
        "ready": [ready.get(t, (0,))[0] for t in times],
        "failed": [failed.get(t, (0,))[0] for t in times],
        "latency_p50": [_seconds(ready.get(t, (0, None))[1]) for t in times],
        "latency_p99": [_seconds(ready.get(t, (0, None, None))[2]) for t in times],
        "outbox_backlog": backlog,
        "dead_letters": queues,
        "failures_by_code": [{"error_code": code, "failed": f, "retried": r} for code, f, r in by_code],
    }


def _seconds(value) -> float | None:
    return None if value is None else round(float(value), 3)
