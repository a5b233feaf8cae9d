"""Every round of every maintenance service is added up in PostgreSQL and exported by /metrics.

The rounds run through the scheduler's own job runner (``scheduler.__main__.guarded``)
and, in the last test, in a real ``scheduler`` process.
"""

from __future__ import annotations

import logging
import time

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, text, update

from app.adapters.postgres.db import make_engine
from app.adapters.postgres.models import jobs, outbox
from app.config import Settings
from app.services import Services
from app.web import create_app
from scheduler.__main__ import guarded
from scheduler.locking import exclusive
from scheduler.runs import SweeperRuns, outcome_of
from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig
from scheduler.sweepers import sweepers
from tests.conftest import OPERATOR_TOKEN, authed
from tests.processes import Deployment, wait_for
from tests.test_maintenance import seed

SERVICES = {"outbox_relay", "lease_recovery", "reconciler", "staging_cleanup", "object_gc", "retirement", "webhooks",
            "delivery_retention", "counter_fold"}


def sweeper_samples(app) -> dict[str, dict]:
    """``attache_sweeper_*`` samples of one scrape: metric name -> {labels: value}."""
    response = authed(app, OPERATOR_TOKEN).get("/metrics")
    assert response.status_code == 200
    found: dict[str, dict] = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        for sample in family.samples:
            if sample.name.startswith("attache_sweeper_"):
                found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def of(samples: dict, name: str, **labels) -> float | None:
    return samples.get(name, {}).get(tuple(sorted(labels.items())))


def abandon_outbox_rows(engine) -> None:
    """Every unpublished row looks left behind by its producer an hour ago."""
    with engine.begin() as conn:
        conn.execute(update(outbox).where(outbox.c.published_at.is_(None))
                     .values(created_at=func.now() - text("interval '1 hour'"),
                             available_at=func.now() - text("interval '1 hour'")))


def test_each_round_is_added_up_and_exported(settings, services, engine):
    app = create_app(settings)
    runs = SweeperRuns(engine)
    assert sweeper_samples(app) == {}, "no series before a round ran"
    for _ in range(3):
        seed(engine, services.storage)
    _, expired, _ = seed(engine, services.storage, "processing")
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == expired)
                     .values(lease_expires_at=func.now() - text("interval '1 second'")))
    abandon_outbox_rows(engine)
    scheduled = [(sweeper.service, sweeper.interval_seconds) for sweeper in sweepers(services)]
    assert {service.name for service, _ in scheduled} == SERVICES

    started = time.time()
    for service, interval in scheduled:
        guarded(service, interval, runs)()
    first = sweeper_samples(app)
    for service, interval in scheduled:
        name = service.name
        assert of(first, "attache_sweeper_runs_total", service=name, outcome="ok") == 1, name
        assert of(first, "attache_sweeper_runs_total", service=name, outcome="failed") == 0, name
        assert of(first, "attache_sweeper_interval_seconds", service=name) == interval
        success = of(first, "attache_sweeper_last_success_timestamp_seconds", service=name)
        assert started - 5 <= success <= time.time() + 5, (name, success, started)
        assert of(first, "attache_sweeper_first_run_timestamp_seconds", service=name) <= success
        assert of(first, "attache_sweeper_last_duration_seconds", service=name) >= 0
    assert of(first, "attache_sweeper_items_total", service="outbox_relay", action="published") == 4
    # a scheduler just started watches a heartbeat period before it takes a lapsed lease back (lease_recovery.py)
    assert of(first, "attache_sweeper_items_total", service="lease_recovery", action="requeued") == 0
    assert of(first, "attache_sweeper_items_total", service="lease_recovery", action="failed") == 0
    assert of(first, "attache_sweeper_items_total", service="staging_cleanup", action="kept") == 4
    assert of(first, "attache_sweeper_items_total", service="staging_cleanup", action="removed") == 0
    assert of(first, "attache_sweeper_items_total", service="reconciler", action="reannounced") == 0
    assert of(first, "attache_sweeper_items_total", service="retirement", action="retired") == 0
    actions = {dict(labels)["action"] for labels in first["attache_sweeper_items_total"]}
    assert not actions & {"pending", "backlog", "skipped", "deferred"}, "a snapshot of the moment is not work done"

    # a second round adds to the totals
    relay, relay_interval = scheduled[0]
    for _ in range(2):
        seed(engine, services.storage)
    abandon_outbox_rows(engine)
    guarded(relay, relay_interval, runs)()
    second = sweeper_samples(app)
    assert of(second, "attache_sweeper_items_total", service="outbox_relay", action="published") == 4 + 2
    assert of(second, "attache_sweeper_runs_total", service="outbox_relay", outcome="ok") == 2
    assert (of(second, "attache_sweeper_last_success_timestamp_seconds", service="outbox_relay")
            >= of(first, "attache_sweeper_last_success_timestamp_seconds", service="outbox_relay"))

    # a round skipped because another scheduler holds the cleanup's lock: counted, no success
    cleanup, cleanup_interval = next(pair for pair in scheduled if pair[0].name == "staging_cleanup")
    with exclusive(engine, "staging_cleanup") as held:
        assert held
        guarded(cleanup, cleanup_interval, runs)()
    # a round that raises (its database cannot be reached): counted, nothing added
    broken = Services(Settings.from_env({"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/attache",
                                         "BROKER_URL": settings.broker_url, "STORAGE_URL": settings.storage_url}))
    guarded(StagingCleanup(broken.engine, broken.storage, StagingCleanupConfig()), cleanup_interval, runs)()
    broken.engine.dispose()
    third = sweeper_samples(app)
    assert of(third, "attache_sweeper_runs_total", service="staging_cleanup", outcome="ok") == 1
    assert of(third, "attache_sweeper_runs_total", service="staging_cleanup", outcome="skipped") == 1
    assert of(third, "attache_sweeper_runs_total", service="staging_cleanup", outcome="failed") == 1
    assert (of(third, "attache_sweeper_last_success_timestamp_seconds", service="staging_cleanup")
            == of(first, "attache_sweeper_last_success_timestamp_seconds", service="staging_cleanup"))
    assert of(third, "attache_sweeper_items_total", service="staging_cleanup", action="kept") == 4
    app.extensions["attache"].close()


def test_a_sweeper_that_never_succeeded_has_no_last_success(settings, engine):
    app = create_app(settings)
    SweeperRuns(engine).record("object_gc", 300.0, None, 0.25)
    samples = sweeper_samples(app)
    assert of(samples, "attache_sweeper_runs_total", service="object_gc", outcome="failed") == 1
    assert of(samples, "attache_sweeper_first_run_timestamp_seconds", service="object_gc") is not None
    assert of(samples, "attache_sweeper_last_success_timestamp_seconds", service="object_gc") is None
    assert of(samples, "attache_sweeper_last_duration_seconds", service="object_gc") == 0.25
    app.extensions["attache"].close()


def test_a_cleanup_round_that_left_objects_the_store_refused_to_delete_failed():
    """A storage cleanup goes on past an object whose delete the store refuses, and returns its counts: before, one
    such object made every round raise (``failed``, an adversarial run), and a round that now returns ``not_removed``
    is ``failed`` still, so ``AttacheSweeperOverdue`` fires while the object stays."""
    assert outcome_of({"removed": 29, "not_removed": 1}) == "failed"
    assert outcome_of({"removed": 29, "not_removed": 0}) == "ok"
    assert outcome_of({"skipped": 1, "not_removed": 0}) == "skipped"
    assert outcome_of(None) == "failed"


def test_recording_never_fails_the_scheduler(caplog):
    gone = make_engine("postgresql://postgres@127.0.0.1:1/attache")
    with caplog.at_level(logging.WARNING, logger="attache.scheduler.runs"):
        SweeperRuns(gone).record("outbox_relay", 5.0, {"published": 1, "pending": 0}, 0.1)
    assert "could not record the outbox_relay round" in caplog.text
    gone.dispose()


def test_the_scheduler_process_records_every_service(env, settings, tmp_path):
    app = create_app(settings)
    deployment = Deployment(env, tmp_path)
    deployment.start("scheduler", wait=False)
    try:
        samples = wait_for(lambda: (lambda s: s if {
            dict(labels)["service"] for labels, n in s.get("attache_sweeper_runs_total", {}).items()
            if dict(labels)["outcome"] == "ok" and n >= 1} == SERVICES else None)(sweeper_samples(app)),
            timeout=60, interval=0.5, message="an ok round of every service")
        assert of(samples, "attache_sweeper_interval_seconds", service="outbox_relay") == \
            settings.outbox_interval_seconds
        # the relay runs every 0.5 s here: its rounds keep being counted
        wait_for(lambda: of(sweeper_samples(app), "attache_sweeper_runs_total", service="outbox_relay",
                            outcome="ok") >= 4, timeout=30, interval=0.5, message="more relay rounds")
    except AssertionError:
        print(deployment.logs())
        raise
    finally:
        deployment.stop_all()
        app.extensions["attache"].close()
