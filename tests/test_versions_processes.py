"""Pipeline versions with real web, worker and scheduler processes.

The in-process tests (tests/test_pipeline_versions.py) force each order
exactly; here real workers race v1 and v2 attempts of one attachment, and
whatever order they take, the newest ready version is served and nothing
is made twice.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from app.adapters.postgres.models import jobs, variants
from app.core import states
from app.observability.tracing import new_traceparent
from tests.conftest import OPERATOR_TOKEN
from tests.processes import Deployment, wait_for

pytestmark = pytest.mark.processes


@pytest.fixture
def deployment(env, tmp_path):
    deployment = Deployment({**env, "ATTACHE_MAX_ATTEMPTS": "1"}, tmp_path)
    yield deployment
    deployment.stop_all()


def add_version(engine, attachment_id: str, version: int):
    """What a backfill does for one attachment (the scheduler's relay publishes the message)."""
    with engine.begin() as conn:
        job_id, _ = states.create_job(conn, attachment_id=uuid.UUID(attachment_id), pipeline_version=version,
                                      max_attempts=1, traceparent=new_traceparent(), tracestate=None, actor="test",
                                      room_bytes=0)
    return job_id


def state_of(engine, job_id):
    with engine.connect() as conn:
        return conn.execute(select(jobs.c.state, jobs.c.error_code).where(jobs.c.id == job_id)).one()


def single_effects(engine):
    with engine.connect() as conn:
        counts = conn.execute(select(func.count()).select_from(variants)
                              .group_by(variants.c.attachment_id, variants.c.pipeline_version, variants.c.variant)).scalars().all()
    return counts and set(counts) == {1}


def test_v1_and_v2_racing_in_real_workers_serve_v2(deployment, engine, data_file):
    deployment.start("web")
    deployment.start("scheduler")
    worker = deployment.start("worker", ATTACHE_FAULT="during_render")  # v1 stops mid-render
    uploaded = deployment.upload(data_file("photos/coffee.jpg")).json()
    assert worker.wait_dead(timeout=60) != 0
    v2 = add_version(engine, uploaded["id"], 2)
    deployment.start("worker", WORKER_THREADS="4")  # v1's redelivered renders and v2's race here
    wait_for(lambda: state_of(engine, v2).state == "ready", timeout=60, message="v2 ready")
    status = deployment.status(uploaded["id"])
    assert status["pipeline_version"] == 2 and "webp" in status["variants"]
    v1_job = uuid.UUID(uploaded["job_id"])
    # v1 either finished late (the redelivery came within its lease) or was declared lost; either way v2 is served
    wait_for(lambda: state_of(engine, v1_job).state in ("ready", "failed"), timeout=60, message="v1 settled")
    assert deployment.status(uploaded["id"])["pipeline_version"] == 2
    assert single_effects(engine)


def test_a_failed_v2_leaves_v1_served_until_its_replay(deployment, engine, data_file):
    deployment.start("web")
    deployment.start("scheduler")
    deployment.start("worker")
    uploaded = deployment.upload(data_file("photos/chelsea.jpg")).json()
    assert deployment.wait_state(uploaded["id"])["state"] == "ready"
    # v2 meets a worker that dies on every render: one attempt, then failed worker_lost
    deployment.processes["worker"].stop()
    v2 = add_version(engine, uploaded["id"], 2)
    deployment.start("worker", ATTACHE_FAULT="during_render")
    wait_for(lambda: state_of(engine, v2).state == "failed", timeout=60, message="v2 failed")
    assert state_of(engine, v2).error_code == "worker_lost"
    deployment.processes["worker"].stop()
    status = deployment.status(uploaded["id"])
    assert (status["pipeline_version"], status["state"]) == (1, "ready"), "a failed v2 leaves v1 served"
    assert {"pipeline_version": 2, "state": "failed"} in status["versions"]
    # the operator replays v2: it becomes ready and is served; a ready v1 cannot be replayed
    ops = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    deployment.start("worker")
    replay = deployment.session.post(f"{deployment.url}/v1/ops/jobs/{v2}/replay", json={"reason": "worker fixed"},
                                     headers=ops, timeout=10)
    assert replay.status_code == 200, replay.text
    wait_for(lambda: state_of(engine, v2).state == "ready", timeout=60, message="v2 ready after replay")
    assert deployment.status(uploaded["id"])["pipeline_version"] == 2
    v1_job = uploaded["job_id"]
    refused = deployment.session.post(f"{deployment.url}/v1/ops/jobs/{v1_job}/replay", json={"reason": "late"},
                                      headers=ops, timeout=10)
    assert refused.status_code == 409, "v1 is ready: nothing to replay, nothing regresses"
    assert deployment.status(uploaded["id"])["pipeline_version"] == 2
    assert single_effects(engine)


def test_a_v1_replay_after_v2_leaves_v2_served(deployment, engine, data_file):
    deployment.start("web")
    deployment.start("scheduler")
    worker = deployment.start("worker", ATTACHE_FAULT="during_render")
    uploaded = deployment.upload(data_file("photos/rocket.jpg")).json()
    v1_job = uuid.UUID(uploaded["job_id"])
    assert worker.wait_dead(timeout=60) != 0
    wait_for(lambda: state_of(engine, v1_job).state == "failed", timeout=60, message="v1 failed (lease expired)")
    v2 = add_version(engine, uploaded["id"], 2)
    deployment.start("worker")
    wait_for(lambda: state_of(engine, v2).state == "ready", timeout=60, message="v2 ready")
    replay = deployment.session.post(f"{deployment.url}/v1/ops/jobs/{v1_job}/replay", json={"reason": "late v1"},
                                     headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=10)
    assert replay.status_code == 200, replay.text
    wait_for(lambda: state_of(engine, v1_job).state == "ready", timeout=60, message="replayed v1 ready")
    status = deployment.status(uploaded["id"])
    assert status["pipeline_version"] == 2 and "webp" in status["variants"], "the late v1 changes nothing served"
    assert single_effects(engine)
