"""The maintenance services' ledger: what each round did, kept in PostgreSQL for ``/metrics``.

``/metrics`` is computed from PostgreSQL at scrape time, so every web
worker answers the same; a counter kept in the scheduler's memory would
reach no scrape. After every round the scheduler's job runner
(``scheduler/__main__.py``) calls :meth:`SweeperRuns.record`, which
upserts, in one transaction:

* ``sweeper_runs``: the service's interval, one more ``ok``, ``skipped``
  (another scheduler holds the lock, or the broker is unreachable) or
  ``failed`` (``run_once()`` raised, or returned a count of
  :data:`FAILURE_KEYS` above zero) round, the last success and the
  round's duration;
* ``sweeper_items``: each count ``run_once()`` returned, added to the
  service's running totals (``published``, ``requeued``, ``removed``,
  ``retired``, ``reannounced``, ...), zeros included so that every series
  exists from the first round on.

Two schedulers add to the same rows. A round that raised adds no items:
what it did before it failed is not known. A storage cleanup that went on
past objects the store refused to delete returns its counts, ``not_removed``
among them: it is ``failed`` (its service's last success stays, and
``AttacheSweeperOverdue`` fires while an object stays refused, as when such
an object made every round raise), and its items are added. Recording is best effort: a
lost database costs the round's figures, never the scheduler.
"""

from __future__ import annotations

import logging
from typing import Mapping

from sqlalchemy import func
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import SWEEPER_OUTCOMES, sweeper_items, sweeper_runs

log = logging.getLogger("attache.scheduler.runs")

#: keys of ``run_once()`` results that describe the moment rather than work done: not added up
SNAPSHOT_KEYS = frozenset({"pending", "backlog", "skipped", "deferred"})
#: keys of ``run_once()`` results that count work the round could not do: one above zero makes the round ``failed``
#: (the storage cleanups' deletes the store refused, ``scheduler/refusals.py``)
FAILURE_KEYS = frozenset({"not_removed"})


def outcome_of(counts: Mapping[str, int] | None) -> str:
    """``None`` (the round raised) is ``failed``, and so is a round that counts work it could not do
    (:data:`FAILURE_KEYS`); a round that says ``skipped`` did nothing."""
    if counts is None:
        return "failed"
    if counts.get("skipped"):
        return "skipped"
    return "failed" if any(counts.get(key) for key in FAILURE_KEYS) else "ok"


def items_of(counts: Mapping[str, int] | None) -> dict[str, int]:
    """The counts of work done, from a round's result."""
    return {action: int(n) for action, n in (counts or {}).items() if action not in SNAPSHOT_KEYS}


class SweeperRuns:
    def __init__(self, engine: Engine):
        self.engine = engine

    def record(self, service: str, interval_seconds: float, counts: Mapping[str, int] | None,
               duration_seconds: float) -> None:
        """Add one round of ``service`` (``counts`` is ``None`` when it raised). Never raises."""
        try:
            self._record(service, interval_seconds, counts, duration_seconds)
        except Exception as exc:  # the next round records itself; the figures of this one are lost
            log.warning("could not record the %s round: %s", service, exc, extra={"service": service})

    def _record(self, service: str, interval_seconds: float, counts: Mapping[str, int] | None,
                duration_seconds: float) -> None:
        outcome = outcome_of(counts)
        run = insert(sweeper_runs).values(
            service=service, interval_seconds=float(interval_seconds), last_duration_seconds=float(duration_seconds),
            last_success_at=func.now() if outcome == "ok" else None,
            **{f"runs_{name}": int(name == outcome) for name in SWEEPER_OUTCOMES})
        run = run.on_conflict_do_update(index_elements=[sweeper_runs.c.service], set_={
            "interval_seconds": run.excluded.interval_seconds,
            "last_run_at": func.now(),
            "last_duration_seconds": run.excluded.last_duration_seconds,
            # greatest() passes over NULL: a round that did not succeed keeps the last success
            "last_success_at": func.greatest(run.excluded.last_success_at, sweeper_runs.c.last_success_at),
            **{f"runs_{name}": sweeper_runs.c[f"runs_{name}"] + run.excluded[f"runs_{name}"]
               for name in SWEEPER_OUTCOMES},
        })
        items = items_of(counts)
        with transaction(self.engine) as conn:
            conn.execute(run)
            if items:
                add = insert(sweeper_items).values(
                    [{"service": service, "action": action, "total": n} for action, n in sorted(items.items())])
                conn.execute(add.on_conflict_do_update(
                    index_elements=[sweeper_items.c.service, sweeper_items.c.action],
                    set_={"total": sweeper_items.c.total + add.excluded.total}))
