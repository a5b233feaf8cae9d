"""/v1/ops: job history and audited replay, driven through the real app and pipeline steps."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.models import audit_log, variants
from app.web import create_app
from app.workflow import Workflow
from tests.conftest import OPERATOR_TOKEN, authed
from tests.driver import run


@pytest.fixture
def app(env):
    from app.config import Settings

    # no broker: the test delivers the outbox messages to the steps itself
    app = create_app(Settings.from_env({**env, "ATTACHE_RETRY_INITIAL_SECONDS": "0",
                                        "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                        "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
    yield app
    app.extensions["attache"].engine.dispose()


@pytest.fixture
def failed_job(app, engine, data_file):
    """A corrupt upload processed to ``failed`` (its original already rendered)."""
    with open(data_file("pillow/truncated_jpeg.jpg"), "rb") as fh:
        response = authed(app).post("/v1/attachments", data={"file": (fh, "t.jpg")}, content_type="multipart/form-data")
    assert response.status_code == 202
    run(Workflow(app.extensions["attache"]), engine, response.json["job_id"])
    return response.json


def test_jobs_are_listed_by_state_and_shown_with_history(app, failed_job):
    ops = authed(app, OPERATOR_TOKEN)
    listed = ops.get("/v1/ops/jobs?state=failed&pipeline_version=1").json["jobs"]
    assert [j["job_id"] for j in listed] == [failed_job["job_id"]]
    assert ops.get("/v1/ops/jobs?state=ready").json["jobs"] == []
    assert ops.get("/v1/ops/jobs?state=nonsense").status_code == 400
    job = ops.get(f"/v1/ops/jobs/{failed_job['job_id']}").json
    assert job["state"] == "failed" and job["error_code"] == "corrupt_image"
    assert [(h["from"], h["to"]) for h in job["history"]] == [(None, "queued"), ("queued", "processing"),
                                                              ("processing", "failed")]
    assert job["history"][-1]["error_code"] == "corrupt_image" and job["history"][-1]["who"].startswith("worker:")
    assert job["trace"]["traceparent"].startswith("00-")
    assert ops.get("/v1/ops/jobs/00000000-0000-4000-8000-000000000000").status_code == 404


def test_replay_needs_a_reason_is_audited_and_gets_a_fresh_budget(app, engine, failed_job):
    ops = authed(app, OPERATOR_TOKEN)
    path = f"/v1/ops/jobs/{failed_job['job_id']}/replay"
    assert ops.post(path, json={}).status_code == 400
    assert ops.post(path, json={"reason": "   "}).status_code == 400
    response = ops.post(path, json={"reason": "decoder upgraded"})
    assert response.status_code == 200, response.json
    job = response.json
    assert job["state"] == "queued" and job["max_attempts"] == job["attempt"] + 5
    replayed = job["history"][-1]
    assert (replayed["from"], replayed["to"], replayed["who"], replayed["reason"]) == \
        ("failed", "queued", "operator:olga", "decoder upgraded")
    assert job["audit"][-1]["actor"] == "operator:olga" and job["audit"][-1]["reason"] == "decoder upgraded"
    assert ops.post(path, json={"reason": "again"}).status_code == 409, "only a failed job can be replayed"
    # the replayed attempt runs; what was recorded before stays single
    run(Workflow(app.extensions["attache"]), engine, failed_job["job_id"])
    with engine.connect() as conn:
        per_key = conn.execute(select(variants.c.variant, func.count()).group_by(variants.c.variant)).all()
        audits = conn.execute(select(func.count()).select_from(audit_log)).scalar()
    assert all(count == 1 for _, count in per_key)
    assert audits == 1
    job = ops.get(f"/v1/ops/jobs/{failed_job['job_id']}").json
    assert job["state"] == "failed" and job["attempt"] == 2
