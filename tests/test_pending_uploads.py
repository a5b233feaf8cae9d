"""ATTACHE_MAX_PENDING_PER_UPLOADER: one uploader cannot put unbounded work ahead of everyone else's.

The queues are first come, first served: without a bound, one uploader's
thousand costly images held every other uploader's photo behind them.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text

from app.adapters.postgres.models import attachments, jobs, pending_uploads, uploads
from app.config import Settings
from app.core import backfill, states
from app.core.workflow import Workflow
from app.web import create_app
from app.web.spool import HashingSpool
from tests.conftest import OTHER_UPLOADER_TOKEN, authed
from tests.driver import job, run
from tests.test_migrations import ADD_ATTACHMENT
from tests.test_tus_api import PHOTO, create, patch

LIMIT = 2
TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


@pytest.fixture
def settings(env) -> Settings:
    """No broker: the tests deliver the messages themselves (:mod:`tests.driver`)."""
    return Settings.from_env({**env, "ATTACHE_MAX_PENDING_PER_UPLOADER": str(LIMIT),
                              "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F", "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"})


@pytest.fixture(autouse=True)
def _no_early_refusals(monkeypatch):
    """Each test sees the count itself; the early refusal after a refusal has its own test."""
    from app.core import pending

    monkeypatch.setattr(pending, "REFUSED_SECONDS", 0.0)


@pytest.fixture
def app(settings):
    app = create_app(settings)
    yield app
    app.extensions["attache"].close()


def post(client, path, **headers):
    with open(path, "rb") as fh:
        return client.post("/v1/attachments", data={"file": (fh, path.name)}, content_type="multipart/form-data",
                           headers=headers)


def count(engine, table, *where) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def staged(storage_dir) -> int:
    return len(list((storage_dir / "staging").glob("*"))) if (storage_dir / "staging").exists() else 0


def fill(client, data_file) -> list[dict]:
    answers = [post(client, data_file(PHOTO)) for _ in range(LIMIT)]
    assert [a.status_code for a in answers] == [202] * LIMIT
    return [a.json for a in answers]


def test_an_uploader_with_its_fill_pending_gets_429_and_nothing_of_the_request_stays(app, engine, storage_dir,
                                                                                     data_file):
    alice = authed(app)
    fill(alice, data_file)
    refused = post(alice, data_file(PHOTO))
    assert refused.status_code == 429, refused.get_data(as_text=True)
    assert refused.json["error"] == "too_many_pending" and refused.headers["Retry-After"] == "5"
    assert count(engine, attachments) == count(engine, jobs) == LIMIT and staged(storage_dir) == LIMIT
    assert post(authed(app, OTHER_UPLOADER_TOKEN), data_file(PHOTO)).status_code == 202, \
        "another uploader's uploads are not held by alice's"


def test_after_a_refusal_the_next_bodies_are_refused_before_they_are_read(app, engine, data_file, monkeypatch):
    """No query before every body (it cost each large upload 2-4 ms): an uploader refused in the transaction is
    refused again before its body is read for ``Retry-After`` seconds; a body that is not an image shows it."""
    from app.core import pending

    monkeypatch.setattr(pending, "REFUSED_SECONDS", 5.0)
    alice = authed(app)
    fill(alice, data_file)
    not_an_image = dict(data=b"hello" * 1000, content_type="text/plain")
    assert alice.post("/v1/attachments", **not_an_image).status_code == 415, "no refusal yet: the body is read"
    assert post(alice, data_file(PHOTO)).status_code == 429
    early = alice.post("/v1/attachments", **not_an_image)
    assert early.status_code == 429 and early.json["error"] == "too_many_pending"
    bob = authed(app, OTHER_UPLOADER_TOKEN)
    assert bob.post("/v1/attachments", **not_an_image).status_code == 415, "another uploader is not refused"
    clock = pending.time.monotonic() + pending.REFUSED_SECONDS
    monkeypatch.setattr(pending.time, "monotonic", lambda: clock)
    assert alice.post("/v1/attachments", **not_an_image).status_code == 415, "the refusal lasts Retry-After"


def test_a_finished_upload_makes_room_whether_failed_or_ready(app, engine, data_file, quiet_services):
    alice = authed(app)
    corrupt = post(alice, data_file("pillow/truncated_jpeg.jpg")).json
    photo = post(alice, data_file(PHOTO)).json
    assert post(alice, data_file(PHOTO)).status_code == 429
    run(Workflow(quiet_services), engine, corrupt["job_id"])
    assert job(engine, corrupt["job_id"]).state == "failed"
    assert post(alice, data_file(PHOTO)).status_code == 202, "a failed upload no longer counts"
    assert post(alice, data_file(PHOTO)).status_code == 429
    run(Workflow(quiet_services), engine, photo["job_id"])
    assert job(engine, photo["job_id"]).state == "ready"
    assert post(alice, data_file(PHOTO)).status_code == 202, "a ready upload no longer counts"
    assert count(engine, pending_uploads) == LIMIT and count(engine, attachments) == LIMIT + 2


def test_a_retry_with_its_idempotency_key_is_answered_even_at_the_limit(app, engine, data_file):
    alice = authed(app)
    first = post(alice, data_file(PHOTO), **{"Idempotency-Key": "k-1"})
    post(alice, data_file(PHOTO))
    again = post(alice, data_file(PHOTO), **{"Idempotency-Key": "k-1"})
    assert again.status_code == 202 and again.json["id"] == first.json["id"], "the 202 a client lost is answered"
    new_key = post(alice, data_file(PHOTO), **{"Idempotency-Key": "k-2"})
    assert new_key.status_code == 429, "a new upload under a new key is one more"
    assert count(engine, attachments) == LIMIT


def test_replays_and_backfills_are_operators_work_and_not_counted(app, engine, data_file, quiet_services):
    alice = authed(app)
    ready = post(alice, data_file(PHOTO)).json
    failing = post(alice, data_file("pillow/truncated_jpeg.jpg")).json
    for accepted in (ready, failing):
        run(Workflow(quiet_services), engine, accepted["job_id"])
    with engine.begin() as conn:
        assert states.replay(conn, failing["job_id"], actor="olga", reason="test", budget=1) is not None
    assert backfill.run(quiet_services, 2), "the backfill made a job for version 2"
    assert count(engine, jobs, jobs.c.state == "queued") == 2 and count(engine, pending_uploads) == 0
    fill(alice, data_file)


def test_a_resumable_upload_is_refused_at_creation_and_waits_at_its_last_byte(app, engine, data_file, storage_dir,
                                                                             quiet_services):
    alice = authed(app)
    photo = data_file(PHOTO).read_bytes()
    made = create(alice, len(photo))
    assert made.status_code == 201
    location = made.headers["Location"]
    assert patch(alice, location, 0, photo[:1000]).status_code == 204
    posted = fill(alice, data_file)  # meanwhile the uploader's POSTs fill its share
    refused = create(alice, len(photo))
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "5"
    assert count(engine, uploads) == 1, "a refused creation makes no upload"
    last = patch(alice, location, 1000, photo[1000:])
    assert last.status_code == 429 and last.json["error"] == "too_many_pending"
    assert alice.head(location, headers={"Tus-Resumable": "1.0.0"}).headers["Upload-Offset"] == "1000", \
        "the upload waits where it was"
    upload_id = location.rstrip("/").rsplit("/", 1)[1]
    assert len([path for path in storage_dir.rglob("*") if path.is_file() and upload_id in str(path)]) == 1, \
        "refused before its last part is stored, and its parts joined, probed and staged (a review: each retry cost " \
        "the whole upload)"
    run(Workflow(quiet_services), engine, posted[0]["job_id"])  # one of the POSTed uploads is done
    again = patch(alice, location, 1000, photo[1000:])
    assert again.status_code == 204 and again.headers["Attachment-Id"]
    assert count(engine, attachments) == LIMIT + 1


def test_a_request_that_lost_the_race_for_its_key_returns_the_winner_even_at_the_limit(services, data_file,
                                                                                        monkeypatch):
    """Two requests with one Idempotency-Key: the second looked for the key before the first committed, and the
    first's COMMIT then filled the uploader's share. The second is the same upload: it must answer the first's
    attachment (the key decides), not 429."""
    from app.core import intake
    from tests.driver import upload

    def accept(key):
        spool = HashingSpool(10**9)
        spool.write(data_file(PHOTO).read_bytes())
        received = spool.finish()
        try:
            return intake.accept(services, received, filename="a.jpg", owner="t", traceparent=TRACEPARENT,
                                 tracestate=None, idempotency_key=key)
        finally:
            received.discard()

    upload(services, data_file(PHOTO))  # one of the uploader's two
    look = intake.earlier
    first = []

    def earlier_then_the_other_request_commits(*args):
        found = look(*args)
        if not first:
            first.append(None)
            first[0] = accept("k")  # the winner, from start to COMMIT, between the loser's look and its own
        return found

    monkeypatch.setattr(intake, "earlier", earlier_then_the_other_request_commits)
    second = accept("k")
    assert not first[0].replayed and second.attachment_id == first[0].attachment_id and second.replayed


def test_the_count_follows_jobs_whichever_release_writes_them(app, engine, data_file):
    """A release migrates while the previous one still serves: its workers knew nothing of the count, and the rows
    they left behind for finished jobs refused their uploader for good (an adversarial run of a rolling deploy);
    its web's uploads went uncounted. The previous release's statements, as they were:"""
    alice = authed(app)
    accepted = fill(alice, data_file)
    with engine.begin() as conn:  # its worker: an UPDATE of the state and nothing else
        conn.execute(text("UPDATE jobs SET state = 'processing', attempt = 1, lease_owner = 'old', "
                          "lease_expires_at = now() + interval '1 minute' WHERE id = :id"), {"id": accepted[0]["job_id"]})
        conn.execute(text("UPDATE jobs SET state = 'ready', ready_at = now(), lease_owner = NULL, "
                          "lease_expires_at = NULL WHERE id = :id"), {"id": accepted[0]["job_id"]})
        conn.execute(text("UPDATE jobs SET state = 'failed', error_code = 'corrupt_image' WHERE id = :id"),
                     {"id": accepted[1]["job_id"]})
    assert count(engine, pending_uploads) == 0
    with engine.begin() as conn:  # its web: an attachment and its job in one transaction, without a count
        conn.execute(ADD_ATTACHMENT, {"id": "00000000-0000-4000-8000-000000000001", "owner": "alice"})
        conn.execute(text("INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, traceparent) "
                          "VALUES ('00000000-0000-4000-8000-000000000002', '00000000-0000-4000-8000-000000000001', "
                          "1, 'queued', 3, '00-x')"))
    with engine.begin() as conn:  # a backfill: a later transaction
        conn.execute(text("INSERT INTO jobs (id, attachment_id, pipeline_version, state, max_attempts, traceparent) "
                          "VALUES ('00000000-0000-4000-8000-000000000003', '00000000-0000-4000-8000-000000000001', "
                          "2, 'queued', 3, '00-x')"))
    with engine.connect() as conn:
        counted = conn.execute(select(pending_uploads.c.job_id, pending_uploads.c.owner)).all()
    assert [(str(job_id), owner) for job_id, owner in counted] == [("00000000-0000-4000-8000-000000000002", "alice")]
    assert post(alice, data_file(PHOTO)).status_code == 202
    assert post(alice, data_file(PHOTO)).status_code == 429
