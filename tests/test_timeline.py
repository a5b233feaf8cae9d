"""One upload's page: every pipeline version's job with a timeline built from history, step runs and audit.

Jobs are driven through the real state machine and the real pipeline steps
(in-process, tests/driver.py) against real PostgreSQL and storage; the
console is the real Flask app.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update

from app.adapters.postgres.models import jobs, step_runs
from app.config import Settings
from app.core import operations, states, timeline
from app.core.workflow import Workflow
from app.errors import AttachmentNotFound, JobNotFound
from app.services import Services
from app.web import create_app
from tests.conftest import OPERATOR_TOKEN, authed
from tests.driver import job, run, upload
from tests.test_console import signed_in

NOWHERE = "amqp://guest:guest@127.0.0.1:1/%2F"
TRACEPARENT = "00-" + "3" * 32 + "-" + "4" * 16 + "-01"


@pytest.fixture
def storage_down(env):
    """A worker whose storage is down (no wait for it within a step) and whose next try waits a minute."""
    services = Services(Settings.from_env({**env, "STORAGE_URL": "s3://attache?endpoint=http://127.0.0.1:1",
                                           "BROKER_URL": NOWHERE, "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5",
                                           "ATTACHE_RETRY_INITIAL_SECONDS": "60", "ATTACHE_STORAGE_WAIT_SECONDS": "0"}))
    yield services
    services.engine.dispose()


@pytest.fixture
def app(env):
    app = create_app(Settings.from_env({**env, "BROKER_URL": NOWHERE, "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
    yield app
    app.extensions["attache"].close()


def lose_the_lease(engine, job_id):
    """Attempt 1 claimed by a worker that dies: its lease expires and the scheduler takes the attempt back."""
    with engine.begin() as conn:
        assert states.claim(conn, job_id, 1, states.Lease("worker:dead:1:1", 30)) is not None
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(lease_expires_at=jobs.c.updated_at))
        assert states.recover_expired(conn, batch=10, actor="scheduler:test") == {"requeued": 1, "failed": 0}


@pytest.fixture
def two_versions(quiet_services, storage_down, engine, data_file):
    """v1: a lease expired, then ready after a real run. v2: its storage was down, a retry waits a minute."""
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    lose_the_lease(engine, accepted.job_id)
    run(Workflow(quiet_services), engine, accepted.job_id)
    assert job(engine, accepted.job_id).state == "ready"
    with engine.begin() as conn:
        v2, _ = states.create_job(conn, attachment_id=accepted.attachment_id, pipeline_version=2, max_attempts=3,
                                  traceparent=TRACEPARENT, tracestate=None, actor="backfill:test", room_bytes=0)
    run(Workflow(storage_down), engine, v2)
    assert job(engine, v2).state == "queued" and job(engine, v2).next_attempt_at is not None
    return accepted.attachment_id, accepted.job_id, v2


def kinds(detail):
    return [e["kind"] if e["kind"] != "step" else f"step:{e['step']}" for e in detail["timeline"]]


def test_the_timeline_names_each_step_retry_lease_expiry_and_derivative(quiet_services, engine, two_versions):
    attachment_id, v1, v2 = two_versions
    overview = timeline.attachment_overview(quiet_services.engine, attachment_id)
    assert overview["attachment"]["attachment_id"] == str(attachment_id)
    assert overview["attachment"]["filename"] == "chelsea.jpg"
    first, second = overview["jobs"]
    assert (first["job_id"], first["pipeline_version"], second["job_id"], second["pipeline_version"]) == \
        (str(v1), 1, str(v2), 2), "every pipeline version's job, oldest version first"

    assert kinds(first)[:3] == ["created", "claimed", "lease_expired"]
    lost = first["timeline"][2]
    assert lost["who"] == "scheduler:test" and lost["error_code"] == "worker_lost"
    assert "worker:dead:1:1" in lost["reason"]
    steps = [e for e in first["timeline"] if e["kind"] == "step"]
    stale, *second_attempt = steps
    assert (stale["step"], stale["attempt"], stale["outcome"]) == ("inspect", 1, "stale"), \
        "the dead worker's message, delivered after the attempt was taken back, did nothing"
    assert sorted((e["step"], e["variant"]) for e in second_attempt) == [
        ("inspect", None), ("publish", None), ("render", "crop"), ("render", "optimized"), ("render", "original"),
        ("render", "thumbnail")], "every step and variant of attempt 2"
    assert all(e["attempt"] == 2 and e["who"].startswith("worker:") and e["seconds"] >= 0 for e in second_attempt)
    assert {e["outcome"] for e in second_attempt} == {"inspected", "rendered", "ready"}
    for event in steps:  # a step starts when it finished minus its duration
        started, finished = datetime.fromisoformat(event["at"]), datetime.fromisoformat(event["finished_at"])
        assert abs((finished - started).total_seconds() - event["seconds"]) < 0.001
    assert sorted(kinds(first)) == sorted(["created", "claimed", "lease_expired", "claimed", "ready"]
                                          + [f"step:{e['step']}" for e in steps])
    assert [e["at"] for e in first["timeline"]] == sorted(e["at"] for e in first["timeline"]), "in time order"
    assert first["now"]["kind"] == "ready"
    assert first["trace_id"] == "1" * 32, "the upload's trace id (tests/driver.py uploads with it)"
    assert {v["variant"] for v in first["variants"] if v["published_at"]} == \
        {"original", "thumbnail", "crop", "optimized"}

    assert sorted(kinds(second)) == ["claimed", "created", "retry_scheduled", "step:inspect"]
    retry = next(e for e in second["timeline"] if e["kind"] == "retry_scheduled")
    due = job(engine, v2).next_attempt_at
    assert retry["error_code"] == "storage_unavailable"
    assert datetime.fromisoformat(retry["next_attempt_at"]) == due, "when the next attempt is due"
    assert second["now"]["kind"] == "retry_waiting" and datetime.fromisoformat(second["now"]["until"]) == due
    assert "storage_unavailable" in second["now"]["text"] and "attempt 2" in second["now"]["text"]
    assert second["trace_id"] == "3" * 32 and second["variants"] == []


def test_a_replay_shows_who_did_it_and_why(quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    operations.replay(quiet_services, accepted.job_id, operator="olga", reason="decoder upgraded")
    detail = timeline.job_detail(quiet_services.engine, accepted.job_id)
    failed = next(e for e in detail["timeline"] if e["kind"] == "failed")
    assert failed["error_code"] == "corrupt_image"
    replayed = detail["timeline"][-1]
    assert (replayed["kind"], replayed["who"], replayed["reason"]) == ("replayed", "operator:olga", "decoder upgraded")
    assert [(a["actor"], a["action"]) for a in detail["audit"]] == [("operator:olga", "job.replay")]
    assert detail["now"]["kind"] == "queued"
    with pytest.raises(JobNotFound):
        timeline.job_detail(quiet_services.engine, uuid.uuid4())
    with pytest.raises(AttachmentNotFound):
        timeline.attachment_overview(quiet_services.engine, uuid.uuid4())


def test_now_says_what_a_processing_job_waits_for(engine):
    from tests.test_states import seed

    with engine.begin() as conn:
        _, job_id = seed(conn)
        assert states.claim(conn, job_id, 1, states.Lease("worker:a:1:1", 30)) is not None
    running = timeline.job_detail(engine, job_id)["now"]
    assert running["kind"] == "running" and "worker:a:1:1 holds the lease until" in running["text"]
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(lease_expires_at=jobs.c.updated_at))
    expired = timeline.job_detail(engine, job_id)["now"]
    assert expired["kind"] == "lease_expired" and "the lease of worker:a:1:1 expired at" in expired["text"]
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(lease_expires_at=jobs.c.updated_at
                                                                     + timedelta(seconds=30)))
        assert states.hand_off(conn, job_id, 1, "worker:a:1:1")
    assert timeline.job_detail(engine, job_id)["now"]["kind"] == "between_steps"


def test_step_runs_name_their_worker(quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    with engine.connect() as conn:
        workers = conn.execute(select(step_runs.c.worker).where(step_runs.c.job_id == accepted.job_id)).scalars().all()
    assert workers and all(re.fullmatch(r"worker:[^:]+:\d+:\d+", w) for w in workers), workers


def test_the_attachment_page_shows_both_versions_with_timelines_and_thumbnails(app, two_versions):
    attachment_id, v1, v2 = two_versions
    client = signed_in(app)
    page = client.get(f"/ops/attachments/{attachment_id}")
    assert page.status_code == 200
    html = page.text
    for job_id in (v1, v2):
        assert f'id="job-{job_id}"' in html and f'id="timeline-{job_id}"' in html
    assert "Pipeline v1" in html and "Pipeline v2" in html
    assert 'data-kind="lease_expired"' in html and "worker_lost" in html
    assert 'data-kind="retry_scheduled"' in html and "next attempt due" in html
    assert f'id="now-{v2}"' in html and "waiting to retry" in html
    assert f'id="trace-id-{v1}">{"1" * 32}<' in html
    thumbnails = re.findall(r'<img src="([^"]+)"', html)
    assert f"/v1/attachments/{attachment_id}/variants/thumbnail?version=1" in thumbnails
    assert len(thumbnails) == 3, "thumbnail, crop and optimized of v1; the original is a link; v2 has none"
    for src in thumbnails:  # the existing download endpoint serves them to the console's session
        image = client.get(src)
        assert image.status_code == 200 and image.mimetype.startswith("image/"), src
    assert client.get(f"/ops/attachments/{uuid.uuid4()}").status_code == 404
    assert app.test_client().get(f"/ops/attachments/{attachment_id}").status_code == 302, "login first"


def test_the_job_page_has_the_timeline_and_links_its_attachment(app, two_versions):
    attachment_id, v1, _ = two_versions
    page = authed(app, OPERATOR_TOKEN).get(f"/ops/jobs/{v1}")
    assert page.status_code == 200
    assert f'href="/ops/attachments/{attachment_id}"' in page.text
    assert f'id="timeline-{v1}"' in page.text and 'data-kind="step"' in page.text
    assert 'id="history"' in page.text


def test_with_presigned_s3_downloads_the_console_lets_images_come_from_the_storage(env):
    """A thumbnail's download redirects to the storage host there; ``img-src 'self'`` alone would block it."""
    from app.adapters.storage import storage_from_url
    from tests.s3server import moto_server
    from tests.test_console import CSP

    with moto_server() as endpoint:
        s3 = {**env, "STORAGE_URL": f"s3://console?endpoint={endpoint}", "S3_ACCESS_KEY": "test",
              "S3_SECRET_KEY": "test-secret", "BROKER_URL": NOWHERE}
        storage_from_url(s3["STORAGE_URL"], access_key="test", secret_key="test-secret").ensure_bucket()
        for presign, expected in (("300", f"{CSP}; img-src 'self' {endpoint}"), ("0", CSP)):
            app = create_app(Settings.from_env({**s3, "ATTACHE_PRESIGN_SECONDS": presign}))
            try:
                page = signed_in(app).get("/ops")
                assert page.status_code == 200
                assert page.headers["Content-Security-Policy"] == expected, presign
            finally:
                app.extensions["attache"].close()


@pytest.mark.processes
def test_an_operator_finds_an_upload_in_a_real_browser(env, quiet_services, storage_down, engine, data_file, tmp_path):
    """The header's search box, a job id prefix, the attachment's page with its thumbnails loaded.

    Screenshot: ``artifacts/console/attachment.png``.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    from tests.browser import browsing, waiting
    from tests.processes import Deployment
    from tests.test_activity import ARTIFACTS

    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    lose_the_lease(engine, accepted.job_id)
    run(Workflow(quiet_services), engine, accepted.job_id)
    with engine.begin() as conn:
        v2, _ = states.create_job(conn, attachment_id=accepted.attachment_id, pipeline_version=2, max_attempts=3,
                                  traceparent=TRACEPARENT, tracestate=None, actor="backfill:test", room_bytes=0)
    run(Workflow(storage_down), engine, v2)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "attachment.png").unlink(missing_ok=True)
    deployment = Deployment(env, tmp_path)
    with browsing(deployment, tmp_path, "web") as driver:
        wait = waiting(driver)
        driver.get(deployment.url + "/ops/login")
        wait.until(EC.visibility_of_element_located((By.ID, "token"))).send_keys(OPERATOR_TOKEN)
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        box = wait.until(EC.visibility_of_element_located((By.ID, "search-q")))
        assert driver.find_element(By.CSS_SELECTOR, "label[for=search-q]").get_attribute("textContent") == \
            "Find an upload"
        box.send_keys(str(v2)[:8])
        driver.find_element(By.CSS_SELECTOR, "form.search button[type=submit]").click()
        wait.until(EC.url_contains(f"/ops/attachments/{accepted.attachment_id}#job-{v2}"))
        now = wait.until(EC.visibility_of_element_located((By.ID, f"now-{v2}")))
        assert "waiting to retry" in now.text
        images = driver.find_elements(By.CSS_SELECTOR, f"#derivatives-{accepted.job_id} img")
        assert len(images) == 3
        wait.until(lambda d: all(int(img.get_property("naturalWidth") or 0) > 0 for img in images))
        rows = driver.find_elements(By.CSS_SELECTOR, f"#timeline-{accepted.job_id} tbody tr")
        assert {r.get_attribute("data-kind") for r in rows} >= {"created", "claimed", "lease_expired", "step", "ready"}
        driver.set_window_size(1280, 3000)
        driver.save_screenshot(str(ARTIFACTS / "attachment.png"))
    assert (ARTIFACTS / "attachment.png").stat().st_size > 10_000
