"""/metrics reflects PostgreSQL and RabbitMQ, for operators only."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event, func, text, update

from app.adapters.postgres.models import outbox
from app.core.workflow import Workflow
from app.web import create_app
from tests.conftest import OPERATOR_TOKEN, authed
from tests.driver import run, upload


def samples(app):
    response = authed(app, OPERATOR_TOKEN).get("/metrics")
    assert response.status_code == 200 and response.mimetype == "text/plain"
    found = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_metrics_follow_the_pipeline(settings, quiet_services, engine, data_file):
    app = create_app(settings)
    assert authed(app).get("/metrics").status_code == 403
    assert app.test_client().get("/metrics").status_code == 401
    before = samples(app)
    assert before[("attache_uploads_total", ())] == 0
    ok = upload(quiet_services, data_file("photos/chelsea.jpg"))
    bad = upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))
    mid = samples(app)
    assert mid[("attache_uploads_total", ())] == 2
    assert mid[("attache_outbox_backlog", ())] == 2, "the quiet services could not publish"
    assert mid[("attache_jobs", (("pipeline_version", "1"), ("state", "queued")))] == 2
    for job_id in (ok.job_id, bad.job_id):
        run(Workflow(quiet_services), engine, job_id)
    after = samples(app)
    assert after[("attache_jobs", (("pipeline_version", "1"), ("state", "ready")))] == 1
    assert after[("attache_jobs", (("pipeline_version", "1"), ("state", "failed")))] == 1
    assert after[("attache_job_transitions_total", (("from", "processing"), ("to", "ready")))] == 1
    assert after[("attache_job_transitions_total", (("from", "processing"), ("to", "failed")))] == 1
    assert after[("attache_job_duration_seconds_count", ())] == 1
    assert after[("attache_step_duration_seconds_count", (("step", "render"),))] == 4 + 4, \
        "four render messages per file (those after the failure end 'ignored', and are timed too)"
    assert after[("attache_step_duration_seconds_count", (("step", "publish"),))] == 1
    assert after[("attache_dlq_messages", (("queue", "attache.inspect.XQ"),))] == 0
    app.extensions["attache"].close()


def test_a_managed_retry_waiting_for_its_delay_is_not_a_late_outbox_row(settings, quiet_services, engine, data_file):
    app = create_app(settings)
    first = upload(quiet_services, data_file("photos/chelsea.jpg"))
    with engine.begin() as conn:  # its retry was written an hour ago, to be sent in ten minutes
        conn.execute(update(outbox).where(outbox.c.job_id == first.job_id).values(
            created_at=func.now() - text("interval '1 hour'"), available_at=func.now() + text("interval '10 minutes'")))
    waiting = samples(app)
    assert waiting[("attache_outbox_oldest_age_seconds", ())] >= 3600
    assert waiting[("attache_outbox_oldest_due_age_seconds", ())] == 0
    second = upload(quiet_services, data_file("photos/chelsea.jpg"))
    with engine.begin() as conn:  # due for two minutes, still not published
        conn.execute(update(outbox).where(outbox.c.job_id == second.job_id).values(
            available_at=func.now() - text("interval '2 minutes'")))
    late = samples(app)
    assert 120 <= late[("attache_outbox_oldest_due_age_seconds", ())] < 3600
    app.extensions["attache"].close()


def _relations(plan: dict) -> set[str]:
    found = {plan["Relation Name"]} if "Relation Name" in plan else set()
    for child in plan.get("Plans", []):
        found |= _relations(child)
    return found


def test_a_scrape_reads_the_whole_job_history_once(settings, quiet_services, engine, data_file):
    """``job_history`` grows with every transition, and a scrape read all of it three times (transitions; retries
    and lease expiries; the reconciler's re-announcements): 1.0-1.6 s per scrape at 300,000 jobs (an adversarial
    run), toward Prometheus's 10 s scrape timeout. The counters now come from one pass; the attempt histogram reads
    only its newest rows (a Limit)."""
    app = create_app(settings)
    upload(quiet_services, data_file("photos/chelsea.jpg"))
    sent = []

    def executed(conn, cursor, statement, parameters, context, executemany):
        sent.append(cursor.mogrify(statement, parameters).decode())

    services_engine = app.extensions["attache"].engine
    event.listen(services_engine, "before_cursor_execute", executed)
    try:
        scraped = samples(app)
    finally:
        event.remove(services_engine, "before_cursor_execute", executed)
    assert scraped[("attache_job_transitions_total", (("from", "none"), ("to", "queued")))] == 1
    whole = []
    with engine.connect() as conn:
        for statement in sent:
            plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement.replace("%", "%%")).scalar()[0]["Plan"]
            if "job_history" in _relations(plan) and plan["Node Type"] != "Limit":
                whole.append(statement)
    assert len(whole) == 1, whole
    app.extensions["attache"].close()


def test_scrapes_that_arrive_together_share_one_read(settings, quiet_services, engine, data_file, monkeypatch):
    """An adversarial run: forty scrapes at once, 0.12-0.17 s each alone with 500,000 transitions, each read
    PostgreSQL; they took 3.6 s each and held the web's threads and connections, and an upload between them took
    3.2 s. A web process now reads for one scrape at a time; those that arrived during a read share the next one."""
    from app.observability import metrics

    app = create_app(settings)
    upload(quiet_services, data_file("photos/chelsea.jpg"))
    reads, real = [], metrics.render

    def slow_render(services):  # as a large history makes it
        reads.append(time.monotonic())
        time.sleep(0.3)
        return real(services)

    monkeypatch.setattr(metrics, "render", slow_render)
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: authed(app, OPERATOR_TOKEN).get("/metrics"), range(12)))
    assert {a.status_code for a in answers} == {200}
    assert len(reads) <= 2, f"{len(reads)} reads for 12 scrapes at once"
    assert "attache_uploads_total 1.0" in answers[-1].get_data(as_text=True)
    before, began = len(reads), time.monotonic()
    samples(app)  # one that comes later reads again: never a result read before it arrived
    assert len(reads) == before + 1 and reads[-1] >= began
    app.extensions["attache"].close()


def test_scrapes_that_arrive_together_share_a_failed_read_too(settings, monkeypatch):
    """A read that failed was nobody's result, so each scrape waiting behind it read again in turn, PostgreSQL down,
    and held its thread for as many timeouts (an adversarial review): they share the failure as they share a read."""
    from app.errors import DatabaseUnavailable
    from app.observability import metrics

    app = create_app(settings)
    reads = []

    def failing_render(services):
        reads.append(time.monotonic())
        time.sleep(0.3)
        raise DatabaseUnavailable("database unavailable")

    monkeypatch.setattr(metrics, "render", failing_render)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: authed(app, OPERATOR_TOKEN).get("/metrics"), range(8)))
    assert {a.status_code for a in answers} == {503}
    assert len(reads) <= 2, f"{len(reads)} reads for 8 scrapes at once"
    app.extensions["attache"].close()
