"""Idempotency-Key: a retried POST returns the same attachment, never a second one."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select, text, update

from app.adapters.postgres.models import attachments, idempotency_keys, jobs
from app.web import create_app
from tests.conftest import OTHER_UPLOADER_TOKEN, authed
from tests.processes import Deployment


@pytest.fixture
def app(settings):
    app = create_app(settings)
    yield app
    app.extensions["attache"].close()


def post(client, path, key):
    with open(path, "rb") as fh:
        return client.post("/v1/attachments", data={"file": (fh, path.name)}, content_type="multipart/form-data",
                           headers={"Idempotency-Key": key})


def count(engine, table):
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar()


def staged(storage_dir):
    return sorted(p.name for p in (storage_dir / "staging").glob("*")) if (storage_dir / "staging").exists() else []


def test_same_key_same_content_returns_the_same_attachment(app, engine, storage_dir, data_file):
    client = authed(app)
    first = post(client, data_file("photos/chelsea.jpg"), "order-42")
    second = post(client, data_file("photos/chelsea.jpg"), "order-42")
    assert first.status_code == second.status_code == 202
    assert second.json["id"] == first.json["id"] and second.json["job_id"] == first.json["job_id"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert count(engine, attachments) == 1 and count(engine, jobs) == 1
    assert staged(storage_dir) == [first.json["id"]], "no second staged object is kept"


def test_same_key_different_content_is_422(app, engine, storage_dir, data_file):
    client = authed(app)
    assert post(client, data_file("photos/chelsea.jpg"), "k1").status_code == 202
    reused = post(client, data_file("photos/coffee.jpg"), "k1")
    assert reused.status_code == 422 and reused.json["error"] == "idempotency_key_reused"
    assert count(engine, attachments) == 1 and len(staged(storage_dir)) == 1


def test_keys_belong_to_their_principal_and_expire(app, engine, data_file):
    alice = post(authed(app), data_file("photos/chelsea.jpg"), "shared-name")
    bob = post(authed(app, OTHER_UPLOADER_TOKEN), data_file("photos/chelsea.jpg"), "shared-name")
    assert bob.status_code == 202 and bob.json["id"] != alice.json["id"], "another principal's key is another key"
    with engine.begin() as conn:  # a day later
        conn.execute(update(idempotency_keys).values(created_at=func.now() - func.make_interval(0, 0, 0, 2)))
    again = post(authed(app), data_file("photos/chelsea.jpg"), "shared-name")
    assert again.status_code == 202 and again.json["id"] != alice.json["id"], "an expired key starts afresh"
    assert "Idempotent-Replayed" not in again.headers


def test_bad_keys_are_400(app, data_file):
    assert post(authed(app), data_file("photos/chelsea.jpg"), "x" * 300).status_code == 400


def test_a_key_is_printable_ascii(app, engine, data_file):
    """A header's bytes reach the web as Latin-1: a UTF-8 ``café`` was kept as ``cafÃ©`` and ``ключ`` refused, by
    whether its bytes fell in 0x80-0x9F (an adversarial run). A key is ASCII, as a structured field's string is."""
    client = authed(app)
    for key in ("café".encode().decode("latin-1"), "ключ".encode().decode("latin-1"), "caf\xe9"):
        answer = post(client, data_file("photos/chelsea.jpg"), key)
        assert (answer.status_code, answer.json["error"]) == (400, "bad_idempotency_key"), (key, answer.json)
    assert count(engine, attachments) == 0
    assert post(client, data_file("photos/chelsea.jpg"), "order 42/a~b").status_code == 202


def test_a_key_sent_as_a_list_is_refused(app, engine, data_file):
    """gunicorn joins a header sent twice with a comma: two keys reached intake as one, ``a,b``, and a retry that
    sent them the other way round made a second attachment of one upload. Then ``"k7`` and ``k8"`` sent twice were
    joined into one quoted key; a no-break space was stripped off a key; ``"k\\1"`` and ``k\1`` were two keys
    (a re-attack). A key has no comma, quote or backslash in it, and only a header's own spaces are trimmed."""
    client = authed(app)
    for key in ("order-1,order-2", "order-2,order-1", '"order-1","order-2"', '"order-1", "order-2"', 'a"b',
                '"order-1,order-2"', '"k\\1"', "k\\1", "k15\xa0"):
        answer = post(client, data_file("photos/chelsea.jpg"), key)
        assert (answer.status_code, answer.json["error"]) == (400, "bad_idempotency_key"), (key, answer.json)
    assert count(engine, attachments) == 0 and count(engine, idempotency_keys) == 0
    first = post(client, data_file("photos/chelsea.jpg"), '"order-1"')
    again = post(client, data_file("photos/chelsea.jpg"), "\torder-1 ")
    assert first.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json["id"] == first.json["id"] and count(engine, attachments) == 1


@pytest.mark.processes
def test_a_key_of_a_resumable_uploads_own_shape_is_refused(app, engine, data_file):
    """An adversarial run: a POST under ``tus:<upload id>`` took the key a tus upload's last byte hands off under,
    and that PATCH then failed ``422`` and terminated the upload, its bytes gone. The prefix is the uploads' own."""
    refused = post(authed(app), data_file("photos/chelsea.jpg"), "tus:7f2b3c4d-0000-4000-8000-000000000000")
    assert refused.status_code == 400 and refused.json["error"] == "bad_idempotency_key"
    assert count(engine, attachments) == 0 and count(engine, idempotency_keys) == 0


def test_parallel_posts_with_one_key_make_one_attachment(env, tmp_path, engine, storage_dir, data_file):
    deployment = Deployment(env, tmp_path)
    deployment.start("web", WEB_CONCURRENCY="2")
    try:
        barrier = threading.Barrier(6)
        results = []

        def send():
            barrier.wait()
            results.append(deployment.upload(data_file("photos/coffee.jpg"), headers={"Idempotency-Key": "race"}))

        threads = [threading.Thread(target=send) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert [r.status_code for r in results] == [202] * 6
        assert len({r.json()["id"] for r in results}) == 1
        assert count(engine, attachments) == 1 and count(engine, jobs) == 1
        assert staged(storage_dir) == [results[0].json()["id"]], "the losers removed their staged copies"
    finally:
        deployment.stop_all()


def test_a_commit_whose_connection_dies_keeps_staging_for_the_cleanup(app, engine, storage_dir, data_file):
    """The connection is terminated as COMMIT is sent: the web cannot know the outcome, so it keeps the bytes."""
    from sqlalchemy import event, text

    from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig
    from tests.conftest import _admin

    services = app.extensions["attache"]
    admin = _admin()
    killed = []

    def mark_upload(conn, cursor, statement, *args):
        if statement.startswith("INSERT INTO attachments"):
            conn.info["upload"] = True

    def terminate_before_commit(conn):
        if killed or not conn.info.pop("upload", False):
            return
        pid = conn.connection.dbapi_connection.get_backend_pid()
        with admin.connect() as other:  # pg_terminate_backend(pid, timeout) waits until the backend is gone
            killed.append(other.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid}).scalar())

    event.listen(services.engine, "before_cursor_execute", mark_upload)
    event.listen(services.engine, "commit", terminate_before_commit)
    try:
        lost = post(authed(app), data_file("photos/chelsea.jpg"), "lost-commit")
    finally:
        event.remove(services.engine, "commit", terminate_before_commit)
        event.remove(services.engine, "before_cursor_execute", mark_upload)
        admin.dispose()
    assert killed == [True]
    assert lost.status_code == 503, lost.json
    assert lost.json["error"] == "outcome_unknown", "told apart from a refusal that left nothing behind"
    assert count(engine, attachments) == 0, "the server never got the COMMIT"
    assert len(staged(storage_dir)) == 1, "an unknown outcome leaves the staged bytes to the staging cleanup"
    # the key was not used: the retry makes the upload
    retry = post(authed(app), data_file("photos/chelsea.jpg"), "lost-commit")
    assert retry.status_code == 202 and count(engine, attachments) == 1
    # the cleanup checks the database: the orphan (no row) goes, the retry's staging (queued job) stays
    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=0))
    assert cleanup.run_once()["removed"] == 1
    assert staged(storage_dir) == [retry.json["id"]]


def test_a_retry_behind_a_request_that_holds_its_key_is_a_503_not_a_wait(app, engine, storage_dir, data_file,
                                                                         monkeypatch):
    """A web process paused inside an upload's transaction (SIGSTOP, a frozen VM) holds its key's row; a retry with
    that key waited on the lock, holding a thread and a database connection, for as long as it stayed paused. Now
    a web request waits at most ``WEB_LOCK_TIMEOUT_SECONDS`` for a lock (2 s here), then answers ``503`` with
    Retry-After, and staged nothing."""
    from app import services

    monkeypatch.setattr(services, "WEB_LOCK_TIMEOUT_SECONDS", 2.0)
    app = create_app(app.extensions["attache"].settings)
    client = authed(app)
    first = post(client, data_file("photos/chelsea.jpg"), "held")
    assert first.status_code == 202
    with engine.begin() as conn:  # expired: the next request with the key takes it over, under the row's lock
        conn.execute(update(idempotency_keys).values(created_at=func.now() - text("interval '30 days'")))
    answers = []
    with engine.connect() as holder:
        holder.execute(select(idempotency_keys).with_for_update())  # the paused request's lock
        retry = threading.Thread(target=lambda: answers.append(post(client, data_file("photos/chelsea.jpg"), "held")),
                                 daemon=True)
        retry.start()
        retry.join(timeout=20)
        holder.rollback()
    retry.join(timeout=20)
    assert answers, "the retry still waits for the lock"
    assert answers[0].status_code == 503 and answers[0].headers["Retry-After"], answers[0].json
    assert count(engine, attachments) == 1 and staged(storage_dir) == [first.json["id"]]
    app.extensions["attache"].close()


def test_a_commit_that_landed_unseen_is_told_apart_from_a_refusal(app, engine, data_file, monkeypatch):
    """The upload's COMMIT landed, its answer was lost, and the web's look for its row could not reach PostgreSQL
    either: the upload may have been accepted. It was answered as a clean refusal is (``503
    database_unavailable``, "retry later"), and a client without an Idempotency-Key that retried as told made a
    second attachment of one upload (an adversarial run, through a proxy that dropped the COMMIT's answer)."""
    from app import faults
    from app.core import intake

    monkeypatch.setenv("ATTACHE_FAULT", "during_commit")  # the COMMIT lands, then the web sees a lost connection
    monkeypatch.setattr(faults, "_reached", set())
    monkeypatch.setattr(intake, "committed_after_all", lambda *args: False)  # its look for the row cannot connect
    client = authed(app)
    with open(data_file("photos/chelsea.jpg"), "rb") as fh:
        lost = client.post("/v1/attachments", data={"file": (fh, "chelsea.jpg")}, content_type="multipart/form-data")
    assert lost.status_code == 503 and lost.headers["Retry-After"], lost.json
    assert lost.json["error"] == "outcome_unknown", f"before: {lost.json}"
    assert "may have been accepted" in lost.json["message"] and "Idempotency-Key" in lost.json["message"]
    assert count(engine, attachments) == 1, "it was accepted: processed as any other upload"
