"""Each maintenance service, tested by seeding rows and objects and calling ``run_once()``."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, insert, select, text, update

from app.adapters.postgres.models import attachments, jobs, outbox, upload_parts, uploads, variants
from app.core import outbox as outbox_rows
from app.core import pipeline, resumable, states
from app.core.steps import Step
from app.observability.tracing import new_traceparent
from scheduler.__main__ import guarded
from scheduler.lease_recovery import LeaseRecovery, LeaseRecoveryConfig
from scheduler.locking import exclusive
from scheduler.object_gc import ObjectGc, ObjectGcConfig
from scheduler.outbox_relay import OutboxRelay, OutboxRelayConfig
from scheduler.runs import SweeperRuns
from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig
from tests.conftest import REPO
from tests.filesystems import read_only_view
from tests.processes import read_only, wait_for
from tests.sql_log import sql_log
from tests.tcp import Listener

HOUR = 3600


def seed(engine, storage, state="queued", *, stage=True):
    attachment_id = uuid.uuid4()
    key = pipeline.staging_key(attachment_id)
    if stage:
        storage.put_bytes(key, b"original bytes")
    with engine.begin() as conn:
        conn.execute(insert(attachments).values(
            id=attachment_id, owner="t", filename="a.jpg", content_type="image/jpeg", format="JPEG", size=14,
            sha256="0" * 64, width=1, height=1, staging_key=key))
    return attachment_id, add_job(engine, attachment_id, 1, state), key


def add_job(engine, attachment_id, version, state):
    with engine.begin() as conn:
        job_id, _ = states.create_job(conn, attachment_id=attachment_id, pipeline_version=version, max_attempts=3,
                                      traceparent=new_traceparent(), tracestate=None, actor="test", room_bytes=0)
        if state != "queued":
            values = {"state": state, "attempt": 1}
            if state == "failed":
                values["error_code"] = "corrupt_image"
            if state == "processing":  # a step is running
                values["lease_expires_at"] = func.now() + text("interval '1 hour'")
                values["lease_owner"] = "worker:test"
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
    return job_id


def age(storage_dir, key, seconds):
    path = storage_dir / key
    past = time.time() - seconds
    os.utime(path, (past, past))


def exists(storage_dir, key):
    return (storage_dir / key).exists()


# --- outbox relay -------------------------------------------------------------


def test_outbox_relay_publishes_only_abandoned_and_due_rows(services, engine):
    _, young_job, _ = seed(engine, services.storage)
    _, old_job, _ = seed(engine, services.storage)
    _, delayed_job, _ = seed(engine, services.storage)
    with engine.begin() as conn:
        conn.execute(update(outbox).where(outbox.c.job_id == old_job).values(created_at=func.now() - text("interval '1 minute'")))
        conn.execute(update(outbox).where(outbox.c.job_id == delayed_job)
                     .values(available_at=func.now() + text("interval '1 hour'")))
    relay = OutboxRelay(services.publisher, OutboxRelayConfig(publish_after_seconds=30))
    assert relay.run_once() == {"published": 1, "pending": 0}
    assert services.broker.queue_depth("attache.inspect") == 1
    with engine.begin() as conn:
        marked = dict(conn.execute(select(outbox.c.job_id, outbox.c.published_at)).all())
        assert marked[old_job] is not None and marked[young_job] is None and marked[delayed_job] is None
        conn.execute(update(outbox).where(outbox.c.job_id == delayed_job).values(available_at=func.now()))
    # a delayed row is published as soon as it is due, without waiting for the threshold
    assert relay.run_once()["published"] == 1
    assert relay.run_once()["published"] == 0, "a marked row is never published again by the relay"


def test_a_unit_of_work_publishes_its_fan_out_without_reading_it_back_and_marks_it_in_one_commit(services, engine):
    """The step's own COMMIT, then one mark: the rows it wrote are sent as written, not selected again."""
    _, job_id, _ = seed(engine, services.storage)
    with engine.connect() as conn:
        job = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
    with sql_log(engine) as log, services.unit_of_work.begin() as work:
        for name in ("a", "b", "c", "d"):
            outbox_rows.announce(work.conn, job, 1, Step.RENDER, variant=name)
        later = outbox_rows.announce(work.conn, job, 2, Step.INSPECT,
                                     available_at=datetime.now(timezone.utc) + timedelta(hours=1))
    statements, commits = log.statements, log.commits
    assert work.published == 4, "the row not yet due is the relay's"
    assert len(commits) == 2, f"the transaction and one mark, not {len(commits)} commits"
    assert not any(sql.lstrip().upper().startswith("SELECT") for sql in statements[commits[0]:]), statements
    with engine.connect() as conn:
        marked = dict(conn.execute(select(outbox.c.id, outbox.c.published_at)
                                   .where(outbox.c.job_id == job_id, outbox.c.queue_name == "attache.render")).all())
        assert len(marked) == 4 and all(at is not None for at in marked.values())
        assert conn.execute(select(outbox.c.published_at).where(outbox.c.id == later)).scalar() is None
    assert services.broker.queue_depth("attache.render") == 4


def test_a_fan_out_is_marked_in_one_commit_that_does_not_wait_for_the_wal(services, engine):
    """Five confirmed messages of one transaction: one read, one mark, not one commit per message."""
    _, job_id, _ = seed(engine, services.storage)
    with engine.begin() as conn:
        ids = list(conn.execute(select(outbox.c.id).where(outbox.c.job_id == job_id)).scalars())
        job = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
        ids += [outbox_rows.announce(conn, job, 1, Step.RENDER, variant=name) for name in ("a", "b", "c", "d")]
    with sql_log(engine) as log:
        assert services.publisher.publish(ids) == 5
    statements, commits = log.statements, log.commits
    assert len(commits) == 2, f"one read and one mark, not {len(commits)} commits"
    assert any("synchronous_commit = off" in sql for sql in statements), statements
    with engine.connect() as conn:
        marked = conn.execute(select(outbox.c.published_at, outbox.c.publish_attempts)
                              .where(outbox.c.id.in_(ids))).all()
    assert all(row.published_at is not None and row.publish_attempts == 1 for row in marked)
    assert services.broker.queue_depth("attache.render") == 4


def test_outbox_relay_leaves_rows_unmarked_while_the_broker_is_down(settings, engine):
    from app.config import Settings
    from app.services import Services

    down = Services(Settings.from_env({"DATABASE_URL": settings.database_url,
                                       "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                       "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "1"}))
    seed(engine, down.storage, stage=False)
    counts = OutboxRelay(down.publisher, OutboxRelayConfig(publish_after_seconds=0)).run_once()
    assert counts == {"published": 0, "pending": 1}
    with engine.connect() as conn:
        row = conn.execute(select(outbox)).one()
    assert row.published_at is None and row.publish_attempts == 1 and "not confirmed" in row.last_error
    down.engine.dispose()


def test_the_relay_holds_no_row_lock_while_it_waits_on_rabbitmq(settings, services, engine):
    """The relay claims its batch and commits before publishing: a stalled broker blocks nobody's row,
    a second relay skips the claimed row, and a failed publish releases it for the next round."""
    from app.config import Settings
    from app.services import Services

    silent = Listener()  # accepts the connection and never answers
    stalled = Services(Settings.from_env({"DATABASE_URL": settings.database_url,
                                          "BROKER_URL": f"amqp://guest:guest@127.0.0.1:{silent.port}/%2F",
                                          "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "4"}))
    seed(engine, services.storage, stage=False)
    results = []
    waiting = threading.Thread(target=lambda: results.append(
        OutboxRelay(stalled.publisher, OutboxRelayConfig(publish_after_seconds=0)).run_once()))
    try:
        waiting.start()
        wait_for(lambda: silent.accepted, timeout=10, message="the relay to connect to the stalled broker")
        with engine.connect() as conn:  # NOWAIT: raises at once if the waiting relay held the row's lock
            row = conn.execute(select(outbox).with_for_update(nowait=True)).one()
            conn.rollback()
        assert row.published_at is None and row.claimed_until is not None, "claimed, not published"
        other = OutboxRelay(services.publisher, OutboxRelayConfig(publish_after_seconds=0))
        assert other.run_once() == {"published": 0, "pending": 0}, "another relay skips a claimed row"
        waiting.join(timeout=30)
        assert results == [{"published": 0, "pending": 1}]
        with engine.connect() as conn:
            row = conn.execute(select(outbox)).one()
        assert row.claimed_until is None and row.publish_attempts == 1 and "not confirmed" in row.last_error
        assert other.run_once() == {"published": 1, "pending": 0}, "released: the next round publishes it"
        assert services.broker.queue_depth("attache.inspect") == 1
    finally:
        waiting.join(timeout=30)
        silent.close()
        stalled.engine.dispose()


# --- lease recovery ------------------------------------------------------------


def test_lease_recovery_requeues_expired_and_publishes_the_next_attempt(services, engine):
    _, expired, _ = seed(engine, services.storage, "processing")
    _, live, _ = seed(engine, services.storage, "processing")
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == expired).values(lease_expires_at=func.now() - text("interval '1 second'")))
    assert LeaseRecovery(services.unit_of_work, LeaseRecoveryConfig()).run_once() == {"requeued": 1, "failed": 0}
    with engine.connect() as conn:
        got = dict(conn.execute(select(jobs.c.id, jobs.c.state)).all())
        newest = conn.execute(select(outbox.c.payload, outbox.c.published_at).where(outbox.c.job_id == expired)
                              .order_by(outbox.c.id.desc())).first()
    assert got == {expired: "queued", live: "processing"}
    assert newest.payload["attempt"] == 2 and newest.published_at is not None


def test_a_round_takes_back_every_lapsed_lease_batch_after_batch(services, engine):
    """One batch a round took 2,000 lapsed leases back in 223 s, ten a second at the default interval, while the
    workers stood idle (an adversarial run): a round goes on while its batches are full."""
    lapsed = [seed(engine, services.storage, "processing")[1] for _ in range(25)]
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_(lapsed))
                     .values(lease_expires_at=func.now() - text("interval '1 second'")))
    assert LeaseRecovery(services.unit_of_work, LeaseRecoveryConfig(batch=10)).run_once() == {"requeued": 25,
                                                                                            "failed": 0}
    assert LeaseRecovery(services.unit_of_work, LeaseRecoveryConfig(batch=10, max_batches=1)).run_once() == {
        "requeued": 0, "failed": 0}


def test_a_round_of_many_quick_batches_is_not_a_break(services, engine):
    """A round was watched as a whole: one of many quick batches took longer than the settle time, counted as a
    break, and left the rest deferred for another settle time (a re-attack). Each batch is watched on its own."""
    lapsed = [seed(engine, services.storage, "processing")[1] for _ in range(25)]
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_(lapsed))
                     .values(lease_expires_at=func.now() - text("interval '1 second'")))
    recovery = LeaseRecovery(services.unit_of_work, LeaseRecoveryConfig(batch=1, settle_seconds=0.05))
    first = wait_for(lambda: (counts := recovery.run_once())["requeued"] and counts, timeout=10, interval=0.01,
                     message="a round that takes leases back")
    assert first == {"requeued": 25, "failed": 0}, "all in the round, none deferred"


def test_an_interval_longer_than_the_settle_time_still_takes_leases_back(services, engine):
    """Every gap between rounds longer than the settle time was a break: with ``ATTACHE_LEASE_INTERVAL_SECONDS``
    longer than a third of the lease, no lapsed lease was ever taken back (an adversarial run)."""
    _, lapsed, _ = seed(engine, services.storage, "processing")
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == lapsed).values(lease_expires_at=func.now() - text("interval '1 second'")))
    recovery = LeaseRecovery(services.unit_of_work, LeaseRecoveryConfig(settle_seconds=0.1, interval_seconds=0.3))
    wait_for(lambda: recovery.run_once()["requeued"] == 1, timeout=10, interval=0.3,
             message="the lapsed lease taken back by rounds an interval apart")


def test_after_a_round_the_database_refused_lapsed_leases_wait_a_heartbeat_period(services, engine, database_url):
    """A read-only spell longer than the lease lets every running step's lease lapse, though its worker lives
    and renews it within a second of the spell's end (states.held_by). Rounds that succeed again first leave
    the lapsed leases for ``settle_seconds`` (counted ``deferred``); then they are taken back."""
    from app.errors import DatabaseUnavailable

    _, lapsed, _ = seed(engine, services.storage, "processing")
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == lapsed).values(lease_expires_at=func.now() - text("interval '1 second'")))
    recovery = LeaseRecovery(services.unit_of_work, LeaseRecoveryConfig(settle_seconds=1.0))
    with read_only(database_url), pytest.raises(DatabaseUnavailable):  # SELECT ... FOR UPDATE, read-only session
        recovery.run_once()
    engine.dispose()
    services.engine.dispose()  # its sessions opened during the spell stay read-only
    began = time.monotonic()
    assert recovery.run_once() == {"requeued": 0, "failed": 0, "deferred": 1}
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.state).where(jobs.c.id == lapsed)).scalar() == "processing"
    wait_for(lambda: recovery.run_once()["requeued"] == 1, timeout=10, interval=0.1,
             message="the lapsed lease taken back once the settle time has passed")
    assert time.monotonic() - began >= 1.0
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.state).where(jobs.c.id == lapsed)).scalar() == "queued"


# --- staging cleanup -------------------------------------------------------------


def test_staging_cleanup_never_removes_current_work(services, engine, storage_dir):
    orphan_old, orphan_young = f"staging/{uuid.uuid4()}", f"staging/{uuid.uuid4()}"
    for key in (orphan_old, orphan_young):
        services.storage.put_bytes(key, b"x")
    _, _, queued_key = seed(engine, services.storage, "queued")
    _, _, processing_key = seed(engine, services.storage, "processing")
    _, _, ready_key = seed(engine, services.storage, "ready")
    _, _, failed_recent_key = seed(engine, services.storage, "failed")
    _, failed_old_job, failed_old_key = seed(engine, services.storage, "failed")
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == failed_old_job).values(updated_at=func.now() - text("interval '8 days'")))
    for key in (orphan_old, queued_key, processing_key, ready_key, failed_recent_key, failed_old_key):
        age(storage_dir, key, 2 * HOUR)
    cleanup = StagingCleanup(services.engine, services.storage,
                             StagingCleanupConfig(grace_seconds=HOUR, failed_retention_seconds=7 * 24 * HOUR))
    assert cleanup.run_once(dry_run=True)["removed"] == 3
    assert all(exists(storage_dir, k) for k in (orphan_old, ready_key, failed_old_key)), "a dry run removes nothing"
    counts = cleanup.run_once()
    assert counts["removed"] == 3 and counts["examined"] == 7
    assert not exists(storage_dir, orphan_old) and not exists(storage_dir, ready_key)
    assert not exists(storage_dir, failed_old_key)
    for key in (orphan_young, queued_key, processing_key, failed_recent_key):
        assert exists(storage_dir, key), key


@pytest.mark.parametrize("paused", ["before_its_transaction", "inside_its_transaction"])
def test_an_upload_paused_past_the_grace_period_is_never_answered_without_its_bytes(services, engine, storage_dir,
                                                                                  data_file, monkeypatch, paused):
    """The staging cleanup runs, with no grace period left, while an upload is paused after staging its bytes.

    Its uncommitted row is invisible to the cleanup, which removed the bytes;
    the upload was then answered 202 and failed ``staging_missing`` (an
    adversarial review SIGSTOPped the web there). Paused inside its
    transaction, the upload now holds the object's lock and the cleanup
    keeps it; paused before, it finds its bytes gone and is refused with a
    503, nothing committed.
    """
    from app.core import intake
    from app.errors import StorageUnavailable
    from tests.driver import upload

    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=0))
    swept = []
    if paused == "before_its_transaction":
        monkeypatch.setattr(intake.faults, "point", lambda name: name == "after_staging" and swept.append(
            cleanup.run_once()["removed"]))
    else:
        create_job = intake.states.create_job

        def sweep_then_create(*args, **kwargs):
            swept.append(cleanup.run_once()["removed"])
            return create_job(*args, **kwargs)

        monkeypatch.setattr(intake.states, "create_job", sweep_then_create)
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
    except StorageUnavailable:
        accepted = None
    staged = sorted(p.name for p in (storage_dir / "staging").iterdir())
    with engine.connect() as conn:
        committed = conn.execute(select(func.count()).select_from(attachments)).scalar_one()
    if paused == "before_its_transaction":
        assert swept == [1], "the cleanup removed the bytes of an upload not yet in its transaction"
        assert (accepted, committed, staged) == (None, 0, []), "refused: nothing committed without the bytes"
    else:
        assert swept == [0], "the cleanup keeps what an open upload transaction holds"
        assert accepted is not None and committed == 1 and staged == [str(accepted.attachment_id)]


def test_a_removal_the_cleanup_decided_holds_after_its_session_is_lost(services, engine, storage_dir, monkeypatch):
    """The cleanup deleted under the object's lock, and a lock is its session's: a PostgreSQL restart, or the
    cleanup paused past ``idle_in_transaction_session_timeout``, ended the session and freed the lock while the
    cleanup went on to its delete. A web paused past the grace period then took the lock, found its bytes, committed
    and answered 202, and the delete removed them: ``failed staging_missing`` (an adversarial run). The decision is
    now committed before the delete, and an upload that finds it is refused."""
    from app.core import staging

    key = f"staging/{uuid.uuid4()}"
    services.storage.put_bytes(key, b"x")
    looked, delete = [], services.storage.delete

    def delete_after_losing_the_session(doomed):
        with engine.begin() as conn:  # the cleanup's session ends here; whatever lock it held is free
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                              "AND classid = :ns AND pid <> pg_backend_pid()"), {"ns": staging.NAMESPACE})
        with engine.begin() as conn:  # the paused upload resumes: its lock, its look, then its COMMIT
            staging.lock(conn, doomed)
            looked.append(staging.usable(conn, services.storage, doomed))
        delete(doomed)

    monkeypatch.setattr(services.storage, "delete", delete_after_losing_the_session)
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=0))
    assert cleanup.run_once()["removed"] == 1
    assert looked == [False], "the upload must not commit bytes the cleanup is removing"
    assert not exists(storage_dir, key)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM staging_removals")).scalar() == 0, "forgotten once gone"


def test_staging_cleanup_removes_what_a_ready_version_left_once_no_other_version_runs(services, engine, storage_dir):
    """v1's publish keeps staging while v2 runs (v2 may be reading it); v2 failing must not keep it forever."""
    v1_ready, _, left_to_failed_v2 = seed(engine, services.storage, "ready")
    add_job(engine, v1_ready, 2, "failed")
    v1_ready_too, _, read_by_running_v2 = seed(engine, services.storage, "ready")
    add_job(engine, v1_ready_too, 2, "processing")
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig())
    assert cleanup.run_once()["removed"] == 1
    assert not exists(storage_dir, left_to_failed_v2), "a replay of v2 reads the original v1 kept"
    assert exists(storage_dir, read_by_running_v2)


def test_staging_cleanup_reads_a_batch_of_current_work_at_once(services, engine, storage_dir):
    """A backlog of queued uploads is a staged object each, examined every round: each took a transaction of its
    own (2.1 ms: some 35 minutes a round for a million). Now a batch's current work is read in one statement."""
    from tests.sql_log import sql_log

    queued = [seed(engine, services.storage, "queued")[2] for _ in range(30)]
    _, _, ready_key = seed(engine, services.storage, "ready")
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig())
    with sql_log(services.engine) as log:
        counts = cleanup.run_once()
    assert (counts["examined"], counts["kept"], counts["removed"]) == (31, 30, 1)
    assert all(exists(storage_dir, key) for key in queued) and not exists(storage_dir, ready_key)
    assert len(log.commits) < 10, f"{len(log.commits)} transactions for 30 queued uploads and a ready one"


def test_cleanups_skip_a_round_while_another_scheduler_holds_the_lock(services, engine):
    with exclusive(engine, "staging_cleanup") as held:
        assert held
        assert StagingCleanup(services.engine, services.storage, StagingCleanupConfig()).run_once()["skipped"] == 1
    assert StagingCleanup(services.engine, services.storage, StagingCleanupConfig()).run_once()["skipped"] == 0


#: a scheduler's round holding the staging cleanup's lock, in a process of its own: it says so, then waits
HOLDER = """
import sys, time
from app.adapters.postgres.db import make_engine
from scheduler.locking import exclusive
engine = make_engine(sys.argv[1], process="scheduler", idle_in_transaction_seconds=float(sys.argv[2]))
with exclusive(engine, "staging_cleanup") as lock:
    print("held" if lock else "not held", flush=True)
    time.sleep(600)
"""


def test_a_scheduler_paused_holding_a_cleanups_lock_holds_it_a_lease_at_most(services, settings):
    """An adversarial review: a scheduler SIGSTOPped in a cleanup's round kept its lock for as long as it stayed
    stopped (a session-level lock, its connection idle outside any transaction), and every other scheduler skipped
    the cleanup meanwhile: 90 rounds in 90 s. The lock is now its transaction's, which PostgreSQL ends after a
    lease idle (idle_in_transaction_session_timeout): here 2 s. While the holder runs, it keeps it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, settings.database_url, "2"], stdout=subprocess.PIPE,
                              text=True, cwd=REPO)
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig())
    try:
        assert holder.stdout.readline().strip() == "held"
        for _ in range(3):  # running, it keeps its lock past the idle limit
            assert cleanup.run_once()["skipped"] == 1
            time.sleep(1.5)  # the holder's own time passing is what is under test
        os.kill(holder.pid, signal.SIGSTOP)
        wait_for(lambda: cleanup.run_once()["skipped"] == 0, timeout=20, interval=0.5,
                 message="the stopped scheduler's lock freed")  # before: skipped for as long as it was stopped
    finally:
        holder.kill()
        holder.wait(10)


def test_a_round_whose_batches_outlast_the_idle_limit_keeps_its_lock(services, settings, storage_dir, monkeypatch):
    """A review of the lock made its transaction's: touched only between batches, a round whose batch took longer
    than the idle limit (a slow store, a backlog) lost its lock at every round and failed. Here a batch of 2.5 s
    under a 1 s limit."""
    from app.adapters.postgres.db import make_engine

    for name in ("a", "b"):
        path = storage_dir / "staging" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"orphan")
    limited = make_engine(settings.database_url, process="scheduler", idle_in_transaction_seconds=1)
    cleanup = StagingCleanup(limited, services.storage, StagingCleanupConfig(batch=1))
    slow = cleanup._process
    monkeypatch.setattr(cleanup, "_process", lambda *args: (time.sleep(2.5), slow(*args)))
    try:
        counts = cleanup.run_once()  # before: DatabaseUnavailable at the second batch
    finally:
        limited.dispose()
    assert counts["skipped"] == 0 and counts["examined"] == 2


def test_a_staging_cleanup_round_holds_its_lock_from_start_to_end(services, engine, monkeypatch):
    """An adversarial review: the round swept staged objects and tus parts under the lock taken twice; another
    scheduler taking it between the two made the round, which had removed 2,000 objects, count as skipped (no
    success recorded: a cleanup seen as stalled)."""
    taken_between = []
    list_objects = services.storage.list_objects

    def listing(prefix):
        if prefix == resumable.PREFIX:  # the second sweep's listing (tus parts): another scheduler tries now
            other = exclusive(engine, "staging_cleanup")
            taken_between.append((other, other.__enter__()))
        return list_objects(prefix)

    monkeypatch.setattr(services.storage, "list_objects", listing)
    try:
        counts = StagingCleanup(services.engine, services.storage, StagingCleanupConfig()).run_once()
    finally:
        for other, _ in taken_between:
            other.__exit__(None, None, None)
    assert [bool(held) for _, held in taken_between] == [False]  # before: True, and the round said skipped
    assert counts["skipped"] == 0


# --- unreferenced objects ------------------------------------------------------------


def test_object_gc_removes_only_old_unreferenced_objects(services, engine, storage_dir):
    attachment_id, job_id, _ = seed(engine, services.storage, "ready")
    referenced = pipeline.variant_key(attachment_id, 1, "thumbnail", "a" * 64, "jpg")
    unreferenced_old = pipeline.variant_key(attachment_id, 1, "thumbnail", "b" * 64, "jpg")
    unreferenced_young = pipeline.variant_key(attachment_id, 1, "crop", "c" * 64, "jpg")
    for key in (referenced, unreferenced_old, unreferenced_young):
        services.storage.put_bytes(key, b"bytes")
    for key in (referenced, unreferenced_old):
        age(storage_dir, key, 2 * HOUR)
    with engine.begin() as conn:
        conn.execute(insert(variants).values(
            job_id=job_id, attachment_id=attachment_id, pipeline_version=1, variant="thumbnail",
            storage_key=referenced, content_type="image/jpeg", size=5, sha256="a" * 64, width=1, height=1,
            attempt=1))
    gc = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=HOUR))
    counts = gc.run_once()
    assert (counts["removed"], counts["referenced"], counts["young"]) == (1, 1, 1)
    assert exists(storage_dir, referenced) and exists(storage_dir, unreferenced_young)
    assert not exists(storage_dir, unreferenced_old)
    assert gc.run_once()["removed"] == 0


def test_object_gc_spares_a_fresh_copy_of_an_old_staged_original(services, engine, storage_dir):
    """The render copies staging (2 h old) to the original's key; until its row is recorded only age protects it."""
    attachment_id, _, staging = seed(engine, services.storage, "processing")
    age(storage_dir, staging, 2 * HOUR)
    original = pipeline.original_key(attachment_id, "0" * 64)
    services.storage.copy(staging, original)  # what the original's render does, right before its row's COMMIT
    counts = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=HOUR)).run_once()
    assert exists(storage_dir, original), "a copy made just now is young, whatever its source's age"
    assert (counts["removed"], counts["young"]) == (0, 1)
    assert exists(storage_dir, staging)


def test_object_gc_keeps_the_objects_of_an_attachment_with_work_in_flight(services, engine, storage_dir):
    """An old original left by an earlier try is reused by the next render, not rewritten: never collect it mid-job."""
    attachment_id, job_id, _ = seed(engine, services.storage, "processing")
    original = pipeline.original_key(attachment_id, "0" * 64)
    services.storage.put_bytes(original, b"original bytes")
    age(storage_dir, original, 2 * HOUR)
    gc = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=HOUR))
    counts = gc.run_once()
    assert exists(storage_dir, original), "the processing job's render may be recording this very key"
    assert (counts["removed"], counts["in_flight"]) == (0, 1)
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="failed", error_code="corrupt_image"))
    assert gc.run_once()["removed"] == 1, "once the job has ended, an unreferenced object goes"
    assert not exists(storage_dir, original)


def test_object_gc_removes_the_temp_files_of_writes_cut_short(services, engine, storage_dir):
    """A ``.tmp-*`` file anywhere under the root (a writer killed mid-write) goes once untouched for the grace."""
    attachment_id, _, staging = seed(engine, services.storage, "ready")
    kept = pipeline.variant_key(attachment_id, 1, "thumbnail", "a" * 64, "jpg")
    services.storage.put_bytes(kept, b"bytes")
    old = [storage_dir / kept.rpartition("/")[0] / ".tmp-dead1", storage_dir / "staging" / ".tmp-dead2"]
    young = storage_dir / kept.rpartition("/")[0] / ".tmp-writing"
    for path in (*old, young):
        path.write_bytes(b"half an object")
    for path in old:
        os.utime(path, (time.time() - 2 * HOUR,) * 2)
    gc = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=HOUR))
    assert gc.run_once(dry_run=True)["abandoned_writes"] == 2
    assert all(path.exists() for path in old), "a dry run removes nothing"
    assert gc.run_once()["abandoned_writes"] == 2
    assert not any(path.exists() for path in old)
    assert young.exists(), "a temp file touched within the grace may be a write in progress"
    assert exists(storage_dir, kept) and exists(storage_dir, staging), "objects are not temp files"
    with exclusive(engine, "object_gc") as held:
        assert held
        counts = gc.run_once()
    assert (counts["skipped"], counts["abandoned_writes"]) == (1, 0), "a round without the lock sweeps nothing"


def test_object_gc_enters_only_directories_of_keys_and_removes_the_empty_ones(services, engine, storage_dir,
                                                                              tmp_path):
    """The sweep of leftovers walks the whole root: a mount point's ``lost+found`` (0700, root's) made every
    round of a non-root scheduler fail (an adversarial review), and a directory swapped for a symlink must not
    lead it outside. Each finished resumable upload left an empty ``partial/{id}/`` for good."""
    def aged(path):
        os.utime(path, (time.time() - 2 * HOUR,) * 2, follow_symlinks=False)
        return path

    foreign = storage_dir / "lost+found"
    foreign.mkdir()
    theirs = foreign / ".tmp-theirs"
    theirs.write_bytes(b"x")
    aged(theirs)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ".tmp-outside").write_bytes(b"x")
    aged(outside / ".tmp-outside")
    (storage_dir / "partial").mkdir()
    aged(outside)
    (storage_dir / "partial" / "link").symlink_to(outside)
    done = [storage_dir / "partial" / name for name in ("u1", "u2")]
    for path in done:
        path.mkdir()
        aged(path)
    live = storage_dir / "partial" / "u3"
    live.mkdir()  # untouched within the grace
    kept = pipeline.variant_key(uuid.uuid4(), 1, "thumbnail", "a" * 64, "jpg")
    services.storage.put_bytes(kept, b"bytes")
    aged(storage_dir / kept.rpartition("/")[0])

    gc = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=HOUR))
    assert gc.run_once(dry_run=True)["empty_directories"] == 2
    assert all(path.exists() for path in done), "a dry run removes nothing"
    counts = gc.run_once()
    assert (counts["empty_directories"], counts["abandoned_writes"]) == (2, 0), counts
    assert not any(path.exists() for path in done)
    assert live.is_dir() and exists(storage_dir, kept), "young or not empty: kept"
    assert theirs.exists() and (outside / ".tmp-outside").exists(), "nothing outside the store's own directories"
    assert (storage_dir / "partial" / "link").is_symlink()
    services.storage.put_bytes("partial/u1/0", b"a new part")  # a write into a directory the sweep took


def test_a_write_whose_temp_file_was_swept_is_unavailable_not_an_error(tmp_path):
    """A writer paused (SIGSTOP, a frozen VM) past the grace, between its bytes and the rename, finds its temp
    file swept: the web answered 500 (an adversarial review); it is a retry (503), as a swept spool is."""
    from app.adapters.storage.filesystem import FilesystemStorage
    from app.errors import StorageUnavailable

    store = FilesystemStorage(tmp_path)

    def write_then_lose_it(dst):
        dst.write(b"bytes")
        for path in (tmp_path / "staging").glob(".tmp-*"):
            path.unlink()  # what the sweep does to a temp file untouched for the grace
        return 5

    with pytest.raises(StorageUnavailable, match="temp file was removed"):
        store._write_atomic("staging/a", write_then_lose_it)
    assert not (tmp_path / "staging" / "a").exists()
    assert store.put_bytes("staging/a", b"bytes").size == 5, "the retry works"


@pytest.mark.processes
def test_a_worker_killed_mid_write_leaves_a_temp_file_the_object_gc_removes(env, tmp_path, services, engine,
                                                                             storage_dir, data_file):
    """SIGKILL with an object's bytes in its temp file: the upload still ends ready, and the leftover, which no
    key names, is removed by the object GC once older than the grace (before: kept for ever)."""
    from tests.processes import Deployment
    from tests.test_failure_windows import assert_invariants

    deployment = Deployment(env, tmp_path)
    try:
        deployment.start("web")
        worker = deployment.start("worker", ATTACHE_FAULT="during_object_write")
        attachment_id = deployment.upload(data_file("photos/chelsea.jpg")).json()["id"]
        assert worker.wait_dead(timeout=60) != 0
        leftovers = [p for p in storage_dir.rglob(".tmp-*") if p.is_file()]  # one, or more: other render threads
        assert leftovers
        deployment.start("worker")
        assert deployment.wait_state(attachment_id)["state"] == "ready"
        assert_invariants(engine, storage_dir, [attachment_id])
        gc = ObjectGc(engine, services.storage, ObjectGcConfig(grace_seconds=HOUR))
        assert gc.run_once()["abandoned_writes"] == 0 and all(p.exists() for p in leftovers), "young: kept"
        for path in leftovers:
            os.utime(path, (time.time() - 2 * HOUR,) * 2)
        counts = gc.run_once()
        assert (counts["abandoned_writes"], counts["removed"]) == (len(leftovers), 0), counts
        assert not any(p.exists() for p in leftovers)
        assert_invariants(engine, storage_dir, [attachment_id])
    finally:
        deployment.stop_all()



def _decisions(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM object_removals")).scalar()


def test_a_scheduler_killed_between_its_gc_decision_and_the_delete(env, tmp_path, services, engine, storage_dir):
    """SIGKILL at ``object_gc_before_delete``: the decision is committed, the object still there; a scheduler
    started again removes it as decided once the decision is a grace period old, and forgets the decision."""
    from tests.processes import Deployment

    attachment_id, _, _ = seed(engine, services.storage, "failed")
    key = pipeline.variant_key(attachment_id, 1, "thumbnail", "b" * 64, "jpg")
    services.storage.put_bytes(key, b"bytes")
    age(storage_dir, key, 2 * HOUR)
    fast = {"ATTACHE_OBJECT_GRACE_SECONDS": "1", "ATTACHE_OBJECT_DECISION_GRACE_SECONDS": "1",
            "ATTACHE_CLEANUP_INTERVAL_SECONDS": "0.5"}
    deployment = Deployment(env, tmp_path)
    try:
        scheduler = deployment.start("scheduler", wait=False, ATTACHE_FAULT="object_gc_before_delete", **fast)
        assert scheduler.wait_dead(timeout=60) != 0
        with engine.connect() as conn:
            decided = conn.execute(text("SELECT key, owner FROM object_removals")).all()
        assert decided == [(key, str(attachment_id))] and exists(storage_dir, key)
        deployment.start("scheduler", wait=False, **fast)
        wait_for(lambda: not exists(storage_dir, key), timeout=60, message="the decided removal finished")
        wait_for(lambda: not _decisions(engine), timeout=30, message="the decision forgotten")
    finally:
        deployment.stop_all()


# --- indexes ----------------------------------------------------------------------


def explain(conn, statement) -> str:
    sql = str(statement.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    return "\n".join(conn.exec_driver_sql("EXPLAIN " + sql).scalars())


def test_sweep_lookups_use_their_indexes(engine):
    """Each per-object lookup of the sweeps is an index scan, not a scan of the whole table."""
    from scheduler.object_gc import referenced_query
    from scheduler.retirement import (
        candidates_query,
        oldest_live_version_query,
        still_used_query,
    )
    from scheduler.staging_cleanup import owner_query

    key = pipeline.variant_key(uuid.uuid4(), 1, "thumbnail", "a" * 64, "jpg")
    lookups = {
        "variants_storage_key_idx": [referenced_query([key, key + "x"]), still_used_query(key)],
        "attachments_staging_key_idx": [owner_query(pipeline.staging_key(uuid.uuid4()))],
        "variants_job_idx": [select(variants).where(variants.c.job_id == uuid.uuid4())],
        "variants_live_version_idx": [oldest_live_version_query()],
        # retirement's search starts from the newer ready jobs (on 1,000,000 rows it then probes each
        # attachment's older rows through variants_effect_key: `make bench` prints that plan)
        "jobs_state_idx": [candidates_query(3600, 500, 1)],
    }
    #: indexes that lead with the same column, which the planner may prefer (migration 0011 adds them)
    same_lead = {"jobs_state_idx": ("jobs_state_created_idx",)}
    with engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")  # tables are empty here: ask what an index can do
        for index, statements in lookups.items():
            for statement in statements:
                plan = explain(conn, statement)
                assert any(name in plan for name in (index, *same_lead.get(index, ()))), plan
                assert "Seq Scan" not in plan, plan


def test_lease_recovery_takes_no_lease_back_before_it_has_watched_a_heartbeat_period_without_a_break(services,
                                                                                                     engine):
    """A frozen PostgreSQL answers late rather than refusing, and a paused scheduler runs no round: neither is a
    round that failed, and an adversarial run saw 4 live steps charged worker_lost 0.05 s after a 9 s freeze.
    A scheduler just started, a round after a gap longer than ``settle_seconds``, or one that took longer,
    defers the lapsed leases; rounds without a break for ``settle_seconds`` take them back."""
    _, lapsed, _ = seed(engine, services.storage, "processing")
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == lapsed).values(lease_expires_at=func.now() - text("interval '1 second'")))
    recovery = LeaseRecovery(services.unit_of_work, LeaseRecoveryConfig(settle_seconds=0.5))
    assert recovery.run_once() == {"requeued": 0, "failed": 0, "deferred": 1}, "just started"
    time.sleep(0.7)  # the scheduler paused past the settle time: no round ran
    assert recovery.run_once()["deferred"] == 1, "a gap is a break"
    wait_for(lambda: recovery.run_once()["requeued"] == 1, timeout=10, interval=0.1,
             message="taken back after rounds without a break")

    _, slow, _ = seed(engine, services.storage, "processing")
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == slow).values(lease_expires_at=func.now() - text("interval '1 second'")))
    holder = engine.connect()
    held = holder.begin()
    holder.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))  # the round waits, as on a frozen server
    release = threading.Timer(0.7, lambda: (held.rollback(), holder.close()))
    release.start()
    try:
        assert recovery.run_once()["deferred"] == 1, "a round that took longer than the settle time is a break"
    finally:
        release.join()
    wait_for(lambda: recovery.run_once()["requeued"] == 1, timeout=10, interval=0.1,
             message="taken back after rounds without a break")


def _lost_attempt(services, workflow, storage_dir, data_file):
    """What an attempt that lost its lease after writing its objects leaves: the objects (two hours old), no row
    recorded, the job failed ``worker_lost``. The accepted upload and the objects made, by variant."""
    from tests.driver import upload

    accepted = upload(services, data_file("photos/chelsea.jpg"))
    with services.engine.begin() as conn:
        attachment = workflow._attachment(conn, accepted.attachment_id)
        version = pipeline.get(accepted.pipeline_version)
    with workflow._staged(attachment.staging_key, attachment.sha256) as path:
        made, failed = workflow._make_objects(attachment, version, list(version.variants), path)
    assert failed is None and len(made) == len(version.variants)
    with services.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == accepted.job_id)
                     .values(state="failed", attempt=1, error_code="worker_lost"))
    for effect in made.values():
        age(storage_dir, effect["storage_key"], 2 * HOUR)
    return accepted, made


def _end_sessions(engine, process: str) -> None:
    """What a frozen VM's sessions come to (the server's keepalives end them): their locks are freed."""
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :name"
                          " AND datname = current_database()"),
                     {"name": f"attache {process}"})


class _SlowDelete:
    """Storage whose ``delete`` waits until the test lets it go (a slow storage call, as an adversarial run made
    one with a 15 s ``unlink``); everything else is the real storage's."""

    def __init__(self, storage):
        self.storage, self.entered, self.release, self.deleting = storage, threading.Event(), threading.Event(), None

    def __getattr__(self, name):
        return getattr(self.storage, name)

    def delete(self, key):
        self.deleting = key
        self.entered.set()
        assert self.release.wait(60)
        return self.storage.delete(key)


def until_its_lock_is_lost(run_once) -> None:
    """A round run in a thread of the test: one whose sessions the test ended stops at its next batch, as a
    scheduler's does (its lock went with them: scheduler/locking.py); the scheduler records it failed."""
    from app.errors import DatabaseUnavailable

    try:
        run_once()
    except DatabaseUnavailable as exc:
        assert "lock's session ended" in str(exc), exc  # not any outage: the lock's own


def test_a_replay_during_the_object_gcs_delete_never_loses_the_ready_jobs_object(quiet_services, storage_dir,
                                                                                data_file, caplog):
    """An adversarial run: an attempt lost its lease after writing its objects (``worker_lost``, nothing
    recorded); the GC found one of them unreferenced, with no unfinished job, and began to delete it; an operator
    replayed the job meanwhile, and the new attempt rendered the same key, recorded it and was published ``ready``
    before the slow delete returned and removed it: a ready variant gone for good (``500 effect_missing``). The GC
    now commits its decision before it deletes, and the replayed attempt's claim waits for the delete."""
    from app.core.operations import replay
    from app.core.workflow import Workflow
    from tests.driver import job, run

    services = quiet_services
    engine = services.engine
    caplog.set_level("INFO", logger="attache.workflow")
    workflow = Workflow(services)
    accepted, made = _lost_attempt(services, workflow, storage_dir, data_file)

    slow = _SlowDelete(services.storage)
    gc = ObjectGc(services.engine, slow, ObjectGcConfig(grace_seconds=HOUR))
    collecting = threading.Thread(target=until_its_lock_is_lost, args=(gc.run_once,))
    collecting.start()
    try:
        assert slow.entered.wait(30), "the GC reached its first delete"
        replay(services, accepted.job_id, operator="alice", reason="worker lost")
        done = []
        def work():
            try:
                done.append(run(workflow, engine, accepted.job_id))
            except BaseException as error:
                done.append(error)
                raise

        worker = threading.Thread(target=work)
        worker.start()
        wait_for(lambda: done or job(engine, accepted.job_id).state != "queued"
                 or "the step waits for it" in caplog.text, timeout=30, message="the replayed attempt ran or waits")
        waited = job(engine, accepted.job_id).state
    finally:
        slow.release.set()
        collecting.join(60)
    worker.join(60)
    assert waited == "queued", "the replayed attempt is not claimed while the GC deletes one of its objects"
    assert done and not isinstance(done[0], BaseException), done
    assert job(engine, accepted.job_id).state == "ready", (done, caplog.text[-3000:])
    with engine.connect() as conn:
        published = list(conn.execute(select(variants.c.storage_key)
                                      .where(variants.c.job_id == accepted.job_id)).scalars())
        left = conn.execute(text("SELECT count(*) FROM object_removals")).scalar()
    assert slow.deleting in published and left == 0
    assert all(exists(storage_dir, key) for key in published), "every object of the ready job is there"


def test_a_gc_frozen_in_its_delete_after_another_finished_it_never_removes_a_replayed_jobs_object(
        quiet_services, storage_dir, data_file):
    """An adversarial run: a GC froze between its decision and its delete, its sessions ended (a paused VM: the
    server's keepalives end them in about 10 s) and freed its lock; the next round, the decision grace passed,
    finished the decision (deleted the object, forgot the decision), so the claims went on; an operator replayed
    the job, whose new attempt rendered the same content-addressed key, recorded it and was published ``ready``;
    then the frozen GC thawed and deleted it. The key is now tainted by the round that finished another's
    decision, and the replayed attempt writes that variant under another key."""
    from app.adapters.postgres.db import make_engine
    from app.core.operations import replay
    from app.core.workflow import Workflow
    from tests.driver import job, run

    services = quiet_services
    engine = services.engine
    workflow = Workflow(services)
    accepted, made = _lost_attempt(services, workflow, storage_dir, data_file)
    frozen_engine = make_engine(services.settings.database_url, process="scheduler-frozen")
    slow = _SlowDelete(services.storage)
    frozen = ObjectGc(frozen_engine, slow, ObjectGcConfig(grace_seconds=HOUR, decision_grace_seconds=1))
    collecting = threading.Thread(target=until_its_lock_is_lost, args=(frozen.run_once,))
    collecting.start()
    try:
        assert slow.entered.wait(30), "the frozen GC reached its first delete"
        _end_sessions(engine, "scheduler-frozen")
        after = ObjectGc(engine, services.storage, ObjectGcConfig(grace_seconds=HOUR, decision_grace_seconds=1))
        removed = []
        wait_for(lambda: removed.append(after.run_once()["removed"]) or sum(removed) == len(made), timeout=30,
                 interval=0.3, message="the next rounds finished the frozen GC's decision and removed the rest")
        replay(services, accepted.job_id, operator="olga", reason="worker lost")
        assert run(workflow, engine, accepted.job_id)[-1] == "ready"
    finally:
        slow.release.set()
        collecting.join(60)
        frozen_engine.dispose()
    assert job(engine, accepted.job_id).state == "ready"
    with engine.connect() as conn:
        published = list(conn.execute(select(variants.c.storage_key)
                                      .where(variants.c.job_id == accepted.job_id)).scalars())
    assert slow.deleting not in published, "the replayed attempt wrote the tainted key's variant under another"
    assert all(exists(storage_dir, key) for key in published), "every object of the ready job is there"
    assert workflow.verify_ready(job(engine, accepted.job_id)).status == "already_ready"  # raises EffectMissing


def test_a_gc_finishing_a_decision_taints_the_key_before_it_deletes(quiet_services, storage_dir, data_file):
    """A review of the taint: the round finishing a frozen GC's decision tainted the key after its own delete. Slow
    in that delete, it let the frozen GC thaw, delete and forget its decision, the claims go on and a replay write
    the untainted key, published ``ready``; then the finisher's delete removed it. The taint now comes first, in a
    transaction that finds the decision still standing."""
    from app.adapters.postgres.db import make_engine
    from app.core.operations import replay
    from app.core.workflow import Workflow
    from tests.driver import job, run

    services = quiet_services
    engine = services.engine
    workflow = Workflow(services)
    accepted, made = _lost_attempt(services, workflow, storage_dir, data_file)
    frozen_engine = make_engine(services.settings.database_url, process="scheduler-frozen")
    frozen_storage, finisher_storage = _SlowDelete(services.storage), _SlowDelete(services.storage)
    config = ObjectGcConfig(grace_seconds=HOUR, decision_grace_seconds=1)
    frozen = threading.Thread(target=until_its_lock_is_lost,
                              args=(ObjectGc(frozen_engine, frozen_storage, config).run_once,))
    finisher = threading.Thread(target=until_its_lock_is_lost,
                                args=(ObjectGc(engine, finisher_storage, config).run_once,))
    frozen.start()
    try:
        assert frozen_storage.entered.wait(30), "the frozen GC reached its first delete"
        _end_sessions(engine, "scheduler-frozen")

        def decision_past_its_grace() -> int:
            with engine.connect() as conn:
                return conn.execute(text("SELECT count(*) FROM object_removals "
                                         "WHERE decided_at <= now() - interval '1.2 seconds'")).scalar()

        wait_for(decision_past_its_grace, timeout=10, interval=0.2, message="the decision older than its grace")
        finisher.start()
        assert finisher_storage.entered.wait(30), "the finisher reached its delete of the same key"
        assert finisher_storage.deleting == frozen_storage.deleting
        frozen_storage.release.set()  # the frozen GC thaws: deletes, forgets its decision; the claims go on
        frozen.join(60)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM object_removals")).scalar() == 0
        replay(services, accepted.job_id, operator="olga", reason="worker lost")
        assert run(workflow, engine, accepted.job_id)[-1] == "ready"
    finally:
        frozen_storage.release.set()
        finisher_storage.release.set()
        frozen.join(60)
        if finisher.is_alive() or finisher.ident is not None:
            finisher.join(60)
        frozen_engine.dispose()
    with engine.connect() as conn:
        published = list(conn.execute(select(variants.c.storage_key)
                                      .where(variants.c.job_id == accepted.job_id)).scalars())
    assert finisher_storage.deleting not in published
    assert all(exists(storage_dir, key) for key in published), "every object of the ready job is there"
    assert workflow.verify_ready(job(engine, accepted.job_id)).status == "already_ready"


def test_a_removal_decided_by_a_gc_that_died_is_finished_by_the_next_round(services, engine, storage_dir):
    """A GC killed between its committed decision and its delete (``object_gc_before_delete``) leaves the decision;
    claims of the attachment's jobs wait on it, so a round ``decision_grace_seconds`` later removes the object as
    decided and forgets it; a round before that leaves it, even with no job of the attachment unfinished (its GC
    may still be deleting: a second GC took the decision as its own, deleted and forgot it, and a replay's render
    then lost its object to the first GC's delete, a review found)."""
    from app.core import objects
    from app.errors import RemovalUnderWay

    attachment_id, job_id, _ = seed(engine, services.storage, "failed")
    key = pipeline.variant_key(attachment_id, 1, "thumbnail", "b" * 64, "jpg")
    services.storage.put_bytes(key, b"bytes")
    age(storage_dir, key, 2 * HOUR)
    with engine.begin() as conn:
        objects.decide_removal(conn, key, str(attachment_id))
    lease = states.Lease("worker:test", 30)
    gc = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=HOUR))
    counts = gc.run_once()
    assert (counts["removed"], counts["decided_elsewhere"]) == (0, 1) and exists(storage_dir, key), \
        "a GC that lost its session may be deleting it"
    with engine.begin() as conn:  # an operator's replay
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="queued", attempt=0, error_code=None))
    with engine.begin() as conn:
        conn.execute(text("UPDATE object_removals SET decided_at = now() - interval '10 minutes'"))
    with pytest.raises(RemovalUnderWay), engine.begin() as conn:
        assert states.claim(conn, job_id, 1, lease) is not None
        objects.await_removals(conn, attachment_id)
    counts = gc.run_once()
    assert counts["removed"] == 1 and not exists(storage_dir, key)
    with engine.begin() as conn:
        assert states.claim(conn, job_id, 1, lease) is not None, "the claim rolled back, and now goes through"
        objects.await_removals(conn, attachment_id)
        assert not conn.execute(text("SELECT count(*) FROM object_removals")).scalar()


# --- objects the store will not delete ------------------------------------------------


@contextlib.contextmanager
def immutable(*paths):
    """``chattr +i`` on ``paths``: not even root may unlink them. Yields ``lift()``, which makes them deletable
    again; lifted however the test ends."""
    names = [str(path) for path in paths]
    made = subprocess.run(["chattr", "+i", *names], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is needed (root, a filesystem with the attribute): {made.stderr.decode().strip()}")

    def lift():
        subprocess.run(["chattr", "-i", *names], check=True, capture_output=True)

    try:
        yield lift
    finally:
        subprocess.run(["chattr", "-i", *names], capture_output=True)


def _messages(caplog, logger: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == logger]


def _before(messages: list[str], first: str, then: str) -> bool:
    """Whether a message containing ``first`` was logged before one containing ``then``."""
    at = {text: next(i for i, message in enumerate(messages) if text in message) for text in (first, then)}
    return at[first] < at[then]


def _staging_decisions(engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT key FROM staging_removals")).scalars())


def test_a_staged_object_the_store_will_not_delete_holds_up_nothing_else(services, engine, storage_dir, caplog):
    """An adversarial run: one staged orphan made immutable (``chattr +i``) among 30 kept all 30 round after round,
    and an expired resumable upload's row and part were never removed: the first refused delete raised out of the
    round, before the other objects and before ``forget_expired`` and the parts sweep. Now the refused object is
    counted (``not_removed``), keeps its decision, and is tried again by every round after the others."""
    orphans = [f"staging/{uuid.uuid4()}" for _ in range(6)]
    for key in orphans:
        services.storage.put_bytes(key, b"orphan")
        age(storage_dir, key, 2 * HOUR)
    stuck = orphans[0]
    expired = uuid.uuid4()
    expired_part, orphan_part = resumable.part_key(expired, 0, "t"), resumable.part_key(uuid.uuid4(), 0, "u")
    with engine.begin() as conn:
        conn.execute(insert(uploads).values(id=expired, owner="t", upload_length=10, upload_offset=5, filename="a.jpg",
                                            expires_at=func.now() - text("interval '1 hour'")))
        conn.execute(insert(upload_parts).values(upload_id=expired, offset=0, token="t"))
    for key in (expired_part, orphan_part):
        services.storage.put_bytes(key, b"12345")
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=HOUR))
    with immutable(storage_dir / stuck) as lift:
        counts = cleanup.run_once()  # before: StorageUnavailable (EPERM), and whatever came after it stayed
        assert (counts["removed"], counts["not_removed"]) == (5, 1), counts
        assert [key for key in orphans if exists(storage_dir, key)] == [stuck]
        assert (counts["uploads_expired"], counts["parts_removed"]) == (1, 1), "the later phases ran"
        assert not exists(storage_dir, expired_part) and not exists(storage_dir, orphan_part)
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(uploads)).scalar() == 0
        assert _staging_decisions(engine) == [stuck], "its decision stands: no upload may take those bytes"

        newcomer = f"staging/{uuid.uuid4()}"
        services.storage.put_bytes(newcomer, b"orphan")
        age(storage_dir, newcomer, 2 * HOUR)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="attache.scheduler.staging"):
            counts = cleanup.run_once()
        assert (counts["removed"], counts["not_removed"]) == (1, 1), counts
        assert not exists(storage_dir, newcomer) and exists(storage_dir, stuck)
        messages = _messages(caplog, "attache.scheduler.staging")
        assert _before(messages, f"removed staged object {newcomer}", f"could not remove {stuck}"), \
            "the object refused last round is tried after the others"

        lift()  # the operator's fix
        counts = cleanup.run_once()
    assert (counts["removed"], counts["not_removed"]) == (1, 0), counts
    assert not exists(storage_dir, stuck) and _staging_decisions(engine) == []


def test_an_object_the_store_will_not_delete_holds_up_nothing_else(services, engine, storage_dir, caplog):
    """An adversarial run: one orphan object made immutable (``chattr +i``) among 30 kept all 30, and a ``.tmp-``
    leftover, round after round: its delete raised out of the round, and once its decision was a grace old
    (``ATTACHE_OBJECT_DECISION_GRACE_SECONDS``) every round began with it. Now it is counted (``not_removed``, the
    round recorded ``failed``), its decision stands, and every later round tries it after its other work."""
    orphans = [pipeline.variant_key(uuid.uuid4(), 1, "thumbnail", f"{n:064x}", "jpg") for n in range(5)]
    for key in orphans:
        services.storage.put_bytes(key, b"bytes")
        age(storage_dir, key, 2 * HOUR)
    stuck = orphans[0]
    leftover = storage_dir / stuck.rpartition("/")[0] / ".tmp-cut"  # a write cut short
    leftover.write_bytes(b"half an object")
    os.utime(leftover, (time.time() - 2 * HOUR,) * 2)
    gc = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=HOUR, decision_grace_seconds=0))
    with immutable(storage_dir / stuck) as lift:
        counts = gc.run_once()  # before: StorageUnavailable (EPERM), and whatever came after it stayed
        assert (counts["removed"], counts["not_removed"]) == (4, 1), counts
        assert [key for key in orphans if exists(storage_dir, key)] == [stuck]
        assert counts["abandoned_writes"] == 1 and not leftover.exists(), "the leftovers were swept"
        assert _decisions(engine) == 1, "its decision stands: the claims of its attachment wait"

        newcomer = pipeline.variant_key(uuid.uuid4(), 1, "thumbnail", "f" * 64, "jpg")
        services.storage.put_bytes(newcomer, b"bytes")
        age(storage_dir, newcomer, 2 * HOUR)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="attache.scheduler.objects"):
            guarded(gc, 300.0, SweeperRuns(engine))()  # as the scheduler runs it, recorded
        assert not exists(storage_dir, newcomer) and exists(storage_dir, stuck)
        messages = _messages(caplog, "attache.scheduler.objects")
        assert _before(messages, f"removed unreferenced object {newcomer}", f"could not remove {stuck}"), \
            "the decision refused last round is finished after the others"
        with engine.connect() as conn:
            runs = conn.execute(text("SELECT runs_ok, runs_failed FROM sweeper_runs WHERE service = :s"),
                                {"s": "object_gc"}).one()
            items = dict(conn.execute(text("SELECT action, total FROM sweeper_items WHERE service = :s"),
                                      {"s": "object_gc"}).all())
        assert tuple(runs) == (0, 1), "a round that left an object it should have removed failed"
        assert (items["removed"], items["not_removed"]) == (1, 1), items

        lift()  # the operator's fix
        counts = gc.run_once()
    assert (counts["removed"], counts["not_removed"]) == (1, 0), counts
    assert not exists(storage_dir, stuck) and _decisions(engine) == 0


@pytest.mark.parametrize("cleanup", ["staging_cleanup", "object_gc"])
def test_a_store_that_is_down_ends_the_round_at_its_first_refused_delete(services, engine, storage_dir, monkeypatch,
                                                                        cleanup):
    """The other side of going on past a refused delete: a whole store refusing (a read-only filesystem, EROFS;
    its probe write refused too) ends the round at once, as before, rather than sending every delete to it."""
    from app.adapters.storage.filesystem import FilesystemStorage
    from app.errors import StorageUnavailable

    prefix = "staging/" if cleanup == "staging_cleanup" else "attachments/"
    keys = [f"staging/{uuid.uuid4()}" if cleanup == "staging_cleanup"
            else pipeline.variant_key(uuid.uuid4(), 1, "thumbnail", f"{n:064x}", "jpg") for n in range(3)]
    for key in keys:
        services.storage.put_bytes(key, b"bytes")
        age(storage_dir, key, 2 * HOUR)
    deletes = []
    delete = FilesystemStorage.delete
    monkeypatch.setattr(FilesystemStorage, "delete", lambda self, key: (deletes.append(key), delete(self, key))[1])
    with read_only_view(storage_dir) as view:
        store = FilesystemStorage(view)
        service = (StagingCleanup(engine, store, StagingCleanupConfig(grace_seconds=HOUR))
                   if cleanup == "staging_cleanup" else ObjectGc(engine, store, ObjectGcConfig(grace_seconds=HOUR)))
        with pytest.raises(StorageUnavailable):
            service.run_once()
    assert len(deletes) == 1 and deletes[0].startswith(prefix), deletes
    assert all(exists(storage_dir, key) for key in keys)


def test_an_expired_upload_whose_part_the_store_will_not_delete_keeps_no_other_from_being_forgotten(
        services, engine, storage_dir):
    """A re-attack: the oldest of four expired uploads had an immutable part (``chattr +i``), and the first refused
    delete rolled back the whole batch: every round forgot none of them (``not_removed`` 1, all four rows and the
    other three's parts kept). Now that upload alone is passed over, and forgotten once its part can go."""
    made = []
    with engine.begin() as conn:
        for hours in (4, 3, 2, 1):  # the oldest first in the round
            upload_id = uuid.uuid4()
            conn.execute(insert(uploads).values(id=upload_id, owner="t", upload_length=10, upload_offset=5,
                                                filename="a.jpg",
                                                expires_at=func.now() - text(f"interval '{hours} hours'")))
            conn.execute(insert(upload_parts).values(upload_id=upload_id, offset=0, token="t"))
            made.append((upload_id, resumable.part_key(upload_id, 0, "t")))
    for _, key in made:
        services.storage.put_bytes(key, b"12345")
    (stuck, stuck_part), others = made[0], made[1:]
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=HOUR))

    def left() -> set:
        with engine.connect() as conn:
            return set(conn.execute(select(uploads.c.id)).scalars())

    with immutable(storage_dir / stuck_part) as lift:
        counts = cleanup.run_once()
        assert (counts["uploads_expired"], counts["not_removed"]) == (3, 1), counts
        assert left() == {stuck} and exists(storage_dir, stuck_part)
        assert not any(exists(storage_dir, key) for _, key in others)
        lift()
        counts = cleanup.run_once()
    assert (counts["uploads_expired"], counts["not_removed"]) == (1, 0), counts
    assert left() == set() and not exists(storage_dir, stuck_part)
