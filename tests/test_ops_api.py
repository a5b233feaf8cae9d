"""/v1/ops: job history and audited replay, driven through the real app and pipeline steps."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from app.adapters.postgres.models import audit_log, variants
from app.core.workflow import Workflow
from app.web import create_app
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
    app.extensions["attache"].close()


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
    # a reason sent as a form was dropped: refused for having none, where the body is what is wrong
    sent_as_form = ops.post(path, data={"reason": "decoder upgraded"})
    assert sent_as_form.status_code == 400 and "JSON object" in sent_as_form.json["message"], sent_as_form.json
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


def test_a_job_whose_original_is_gone_is_refused_a_replay(app, engine, storage_dir, failed_job):
    """Once a failed job's retention passed, the staging cleanup removed its staged original; its replay was
    accepted and audited, and failed ``staging_missing`` at once, again each time it was replayed (an adversarial
    run). A replay now looks where the job would read the original; an object the cleanup decided to remove counts
    as gone."""
    from sqlalchemy import insert

    from app.adapters.postgres.models import attachments, staging_removals

    ops = authed(app, OPERATOR_TOKEN)
    path = f"/v1/ops/jobs/{failed_job['job_id']}/replay"
    with engine.connect() as conn:
        key = conn.execute(select(attachments.c.staging_key)).scalar_one()
    with engine.begin() as conn:
        conn.execute(insert(staging_removals).values(key=key))  # decided, not yet deleted
    decided = ops.post(path, json={"reason": "decoder upgraded"})
    assert decided.status_code == 409 and "original is gone" in decided.json["message"], decided.json
    with engine.begin() as conn:
        conn.execute(staging_removals.delete())
    (storage_dir / key).unlink()  # deleted
    gone = ops.post(path, json={"reason": "decoder upgraded"})
    assert gone.status_code == 409 and "original is gone" in gone.json["message"], gone.json
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(audit_log)).scalar() == 0
    assert ops.get(f"/v1/ops/jobs/{failed_job['job_id']}").json["state"] == "failed"


def test_a_replay_without_room_on_the_storage_is_503_and_changes_nothing(env, engine, data_file):
    """Replays were never asked for room: 32 of them took the room counted for six uploads accepted beside them,
    and all six failed ``storage_unavailable`` (a re-attack). A replay is refused where the storage's disk has no
    room for what the job will write beside the work not yet done: ``503``, retry later, no audit row."""
    from app.config import Settings
    from tests.filesystems import fill, small_filesystem

    with small_filesystem(32 << 20) as disk:
        app = create_app(Settings.from_env({**env, "STORAGE_URL": f"file://{disk}",
                                            "ATTACHE_SPOOL_MIN_FREE_BYTES": str(4 << 20),
                                            "ATTACHE_RETRY_INITIAL_SECONDS": "0",
                                            "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                            "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
        try:
            with open(data_file("pillow/truncated_jpeg.jpg"), "rb") as fh:
                accepted = authed(app).post("/v1/attachments", data={"file": (fh, "t.jpg")},
                                            content_type="multipart/form-data").json
            run(Workflow(app.extensions["attache"]), engine, accepted["job_id"])
            fill(disk / "filler")
            ops = authed(app, OPERATOR_TOKEN)
            path = f"/v1/ops/jobs/{accepted['job_id']}/replay"
            refused = ops.post(path, json={"reason": "decoder upgraded"})
            assert refused.status_code == 503 and refused.json["error"] == "storage_unavailable", refused.json
            assert "no room" in refused.json["message"] and refused.headers["Retry-After"]
            assert ops.get(f"/v1/ops/jobs/{accepted['job_id']}").json["state"] == "failed"
            with engine.connect() as conn:
                assert conn.execute(select(func.count()).select_from(audit_log)).scalar() == 0
            (disk / "filler").unlink()
            assert ops.post(path, json={"reason": "decoder upgraded"}).status_code == 200
        finally:
            app.extensions["attache"].close()


def test_ops_answers_are_byte_for_byte_what_the_operations_return(app, failed_job):
    """The answer models (app/web/schemas.py) change no byte of what app.core.operations returns."""
    from flask import jsonify

    from app.core import operations

    ops = authed(app, OPERATOR_TOKEN)
    replayed = ops.post(f"/v1/ops/jobs/{failed_job['job_id']}/replay", json={"reason": "decoder upgraded"})
    assert replayed.status_code == 200
    services = app.extensions["attache"]
    job = ops.get(f"/v1/ops/jobs/{failed_job['job_id']}")
    listed = ops.get("/v1/ops/jobs")
    leases = ops.get("/v1/ops/leases")
    with app.app_context():
        shown = operations.show_job(services, failed_job["job_id"])
        assert shown["history"] and shown["audit"] and shown["audit"][-1]["details"]
        assert job.data == replayed.data == jsonify(shown).data
        assert listed.data == jsonify(operations.find_jobs(services.engine, operations.JobFilter())).data
        assert leases.data == jsonify(operations.lease_status(services)).data


# --- dead letters (real RabbitMQ vhost) ---------------------------------------------


@pytest.fixture
def broker_app(env):
    from app.config import Settings

    app = create_app(Settings.from_env(env))
    yield app
    app.extensions["attache"].close()


def test_dlq_requeue_and_purge_take_the_chosen_ids_or_a_confirmed_count(broker_app, services, broker_url, engine):
    from tests.test_dlq import XQ, dead_letter_three, depth

    ids = dead_letter_three(services, broker_url)
    ops = authed(broker_app, OPERATOR_TOKEN)
    listed = ops.get(f"/v1/ops/dlq/{XQ}/messages?limit=2").json
    assert listed["depth"] == 3 and [m["message_id"] for m in listed["messages"]] == ids[:2]

    for action in ("requeue", "purge"):
        for body in (None, {}, {"reason": "all?"}, {"message_ids": []}, {"message_ids": "x"}, {"message_ids": [1]},
                     {"message_ids": [""]}, {"all": True}, {"all": True, "expected": 0},
                     {"all": True, "expected": "3"}, {"all": "yes", "expected": 3}, {"expected": 3},
                     {"all": True, "expected": 3, "message_ids": [ids[0]]}, ["x"]):
            response = ops.post(f"/v1/ops/dlq/{XQ}/{action}", json=body)
            assert response.status_code == 400, (action, body, response.json)
            assert response.json["error"] == "bad_request"
        # a re-attack: a field the action does not take (a purge "dry_run" purged), and a field given twice
        for data in (json.dumps({"message_ids": [ids[0]], "dry_run": True}),
                     '{"all": false, "all": true, "expected": 3}'):
            response = ops.post(f"/v1/ops/dlq/{XQ}/{action}", data=data, content_type="application/json")
            assert response.status_code == 400, (action, data, response.json)
    assert depth(broker_url, XQ) == 3

    [late] = dead_letter_three(services, broker_url, count=1)  # arrives after the operator counted 3
    refused = ops.post(f"/v1/ops/dlq/{XQ}/purge", json={"all": True, "expected": 3, "reason": "junk"})
    assert refused.status_code == 409 and refused.json["error"] == "more_than_expected"
    assert "holds 4 message(s)" in refused.json["message"]
    assert depth(broker_url, XQ) == 4

    purged = ops.post(f"/v1/ops/dlq/{XQ}/purge", json={"message_ids": ids[:2], "reason": "junk"})
    assert purged.status_code == 200 and purged.json == {"purged": 2, "message_ids": ids[:2], "not_found": []}
    requeued = ops.post("/v1/ops/dlq/attache.inspect/requeue", json={"message_ids": [ids[2], ids[0]]})
    assert requeued.json == {"requeued": 1, "message_ids": [ids[2]], "not_found": [ids[0]]}
    assert [m["message_id"] for m in ops.get(f"/v1/ops/dlq/{XQ}/messages").json["messages"]] == [late]
    assert depth(broker_url, "attache.inspect") == 1

    with engine.connect() as conn:
        rows = conn.execute(select(audit_log).order_by(audit_log.c.id)).all()
    assert [(r.actor, r.action, r.details["status"], r.details.get("message_ids")) for r in rows] == [
        ("operator:olga", "dlq.purge", "completed", ids[:2]),
        ("operator:olga", "dlq.requeue", "completed", [ids[2], ids[0]])]


def _failed_through(env, engine, data_file, proxy_port):
    """An app whose database connections go through the proxy on ``proxy_port``, and a job of it ``failed``."""
    from sqlalchemy.engine import make_url

    from app.config import Settings

    url = make_url(env["DATABASE_URL"]).set(port=proxy_port).render_as_string(hide_password=False)
    app = create_app(Settings.from_env({**env, "DATABASE_URL": url, "ATTACHE_RETRY_INITIAL_SECONDS": "0",
                                        "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                        "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
    with open(data_file("pillow/truncated_jpeg.jpg"), "rb") as fh:
        accepted = authed(app).post("/v1/attachments", data={"file": (fh, "t.jpg")},
                                    content_type="multipart/form-data").json
    run(Workflow(app.extensions["attache"]), engine, accepted["job_id"])
    return app, accepted["job_id"]


def test_a_replay_made_while_postgresql_goes_away_says_it_was_made(env, engine, data_file, monkeypatch):
    """A replay that committed was read back in a transaction of its own, and PostgreSQL cut for 0.7 s there made it
    ``503 database_unavailable``, "retry later" (an adversarial run: 8 of 30). It reads its job back while
    PostgreSQL comes back."""
    import threading

    from tests.tcp import Listener

    upstream = (engine.url.host, engine.url.port or 5432)
    proxy = [Listener(upstream)]
    app, job_id = _failed_through(env, engine, data_file, proxy[0].port)
    services = app.extensions["attache"]
    publish = type(services.unit_of_work)._publish
    back = threading.Timer(2.0, lambda: proxy.append(Listener(upstream, port=proxy[0].port)))

    def cut_after_commit(self, rows):  # as the replay reads its job back
        published = publish(self, rows)
        proxy[0].cut()  # every connection cut, new ones refused, for two seconds
        back.start()
        return published

    monkeypatch.setattr(type(services.unit_of_work), "_publish", cut_after_commit)
    try:
        answered = authed(app, OPERATOR_TOKEN).post(f"/v1/ops/jobs/{job_id}/replay", json={"reason": "blip"})
    finally:
        back.join()
        app.extensions["attache"].close()
        for listener in proxy:
            listener.close()
    assert answered.status_code == 200, answered.json
    assert answered.json["state"] == "queued" and answered.json["audit"][-1]["action"] == "job.replay"


def test_a_replay_whose_commit_went_unanswered_says_it_may_have_been_made(env, engine, data_file):
    """Its answer was ``503 database_unavailable``, "retry later", whatever became of it."""
    from sqlalchemy import event

    from tests.tcp import Listener

    proxy = Listener((engine.url.host, engine.url.port or 5432))
    app, job_id = _failed_through(env, engine, data_file, proxy.port)
    audited = []
    engine_through = app.extensions["attache"].engine
    event.listen(engine_through, "after_cursor_execute",
                 lambda conn, cursor, statement, *args: audited.append(1) if "INSERT INTO audit_log" in statement
                 else None)
    event.listen(engine_through, "commit", lambda conn: proxy.cut() if audited else None)  # the replay's COMMIT
    try:
        answered = authed(app, OPERATOR_TOKEN).post(f"/v1/ops/jobs/{job_id}/replay", json={"reason": "blip"})
    finally:
        app.extensions["attache"].close()
        proxy.close()
    assert answered.status_code == 503 and answered.json["error"] == "outcome_unknown", answered.json
    assert "may have been made; look at the job before replaying it again" in answered.json["message"]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(audit_log)).scalar() == 0, "it did not land, here"
