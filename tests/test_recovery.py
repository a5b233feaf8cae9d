"""Level-4 recovery with real processes and no manual step.

Short leases and sweeps come from the environment (tests/conftest.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import func, insert, select, text, update

from app.adapters.postgres.models import attachments, job_history, jobs, outbox
from app.core import states
from app.observability.tracing import new_traceparent
from tests.conftest import BROKER_KINDS, REPO
from tests.processes import Deployment, read_only, wait_for, waiting_on_a_lock
from tests.test_failure_windows import assert_invariants

pytestmark = pytest.mark.processes


@pytest.fixture
def deployment(env, tmp_path):
    deployment = Deployment(env, tmp_path)
    yield deployment
    deployment.stop_all()


def history(engine, job_id):
    with engine.connect() as conn:
        return conn.execute(select(job_history.c.from_state, job_history.c.to_state, job_history.c.error_code)
                            .where(job_history.c.job_id == job_id).order_by(job_history.c.id)).all()


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_worker_killed_mid_render_is_recovered_through_its_lease(deployment, engine, storage_dir, data_file):
    deployment.start("web")
    deployment.start("scheduler")
    worker = deployment.start("worker", ATTACHE_FAULT="during_render")
    response = deployment.upload(data_file("photos/coffee.jpg"))
    attachment_id, job_id = response.json()["id"], uuid.UUID(response.json()["job_id"])
    assert worker.wait_dead(timeout=60) != 0
    # no worker runs: only the lease can bring the job back
    wait_for(lambda: ("processing", "queued", "worker_lost") in [tuple(h) for h in history(engine, job_id)],
             timeout=30, message="the scheduler to requeue the expired lease")
    deployment.start("worker")
    assert deployment.wait_state(attachment_id)["state"] == "ready"
    assert_invariants(engine, storage_dir, [attachment_id])
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.attempt)).scalar() == 2
        # an operator can tell in pg_stat_activity which process holds which connection
        names = set(conn.execute(text("SELECT application_name FROM pg_stat_activity "
                                      "WHERE datname = current_database()")).scalars())
    assert {"attache web", "attache worker", "attache scheduler"} <= names, names


@pytest.mark.parametrize("broker_kind", [  # the RabbitMQ run, 16-17 s, in make soak (the marker's 15 s)
    pytest.param("rabbitmq", marks=pytest.mark.long), "postgres"])
def test_a_file_that_kills_every_worker_ends_failed_worker_lost(deployment, engine, data_file):
    deployment.env["ATTACHE_MAX_ATTEMPTS"] = "2"
    # Each new worker takes the redelivered render and dies at once, renewing the attempt's lease, until
    # the broker's delivery limit dead-letters the message; then the lease lapses. A low limit keeps the
    # loop short; the assertion below then bounds it.
    deployment.env["ATTACHE_BROKER_DELIVERY_LIMIT"] = "3"
    deployment.env["ATTACHE_LEASE_SECONDS"] = "3"
    deployment.start("web")
    deployment.start("scheduler")
    response = deployment.upload(data_file("photos/coffee.jpg"))
    attachment_id = response.json()["id"]
    restarts = 0

    def failed_or_restart():
        nonlocal restarts
        status = deployment.status(attachment_id)
        if status["state"] == "failed":
            return status
        worker = deployment.processes.get("worker")
        if worker is None or not worker.alive:
            restarts += 1
            assert restarts < 20, "the job must not loop forever"
            deployment.start("worker", wait=False, ATTACHE_FAULT="during_render")
        return None

    status = wait_for(failed_or_restart, timeout=120, interval=0.5, message="job failed with worker_lost")
    assert (status["state"], status["error_code"], status["attempt"]) == ("failed", "worker_lost", 2)
    assert status["variants"] == {}


#: a step time limit a test waits for (the waits for PostgreSQL and storage may take at most half of it)
SHORT_STEP_LIMIT = {"ATTACHE_STEP_TIME_LIMIT_SECONDS": "4", "ATTACHE_DATABASE_WAIT_SECONDS": "2",
                    "ATTACHE_STORAGE_WAIT_SECONDS": "2", "ATTACHE_RETRY_INITIAL_SECONDS": "0"}


@pytest.mark.parametrize("one_step", [True, False], ids=["made_in_inspect", "a_render_message_per_variant"])
def test_a_render_that_never_returns_ends_its_attempt_at_the_step_time_limit(deployment, engine, storage_dir,
                                                                              data_file, one_step):
    # The first render hangs in a call into C (the fault point sleeps in time.sleep), where no Python exception
    # reaches it: before, its heartbeat renewed the lease for ever and the job stayed processing. The worker lives
    # on (another thread takes the next attempt), so only the step's own time limit can end the attempt.
    deployment.start("web")
    deployment.start("scheduler")
    deployment.start("worker", ATTACHE_FAULT="render_hangs", **SHORT_STEP_LIMIT,
                     **({"ATTACHE_ONE_STEP_MAX_PIXELS": "64000000"} if one_step else {}))
    response = deployment.upload(data_file("photos/coffee.jpg"))
    attachment_id, job_id = response.json()["id"], uuid.UUID(response.json()["job_id"])
    status = deployment.wait_state(attachment_id, timeout=60)
    assert (status["state"], status["attempt"]) == ("ready", 2), status
    assert ("processing", "queued", "step_timeout") in [tuple(h) for h in history(engine, job_id)]
    assert "worker_lost" not in [h.error_code for h in history(engine, job_id)]
    assert_invariants(engine, storage_dir, [attachment_id])
    # the heartbeat's line carries the step's fields, as the step's own lines do
    [timed_out] = [json.loads(line) for line in deployment.processes["worker"].output().splitlines()
                   if "step ran longer than its time limit of 4 s" in line]
    assert (timed_out["job_id"], timed_out["attempt"], timed_out["level"]) == (str(job_id), 1, "error"), timed_out


@pytest.mark.parametrize("broker_kind", [  # the PostgreSQL broker's run, 20 s, in make soak (the marker's 15 s)
    "rabbitmq", pytest.param("postgres", marks=pytest.mark.long)])
def test_a_worker_whose_step_stays_inside_a_call_into_c_exits_for_a_fresh_one(deployment, engine, storage_dir,
                                                                             data_file):
    # One thread, and the render that hangs holds it: the retried attempt had nowhere to run in that worker, and a
    # file that hangs every attempt took a thread per attempt until the worker did nothing (an adversarial run).
    # Past the limit, Dramatiq's interrupt and as long again, the process exits for its process manager to restart.
    deployment.start("web")
    deployment.start("scheduler")
    worker = deployment.start("worker", ATTACHE_FAULT="render_hangs", WORKER_THREADS="1", **SHORT_STEP_LIMIT)
    response = deployment.upload(data_file("photos/coffee.jpg"))
    attachment_id, job_id = response.json()["id"], uuid.UUID(response.json()["job_id"])
    assert worker.wait_dead(timeout=60) == 75, worker.output()[-3000:]
    assert "a step is still running" in worker.output()
    assert ("processing", "queued", "step_timeout") in [tuple(h) for h in history(engine, job_id)]
    deployment.start("worker")
    status = deployment.wait_state(attachment_id, timeout=60)
    assert (status["state"], status["attempt"]) == ("ready", 2), status
    assert_invariants(engine, storage_dir, [attachment_id])


STUCK_PROCESS = """
import signal, sys, threading, time
from pathlib import Path
from app.services import exit_stuck_worker

out = Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: out.joinpath("stopping").touch())  # Dramatiq's: stop taking messages
threading.Thread(target=time.sleep, args=(3600,)).start()  # the stuck step: not a daemon, never returns

def other_step():
    time.sleep(0.5)
    out.joinpath("finished").touch()

threading.Thread(target=other_step).start()
threading.Thread(target=exit_stuck_worker, args=(2.0,)).start()  # called by the stuck step's heartbeat thread
while True:
    time.sleep(0.05)
"""


def test_a_stuck_worker_stops_taking_messages_lets_its_other_steps_finish_then_exits(tmp_path):
    """What the exit above does in its process, measured where the timing is exact: the SIGTERM first (the worker
    stops taking messages), then the drain, in which a step half a second from its end finishes, then exit 75 in
    spite of the thread that never returns (``sys.exit`` would wait for it for ever, an immediate ``os._exit``
    would cut the other step off)."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", STUCK_PROCESS, str(tmp_path)], cwd=REPO, timeout=60,
                            capture_output=True, text=True)
    took = time.monotonic() - started
    assert result.returncode == 75, result.stderr[-2000:]
    assert (tmp_path / "stopping").exists(), "the worker was told to stop taking messages"
    assert (tmp_path / "finished").exists(), "the other step finished in the drain"
    assert 2.0 <= took < 30, took


def test_a_render_that_never_returns_on_the_last_attempt_fails_the_job_with_its_code(deployment, engine, data_file):
    deployment.env["ATTACHE_MAX_ATTEMPTS"] = "1"  # the web writes it on the job
    deployment.start("web")
    deployment.start("scheduler")
    deployment.start("worker", ATTACHE_FAULT="render_hangs", **SHORT_STEP_LIMIT)
    response = deployment.upload(data_file("photos/coffee.jpg"))
    status = deployment.wait_state(response.json()["id"], timeout=60)
    assert (status["state"], status["error_code"], status["attempt"]) == ("failed", "step_timeout", 1), status
    assert "time limit of 4 s" in status["error_reason"]


@pytest.mark.alone
def test_rabbitmq_outage_loses_nothing_and_uploads_keep_being_accepted(deployment, engine, storage_dir, data_file):
    deployment.start("web")
    deployment.start("worker")
    deployment.start("scheduler")
    accepted = [deployment.upload(data_file("photos/chelsea.jpg")).json()["id"]]
    subprocess.run(["rabbitmqctl", "-q", "stop_app"], check=True, timeout=120)
    try:
        for name in ("photos/coffee.jpg", "photos/rocket.jpg", "pillow/hopper.bmp"):
            response = deployment.upload(data_file(name))
            assert response.status_code == 202, response.text
            accepted.append(response.json()["id"])
        with engine.connect() as conn:
            unpublished = conn.execute(select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None))).scalar()
        assert unpublished >= 3, "work accepted during the outage waits in the outbox"
    finally:
        subprocess.run(["rabbitmqctl", "-q", "start_app"], check=True, timeout=120)
        subprocess.run(["rabbitmqctl", "-q", "await_startup"], check=True, timeout=120)
    for attachment_id in accepted:
        assert deployment.wait_state(attachment_id, timeout=120)["state"] == "ready"
    assert_invariants(engine, storage_dir, accepted)


def seed_stuck(engine, count):
    """Jobs whose producers died: unpublished outbox rows, and expired leases."""
    outbox_jobs, lease_jobs = [], []
    with engine.begin() as conn:
        for i in range(2 * count):
            attachment_id = uuid.uuid4()
            conn.execute(insert(attachments).values(
                id=attachment_id, owner="t", filename="a.jpg", content_type="image/jpeg", format="JPEG", size=1,
                sha256="0" * 64, width=1, height=1, staging_key=f"staging/{attachment_id}"))
            job_id, _ = states.create_job(conn, attachment_id=attachment_id, pipeline_version=1, max_attempts=5,
                                          traceparent=new_traceparent(), tracestate=None, actor="test", room_bytes=0)
            if i < count:
                outbox_jobs.append(job_id)
            else:
                conn.execute(update(outbox).where(outbox.c.job_id == job_id).values(published_at=func.now()))
                conn.execute(update(jobs).where(jobs.c.id == job_id).values(
                    state="processing", attempt=1, lease_owner="worker:gone",
                    lease_expires_at=func.now() - text("interval '1 second'")))
                lease_jobs.append(job_id)
        conn.execute(update(outbox).values(created_at=func.now() - text("interval '1 minute'")))
    return outbox_jobs, lease_jobs


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_two_schedulers_do_nothing_twice(deployment, engine, services):
    outbox_jobs, lease_jobs = seed_stuck(engine, 40)
    deployment.start("scheduler")
    second = Deployment(deployment.env, deployment.log_dir)
    second.start("scheduler")
    try:
        def settled():
            with engine.connect() as conn:
                pending = conn.execute(select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None))).scalar()
                stuck = conn.execute(select(func.count()).select_from(jobs).where(jobs.c.state == "processing")).scalar()
            return pending == 0 and stuck == 0

        wait_for(settled, timeout=60, message="both schedulers to settle")
    finally:
        second.stop_all()
    with engine.connect() as conn:
        for job_id in lease_jobs:
            requeues = [h for h in history(engine, job_id) if h.to_state == "queued" and h.from_state == "processing"]
            assert len(requeues) == 1, f"job {job_id} was requeued {len(requeues)} times"
        assert conn.execute(select(func.count()).select_from(outbox)).scalar() == 2 * 40 + 40
    # 40 abandoned rows + 40 fresh attempts after lease recovery, each published exactly once. The depth RabbitMQ
    # reports may trail the last confirms by a moment on a loaded machine (40 of 80 once in a full run): polled
    depth = wait_for(lambda: (lambda n: n if n >= 80 else None)(services.broker.queue_depth("attache.inspect")),
                     timeout=10, message="80 messages in attache.inspect")
    assert depth == 80


@pytest.mark.parametrize("broker_kind", ["postgres"])  # RabbitMQ gives the stopped worker's unacked messages back
# once its consumer's heartbeats time out (this test with RabbitMQ: 32 s, once; 80 s before the consumer's 10 s
# heartbeat), the gap docs/contract.md describes, proven by tests/test_silent_network.py; the row lock is the same
def test_a_worker_stopped_inside_a_transaction_does_not_hold_its_job_for_ever(deployment, engine, env, data_file,
                                                                              broker_kind):
    """A worker SIGSTOPped while its transaction holds the job's row: another worker finishes the job.

    The stopped worker's session sat idle in its transaction for as long as
    the process stayed stopped, holding the job's row: lease recovery
    (``SKIP LOCKED``) passed it by and the other worker's fence waited on
    it (an adversarial review: 150 s, until SIGCONT). PostgreSQL now ends a
    worker's session idle in a transaction for a lease.
    """
    import psycopg2

    deployment.start("web")
    deployment.start("scheduler")
    stopped = deployment.start("worker", WORKER_THREADS="1")
    holder = psycopg2.connect(env["DATABASE_URL"])
    try:
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE variants IN SHARE MODE")  # the first render's INSERT waits, its job row locked
        attachment_id = deployment.upload(data_file("photos/chelsea.jpg")).json()["id"]
        wait_for(lambda: waiting_on_a_lock(engine, "attache worker"), timeout=30,
                 message="the worker's render waiting inside its transaction")
        stopped.signal(signal.SIGSTOP)
        holder.rollback()  # its INSERT goes through; the stopped worker will never COMMIT
        del deployment.processes["worker"]
        deployment.start("worker")
        assert deployment.wait_state(attachment_id, timeout=45)["state"] == "ready"
        assert stopped.alive and open(f"/proc/{stopped.popen.pid}/stat").read().split(") ")[1][0] == "T", \
            "finished while the first worker is still stopped"
    finally:
        holder.close()
        stopped.signal(signal.SIGKILL)
        stopped.popen.wait(timeout=30)


def test_a_scheduler_stopped_inside_lease_recovery_does_not_hold_the_jobs_it_took(deployment, engine, env, data_file):
    """A scheduler SIGSTOPped (a frozen VM) inside lease recovery's transaction holds the expired jobs' rows: the
    other schedulers' recovery (``SKIP LOCKED``) passed them by for as long as it stayed stopped (an adversarial
    review: two jobs waited out a 2-minute pause). PostgreSQL now ends a scheduler's session that has been idle
    in its transaction for a lease, as a worker's."""
    import psycopg2

    deployment.start("web")
    paused = deployment.start("scheduler")
    worker = deployment.start("worker", WORKER_THREADS="1")
    holder = psycopg2.connect(env["DATABASE_URL"])
    try:
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE variants IN SHARE MODE")  # the render waits inside its transaction, leased
        attachment_id = deployment.upload(data_file("photos/chelsea.jpg")).json()["id"]
        wait_for(lambda: waiting_on_a_lock(engine, "attache worker", "INSERT INTO variants"), timeout=30,
                 message="the render waiting inside its transaction")
        worker.kill()  # its lease will expire
        holder.rollback()
        with holder.cursor() as cur:  # lease recovery takes the job's row, then waits to announce the next attempt
            cur.execute("LOCK TABLE outbox IN SHARE ROW EXCLUSIVE MODE")
        wait_for(lambda: waiting_on_a_lock(engine, "attache scheduler", "INSERT INTO outbox"), timeout=30,
                 message="lease recovery waiting inside its transaction")
        paused.signal(signal.SIGSTOP)
        holder.rollback()  # its INSERT goes through; the stopped scheduler will never COMMIT
        del deployment.processes["scheduler"]
        deployment.start("scheduler")
        deployment.start("worker")
        assert deployment.wait_state(attachment_id, timeout=45)["state"] == "ready"
        assert open(f"/proc/{paused.popen.pid}/stat").read().split(") ")[1][0] == "T", \
            "finished while the first scheduler is still stopped"
    finally:
        holder.close()
        paused.signal(signal.SIGKILL)
        paused.popen.wait(timeout=30)


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_a_database_gone_read_only_is_waited_out_like_an_outage(deployment, engine, storage_dir, data_file,
                                                                  database_url):
    """A failover leaves clients on a demoted primary, or an operator sets ``default_transaction_read_only``:
    every write is refused (SQLSTATE 25006) while reads work. The worker took it for a bug in the step: Dramatiq's
    retries backed off, and after a 15 s read-only spell jobs waited up to 285 s (an adversarial run). Now a step
    waits for writes as for an outage, the web answers 503, and the pools reconnect. With the PostgreSQL broker
    (single-node mode) its pool kept the sessions opened during the spell, read-only for life, and not one job
    moved in the two minutes after it."""
    photos = [data_file(f"photos/{photo}") for photo in
              ("chelsea_12mp_4247x2825.jpg", "astronaut_12mp_3464x3464.jpg", "chelsea.jpg")]
    for process in ("web", "worker", "scheduler"):
        deployment.start(process)
    accepted = [deployment.upload(photos[i % len(photos)]).json()["id"] for i in range(9)]
    with read_only(database_url):
        refused = deployment.upload(photos[2])
        assert (refused.status_code, refused.json()["error"]) == (503, "database_unavailable"), refused.text
        time.sleep(3)  # the spell goes on while the steps in flight try to write (in single-node mode, to claim)
    wait_for(lambda: all(deployment.status(i)["state"] in ("ready", "failed") for i in accepted), timeout=30,
             message="every upload finished soon after the database took writes again")
    assert_invariants(engine, storage_dir, accepted)
    assert deployment.upload(photos[2]).status_code == 202


@pytest.mark.parametrize("one_step", [True, False], ids=["one step", "a render message per variant"])
def test_steps_that_live_through_a_spell_longer_than_their_lease_are_not_charged_for_it(
        deployment, engine, storage_dir, data_file, database_url, one_step):
    """No heartbeat can be written while PostgreSQL is read-only (or down, or full): a spell longer than the lease
    let every running step's lease lapse, and lease recovery, first to write once the spell ended, charged each of
    those jobs an attempt, ``worker_lost`` (one on its last attempt failed), and threw their steps' work away.
    Now the step that owns a lapsed lease goes on, and lease recovery waits a heartbeat period after it could not
    write (states.held_by, scheduler/lease_recovery.py). Before: the jobs in flight ended ready on attempt 2.
    Render steps of one attempt run side by side (images above ATTACHE_ONE_STEP_MAX_PIXELS): there a lapsed
    lease is lost as before and the attempt is taken back; when the one that owned it went on instead, the others
    were acked as stale and the job waited for the reconciler (300 s) with variants missing (an adversarial
    run). Every job must finish within seconds of the spell either way."""
    # 12 MP photos only: their steps run for seconds, so steps are running when the spell begins
    photos = [data_file(f"photos/{photo}") for photo in ("chelsea_12mp_4247x2825.jpg", "astronaut_12mp_3464x3464.jpg")]
    deployment.start("web")
    # the default makes every variant in one step; 0: a render message per variant
    deployment.start("worker", ATTACHE_ONE_STEP_MAX_PIXELS="64000000" if one_step else "0")
    deployment.start("scheduler")
    accepted = [deployment.upload(photos[i % len(photos)]).json()["id"] for i in range(6 if one_step else 8)]
    running = (jobs.c.state == "processing", jobs.c.lease_owner.is_not(None))

    def read(query):
        with engine.connect() as conn:
            return conn.execute(query).scalar()

    # steps hand off between a read and the spell's start: when none was running as it began, end it and try again
    for _ in range(5):
        wait_for(lambda: read(select(func.count()).select_from(jobs).where(*running)), timeout=30,
                 message="steps running")
        with read_only(database_url):  # reads still work
            last = read(select(func.max(jobs.c.lease_expires_at)).where(*running))
            if last is not None:
                wait_for(lambda: read(select(func.now())) > last, timeout=30,
                         message="the spell outlasts every lease held when it began")
                break
    assert last is not None, "steps ran as a spell began"
    wait_for(lambda: all(deployment.status(i)["state"] in ("ready", "failed") for i in accepted), timeout=60,
             message="every upload finished soon after the spell (the reconciler would take 300 s)")
    assert_invariants(engine, storage_dir, accepted)
    if not one_step:
        return
    with engine.connect() as conn:
        charged = conn.execute(select(job_history.c.job_id, job_history.c.error_code)
                               .where(job_history.c.error_code.is_not(None))).all()
        attempts = conn.execute(select(jobs.c.attempt).where(jobs.c.attachment_id.in_(accepted))).scalars().all()
    assert charged == [] and attempts == [1] * len(accepted), (charged, attempts)


@pytest.mark.parametrize("one_step", [  # 16-17 s each: both in make soak (the marker's 15 s)
    pytest.param(True, id="one step", marks=pytest.mark.long),
    pytest.param(False, id="a render message per variant", marks=pytest.mark.long)])
def test_a_full_storage_disk_that_outlasts_the_retry_budget_costs_no_attempt(env, tmp_path, engine, data_file,
                                                                              one_step):
    """Storage full (ENOSPC) as the worker writes the variants: each try cost the job an attempt, the managed
    retries were spent in less than three minutes by default (some 8 s here), and every upload accepted before the
    disk filled ended ``failed storage_unavailable`` however soon it was freed (an adversarial run: 200 s full, three
    of three failed). Now a step tries its storage call again, holding its lease, for ``ATTACHE_STORAGE_WAIT_SECONDS``
    (workflow._outlasting_storage)."""
    from tests.filesystems import fill, small_filesystem

    photos = [data_file(f"photos/{name}") for name in ("chelsea.jpg", "coffee.jpg")]
    with small_filesystem(32 * 1024 * 1024) as disk:
        # a floor below the disk: the uploads are accepted, and something else fills the disk after
        deployment = Deployment({**env, "STORAGE_URL": f"file://{disk}", "ATTACHE_RETRY_INITIAL_SECONDS": "0.1",
                                 "ATTACHE_SPOOL_MIN_FREE_BYTES": str(1 << 20)}, tmp_path)
        try:
            deployment.start("web")
            accepted = [deployment.upload(photo).json()["id"] for photo in photos]  # staged while there is room
            fill(disk / "filler")
            worker = deployment.start("worker", ATTACHE_ONE_STEP_MAX_PIXELS="64000000" if one_step else "0")
            deployment.start("scheduler")

            def found_full() -> bool:  # it waits (and says so), or (before) it was charged an attempt
                with engine.connect() as conn:
                    retried = conn.execute(select(func.count()).select_from(job_history).where(
                        job_history.c.error_code == "storage_unavailable")).scalar()
                return retried > 0 or "storage unavailable, tried again" in worker.output()

            wait_for(found_full, timeout=30, message="a step finding the storage disk full")
            time.sleep(12)  # full for longer than the retry budget (0.2 + 0.6 + 1.8 + 5.4 s)
            assert all(deployment.status(i)["state"] in ("queued", "processing") for i in accepted)
            (disk / "filler").unlink()
            wait_for(lambda: all(deployment.status(i)["state"] in ("ready", "failed") for i in accepted),
                     timeout=60, message="every upload finished once the disk had room")
            assert_invariants(engine, disk, accepted)
            with engine.connect() as conn:
                attempts = conn.execute(select(jobs.c.attempt)).scalars().all()
                charged = conn.execute(select(job_history.c.error_code)
                                       .where(job_history.c.error_code.is_not(None))).scalars().all()
            assert [deployment.status(i)["state"] for i in accepted] == ["ready"] * len(accepted)
            assert attempts == [1] * len(accepted) and charged == [], (attempts, charged)
        finally:
            deployment.stop_all()
