"""The migrations create exactly the schema app/adapters/postgres/models.py describes, and re-running them is harmless."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from app.adapters.postgres import db
from app.adapters.postgres.models import metadata

#: an attachment row of any schema since 0001 (``:id``, ``:owner``), for tests that write rows below a migration
ADD_ATTACHMENT = text("INSERT INTO attachments (id, owner, filename, content_type, format, size, sha256, width, "
                      "height, staging_key) VALUES (:id, :owner, 'a.jpg', 'image/jpeg', 'JPEG', 1, repeat('0', 64), "
                      "1, 1, 'staging/' || :id)")
#: a queued job of that attachment (schemas from 0014 on)
ADD_JOB = text("INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, traceparent, owner) "
               "VALUES (gen_random_uuid(), '00000000-0000-4000-8000-000000000001', 1, 'queued', 3, '00-x', 'u')")


def test_models_and_migrations_agree(database_url):
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == [], diff


def head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(db.alembic_config("postgresql://unused/none")).get_current_head()


def test_upgrade_is_idempotent(database_url):
    db.upgrade(database_url)
    db.upgrade(database_url)
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head()
    engine.dispose()


def test_jobs_get_their_owner_from_0014_on_whoever_inserts_them(database_url):
    """Migration 0014 copies each attachment's owner onto its jobs; a job inserted without one (by the previous
    release, still serving while the release migrates) gets it from a trigger instead of failing the insert:
    an adversarial run of the previous web against the new schema answered every upload 503."""
    from alembic import command

    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    insert_job = text("INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, traceparent) "
                      "VALUES (gen_random_uuid(), :attachment, :version, 'queued', 3, '00-x')")
    try:
        command.downgrade(db.alembic_config(database_url), "0013")
        with engine.begin() as conn:
            for attachment, owner in (("00000000-0000-4000-8000-000000000001", "alice"),
                                      ("00000000-0000-4000-8000-000000000002", "bob")):
                conn.execute(ADD_ATTACHMENT, {"id": attachment, "owner": owner})
                conn.execute(insert_job, {"attachment": attachment, "version": 1})
        db.upgrade(database_url)
        with engine.begin() as conn:
            conn.execute(insert_job, {"attachment": "00000000-0000-4000-8000-000000000002", "version": 2})
            owners = conn.execute(text("SELECT a.owner, j.owner FROM jobs j JOIN attachments a "
                                       "ON a.id = j.attachment_id")).all()
        assert sorted(owners) == [("alice", "alice"), ("bob", "bob"), ("bob", "bob")]
    finally:
        db.upgrade(database_url)
        engine.dispose()


def test_0019_counts_the_history_written_before_it(database_url):
    """The transitions written before migration 0019 are counted by it, once; those after, by its trigger."""
    from alembic import command

    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    add_history = text("INSERT INTO job_history (job_id, from_state, to_state, attempt, actor, error_code) "
                       "SELECT id, :f, :t, 1, 'test', :e FROM jobs")
    try:
        command.downgrade(db.alembic_config(database_url), "0018")
        with engine.begin() as conn:
            conn.execute(ADD_ATTACHMENT, {"id": "00000000-0000-4000-8000-000000000001", "owner": "u"})
            conn.execute(ADD_JOB)
            conn.execute(add_history, {"f": None, "t": "queued", "e": None})
            conn.execute(add_history, {"f": "processing", "t": "queued", "e": "worker_lost"})
        db.upgrade(database_url)
        with engine.begin() as conn:
            conn.execute(add_history, {"f": "processing", "t": "queued", "e": "worker_lost"})
            counted = conn.execute(text("SELECT from_state, to_state, worker_lost, sum(n) FROM ("
                                        "SELECT from_state, to_state, worker_lost, total AS n FROM transition_counts "
                                        "UNION ALL SELECT from_state, to_state, worker_lost, rows FROM "
                                        "transition_deltas) k GROUP BY 1, 2, 3 ORDER BY 1")).all()
        assert [tuple(row) for row in counted] == [("none", "queued", False, 1), ("processing", "queued", True, 2)]
    finally:
        db.upgrade(database_url)
        engine.dispose()


def test_0026_counts_the_durations_written_after_it(database_url):
    """The runs and attempts written after migration 0026 are counted by its triggers; those before are not: counting
    them in the migration held ``job_history`` and ``step_runs`` locked for the whole scan, and every upload was
    refused for 70-78 s at 1.5 million uploads (an adversarial run)."""
    from alembic import command

    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    add_history = text("INSERT INTO job_history (job_id, at, from_state, to_state, attempt, actor) "
                       "SELECT id, created_at + make_interval(secs => :at), :f, :t, 1, 'test' FROM jobs")
    add_run = text("INSERT INTO step_runs (job_id, step, attempt, outcome, seconds) "
                   "SELECT id, :step, 1, 'ok', :seconds FROM jobs")
    counted = text("SELECT histogram, label, le, sum(n)::int, sum(s) / 1e6 FROM (SELECT histogram, label, le, "
                   "total AS n, microseconds AS s FROM duration_counts UNION ALL SELECT histogram, label, le, rows, "
                   "microseconds FROM duration_deltas) k GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
    try:
        command.downgrade(db.alembic_config(database_url), "0025")
        with engine.begin() as conn:
            conn.execute(ADD_ATTACHMENT, {"id": "00000000-0000-4000-8000-000000000001", "owner": "u"})
            conn.execute(ADD_JOB)
            conn.execute(add_history, {"at": 0, "f": None, "t": "queued"})
            conn.execute(add_history, {"at": 1, "f": "queued", "t": "processing"})
            conn.execute(add_history, {"at": 4, "f": "processing", "t": "queued"})  # an attempt of 3 s
            conn.execute(add_run, {"step": "inspect", "seconds": 0.05})
        db.upgrade(database_url)
        with engine.begin() as conn:
            conn.execute(add_history, {"at": 5, "f": "queued", "t": "processing"})
            conn.execute(add_history, {"at": 5.2, "f": "processing", "t": "ready"})  # 0.2 s; ready 5.2 s after
            conn.execute(add_run, {"step": "inspect", "seconds": 0.3})
            rows = [tuple(row) for row in conn.execute(counted)]
        assert [row[:4] for row in rows] == [("attempt", "", 0.25, 1), ("job", "", 10, 1), ("step", "inspect", 0.5, 1)]
        assert [float(row[4]) for row in rows] == [0.2, 5.2, 0.3]
    finally:
        db.upgrade(database_url)
        engine.dispose()


def test_0021_counts_the_uploads_already_waiting(database_url):
    """An upload's job not yet finished counts from the migration on; a finished one, a backfill's or a replayed one
    does not."""
    from alembic import command

    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    add_job = text("INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, traceparent, owner, "
                   "ready_at) VALUES (:job, :attachment, :version, :state, 3, '00-x', 'u', "
                   "CASE WHEN :state = 'ready' THEN now() END)")
    waiting, done, backfilled, replayed = ("00000000-0000-4000-8000-00000000000" + n for n in "1234")
    try:
        command.downgrade(db.alembic_config(database_url), "0020")
        for attachment, job, state in ((waiting, waiting, "queued"), (done, done, "ready"),
                                       (replayed, replayed, "queued")):
            with engine.begin() as conn:  # an upload's transaction: its attachment and its job
                conn.execute(ADD_ATTACHMENT, {"id": attachment, "owner": "u"})
                conn.execute(add_job, {"job": job, "attachment": attachment, "version": 1, "state": state})
        with engine.begin() as conn:  # later, a backfill's
            conn.execute(add_job, {"job": backfilled, "attachment": done, "version": 2, "state": "queued"})
            conn.execute(text("INSERT INTO job_history (job_id, from_state, to_state, attempt, actor) "
                              "VALUES (:job, 'failed', 'queued', 3, 'olga')"), {"job": replayed})  # an operator's
        db.upgrade(database_url)
        with engine.begin() as conn:
            counted = conn.execute(text("SELECT job_id::text, owner FROM pending_uploads")).all()
        assert [tuple(row) for row in counted] == [(waiting, "u")]
    finally:
        db.upgrade(database_url)
        engine.dispose()


def test_0031_counts_the_uploads_and_jobs_there_before_it(database_url):
    """An upgraded database reports the uploads and the jobs per state it reported before migration 0031 (which
    counts them, once); the rows written after it are counted by its triggers."""
    from alembic import command

    from app.adapters.postgres import row_counts

    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    add_job = text("INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, traceparent, owner, "
                   "error_code, ready_at) VALUES (gen_random_uuid(), :attachment, :version, :state, 3, '00-x', 'u', "
                   "CASE WHEN :state = 'failed' THEN 'corrupt_image' END, CASE WHEN :state = 'ready' THEN now() END)")
    attachments = [f"00000000-0000-4000-8000-00000000000{n}" for n in "123"]
    scanned = text("SELECT state, pipeline_version, count(*) FROM jobs GROUP BY 1, 2 ORDER BY 1, 2")
    try:
        command.downgrade(db.alembic_config(database_url), "0030")
        with engine.begin() as conn:
            for attachment in attachments:
                conn.execute(ADD_ATTACHMENT, {"id": attachment, "owner": "u"})
            for attachment, version, state in ((attachments[0], 1, "ready"), (attachments[0], 2, "queued"),
                                               (attachments[1], 1, "ready"), (attachments[2], 1, "failed")):
                conn.execute(add_job, {"attachment": attachment, "version": version, "state": state})
            before = [tuple(row) for row in conn.execute(scanned)]
        db.upgrade(database_url)
        with engine.begin() as conn:
            assert row_counts.uploads(conn) == 3
            assert row_counts.jobs(conn) == before == [("failed", 1, 1), ("queued", 2, 1), ("ready", 1, 2)]
            conn.execute(ADD_ATTACHMENT, {"id": "00000000-0000-4000-8000-000000000004", "owner": "u"})
            conn.execute(add_job, {"attachment": attachments[1], "version": 2, "state": "queued"})
            conn.execute(text("UPDATE jobs SET state = 'processing', lease_expires_at = now() "
                              "WHERE state = 'queued' AND attachment_id = :a"), {"a": attachments[0]})
        with engine.begin() as conn:
            assert row_counts.uploads(conn) == 4
            assert row_counts.jobs(conn) == [tuple(row) for row in conn.execute(scanned)] \
                == [("failed", 1, 1), ("processing", 2, 1), ("queued", 2, 1), ("ready", 1, 2)]
    finally:
        db.upgrade(database_url)
        engine.dispose()
