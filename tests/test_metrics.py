"""/metrics reflects PostgreSQL and RabbitMQ, for operators only."""

from __future__ import annotations

import io
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event, func, text, update

from app.adapters.postgres import duration_counts as durations
from app.adapters.postgres import row_counts
from app.adapters.postgres import transition_counts as counters
from app.adapters.postgres.models import outbox
from app.core.workflow import Workflow
from app.web import create_app
from scheduler.counter_fold import CounterFold, CounterFoldConfig
from tests.conftest import OPERATOR_TOKEN, authed
from tests.driver import run, upload
from tests.sql_log import sql_log
from tests.test_migrations import ADD_ATTACHMENT


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


def test_a_scrape_reads_neither_job_history_nor_step_runs(settings, quiet_services, engine, data_file):
    """``job_history`` grows with every transition, and a scrape read all of it three times (transitions; retries
    and lease expiries; the reconciler's re-announcements): 1.0-1.6 s per scrape at 300,000 jobs (an adversarial
    run), toward Prometheus's 10 s scrape timeout. One pass was still 0.3 s at a million uploads: the counters now
    come from ``transition_counts`` and its deltas (``app/adapters/postgres/transition_counts.py``). The duration
    histograms read the newest 10,000 rows of ``job_history`` and ``step_runs``, a window whose counts went down:
    they come from ``duration_counts`` and its deltas (``app/adapters/postgres/duration_counts.py``)."""
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
    read = []
    with engine.connect() as conn:
        for statement in sent:
            plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement.replace("%", "%%")).scalar()[0]["Plan"]
            read += sorted(_relations(plan) & {"job_history", "step_runs"})
    assert read == []
    app.extensions["attache"].close()


#: each duration histogram as the window computed it, over every row: (histogram, label, seconds)
_DURATIONS_BY_SCANNING = text("""
    SELECT 'job', '', extract(epoch FROM ready_at - created_at)::float8 FROM jobs WHERE state = 'ready'
    UNION ALL
    SELECT 'attempt', '', extract(epoch FROM done.at - claim.at)::float8 FROM job_history claim
    JOIN LATERAL (SELECT at FROM job_history h WHERE h.job_id = claim.job_id AND h.id > claim.id
                  ORDER BY h.id LIMIT 1) done ON true WHERE claim.to_state = 'processing'
    UNION ALL
    SELECT 'step', step, seconds FROM step_runs""")


def _durations_by_scanning(conn) -> dict:
    bounds = conn.execute(text("SELECT unnest(duration_bounds())")).scalars().all()
    seen: dict = {}
    for histogram, label, seconds in conn.execute(_DURATIONS_BY_SCANNING):
        counts, total = seen.get((histogram, label), ([0] * len(bounds), 0))
        seen[histogram, label] = ([n + (seconds <= bound) for n, bound in zip(counts, bounds)],
                                  total + max(0, round(seconds * 1e6)))  # the sum: whole microseconds
    return {key: (counts, total / 1e6) for key, (counts, total) in seen.items()}


def _durations(conn) -> dict:
    return {(histogram, label): ([n for _, n in series.buckets], series.seconds)
            for histogram, labels in durations.histograms(conn).items() for label, series in labels.items()}


def test_the_duration_histograms_count_every_run_and_never_go_down(settings, quiet_services, engine, data_file):
    """They were computed over the newest 10,000 rows of their tables, one window for every step: 10,000 runs of
    one step took every other step's out of it, and their counts went down (an adversarial run), which ``rate()``
    takes for a counter reset. Now each run is counted when written, folds or not."""
    app = create_app(settings)
    fold = CounterFold(engine)
    ok = upload(quiet_services, data_file("photos/chelsea.jpg"))
    bad = upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))
    for job_id in (ok.job_id, bad.job_id):
        run(Workflow(quiet_services), engine, job_id)
    with engine.begin() as conn:
        assert _durations(conn) == _durations_by_scanning(conn)
    before = samples(app)
    renders = before[("attache_step_duration_seconds_count", (("step", "render"),))]
    assert renders == 8 and before[("attache_job_duration_seconds_count", ())] == 1
    assert before[("attache_attempt_duration_seconds_count", ())] == 2
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO step_runs (job_id, step, attempt, outcome, seconds) "
                          "SELECT :id, 'inspect', 1, 'ok', 0.2 FROM generate_series(1, 10001)"), {"id": ok.job_id})
    assert fold.run_once()["durations_folded"] > 0
    after = samples(app)
    assert after[("attache_step_duration_seconds_count", (("step", "render"),))] == renders
    inspect = (("step", "inspect"),)
    assert after[("attache_step_duration_seconds_count", inspect)] - \
        before[("attache_step_duration_seconds_count", inspect)] == 10001
    for le, more in (("0.1", 0), ("0.25", 10001), ("+Inf", 10001)):
        bucket = ("attache_step_duration_seconds_bucket", (("le", le),) + inspect)
        assert after[bucket] - before[bucket] == more
    assert abs(after[("attache_step_duration_seconds_sum", inspect)]
               - before[("attache_step_duration_seconds_sum", inspect)] - 2000.2) < 1e-6
    assert after[("attache_job_duration_seconds_count", ())] == 1
    with engine.begin() as conn:
        assert _durations(conn) == _durations_by_scanning(conn)
        conn.execute(text("DELETE FROM step_runs"))  # rows gone (a retention job's, say): what was counted stays
        assert _durations(conn)[("step", "render")][0][-1] == renders
    app.extensions["attache"].close()


def _counted_by_scanning(conn) -> dict:
    return {(f, t, lost): n for f, t, lost, n in conn.execute(text(
        "SELECT coalesce(from_state, 'none'), to_state, coalesce(error_code = 'worker_lost', false), count(*) "
        "FROM job_history GROUP BY 1, 2, 3"))}


def folded_while_writing(engine, write, *, key: str, batch: int) -> None:
    """``write(worker)`` for four workers at once while two folds of ``batch`` rows keep running; some were folded
    (``run_once()[key]``)."""
    stop = threading.Event()

    def keep_folding() -> int:
        fold, folded = CounterFold(engine, CounterFoldConfig(batch=batch)), 0
        while not stop.is_set():
            folded += fold.run_once()[key]
        return folded

    with ThreadPoolExecutor(6) as pool:
        folds = [pool.submit(keep_folding) for _ in range(2)]
        list(pool.map(write, range(4)))
        stop.set()
        assert sum(f.result() for f in folds) > 0


def _counted(conn) -> dict:
    return {(f, t, lost): n for f, t, lost, n in counters.transitions(conn)}


def test_the_transition_counters_are_exact_through_folds(settings, quiet_services, engine, data_file):
    app = create_app(settings)
    fold = CounterFold(engine)
    ok = upload(quiet_services, data_file("photos/chelsea.jpg"))
    bad = upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))
    with engine.begin() as conn:
        assert _counted(conn) == _counted_by_scanning(conn) == {("none", "queued", False): 2}
    assert fold.run_once()["folded"] == 2
    for job_id in (ok.job_id, bad.job_id):
        run(Workflow(quiet_services), engine, job_id)
    with engine.begin() as conn:  # a lease recovery's rows are told apart
        conn.execute(text("INSERT INTO job_history (job_id, from_state, to_state, attempt, actor, error_code) "
                          "VALUES (:id, 'processing', 'queued', 1, 'test', 'worker_lost')"), {"id": ok.job_id})
    with engine.begin() as conn:
        before = _counted(conn)
        assert before == _counted_by_scanning(conn)
        assert before[("processing", "queued", True)] == 1 and before[("processing", "ready", False)] == 1
        conn.execute(text("INSERT INTO job_history (job_id, from_state, to_state, attempt, actor) "
                          "VALUES (:id, 'processing', 'queued', 1, 'test')"), {"id": bad.job_id})
        conn.rollback()  # a transition rolled back is not counted
    with engine.begin() as conn:
        assert _counted(conn) == before
    assert fold.run_once()["folded"] > 0
    assert fold.run_once()["folded"] == 0
    with engine.begin() as conn:
        assert _counted(conn) == before == _counted_by_scanning(conn)
        assert conn.execute(text("SELECT count(*) FROM transition_deltas")).scalar() == 0
    scraped = samples(app)
    assert scraped[("attache_job_transitions_total", (("from", "processing"), ("to", "ready")))] == 1
    assert scraped[("attache_lease_expiries_total", ())] == 1
    app.extensions["attache"].close()


def test_transitions_written_while_folds_run_are_each_counted_once(engine):
    """Writers of many transitions at once, single and in batches, and two folds taking turns with them."""
    with engine.begin() as conn:
        conn.execute(ADD_ATTACHMENT, {"id": "00000000-0000-4000-8000-000000000001", "owner": "u"})
        job = conn.execute(text("INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, "
                                "traceparent, owner) VALUES (gen_random_uuid(), "
                                "'00000000-0000-4000-8000-000000000001', 1, 'queued', 3, '00-x', 'u') "
                                "RETURNING id")).scalar()
    kinds = [("queued", "processing", None), ("processing", "queued", "worker_lost"), ("processing", "ready", None)]

    def write(worker: int) -> None:
        # statements of one row (executemany sends one each), of several rows (VALUES lists, INSERT ... SELECT)
        # and COPY: the trigger counts each statement's rows, whatever their number
        for i in range(60):
            rows = [kinds[(worker + i + k) % 3] for k in range(1 + i % 4)]
            with engine.begin() as conn:
                if i % 3 == 0:
                    conn.execute(text("INSERT INTO job_history (job_id, from_state, to_state, attempt, actor, "
                                      "error_code) VALUES (:id, :f, :t, 1, 'test', :e)"),
                                 [{"id": job, "f": f, "t": t, "e": e} for f, t, e in rows])
                elif i % 3 == 1:
                    conn.exec_driver_sql(
                        "INSERT INTO job_history (job_id, from_state, to_state, attempt, actor, error_code) VALUES "
                        + ", ".join("(%s, %s, %s, 1, 'test', %s)" for _ in rows),
                        tuple(value for f, t, e in rows for value in (str(job), f, t, e)))
                    conn.execute(text("INSERT INTO job_history (job_id, from_state, to_state, attempt, actor) "
                                      "SELECT :id, 'queued', 'processing', 1, 'test' FROM generate_series(1, :n)"),
                                 {"id": job, "n": len(rows)})
                else:
                    cursor = conn.connection.dbapi_connection.cursor()
                    cursor.copy_expert("COPY job_history (job_id, from_state, to_state, attempt, actor, error_code) "
                                       "FROM STDIN", io.StringIO("".join(
                                           f"{job}\t{f}\t{t}\t1\ttest\t{e or chr(92) + 'N'}\n"
                                           for f, t, e in rows)))

    folded_while_writing(engine, write, key="folded", batch=7)
    with engine.begin() as conn:
        counted, scanned = _counted(conn), _counted_by_scanning(conn)
    assert counted == scanned
    assert sum(scanned.values()) == 4 * sum((2 if i % 3 == 1 else 1) * (1 + i % 4) for i in range(60))


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


def test_a_duration_sum_is_the_same_before_and_after_a_fold(engine):
    """A fold added the deltas' float sums in another order than a scrape did, and moved a ``_sum`` by its last
    place, down in 16-19 of 100 folds (a re-attack): Prometheus takes that for a reset. Sums are whole
    microseconds now; what is no duration (NaN, infinite, negative) counts, and adds nothing, rather than failing
    the insert."""
    fold = CounterFold(engine, CounterFoldConfig(batch=3))
    with engine.begin() as conn:
        job = conn.execute(text("SELECT gen_random_uuid()")).scalar()
    for round_ in range(20):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO step_runs (job_id, step, attempt, outcome, seconds) "
                              "SELECT :job, 'render', 1, 'ok', 0.1 + random() / 7 FROM generate_series(1, 7)"),
                         {"job": job})
            before = durations.histograms(conn)["step"]["render"]
        fold.run_once()
        with engine.begin() as conn:
            assert durations.histograms(conn)["step"]["render"] == before, round_
    with engine.begin() as conn:
        for odd in ("NaN", "Infinity", "-1"):
            conn.execute(text("INSERT INTO step_runs (job_id, step, attempt, outcome, seconds) "
                              "VALUES (:job, 'odd', 1, 'ok', CAST(:s AS float8))"), {"job": job, "s": odd})
        assert durations.histograms(conn)["step"]["odd"].count == 3
        assert durations.histograms(conn)["step"]["odd"].seconds == 0


#: what a scrape sent to count the two tables whole, before they were counted as written
_WHOLE_TABLE_COUNTS = re.compile(r"count\(\*\)\s+FROM\s+attachments|FROM\s+jobs\s+GROUP\s+BY", re.IGNORECASE)


def _jobs_by_scanning(conn) -> dict:
    return {(state, version): n for state, version, n in conn.execute(text(
        "SELECT state, pipeline_version, count(*) FROM jobs GROUP BY 1, 2"))}


def _counted_jobs(conn) -> dict:
    return {(state, version): n for state, version, n in row_counts.jobs(conn)}


def _scraped_jobs(scraped: dict) -> dict:
    return {(dict(labels)["state"], int(dict(labels)["pipeline_version"])): value
            for (name, labels), value in scraped.items() if name == "attache_jobs"}


def _scanned(engine) -> tuple[int, dict]:
    with engine.begin() as conn:
        return conn.execute(text("SELECT count(*) FROM attachments")).scalar(), _jobs_by_scanning(conn)


def test_a_scrape_counts_neither_attachments_nor_jobs_whole(settings, quiet_services, engine, data_file):
    """``attache_uploads_total`` was a ``count(*)`` of ``attachments`` and ``attache_jobs`` a ``GROUP BY`` of
    ``jobs``, at every scrape: two whole-table scans growing with every upload for ever (some 0.3 s at a million
    rows). Both are counted as the rows are written now (``app/adapters/postgres/row_counts.py``); of ``jobs`` a
    scrape reads only the expired leases."""
    from app.observability import metrics

    app = create_app(settings)
    ok = upload(quiet_services, data_file("photos/chelsea.jpg"))
    upload(quiet_services, data_file("photos/chelsea.jpg"))
    run(Workflow(quiet_services), engine, ok.job_id)
    with sql_log(app.extensions["attache"].engine) as sent:
        scraped = samples(app)
    uploads, per_state = _scanned(engine)
    assert scraped[("attache_uploads_total", ())] == uploads == 2
    assert _scraped_jobs(scraped) == per_state == {("ready", 1): 1, ("queued", 1): 1}
    assert [s for s in sent.statements if _WHOLE_TABLE_COUNTS.search(s)] == []
    reading = {}
    with engine.connect() as conn:
        for statement in sent.statements:
            plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, metrics.STATES).scalar()[0]["Plan"]
            for table in _relations(plan) & {"attachments", "jobs"}:
                reading.setdefault(table, []).append(statement)
    assert "attachments" not in reading
    assert [("lease_expires_at" in s) for s in reading.get("jobs", [])] == [True], "only the expired leases"
    app.extensions["attache"].close()


def test_the_uploads_and_jobs_per_state_are_exact_through_folds(settings, quiet_services, engine, data_file):
    """Each upload, each job made, moved (its state or its version) or deleted is counted once, folded or not; one
    rolled back is not; a state with no job left has no series, as the ``GROUP BY`` had none; an attachment deleted
    leaves the counter of accepted uploads as it was."""
    app = create_app(settings)
    fold = CounterFold(engine)
    ok = upload(quiet_services, data_file("photos/chelsea.jpg"))
    bad = upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))

    def agree(uploads: int, per_state: dict) -> None:
        scraped = samples(app)
        assert (scraped[("attache_uploads_total", ())], _scraped_jobs(scraped)) == _scanned(engine) \
            == (uploads, per_state)

    agree(2, {("queued", 1): 2})
    folded = fold.run_once()
    assert {"folded", "durations_folded", "room_folded"} <= folded.keys()
    assert folded["uploads_folded"] == 2 and folded["jobs_folded"] == 2
    agree(2, {("queued", 1): 2})
    for job_id in (ok.job_id, bad.job_id):
        run(Workflow(quiet_services), engine, job_id)
    agree(2, {("ready", 1): 1, ("failed", 1): 1})  # before a fold: queued went to 0, and has no series
    assert fold.run_once()["jobs_folded"] > 0
    agree(2, {("ready", 1): 1, ("failed", 1): 1})
    with engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET pipeline_version = 2 WHERE id = :id"), {"id": bad.job_id})
        conn.execute(text("UPDATE jobs SET updated_at = now()"))  # moves no job: counts nothing
    agree(2, {("ready", 1): 1, ("failed", 2): 1})
    with engine.begin() as conn:
        conn.execute(ADD_ATTACHMENT, {"id": "00000000-0000-4000-8000-000000000001", "owner": "u"})
        conn.execute(text(  # a statement of several jobs
            "INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, traceparent, owner) "
            "SELECT gen_random_uuid(), '00000000-0000-4000-8000-000000000001', v, 'queued', 3, '00-x', 'u' "
            "FROM generate_series(3, 5) v"))
    with engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET state = 'processing', lease_expires_at = now() WHERE state = 'queued'"))
        conn.execute(ADD_ATTACHMENT, {"id": "00000000-0000-4000-8000-000000000002", "owner": "u"})
        conn.rollback()  # what is rolled back is not counted
    agree(3, {("ready", 1): 1, ("failed", 2): 1, ("queued", 3): 1, ("queued", 4): 1, ("queued", 5): 1})
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE pipeline_version >= 4"))
    agree(3, {("ready", 1): 1, ("failed", 2): 1, ("queued", 3): 1})
    fold.run_once()
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE pipeline_version = 3"))
        conn.execute(text("DELETE FROM attachments WHERE id = '00000000-0000-4000-8000-000000000001'"))
        assert conn.execute(text("SELECT count(*) FROM upload_deltas")).scalar() == 0
    with engine.begin() as conn:
        assert row_counts.uploads(conn) == 3, "a counter of accepted uploads never goes down"
        assert _counted_jobs(conn) == _jobs_by_scanning(conn) == {("ready", 1): 1, ("failed", 2): 1}
    fold.run_once()
    assert fold.run_once() == {key: 0 for key in folded}
    with engine.begin() as conn:
        assert _counted_jobs(conn) == _jobs_by_scanning(conn)
        assert conn.execute(text("SELECT count(*) FROM job_deltas")).scalar() == 0
        assert row_counts.uploads(conn) == 3
    app.extensions["attache"].close()


def test_jobs_moved_while_folds_run_are_each_counted_once(engine):
    """Writers making jobs and moving them between states, and two folds taking turns with them."""
    with engine.begin() as conn:
        conn.execute(ADD_ATTACHMENT, {"id": "00000000-0000-4000-8000-000000000001", "owner": "u"})

    def write(worker: int) -> None:
        for i in range(40):
            with engine.begin() as conn:
                conn.execute(text(
                    "INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, traceparent, owner) "
                    "SELECT gen_random_uuid(), '00000000-0000-4000-8000-000000000001', :v + k, 'queued', 3, '00-x', "
                    "'u' FROM generate_series(0, :n) k"), {"v": 1000 * worker + 10 * i, "n": i % 3})
                conn.execute(text("UPDATE jobs SET state = 'processing', lease_expires_at = now() "
                                  "WHERE pipeline_version = :v"), {"v": 1000 * worker + 10 * i})
                if i % 4 == 3:
                    conn.execute(text("UPDATE jobs SET state = 'ready', ready_at = now(), lease_expires_at = NULL "
                                      "WHERE pipeline_version BETWEEN :low AND :high AND state = 'processing'"),
                                 {"low": 1000 * worker, "high": 1000 * worker + 10 * i})

    folded_while_writing(engine, write, key="jobs_folded", batch=5)
    with engine.begin() as conn:
        counted, scanned = _counted_jobs(conn), _jobs_by_scanning(conn)
    assert counted == scanned
    assert sum(scanned.values()) == 4 * sum(1 + i % 3 for i in range(40))
