"""Redelivery, stale and poison messages against a running worker.

Messages are published straight to RabbitMQ (as a duplicate, a late
redelivery or a hostile producer would), and the effects are read back
from PostgreSQL and storage.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import pika
import pytest
from dramatiq.message import Message
from sqlalchemy import func, select

from app.adapters.postgres.models import job_history, jobs, outbox, variants
from app.core import messages
from app.core.steps import Step
from tests.conftest import authed
from tests.processes import Deployment, wait_for

pytestmark = pytest.mark.processes


@pytest.fixture
def deployment(env, tmp_path):
    deployment = Deployment(env, tmp_path)
    deployment.start("web")
    deployment.start("worker")
    deployment.start("scheduler")
    yield deployment
    deployment.stop_all()


def publish_raw(services, payload, *, actor="inspect", queue="attache.inspect"):
    """Publish a message as is, with a confirm; published again while RabbitMQ nacks it, as the outbox relay would.

    The quorum queue may have been declared a moment ago by the processes starting beside the test, and a queue
    whose Raft member is not yet running nacks a publish (seen once in CI, on this very first publish).
    """
    message = Message(queue_name=queue, actor_name=actor, args=(payload,), kwargs={}, options={})
    wait_for(lambda: services.broker.enqueue(message), timeout=15, message="RabbitMQ to confirm the publish")
    return message.message_id


def xq_depth(broker_url, queue):
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        return connection.channel().queue_declare(queue=queue, passive=True).method.message_count
    finally:
        connection.close()


def snapshot(engine, job_id):
    with engine.connect() as conn:
        job = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
        effects = conn.execute(select(variants.c.variant, variants.c.sha256, variants.c.storage_key)
                               .where(variants.c.job_id == job_id).order_by(variants.c.variant)).all()
        history = conn.execute(select(func.count()).select_from(job_history).where(job_history.c.job_id == job_id)).scalar()
    return job.state, job.attempt, job.ready_at, [tuple(e) for e in effects], history


def test_12mp_upload_becomes_ready_with_a_matching_thumbnail(deployment, data_file):
    path = data_file("photos/rocket_12mp_4241x2830.jpg")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = deployment.upload(path, headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    assert response.status_code == 202
    status = deployment.wait_state(response.json()["id"], timeout=60)
    assert status["state"] == "ready", status
    assert status["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    thumb = status["variants"]["thumbnail"]
    assert max(thumb["width"], thumb["height"]) == 256
    body = deployment.session.get(deployment.url + thumb["url"], timeout=10)
    assert body.status_code == 200 and body.headers["Content-Type"] == thumb["content_type"]
    assert hashlib.sha256(body.content).hexdigest() == thumb["sha256"] == body.headers["ETag"].strip('"')
    assert body.headers["X-Content-Type-Options"] == "nosniff"
    original = deployment.session.get(f"{deployment.url}/v1/attachments/{status['id']}/original", timeout=10)
    assert original.content == path.read_bytes()
    # the request's trace reaches the worker's JSON log lines, with the job and the attempt
    steps = [json.loads(line) for line in deployment.processes["worker"].output().splitlines()
             if line.startswith("{") and '"logger": "attache.workflow"' in line]
    mine = [entry for entry in steps if entry.get("job_id") == status["job_id"]]
    assert {entry["step"] for entry in mine} == {"inspect", "render", "publish"}
    assert all(entry["trace_id"] == trace_id and entry["attempt"] == 1 for entry in mine), mine[:2]
    web = [json.loads(line) for line in deployment.processes["web"].output().splitlines()
           if line.startswith("{") and "upload accepted" in line]
    assert web and web[-1]["trace_id"] == trace_id and web[-1]["job_id"] == status["job_id"]


def test_redelivered_and_stale_messages_change_nothing_on_a_ready_job(deployment, services, engine, storage_dir, data_file):
    response = deployment.upload(data_file("photos/chelsea.jpg"))
    attachment_id, job_id = response.json()["id"], response.json()["job_id"]
    assert deployment.wait_state(attachment_id)["state"] == "ready"
    before = snapshot(engine, job_id)
    objects_before = sorted(p for p in storage_dir.rglob("*") if p.is_file())
    with engine.connect() as conn:
        sent = [row.payload for row in conn.execute(select(outbox).where(outbox.c.job_id == job_id))]
    assert {p["step"] for p in sent} == {"inspect", "render", "publish"}
    for payload in sent:  # every message of the job, delivered again
        step = Step(payload["step"])
        publish_raw(services, payload, actor=step.actor, queue=step.queue)
    stale = dict(sent[0], attempt=7)  # an attempt that never existed
    publish_raw(services, stale)
    wait_for(lambda: services.broker.queue_depth("attache.inspect") == 0
             and services.broker.queue_depth("attache.render") == 0
             and services.broker.queue_depth("attache.publish") == 0, timeout=30, message="queues drained")
    wait_for(lambda: "already_ready" in deployment.processes["worker"].output(), timeout=10, message="verify log")
    assert snapshot(engine, job_id) == before
    assert sorted(p for p in storage_dir.rglob("*") if p.is_file()) == objects_before


def test_redelivery_to_a_ready_job_whose_version_was_retired_is_acked(deployment, services, engine, broker_url,
                                                                      data_file):
    from app.adapters.postgres.models import dead_letters, step_runs
    from app.core import states
    from app.observability.tracing import new_traceparent
    from scheduler.retirement import Retirement, RetirementConfig

    uploaded = deployment.upload(data_file("photos/chelsea.jpg")).json()
    assert deployment.wait_state(uploaded["id"])["state"] == "ready"
    with engine.begin() as conn:  # a backfill into v2 (the scheduler's relay publishes its message)
        v2_job, _ = states.create_job(conn, attachment_id=uuid.UUID(uploaded["id"]), pipeline_version=2,
                                      max_attempts=3, traceparent=new_traceparent(), tracestate=None, actor="test",
                                      room_bytes=0)
    wait_for(lambda: deployment.status(uploaded["id"])["pipeline_version"] == 2, timeout=60, message="v2 ready")
    counts = Retirement(services.engine, services.storage, RetirementConfig(grace_seconds=0)).run_once()
    assert counts["retired"] == 4 and counts["objects_removed"] == 3
    v1_job = uuid.UUID(uploaded["job_id"])
    with engine.connect() as conn:
        sent = [row.payload for row in conn.execute(select(outbox).where(outbox.c.job_id == v1_job))]
    for payload in sent:  # v1's messages again, long after its objects were retired
        step = Step(payload["step"])
        publish_raw(services, payload, actor=step.actor, queue=step.queue)

    def settled():
        with engine.connect() as conn:
            verified = conn.execute(select(func.count()).select_from(step_runs).where(
                step_runs.c.job_id == v1_job, step_runs.c.outcome == "already_ready")).scalar()
            lettered = conn.execute(select(func.count()).select_from(dead_letters)).scalar()
        return verified + lettered >= len(sent)

    wait_for(settled, timeout=30, message="every redelivered message handled")
    with engine.connect() as conn:
        assert conn.execute(select(dead_letters.c.error_code)).scalars().all() == []
    assert all(xq_depth(broker_url, f"{queue}.XQ") == 0
               for queue in ("attache.inspect", "attache.render", "attache.publish"))
    assert deployment.status(uploaded["id"])["pipeline_version"] == 2


@pytest.mark.parametrize("payload", [
    {"job_id": "x"},
    "just a string",
    None,
])
def test_schema_invalid_messages_are_dead_lettered_unprocessed(deployment, services, engine, broker_url, payload):
    message_id = publish_raw(services, payload)
    wait_for(lambda: xq_depth(broker_url, "attache.inspect.XQ") == 1, timeout=30, message="message in .XQ")
    record = wait_for(lambda: dead_letter(engine, message_id), timeout=10, message="dead letter recorded")
    assert record.error_code == "invalid_message" and record.retries == 0
    assert "jobs.schema.json" in record.reason


def dead_letter(engine, message_id):
    from app.adapters.postgres.models import dead_letters

    with engine.connect() as conn:
        return conn.execute(select(dead_letters).where(dead_letters.c.message_id == message_id)).one_or_none()


def test_message_for_unknown_job_is_dead_lettered(deployment, services, engine, broker_url):
    from app.observability.tracing import new_traceparent

    job_id = uuid.uuid4()
    payload = messages.build(job_id=job_id, attachment_id=uuid.uuid4(), pipeline_version=1, attempt=1,
                             step="inspect", traceparent=new_traceparent())
    message_id = publish_raw(services, payload)
    wait_for(lambda: xq_depth(broker_url, "attache.inspect.XQ") == 1, timeout=30, message="message in .XQ")
    record = wait_for(lambda: dead_letter(engine, message_id), timeout=10, message="dead letter recorded")
    assert (record.error_code, record.job_id) == ("unknown_job", job_id)


def test_amqp_message_carries_trace_headers(services, broker_url, engine, data_file, settings):
    """The outbox publishes with native headers mirroring the body (docs/contract.md)."""
    from app.web import create_app

    app = create_app(settings)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with open(data_file("photos/chelsea.jpg"), "rb") as fh:
        response = authed(app).post("/v1/attachments", data={"file": (fh, "c.jpg")},
                                          content_type="multipart/form-data", headers={"traceparent": traceparent})
    assert response.status_code == 202

    def published():  # behind the answer (app.core.background_publisher)
        with engine.connect() as conn:
            return conn.execute(select(outbox.c.published_at)).scalar_one()

    wait_for(published, timeout=10, message="the upload's message confirmed")
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        method, properties, body = connection.channel().basic_get("attache.inspect", auto_ack=True)
    finally:
        connection.close()
    decoded = json.loads(body)
    payload = decoded["args"][0]
    assert payload["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c", "same trace"
    assert properties.headers["traceparent"] == payload["traceparent"]
    assert properties.headers["x-attache-job-id"] == payload["job_id"] == response.json["job_id"]
    assert properties.message_id == decoded["message_id"]
    assert properties.delivery_mode == 2 and properties.content_type == "application/json"
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.traceparent)).scalar() == traceparent
    app.extensions["attache"].close()


def test_when_postgresql_is_unreachable_dramatiq_retries_are_bounded_then_dead_letter(env, tmp_path, services, broker_url):
    """The only case for Dramatiq's own retries: the outcome cannot be recorded at all, even after each delivery
    waited for PostgreSQL (here 0.5 s)."""
    from app.observability.tracing import new_traceparent

    deployment = Deployment({**env, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/attache",
                             "ATTACHE_BROKER_RETRIES": "2", "ATTACHE_BROKER_MIN_BACKOFF_MS": "50",
                             "ATTACHE_DATABASE_WAIT_SECONDS": "0.5"}, tmp_path)
    deployment.start("worker")
    try:
        payload = messages.build(job_id=uuid.uuid4(), attachment_id=uuid.uuid4(), pipeline_version=1, attempt=1,
                                 step="inspect", traceparent=new_traceparent())
        message_id = publish_raw(services, payload)
        wait_for(lambda: xq_depth(broker_url, "attache.inspect.XQ") == 1, timeout=60, message="message in .XQ")
        connection = pika.BlockingConnection(pika.URLParameters(broker_url))
        try:
            _, _, body = connection.channel().basic_get("attache.inspect.XQ", auto_ack=False)
        finally:
            connection.close()
        dead = json.loads(body)
        assert dead["message_id"] == message_id
        assert dead["options"]["retries"] == 2, "delivered once, retried twice, then given up"
        assert "DatabaseUnavailable" in dead["options"]["traceback"]
        log = deployment.processes["worker"].output()
        assert "dead letter not recorded in PostgreSQL" in log, "the record falls back to the log"
    finally:
        deployment.stop_all()
