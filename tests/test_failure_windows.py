"""The contract's five failure windows, proven by killing real processes.

Each test starts the Procfile's real ``web``/``worker``/``scheduler``
processes, arms one fault point (the process SIGKILLs its own process group
there), restarts what died without the fault, and checks the invariants:

* every upload that got 202 ends ``ready``;
* exactly one effect per ``(attachment_id, pipeline_version, variant)``,
  and each effect's object exists with its recorded size and sha256;
* nothing that got no 202 becomes visible;
* ``ready`` is never left (history ends in ``ready`` with no later entry).
"""

from __future__ import annotations

import hashlib
import uuid

import pytest
import requests
from sqlalchemy import func, select

from app.adapters.postgres.models import (
    attachments,
    job_history,
    jobs,
    outbox,
    variants,
)
from app.core import pipeline
from tests.conftest import BROKER_KINDS
from tests.processes import Deployment, wait_for

#: every window, against both brokers
pytestmark = [pytest.mark.processes, pytest.mark.parametrize("broker_kind", BROKER_KINDS)]

PHOTO = "photos/chelsea.jpg"


@pytest.fixture
def deployment(env, tmp_path):
    deployment = Deployment(env, tmp_path)
    yield deployment
    deployment.stop_all()


def assert_invariants(engine, storage_dir, accepted_ids: list[str]):
    """The contract's invariants over the whole database and store."""
    with engine.connect() as conn:
        all_jobs = conn.execute(select(jobs)).all()
        assert sorted(str(j.attachment_id) for j in all_jobs) == sorted(accepted_ids)
        for job in all_jobs:
            assert job.state == "ready", (job.state, job.error_code, job.error_reason)
            effects = conn.execute(select(variants).where(variants.c.attachment_id == job.attachment_id)).all()
            names = [e.variant for e in effects]
            assert sorted(names) == sorted(pipeline.get(1).variants), names
            for effect in effects:
                assert effect.published_at is not None
                data = (storage_dir / effect.storage_key).read_bytes()
                assert len(data) == effect.size and hashlib.sha256(data).hexdigest() == effect.sha256
            transitions = conn.execute(select(job_history.c.to_state).where(job_history.c.job_id == job.id)
                                       .order_by(job_history.c.id)).scalars().all()
            assert transitions[-1] == "ready" and transitions.count("ready") == 1, transitions
            staging = conn.execute(select(attachments.c.staging_key).where(attachments.c.id == job.attachment_id)).scalar()
            wait_for(lambda: not (storage_dir / staging).exists(), timeout=20, message="staging removed after publish")
        duplicates = conn.execute(
            select(variants.c.attachment_id, variants.c.pipeline_version, variants.c.variant, func.count())
            .group_by(variants.c.attachment_id, variants.c.pipeline_version, variants.c.variant)
            .having(func.count() > 1)).all()
        assert duplicates == []


def test_window_1_after_staging_before_job_row(deployment, engine, storage_dir, data_file):
    deployment.start("worker")
    deployment.start("scheduler")
    web = deployment.start("web", ATTACHE_FAULT="after_staging")
    with pytest.raises(requests.ConnectionError):
        deployment.upload(data_file(PHOTO))
    assert web.wait_dead() != 0
    deployment.start("web")
    # no answer, no row: nothing is visible, and the staged bytes are an orphan for the cleanup
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(attachments)).scalar() == 0
    assert [p.parent.name for p in storage_dir.rglob("*") if p.is_file()] == ["staging"]
    # the orphan is the staging cleanup's: after its grace period it goes, and nothing else does
    from app.config import Settings
    from app.services import Services
    from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig

    services = Services(Settings.from_env(deployment.env))
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=0))
    assert cleanup.run_once()["removed"] == 1
    services.engine.dispose()
    assert not any(p.is_file() for p in storage_dir.rglob("*"))
    # the service keeps working
    response = deployment.upload(data_file(PHOTO))
    assert response.status_code == 202
    deployment.wait_state(response.json()["id"])
    assert_invariants(engine, storage_dir, [response.json()["id"]])


@pytest.mark.parametrize("fault", ["after_commit", "after_publish"])
def test_windows_2_and_3_commit_survives_a_dead_producer(deployment, engine, storage_dir, data_file, fault):
    deployment.start("worker")
    web = deployment.start("web", ATTACHE_FAULT=fault)
    try:
        answer = deployment.upload(data_file(PHOTO)).status_code
    except requests.ConnectionError:
        answer = None
    if fault == "after_commit":
        assert answer is None, "window 2 lies before the answer"
    else:  # the web publishes behind the answer (app.core.background_publisher): the 202 may leave first
        assert answer in (None, 202)
    assert web.wait_dead() != 0
    with engine.connect() as conn:  # the web's row: the first (the worker may have taken its message already,
        # through the PostgreSQL broker, and written the next steps' rows: a full run saw two)
        row = conn.execute(select(outbox).order_by(outbox.c.id).limit(1)).one()
        attachment_id = str(conn.execute(select(attachments.c.id)).scalar_one())
    assert row.published_at is None, "the producer died before any confirm"
    # the scheduler publishes the unmarked row; a duplicate (window 3) is harmless
    deployment.start("scheduler")
    deployment.start("web")
    status = deployment.wait_state(attachment_id)
    assert status["state"] == "ready"
    assert_invariants(engine, storage_dir, [attachment_id])

    def relayed():
        with engine.connect() as conn:
            return conn.execute(select(outbox.c.published_at).where(outbox.c.id == row.id)).scalar()

    wait_for(relayed, timeout=20, message="the scheduler to publish and mark the abandoned row")


@pytest.mark.parametrize("fault", [  # window 5 on this path (7-15 s) in make soak: make test proves it on the default
    "after_object_write", pytest.param("after_result_commit", marks=pytest.mark.long)])  # path (inspect makes all)
def test_windows_4_and_5_worker_dies_around_the_result(deployment, engine, storage_dir, data_file, fault):
    deployment.start("web")
    deployment.start("scheduler")
    worker = deployment.start("worker", ATTACHE_FAULT=fault)
    response = deployment.upload(data_file(PHOTO))
    assert response.status_code == 202
    attachment_id = response.json()["id"]
    assert worker.wait_dead(timeout=60) != 0
    with engine.connect() as conn:
        state = conn.execute(select(jobs.c.state)).scalar_one()
    assert state == ("processing" if fault == "after_object_write" else "ready")
    deployment.start("worker")
    status = deployment.wait_state(attachment_id)
    assert status["state"] == "ready"
    assert_invariants(engine, storage_dir, [attachment_id])
    with engine.connect() as conn:
        job = conn.execute(select(jobs)).one()
    if fault == "after_result_commit":
        assert job.attempt == 1, "a redelivery of finished work is not a new attempt"


@pytest.mark.parametrize("fault", ["after_object_write", "after_result_commit"])
def test_windows_4_and_5_when_inspect_makes_and_publishes_the_variants(env, tmp_path, engine, storage_dir, data_file,
                                                                       fault):
    """The same windows in the inspect step of an image made in one step: every object written and none of its
    rows committed; or the job ready, and the worker dead before it removed staging.

    The scheduler starts once the worker is dead: its staging cleanup, on its first run, rightly removes the
    staging of a ready job, and a scheduler slow to start (CI) ran it after the ready commit."""
    deployment = Deployment({**env, "ATTACHE_ONE_STEP_MAX_PIXELS": str(1024 * 1024)}, tmp_path)
    try:
        deployment.start("web")
        worker = deployment.start("worker", ATTACHE_FAULT=fault)
        attachment_id = deployment.upload(data_file(PHOTO)).json()["id"]
        assert worker.wait_dead(timeout=60) != 0
        with engine.connect() as conn:
            recorded = conn.execute(select(func.count()).select_from(variants)).scalar()
            state = conn.execute(select(jobs.c.state)).scalar_one()
        staging = storage_dir / pipeline.staging_key(uuid.UUID(attachment_id))
        if fault == "after_object_write":
            assert (recorded, state) == (0, "processing")
            written = [p for p in (storage_dir / "attachments").rglob("*") if p.is_file()]
            assert len(written) == len(pipeline.get(1).variants), "every object written before the worker died"
        else:
            assert (recorded, state) == (len(pipeline.get(1).variants), "ready")
            assert staging.exists(), "the worker died before it removed staging"
        deployment.start("scheduler")
        deployment.start("worker")
        assert deployment.wait_state(attachment_id)["state"] == "ready"
        wait_for(lambda: not staging.exists(), timeout=30, message="the redelivered inspect to verify, then clean")
        assert_invariants(engine, storage_dir, [attachment_id])
        if fault == "after_result_commit":
            with engine.connect() as conn:
                assert conn.execute(select(jobs.c.attempt)).scalar_one() == 1, "no new attempt for finished work"
    finally:
        deployment.stop_all()


def test_an_ambiguous_commit_keeps_staging_and_the_upload_ends_ready(deployment, engine, storage_dir, data_file):
    """The COMMIT reached the server but the web saw an error: the rows may exist, so the bytes must stay."""
    web = deployment.start("web", ATTACHE_FAULT="during_commit")
    key = {"Idempotency-Key": "ambiguous-commit-1"}
    first = deployment.upload(data_file(PHOTO), headers=key)
    assert "during_commit" in web.output(), "the fault point fired"
    with engine.connect() as conn:
        attachment = conn.execute(select(attachments)).one()  # the server did commit
    assert (storage_dir / attachment.staging_key).exists(), "the staged original of a committed upload was removed"
    assert first.status_code == 202, first.text  # the web found its rows: the handoff is durable
    assert first.json()["id"] == str(attachment.id)
    retry = deployment.upload(data_file(PHOTO), headers=key)
    assert retry.status_code == 202 and retry.json()["id"] == str(attachment.id)
    # the staging cleanup looks at the database first: a queued job keeps its staging whatever its age
    from app.config import Settings
    from app.services import Services
    from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig

    services = Services(Settings.from_env(deployment.env))
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=0))
    assert cleanup.run_once()["removed"] == 0
    services.engine.dispose()
    assert (storage_dir / attachment.staging_key).exists()
    deployment.start("worker")
    deployment.start("scheduler")
    assert deployment.wait_state(str(attachment.id))["state"] == "ready"
    assert_invariants(engine, storage_dir, [str(attachment.id)])
