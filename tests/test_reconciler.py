"""The reconciler: a queued job whose message was lost is announced again.

First against rows (``run_once()`` on a real PostgreSQL), then the finding
that made it: PostgreSQL down for longer than the worker's wait and
Dramatiq's retry budget while a worker holds the messages, with real web,
worker and scheduler processes; and an outage the worker's steps wait out,
with nothing dead-lettered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid

import pika
import pytest
import requests
from sqlalchemy import func, insert, select, text, update

from app.adapters.postgres import db
from app.adapters.postgres.models import attachments, dead_letters, job_history, jobs, outbox, step_runs
from app.core import states
from app.observability import metrics
from app.observability.tracing import new_traceparent
from scheduler.reconciler import Reconciler, ReconcilerConfig
from tests.filesystems import fill, small_filesystem
from tests.pgcluster import PrivateCluster
from tests.processes import Deployment, wait_for
from tests.test_failure_windows import assert_invariants

AFTER = 60.0


def seed(engine, *, published_seconds_ago: float | None = 2 * AFTER, state: str = "queued") -> uuid.UUID:
    """A job whose inspect message was announced (and confirmed) ``published_seconds_ago``."""
    attachment_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(insert(attachments).values(
            id=attachment_id, owner="t", filename="a.jpg", content_type="image/jpeg", format="JPEG", size=1,
            sha256="0" * 64, width=1, height=1, staging_key=f"staging/{attachment_id}"))
        job_id, _ = states.create_job(conn, attachment_id=attachment_id, pipeline_version=1, max_attempts=3,
                                      traceparent=new_traceparent(), tracestate=None, actor="test", room_bytes=0)
        if published_seconds_ago is not None:
            backdate(conn, job_id, published_seconds_ago)
        if state in ("processing", "waiting"):  # waiting: between steps, no step holds the lease
            live = state == "processing"  # waiting: its last step's lease ran out long ago, which is no matter
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(
                state="processing", attempt=1, lease_owner="worker:test" if live else None,
                lease_expires_at=func.now() + text("interval '1 hour'" if live else "interval '-1 hour'")))
            backdate(conn, job_id, published_seconds_ago)
    return job_id


def backdate(conn, job_id, seconds: float) -> None:
    past = func.now() - text(f"interval '{seconds} seconds'")
    conn.execute(update(outbox).where(outbox.c.job_id == job_id)
                 .values(created_at=past, available_at=past, published_at=past))
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(updated_at=past))


def inspect_rows(engine, job_id):
    with engine.connect() as conn:
        return conn.execute(select(outbox.c.payload, outbox.c.published_at).where(outbox.c.job_id == job_id)
                            .order_by(outbox.c.id)).all()


def lose_messages(broker_url: str) -> None:
    """What a dead-lettering or a purge does: the step queues are empty again."""
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        channel = connection.channel()
        for queue in ("attache.inspect", "attache.render", "attache.publish"):
            try:
                channel.queue_purge(queue)
            except pika.exceptions.ChannelClosedByBroker:  # never declared
                channel = connection.channel()
    finally:
        connection.close()


def reconciler(services, after=AFTER, **config):
    return Reconciler(services.unit_of_work, services.broker, ReconcilerConfig(after_seconds=after, **config))


def done(counts: dict) -> tuple[int, int]:
    return counts["reannounced"], counts["published"]


def test_a_queued_job_whose_message_was_consumed_without_effect_is_announced_again(services, engine):
    stranded = seed(engine)
    assert done(reconciler(services).run_once()) == (1, 1)
    rows = inspect_rows(engine, stranded)
    assert len(rows) == 2
    assert rows[-1].payload["step"] == "inspect" and rows[-1].payload["attempt"] == 1
    assert rows[-1].published_at is not None, "the re-announcement is published at once"
    assert services.broker.queue_depth("attache.inspect") == 1
    with engine.connect() as conn:
        trail = conn.execute(select(job_history.c.from_state, job_history.c.to_state, job_history.c.reason)
                             .where(job_history.c.job_id == stranded).order_by(job_history.c.id)).all()
    assert trail[-1][:2] == ("queued", "queued") and trail[-1].reason.startswith(states.REANNOUNCED)
    assert b"attache_reconciler_reannounced_total 1.0" in metrics.render(services)


def test_jobs_with_a_path_forward_are_left_alone(services, engine):
    young = seed(engine, published_seconds_ago=AFTER / 2)  # announced recently: maybe just a backlog
    pending = seed(engine, published_seconds_ago=None)  # its outbox row is not published yet
    with engine.begin() as conn:
        conn.execute(update(outbox).where(outbox.c.job_id == pending)
                     .values(created_at=func.now() - text("interval '1 hour'")))
    leased = seed(engine, state="processing")  # a worker holds a live lease
    delayed = seed(engine)  # a managed retry waits for its time
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == delayed).values(
            next_attempt_at=func.now() + text("interval '1 hour'")))
        conn.execute(update(outbox).where(outbox.c.job_id == delayed).values(
            published_at=None, available_at=func.now() + text("interval '1 hour'")))
    for state, code in (("ready", None), ("failed", "corrupt_image")):
        job = seed(engine)
        with engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job).values(state=state, attempt=1, error_code=code))
    assert done(reconciler(services).run_once()) == (0, 0)
    for job in (young, pending, leased, delayed):
        assert len(inspect_rows(engine, job)) == 1


def test_re_announcements_back_off_so_a_backlog_never_storms(services, engine, broker_url):
    job = seed(engine)
    assert reconciler(services).run_once()["reannounced"] == 1
    for seconds_ago, expected, why in ((1.5, 0, "the second time waits twice as long"), (2.5, 1, ""),
                                       (3.5, 0, "the third time waits four times as long")):
        lose_messages(broker_url)
        with engine.begin() as conn:
            backdate(conn, job, seconds_ago * AFTER)
        assert reconciler(services).run_once()["reannounced"] == expected, why
    assert len(inspect_rows(engine, job)) == 3


def test_a_processing_job_waiting_between_steps_is_announced_again_in_its_own_attempt(services, engine):
    """Its render or publish messages were lost: an inspect of the same attempt announces them again."""
    waiting = seed(engine, state="waiting")
    assert reconciler(services).run_once()["reannounced"] == 1
    assert inspect_rows(engine, waiting)[-1].payload["attempt"] == 1, "no attempt is spent"
    with engine.connect() as conn:
        trail = conn.execute(select(job_history.c.from_state, job_history.c.to_state)
                             .where(job_history.c.job_id == waiting).order_by(job_history.c.id)).all()
        assert trail[-1] == ("processing", "processing")
        assert conn.execute(select(jobs.c.state, jobs.c.attempt).where(jobs.c.id == waiting)).one() == (
            "processing", 1)


def test_a_job_waiting_between_steps_never_expires(services, engine):
    """However long its next message waits behind a backlog, a job no step holds keeps its attempt."""
    waiting = seed(engine, state="waiting")
    with engine.begin() as conn:
        assert states.recover_expired(conn, batch=10, actor="test") == {"requeued": 0, "failed": 0}
        assert states.fence(conn, waiting, 1, states.Lease("worker:next", 30)) is not None, "the next step takes it"


def test_a_heartbeat_after_the_hand_off_does_not_take_the_job_back(services, engine):
    job = seed(engine, state="processing")
    with engine.begin() as conn:
        assert states.renew(conn, job, 1, states.Lease("worker:test", 30)), "a running step renews its lease"
        assert states.hand_off(conn, job, 1, "worker:test")
        assert not states.renew(conn, job, 1, states.Lease("worker:test", 5)), "a late beat changes nothing"
        assert conn.execute(select(jobs.c.lease_owner).where(jobs.c.id == job)).scalar() is None


def test_a_sibling_that_fenced_later_keeps_its_lease_when_the_first_hands_off(services, engine):
    job = seed(engine, state="processing")
    with engine.begin() as conn:
        assert states.fence(conn, job, 1, states.Lease("worker:sibling", 30))
        assert not states.hand_off(conn, job, 1, "worker:test")
        assert conn.execute(select(jobs.c.lease_owner).where(jobs.c.id == job)).scalar() == "worker:sibling"


def test_nothing_is_reannounced_while_a_step_queue_holds_messages(services, engine, broker_url):
    """During a backlog a message may simply be waiting; a duplicate would only lengthen the backlog."""
    stranded = seed(engine)
    busy = seed(engine, published_seconds_ago=None)
    with engine.connect() as conn:
        busy_row = conn.execute(select(outbox.c.id).where(outbox.c.job_id == busy)).scalar()
    assert services.publisher.publish([busy_row]) == 1  # nobody consumes it: a backlog of one
    counts = reconciler(services).run_once()
    assert (counts["backlog"], done(counts)) == (1, (0, 0))
    lose_messages(broker_url)
    assert done(reconciler(services).run_once()) == (1, 1)
    assert len(inspect_rows(engine, stranded)) == 2


def test_a_round_goes_on_past_one_batch(services, engine):
    for _ in range(7):
        seed(engine)
    assert done(reconciler(services, batch=3).run_once()) == (7, 7)


def test_the_reannounced_attempt_is_the_next_one(services, engine):
    job = seed(engine)
    with engine.begin() as conn:  # attempt 1 failed transiently; its retry message was consumed and lost
        conn.execute(update(jobs).where(jobs.c.id == job).values(attempt=1))
    reconciler(services).run_once()
    assert inspect_rows(engine, job)[-1].payload["attempt"] == 2


# --- the finding, with real processes -------------------------------------------------


@pytest.fixture
def private_postgres():
    cluster = PrivateCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.destroy()


def xq_depth(broker_url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


PHOTOS = ["photos/chelsea.jpg", "photos/coffee.jpg", "photos/rocket.jpg", "pillow/hopper.bmp", "pillow/hopper.gif"]


@contextlib.contextmanager
def _outage_deployment(private_postgres, env, tmp_path, **settings):
    """A web (and what the test starts) on the private server, with the worker's Dramatiq retries cut to 2."""
    database_url = private_postgres.url("attache")
    db.ensure_database(database_url)
    db.upgrade(database_url)
    env = {**env, "DATABASE_URL": database_url, "ATTACHE_BROKER_RETRIES": "2", **settings}
    deployment = Deployment(env, tmp_path)
    engine = db.make_engine(database_url)
    try:
        deployment.start("web")
        yield deployment, engine
    finally:
        deployment.stop_all()
        engine.dispose()


def _upload_all(deployment, engine, data_file, photos) -> list[str]:
    accepted = []
    for name in photos:
        response = deployment.upload(data_file(name))
        assert response.status_code == 202, response.text
        accepted.append(response.json()["id"])
    wait_for(lambda: _unpublished(engine) == 0, timeout=30, message="every announcement confirmed")
    return accepted


@pytest.mark.processes
@pytest.mark.long  # make soak: waits out an outage or measures for long
def test_postgres_down_longer_than_the_retry_budget_strands_nothing(private_postgres, env, tmp_path, storage_dir,
                                                                   data_file):
    """The review's finding: 10 uploads, PostgreSQL stopped while the worker takes their messages.

    The worker's steps wait 1 s for PostgreSQL, then Dramatiq retries them a
    bounded number of times and dead-letters them: the jobs stay ``queued``
    with their outbox rows marked published. Without the reconciler they
    stay so forever.
    """
    with _outage_deployment(private_postgres, env, tmp_path, ATTACHE_DATABASE_WAIT_SECONDS="1",
                            ATTACHE_RECONCILE_AFTER_SECONDS="3",
                            ATTACHE_RECONCILE_INTERVAL_SECONDS="0.5") as (deployment, engine):
        deployment.start("scheduler")
        accepted = _upload_all(deployment, engine, data_file, PHOTOS * 2)

        private_postgres.stop()
        try:
            deployment.start("worker")
            # every message exhausts its wait and its retries against the dead database and is dead-lettered
            wait_for(lambda: xq_depth(deployment.env["BROKER_URL"], "attache.inspect.XQ") == len(accepted),
                     timeout=120, interval=0.5, message="all inspect messages dead-lettered during the outage")
        finally:
            private_postgres.start()

        for attachment_id in accepted:
            assert deployment.wait_state(attachment_id, timeout=120)["state"] == "ready"
        assert_invariants(engine, storage_dir, accepted)
        scraped = requests.get(deployment.url + "/metrics", timeout=10,
                               headers={"Authorization": "Bearer olga-operator-token"}).text
        assert f"attache_reconciler_reannounced_total {float(len(accepted))}" in scraped, scraped[-2000:]


@pytest.mark.processes
@pytest.mark.long  # make soak: waits out an outage or measures for long
def test_a_step_waits_out_a_postgres_outage_and_nothing_is_dead_lettered(private_postgres, env, tmp_path,
                                                                         storage_dir, data_file):
    """PostgreSQL stopped for seconds, many times the worker's Dramatiq retries (2, from 100 ms).

    Before the steps waited for PostgreSQL, every message the worker took was
    dead-lettered within a second and its job waited for the reconciler
    (minutes). Now no message reaches ``.XQ`` and every job is ``ready`` with
    no scheduler running at all: the steps that waited ran again. A worker
    asked to stop meanwhile stops at once, not when its steps' waits run
    out (300 s by default), and loses nothing.
    """
    with _outage_deployment(private_postgres, env, tmp_path, ATTACHE_BROKER_MIN_BACKOFF_MS="100") as (
            deployment, engine):
        accepted = _upload_all(deployment, engine, data_file, PHOTOS)
        broker_url = deployment.env["BROKER_URL"]

        private_postgres.stop()
        try:
            first = deployment.start("worker")
            wait_for(lambda: "the step waits for it" in first.output(), timeout=60,
                     message="a step waiting for PostgreSQL")
            # SIGTERM to dramatiq's main process alone, as a supervisor sends it: it stops its worker processes
            # gracefully (Process.stop signals the whole group, and a worker process signalled twice exits at once)
            began = time.monotonic()
            os.kill(first.popen.pid, signal.SIGTERM)
            assert first.popen.wait(timeout=60) == 0
            assert time.monotonic() - began < 15, first.output()[-3000:]
            assert "Retrying message" in first.output(), "the waits ended, their messages went to Dramatiq's retries"
            worker = deployment.start("worker")
            wait_for(lambda: "the step waits for it" in worker.output(), timeout=60,
                     message="a step of the second worker waiting for PostgreSQL")
            waiting = time.monotonic()
            time.sleep(3)  # the outage goes on: ten times what the two retries would have lasted
            assert xq_depth(broker_url, "attache.inspect.XQ") == 0
        finally:
            private_postgres.start()
        waited = time.monotonic() - waiting

        for attachment_id in accepted:
            assert deployment.wait_state(attachment_id, timeout=60)["state"] == "ready"
        assert xq_depth(broker_url, "attache.inspect.XQ") == 0
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(dead_letters)).scalar() == 0
        assert_invariants(engine, storage_dir, accepted)
        assert "PostgreSQL answers and takes writes again: the step runs again" in worker.output()
        with engine.connect() as conn:
            longest = conn.execute(select(func.max(step_runs.c.seconds))).scalar()
        assert longest < waited, f"a step's duration ({longest:.1f} s) counted its wait ({waited:.1f} s)"


@pytest.mark.processes
def test_a_step_waits_out_a_full_database_disk_and_nothing_is_dead_lettered(env, tmp_path, storage_dir, data_file):
    """PostgreSQL's data disk full: it answers every ``SELECT`` and refuses what needs a new page (``could not
    extend file``, SQLSTATE 53100). The steps took it for a passing error: Dramatiq's retries (2 here) sent their
    messages to the dead letters, and in an adversarial run a job still waited for the reconciler 150 s after the
    disk was freed. Now a step short of disk runs again every second, its message held."""
    with small_filesystem(160 * 1024 * 1024) as disk:
        cluster = PrivateCluster(data_on=disk)
        try:
            cluster.start()
            with _outage_deployment(cluster, env, tmp_path, ATTACHE_BROKER_MIN_BACKOFF_MS="100") as (
                    deployment, engine):
                broker_url = deployment.env["BROKER_URL"]
                accepted = _upload_all(deployment, engine, data_file, PHOTOS)
                # the worker's tables (step_runs, variants) have no page yet: its first write needs one, and fails
                fill(disk / "filler")
                worker = deployment.start("worker")
                deployment.start("scheduler")

                def short_of_disk() -> bool:  # uploads, accepted or not, fill the tables' last free pages
                    response = deployment.upload(data_file(PHOTOS[len(accepted) % len(PHOTOS)]))
                    if response.status_code == 202:
                        accepted.append(response.json()["id"])
                    else:
                        assert (response.status_code, response.json()["error"]) == (503, "database_unavailable")
                    return "PostgreSQL is short of disk" in worker.output()

                wait_for(short_of_disk, timeout=60, interval=0.2, message="a step finding the disk full")
                time.sleep(3)  # full for many times what Dramatiq's two retries last
                (disk / "filler").unlink()
                wait_for(lambda: all(deployment.status(i)["state"] in ("ready", "failed") for i in accepted),
                         timeout=60, message="every upload finished once the disk had room")
                assert_invariants(engine, storage_dir, accepted)
                for queue in ("attache.inspect.XQ", "attache.render.XQ", "attache.publish.XQ"):
                    assert xq_depth(broker_url, queue) == 0, queue
        finally:
            cluster.destroy()


def _unpublished(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None))).scalar()
