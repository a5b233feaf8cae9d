"""``/metrics``: Prometheus text, read from PostgreSQL (and RabbitMQ) at scrape time.

PostgreSQL is the source of truth, so the numbers are computed from it
rather than counted in process memory: every web worker answers the same,
nothing is lost when a process restarts, and counters stay monotonic
because what they count is only ever added to. The uploads, the jobs per
state, ``job_history``'s transitions and the duration histograms are
counted as their rows are written (``app/adapters/postgres/row_counts.py``,
``transition_counts.py``, ``duration_counts.py``): a scrape reads none of
``attachments``, ``job_history`` and ``step_runs``, and of ``jobs`` only
its ``processing`` jobs (the expired leases); each of those tables grows
with every upload for ever, and a scan of them at each scrape with it.

* ``attache_uploads_total`` - accepted uploads;
* ``attache_job_transitions_total{from,to}`` - every transition of the state machine;
* ``attache_retries_total`` - managed retries (``processing`` -> ``queued`` after a transient error);
* ``attache_lease_expiries_total`` - leases recovered by the scheduler (``worker_lost``);
* ``attache_reconciler_reannounced_total`` - stranded jobs announced again by the reconciler
  (its self-loop history rows, ``queued -> queued`` and ``processing -> processing``);
* ``attache_jobs{state,pipeline_version}`` - jobs per state (a state and version with no job: no series);
* ``attache_outbox_backlog``, ``attache_outbox_oldest_age_seconds``;
* ``attache_outbox_oldest_due_age_seconds`` - how long the oldest unpublished row has been due
  (a managed retry's row is not late while its delay runs; 0 when none is due);
* ``attache_leases_expired`` - ``processing`` jobs whose lease has run out now;
* ``attache_job_duration_seconds`` - time from upload to ``ready`` (histogram of every job made ready);
* ``attache_attempt_duration_seconds`` - from a claim to what followed it in the history (ready, failed,
  requeued; histogram of every attempt);
* ``attache_step_duration_seconds{step}`` - how long each step took in the worker (histogram of every
  run in ``step_runs``).
* ``attache_dlq_messages{queue}`` - dead letters waiting (absent while RabbitMQ is down).

What the scheduler's maintenance services did, from their ledger (``scheduler/runs.py``),
one series per service that has run at least once:

* ``attache_sweeper_items_total{service,action}`` - what its rounds did, added up: the counts
  its ``run_once()`` returns (``published``, ``requeued``, ``reannounced``, ``removed``, ``retired``, ...);
* ``attache_sweeper_runs_total{service,outcome}`` - rounds that ended ``ok``, ``skipped`` or ``failed``;
* ``attache_sweeper_last_success_timestamp_seconds{service}`` - the end of its last ``ok`` round
  (absent until it has one);
* ``attache_sweeper_first_run_timestamp_seconds{service}`` - the end of its first round;
* ``attache_sweeper_interval_seconds{service}`` - how often the scheduler runs it;
* ``attache_sweeper_last_duration_seconds{service}`` - how long its last round took.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from sqlalchemy import text

from app.adapters.postgres import duration_counts, row_counts, transition_counts
from app.adapters.postgres.models import SWEEPER_OUTCOMES, JobState
from app.errors import AttacheError

log = logging.getLogger("attache.metrics")

#: the bound parameters of the queries: the job states by name (``:queued``, ``:processing`` ...)
STATES = {state.value: state.value for state in JobState}


#: each duration histogram's name and help, by its name in ``duration_counts``, and its label's name (if any)
DURATIONS = {
    "job": ("attache_job_duration_seconds", "Upload to ready of each job.", None),
    "attempt": ("attache_attempt_duration_seconds", "Claim to outcome of each attempt.", None),
    "step": ("attache_step_duration_seconds", "Worker time per pipeline step.", "step"),
}


def _durations(conn):
    """The duration histograms, as they were counted when their rows were written
    (``app/adapters/postgres/duration_counts.py``): cumulative, never a window."""
    found = duration_counts.histograms(conn)
    for histogram, (name, doc, label) in DURATIONS.items():
        family = HistogramMetricFamily(name, doc, labels=[label] if label else [])
        for value, series in sorted(found.get(histogram, {}).items()):
            buckets = [("+Inf" if bound == float("inf") else str(bound), count) for bound, count in series.buckets]
            family.add_metric([value] if label else [], buckets, series.seconds)
        yield family


class DatabaseCollector:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        with self.engine.connect() as conn:
            # counted as the rows are written (``app/adapters/postgres/row_counts.py``): not a scan of two tables
            # that grow with every upload
            yield CounterMetricFamily("attache_uploads", "Accepted uploads.", value=row_counts.uploads(conn))

            yield from _history(conn)

            jobs = GaugeMetricFamily("attache_jobs", "Jobs per state and pipeline version.",
                                     labels=["state", "pipeline_version"])
            for state, version, count in row_counts.jobs(conn):
                jobs.add_metric([state, str(version)], count)
            yield jobs

            backlog, age = conn.execute(text(
                "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) "
                "FROM outbox WHERE published_at IS NULL")).one()
            yield GaugeMetricFamily("attache_outbox_backlog", "Outbox rows not yet confirmed by RabbitMQ.",
                                    value=backlog)
            yield GaugeMetricFamily("attache_outbox_oldest_age_seconds", "Age of the oldest unpublished outbox row.",
                                    value=float(age))
            due_age = conn.execute(text(
                "SELECT coalesce(extract(epoch FROM now() - min(available_at)), 0) "
                "FROM outbox WHERE published_at IS NULL AND available_at <= now()")).scalar()
            yield GaugeMetricFamily("attache_outbox_oldest_due_age_seconds",
                                    "How long the oldest unpublished outbox row has been due.", value=float(due_age))
            expired = conn.execute(text(
                "SELECT count(*) FROM jobs WHERE state = :processing AND lease_owner IS NOT NULL "
                "AND lease_expires_at <= now()"), STATES).scalar()
            yield GaugeMetricFamily("attache_leases_expired", "Processing jobs whose lease ran out.", value=expired)

            yield from _durations(conn)
            yield from _sweepers(conn)


def _history(conn):
    """The counters of ``job_history``: its rows by transition and by whether a lease recovery wrote them
    (``worker_lost``), as they were counted when written (``app/adapters/postgres/transition_counts.py``), not
    from ``job_history`` itself, a table that grows with every transition."""
    rows = transition_counts.transitions(conn)
    transitions: dict[tuple[str, str], int] = {}
    for from_state, to_state, _, count in rows:
        transitions[from_state, to_state] = transitions.get((from_state, to_state), 0) + count
    family = CounterMetricFamily("attache_job_transitions", "Job state transitions.", labels=["from", "to"])
    for (from_state, to_state), count in transitions.items():
        family.add_metric([from_state, to_state], count)
    yield family
    processing, queued = JobState.PROCESSING.value, JobState.QUEUED.value
    yield CounterMetricFamily("attache_retries", "Managed retries after transient errors.", value=sum(
        count for from_state, to_state, lost, count in rows
        if (from_state, to_state, lost) == (processing, queued, False)))
    yield CounterMetricFamily("attache_lease_expiries", "Expired leases recovered by the scheduler.", value=sum(
        count for from_state, _, lost, count in rows if from_state == processing and lost))
    yield CounterMetricFamily("attache_reconciler_reannounced", "Stranded jobs announced again by the reconciler.",
                              value=sum(count for from_state, to_state, _, count in rows if from_state == to_state))


def _sweepers(conn):
    """The maintenance services' ledger (``sweeper_runs``, ``sweeper_items``)."""
    items = CounterMetricFamily("attache_sweeper_items", "What the maintenance services did, added up.",
                                labels=["service", "action"])
    for service, action, total in conn.execute(text(
            "SELECT service, action, total FROM sweeper_items ORDER BY 1, 2")):
        items.add_metric([service, action], total)
    yield items

    runs = CounterMetricFamily("attache_sweeper_runs", "Rounds of each maintenance service, by outcome.",
                               labels=["service", "outcome"])
    gauges = {name: GaugeMetricFamily(f"attache_sweeper_{name}", doc, labels=["service"]) for name, doc in (
        ("last_success_timestamp_seconds", "When the maintenance service last ended a round ok (Unix time)."),
        ("first_run_timestamp_seconds", "When the maintenance service ended its first round (Unix time)."),
        ("interval_seconds", "How often the scheduler runs the maintenance service."),
        ("last_duration_seconds", "How long the maintenance service's last round took."))}
    counters = ", ".join(f"runs_{outcome}" for outcome in SWEEPER_OUTCOMES)
    for row in conn.execute(text(
            f"SELECT service, {counters}, extract(epoch FROM last_success_at), extract(epoch FROM first_run_at), "
            "interval_seconds, last_duration_seconds FROM sweeper_runs ORDER BY service")):
        service, counts, values = row[0], row[1:1 + len(SWEEPER_OUTCOMES)], row[1 + len(SWEEPER_OUTCOMES):]
        for outcome, count in zip(SWEEPER_OUTCOMES, counts):
            runs.add_metric([service, outcome], count)
        for name, value in zip(gauges, values):
            if value is not None:
                gauges[name].add_metric([service], float(value))
    yield runs
    yield from gauges.values()


class BrokerCollector:
    def __init__(self, dead_letters):
        self.dead_letters = dead_letters

    def collect(self):
        family = GaugeMetricFamily("attache_dlq_messages", "Dead letters waiting per queue.", labels=["queue"])
        try:
            for queue in self.dead_letters.queues():
                family.add_metric([queue["name"]], queue["messages"])
        except AttacheError as exc:
            log.warning("DLQ depth unavailable for /metrics: %s", exc)
        yield family


def render(services) -> bytes:
    """The scrape, from the process's engine and dead-letter tools (``services.engine``, ``services.dead_letters``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(services.engine))
    registry.register(BrokerCollector(services.dead_letters))
    return generate_latest(registry)
