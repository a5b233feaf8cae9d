"""Counter fold: moves the transitions, durations, uploads, jobs and room counted since its last round into their
totals.

``/metrics`` adds up ``transition_counts``, ``duration_counts``, ``upload_total`` and ``job_counts`` and the deltas
not yet folded (``app/adapters/postgres/transition_counts.py``, ``duration_counts.py``, ``row_counts.py``), so a
scrape costs what those small tables cost, not what ``job_history``, ``step_runs``, ``attachments`` and ``jobs``
do; the web's room check adds up ``room_total`` and ``room_deltas`` (``app/adapters/postgres/room_held.py``), not
the backlog's attachments.
Folding keeps the deltas few; a fold that falls behind (the scheduler down) makes scrapes and checks slower, never
wrong.
Safe with two schedulers: each takes its own deltas (``SKIP LOCKED``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from app.adapters.postgres import duration_counts, room_held, row_counts, transition_counts
from app.adapters.postgres.db import transaction

log = logging.getLogger("attache.scheduler.counters")


@dataclass(frozen=True)
class CounterFoldConfig:
    #: delta rows per transaction; ``run_once`` loops over batches until fewer are left
    batch: int = 10_000
    max_batches: int = 100


class CounterFold:
    name = "counter_fold"

    def __init__(self, engine: Engine, config: CounterFoldConfig = CounterFoldConfig()):
        self.engine = engine
        self.config = config

    def run_once(self) -> dict[str, int]:
        folded = {"folded": self._fold(transition_counts.fold), "durations_folded": self._fold(duration_counts.fold),
                  "room_folded": self._fold(room_held.fold), "uploads_folded": self._fold(row_counts.fold_uploads),
                  "jobs_folded": self._fold(row_counts.fold_jobs)}
        if any(folded.values()):
            log.debug("counter fold moved %(folded)d transition, %(durations_folded)d duration, %(room_folded)d room, "
                      "%(uploads_folded)d upload and %(jobs_folded)d job delta rows", folded, extra=folded)
        return folded

    def _fold(self, fold) -> int:
        folded = 0
        for _ in range(self.config.max_batches):
            with transaction(self.engine) as conn:
                # a fold lost to a crash puts its deltas back with its totals: nothing to wait for the WAL for
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                moved = fold(conn, batch=self.config.batch)
            folded += moved
            if moved < self.config.batch:
                break
        return folded
