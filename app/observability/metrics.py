"""``/metrics``: Prometheus text, read from PostgreSQL (and RabbitMQ) at scrape time.

PostgreSQL is the source of truth, so the numbers are computed from it
rather than counted in process memory: every web worker answers the same,
nothing is lost when a process restarts, and counters stay monotonic
because the rows they count are append-only (``attachments``,
``job_history``).

* ``attache_uploads_total`` - accepted uploads;
* ``attache_job_transitions_total{from,to}`` - every transition of the state machine;
* ``attache_retries_total`` - managed retries (``processing`` -> ``queued`` after a transient error);
* ``attache_lease_expiries_total`` - leases recovered by the scheduler (``worker_lost``);
* ``attache_reconciler_reannounced_total`` - stranded jobs announced again by the reconciler
  (its self-loop history rows, ``queued -> queued`` and ``processing -> processing``);
* ``attache_jobs{state,pipeline_version}`` - jobs per state;
* ``attache_outbox_backlog``, ``attache_outbox_oldest_age_seconds``;
* ``attache_leases_expired`` - ``processing`` jobs whose lease has run out now;
* ``attache_job_duration_seconds`` - time from upload to ``ready`` (histogram over ready jobs);
* ``attache_attempt_duration_seconds`` - from a claim to the attempt's outcome (ready, failed,
  requeued), from the history (histogram);
* ``attache_step_duration_seconds{step}`` - how long each step took in the worker (histogram over
  the last 10 000 runs, from ``step_runs``).
* ``attache_dlq_messages{queue}`` - dead letters waiting (absent while RabbitMQ is down).
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

from app.adapters.postgres.models import JobState
from app.errors import AttacheError

log = logging.getLogger("attache.metrics")

BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, float("inf"))


#: the bound parameters of the queries: the job states by name (``:queued``, ``:processing`` ...)
STATES = {state.value: state.value for state in JobState}


def _histogram(name: str, doc: str, conn, sql: str, labels: list[str] | None = None):
    rows = conn.execute(text(sql), STATES).all()
    family = HistogramMetricFamily(name, doc, labels=labels or [])
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        key = tuple(row[:-1])
        groups.setdefault(key, []).append(float(row[-1]))
    for key, values in groups.items():
        buckets = [(str(bound) if bound != float("inf") else "+Inf", sum(1 for v in values if v <= bound))
                   for bound in BUCKETS]
        family.add_metric(list(key), buckets, sum(values))
    return family


class DatabaseCollector:
    def __init__(self, services):
        self.services = services

    def collect(self):
        with self.services.engine.connect() as conn:
            uploads = conn.execute(text("SELECT count(*) FROM attachments")).scalar()
            yield CounterMetricFamily("attache_uploads", "Accepted uploads.", value=uploads)

            transitions = CounterMetricFamily("attache_job_transitions", "Job state transitions.",
                                              labels=["from", "to"])
            for from_state, to_state, count in conn.execute(text(
                    "SELECT coalesce(from_state, 'none'), to_state, count(*) FROM job_history GROUP BY 1, 2")):
                transitions.add_metric([from_state, to_state], count)
            yield transitions

            retries, expiries = conn.execute(text(
                "SELECT count(*) FILTER (WHERE from_state = :processing AND to_state = :queued "
                "AND coalesce(error_code, '') <> 'worker_lost'), "
                "count(*) FILTER (WHERE from_state = :processing AND error_code = 'worker_lost') "
                "FROM job_history"), STATES).one()
            yield CounterMetricFamily("attache_retries", "Managed retries after transient errors.", value=retries)
            yield CounterMetricFamily("attache_lease_expiries", "Expired leases recovered by the scheduler.",
                                      value=expiries)
            reannounced = conn.execute(text(
                "SELECT count(*) FROM job_history WHERE from_state = to_state")).scalar()
            yield CounterMetricFamily("attache_reconciler_reannounced",
                                      "Stranded jobs announced again by the reconciler.", value=reannounced)

            jobs = GaugeMetricFamily("attache_jobs", "Jobs per state and pipeline version.",
                                     labels=["state", "pipeline_version"])
            for state, version, count in conn.execute(text(
                    "SELECT state, pipeline_version, count(*) FROM jobs GROUP BY 1, 2")):
                jobs.add_metric([state, str(version)], count)
            yield jobs

            backlog, age = conn.execute(text(
                "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) "
                "FROM outbox WHERE published_at IS NULL")).one()
            yield GaugeMetricFamily("attache_outbox_backlog", "Outbox rows not yet confirmed by RabbitMQ.",
                                    value=backlog)
            yield GaugeMetricFamily("attache_outbox_oldest_age_seconds", "Age of the oldest unpublished outbox row.",
                                    value=float(age))
            expired = conn.execute(text(
                "SELECT count(*) FROM jobs WHERE state = :processing AND lease_owner IS NOT NULL "
                "AND lease_expires_at <= now()"), STATES).scalar()
            yield GaugeMetricFamily("attache_leases_expired", "Processing jobs whose lease ran out.", value=expired)

            yield _histogram(
                "attache_job_duration_seconds", "Upload to ready.", conn,
                "SELECT extract(epoch FROM ready_at - created_at) FROM jobs WHERE state = :ready "
                "ORDER BY ready_at DESC LIMIT 10000")
            yield _histogram(
                "attache_attempt_duration_seconds", "Claim to outcome of each attempt.", conn,
                "SELECT extract(epoch FROM done.at - claim.at) FROM job_history claim "
                "JOIN LATERAL (SELECT at FROM job_history h WHERE h.job_id = claim.job_id AND h.id > claim.id "
                "ORDER BY h.id LIMIT 1) done ON true WHERE claim.to_state = :processing "
                "ORDER BY claim.id DESC LIMIT 10000")
            yield _histogram(
                "attache_step_duration_seconds", "Worker time per pipeline step.", conn,
                "SELECT step, seconds FROM (SELECT step, seconds FROM step_runs ORDER BY id DESC LIMIT 10000) recent",
                labels=["step"])


class BrokerCollector:
    def __init__(self, services, step_queues: list[str]):
        self.services = services
        self.step_queues = step_queues

    def collect(self):
        from app.adapters.broker.dead_letter_tools import DeadLetters

        settings = self.services.settings
        family = GaugeMetricFamily("attache_dlq_messages", "Dead letters waiting per queue.", labels=["queue"])
        try:
            for queue in DeadLetters(settings.broker_url, self.services.engine, queues=self.step_queues,
                                     socket_timeout=settings.publish_timeout_seconds).queues():
                family.add_metric([queue["name"]], queue["messages"])
        except AttacheError as exc:
            log.warning("DLQ depth unavailable for /metrics: %s", exc)
        yield family


def render(services, step_queues: list[str]) -> bytes:
    """The metrics text; ``step_queues`` are the queues whose dead letters are counted."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(services))
    registry.register(BrokerCollector(services, step_queues))
    return generate_latest(registry)
