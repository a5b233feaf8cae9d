"""``/v1/uploads``: the tus 1.0 protocol and its extensions, the upload's state, and how it ends.

Against the Flask app in this process, real PostgreSQL and a real storage
directory; the body cut short runs against real gunicorn. The clients
nobody here wrote (tuspy, tus-js-client) are in ``test_tus_clients.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import os
import tempfile
import threading
import time
import uuid

import pytest
from sqlalchemy import delete, func, select, text, update

from app.adapters.postgres.models import (
    attachments,
    idempotency_keys,
    jobs,
    outbox,
    upload_parts,
    uploads,
)
from app.core import intake, resumable
from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig
from tests.conftest import OTHER_UPLOADER_TOKEN, authed
from tests.filesystems import small_filesystem
from tests.processes import wait_for

TUS = {"Tus-Resumable": "1.0.0"}
PART = "application/offset+octet-stream"
PHOTO = "photos/chelsea.jpg"


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def create(client, length: int, *, filename: str | None = "chelsea.jpg", headers=None, **kwargs):
    extra = {"Upload-Metadata": f"filename {b64(filename)},filetype {b64('image/jpeg')}"} if filename else {}
    return client.post("/v1/uploads", headers={**TUS, "Upload-Length": str(length), **extra, **(headers or {})},
                       **kwargs)


def patch(client, location: str, offset: int, data: bytes, headers=None):
    return client.patch(location, data=data, headers={**TUS, "Upload-Offset": str(offset), "Content-Type": PART,
                                                      **(headers or {})})


def send(client, location: str, data: bytes, chunk: int, start: int = 0):
    """PATCH ``data[start:]`` in chunks; the last answer."""
    offset, answer = start, None
    while offset < len(data):
        answer = patch(client, location, offset, data[offset:offset + chunk])
        assert answer.status_code == 204, answer.get_data(as_text=True)
        offset = int(answer.headers["Upload-Offset"])
    return answer


def parts(storage_dir) -> list[str]:
    root = storage_dir / "partial"
    return sorted(str(p.relative_to(storage_dir)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def count(engine, table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


@pytest.fixture
def photo(data_file) -> bytes:
    return data_file(PHOTO).read_bytes()


# --- discovery and the protocol's preconditions --------------------------------------------


def test_options_says_what_the_server_speaks_without_a_token(client, settings):
    answer = client.application.test_client().options("/v1/uploads")
    assert answer.status_code == 204
    assert answer.headers["Tus-Version"] == "1.0.0" and answer.headers["Tus-Resumable"] == "1.0.0"
    assert answer.headers["Tus-Extension"].split(",") == [
        "creation", "creation-with-upload", "termination", "checksum", "expiration"]
    assert answer.headers["Tus-Max-Size"] == str(settings.max_upload_bytes)
    assert answer.headers["Tus-Checksum-Algorithm"].split(",") == ["sha1", "sha256"]


def test_a_token_and_the_protocol_version_are_required(client, engine):
    anonymous = client.application.test_client()
    assert create(anonymous, 100).status_code == 401
    refused = client.post("/v1/uploads", headers={"Upload-Length": "100"})
    assert refused.status_code == 412 and refused.headers["Tus-Version"] == "1.0.0"
    assert create(client, 100, headers={"Tus-Resumable": "0.2.2"}).status_code == 412
    assert count(engine, uploads) == 0


def test_limits_are_checked_at_creation_from_upload_length(client, engine, settings):
    too_large = create(client, settings.max_upload_bytes + 1)
    assert too_large.status_code == 413 and too_large.json["error"] == "too_large"
    assert create(client, settings.max_upload_bytes).status_code == 201, "the limit itself is allowed"
    for length in ("0", "-1", "12abc", ""):
        answer = client.post("/v1/uploads", headers={**TUS, "Upload-Length": length})
        assert answer.status_code == 400, length
    assert client.post("/v1/uploads", headers=TUS).status_code == 400, "no Upload-Length"
    assert client.post("/v1/uploads", headers={**TUS, "Upload-Defer-Length": "1"}).status_code == 400
    assert create(client, 10, filename=None, headers={"Upload-Metadata": "filename not-base64!"}).status_code == 400
    assert count(engine, uploads) == 1


# --- an upload from creation to attachment -------------------------------------------------


def test_chunks_become_one_attachment_through_the_durable_handoff(client, engine, storage_dir, photo):
    created = create(client, len(photo))
    assert created.status_code == 201 and created.headers["Tus-Resumable"] == "1.0.0"
    location = created.headers["Location"]
    assert location.startswith("/v1/uploads/") and "Upload-Expires" in created.headers
    assert "Attachment-Id" not in created.headers

    head = client.head(location, headers=TUS)
    assert head.status_code == 200 and head.headers["Upload-Offset"] == "0"
    assert head.headers["Upload-Length"] == str(len(photo)) and head.headers["Cache-Control"] == "no-store"
    assert head.headers["Upload-Metadata"] == f"filename {b64('chelsea.jpg')},filetype {b64('image/jpeg')}"

    half = len(photo) // 2
    send(client, location, photo[:half], 4096)
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == str(half)
    # partial bytes are in storage under their own prefix, and nothing of them is an attachment
    assert parts(storage_dir) and all(p.startswith("partial/") for p in parts(storage_dir))
    assert [p for p in storage_dir.rglob("*") if p.is_file() and "partial" not in p.parts] == []
    assert count(engine, attachments) == 0

    last = send(client, location, photo, 4096, start=half)
    attachment_id = last.headers["Attachment-Id"]
    assert last.headers["Upload-Offset"] == str(len(photo))
    head = client.head(location, headers=TUS)
    assert head.status_code == 200 and head.headers["Attachment-Id"] == attachment_id
    assert head.headers["Upload-Offset"] == str(len(photo))

    # the same handoff as POST /v1/attachments: staged, recorded, queued, announced
    status = client.get(f"/v1/attachments/{attachment_id}")
    assert status.status_code == 200
    assert (status.json["filename"], status.json["size"], status.json["sha256"]) == (
        "chelsea.jpg", len(photo), hashlib.sha256(photo).hexdigest())
    assert status.json["state"] == "queued"
    with engine.connect() as conn:
        staging_key = conn.execute(select(attachments.c.staging_key)).scalar_one()
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 1
        assert conn.execute(select(func.count()).select_from(outbox)).scalar_one() == 1
    assert (storage_dir / staging_key).read_bytes() == photo
    assert parts(storage_dir) == [], "the parts go once the bytes are staged"


def test_creation_with_upload_takes_the_first_bytes_or_all_of_them(client, engine, photo):
    first = create(client, len(photo), data=photo[:1000], content_type=PART)
    assert first.status_code == 201 and first.headers["Upload-Offset"] == "1000"
    assert "Attachment-Id" not in first.headers
    last = send(client, first.headers["Location"], photo, 64 * 1024, start=1000)
    assert last.headers["Attachment-Id"]

    whole = create(client, len(photo), data=photo, content_type=PART)
    assert whole.status_code == 201 and whole.headers["Upload-Offset"] == str(len(photo))
    assert whole.headers["Attachment-Id"] != last.headers["Attachment-Id"]
    assert count(engine, attachments) == 2
    assert create(client, 10, data=b"0123456789", content_type="image/jpeg").status_code == 415


def test_filename_comes_from_the_metadata_sanitized(client, engine, photo):
    for metadata, expected in ((f"name {b64('../../uppy.jpg')}", "uppy.jpg"), ("", "upload"),
                               (f"filename {b64('tus é.jpg')},name {b64('other.jpg')}", "tus é.jpg")):
        created = create(client, len(photo), filename=None, headers={"Upload-Metadata": metadata},
                         data=photo, content_type=PART)
        assert created.status_code == 201, created.json
        with engine.connect() as conn:
            filename = conn.execute(select(attachments.c.filename).where(
                attachments.c.id == uuid.UUID(created.headers["Attachment-Id"]))).scalar_one()
        assert filename == expected


def test_a_patch_at_the_wrong_offset_or_past_the_length_is_refused(client, storage_dir, photo):
    location = create(client, 100).headers["Location"]
    assert patch(client, location, 0, b"x" * 40).status_code == 204
    behind = patch(client, location, 0, b"y" * 10)
    assert behind.status_code == 409 and behind.json["error"] == "offset_mismatch"
    assert patch(client, location, 50, b"y" * 10).status_code == 409
    past = patch(client, location, 40, b"z" * 61)
    assert past.status_code == 413 and "60 bytes remain" in past.json["message"]
    assert client.patch(location, data=b"z", headers={**TUS, "Upload-Offset": "40"}).status_code == 415
    assert client.patch(location, data=b"z", headers={**TUS, "Content-Type": PART}).status_code == 400
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == "40"
    assert [(storage_dir / p).read_bytes() for p in parts(storage_dir)] == [b"x" * 40]


def test_an_upload_is_stored_in_at_most_its_parts_and_its_rest_in_one_patch_is_always_taken(env, engine,
                                                                                                storage_dir, photo):
    """Each PATCH's bytes are a part, a file: 1,000 PATCHes of one byte took 4 MiB of disk, and the last PATCH
    joined 2,000 parts in 5.7 s under the upload's lock (an adversarial run), within the uploader's byte limits."""
    from app.config import Settings
    from app.web import create_app

    app = create_app(Settings.from_env({**env, "ATTACHE_MAX_PARTS_PER_UPLOAD": "3",
                                        "ATTACHE_MAX_UPLOAD_BYTES": str(3 * 5 * 1024 * 1024)}))
    try:
        client = authed(app)
        location = create(client, len(photo)).headers["Location"]
        send(client, location, photo[:3], chunk=1)
        refused = patch(client, location, 3, photo[3:4])
        assert refused.status_code == 400 and refused.json["error"] == "too_many_parts", refused.json
        assert f"send the {len(photo) - 3} bytes that remain in one PATCH" in refused.json["message"]
        assert client.head(location, headers=TUS).headers["Upload-Offset"] == "3"
        assert len(parts(storage_dir)) == 3
        finished = patch(client, location, 3, photo[3:])
        assert finished.status_code == 204 and finished.headers["Upload-Offset"] == str(len(photo))
        with engine.connect() as conn:
            [(sha256,)] = conn.execute(select(attachments.c.sha256)).all()
        assert sha256 == hashlib.sha256(photo).hexdigest()
    finally:
        app.extensions["attache"].close()


def test_a_part_in_a_content_coding_is_refused_and_the_upload_kept(client, storage_dir, photo):
    import gzip

    location = create(client, len(photo)).headers["Location"]
    refused = patch(client, location, 0, gzip.compress(photo[:100]), headers={"Content-Encoding": "gzip"})
    assert (refused.status_code, refused.json["error"]) == (415, "unsupported_content_encoding"), refused.json
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == "0" and parts(storage_dir) == []


@pytest.mark.parametrize("algorithm", ["sha1", "sha256"])
def test_checksums_are_verified_and_a_mismatch_keeps_nothing(client, storage_dir, photo, algorithm):
    location = create(client, len(photo)).headers["Location"]
    chunk = photo[:5000]
    good = f"{algorithm} {b64(hashlib.new(algorithm, chunk).digest())}"
    bad = f"{algorithm} {b64(hashlib.new(algorithm, b'other').digest())}"
    mismatch = patch(client, location, 0, chunk, {"Upload-Checksum": bad})
    assert mismatch.status_code == 460 and mismatch.json["error"] == "checksum_mismatch"
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == "0" and parts(storage_dir) == []
    assert patch(client, location, 0, chunk, {"Upload-Checksum": good}).status_code == 204
    assert patch(client, location, 5000, b"x", {"Upload-Checksum": f"md5 {b64(b'0' * 16)}"}).status_code == 400
    assert patch(client, location, 5000, b"x", {"Upload-Checksum": f"{algorithm} {b64(b'short')}"}).status_code \
        == 400
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == "5000"


def repr_digest(data: bytes) -> dict[str, str]:
    return {"Repr-Digest": f"sha-256=:{b64(hashlib.sha256(data).digest())}:"}


def test_the_whole_upload_is_checked_against_its_creations_repr_digest(client, engine, storage_dir, photo):
    """Each part's Upload-Checksum says nothing of the whole: parts sent right from a file that changed between two
    sessions of the client made an attachment of bytes nobody had. The creation's Repr-Digest is the whole's."""
    changed = photo[:-100] + bytes(100)
    location = create(client, len(photo), headers=repr_digest(photo)).headers["Location"]
    assert patch(client, location, 0, changed[:5000]).status_code == 204
    refused = patch(client, location, 5000, changed[5000:])
    assert refused.status_code == 422 and refused.json["error"] == "digest_mismatch", refused.get_data(as_text=True)
    assert count(engine, attachments) == 0 and count(engine, uploads) == 0 and parts(storage_dir) == [], \
        "the upload is terminated and nothing of it stays"
    assert not (storage_dir / "staging").exists() or not list((storage_dir / "staging").iterdir())
    location = create(client, len(photo), headers=repr_digest(photo)).headers["Location"]
    done = send(client, location, photo, 5000)
    assert done.headers["Attachment-Id"] and count(engine, attachments) == 1


@pytest.mark.parametrize("header, code", [
    ("sha-256=:not base64!:", "bad_digest_header"),
    ("sha-256=:" + base64.b64encode(b"short").decode() + ":", "bad_digest_header"),
    ("sha-512=:" + base64.b64encode(bytes(64)).decode() + ":", "unsupported_digest"),
])
def test_a_repr_digest_that_cannot_be_checked_is_refused_at_creation(client, engine, photo, header, code):
    refused = create(client, len(photo), headers={"Repr-Digest": header})
    assert refused.status_code == 400 and refused.json["error"] == code
    assert count(engine, uploads) == 0


def test_a_refused_creation_with_upload_leaves_no_upload_behind(client, engine, storage_dir, photo):
    """Before, the upload was made, its body refused (a checksum mismatch, a body past Upload-Length) and the answer
    carried no Location: an upload nobody could reach, counted against its uploader until it expired."""
    bad = f"sha256 {b64(hashlib.sha256(b'other').digest())}"
    mismatch = create(client, len(photo), data=photo[:5000], content_type=PART, headers={"Upload-Checksum": bad})
    assert mismatch.status_code == 460 and "Location" not in mismatch.headers
    past = create(client, 10, data=photo[:5000], content_type=PART)
    assert past.status_code == 413 and "Location" not in past.headers
    assert count(engine, uploads) == 0 and parts(storage_dir) == []
    kept = create(client, len(photo), data=photo[:5000], content_type=PART)
    assert kept.status_code == 201 and count(engine, uploads) == 1, "an accepted creation's upload stays"


def test_an_image_refused_at_the_last_byte_ends_the_upload(client, engine, storage_dir, data_file):
    svg = data_file("synthetic/vector_logo.svg").read_bytes()
    location = create(client, len(svg)).headers["Location"]
    assert patch(client, location, 0, svg[:10]).status_code == 204
    refused = patch(client, location, 10, svg[10:])
    assert refused.status_code == 415 and refused.json["error"] == "unsupported_format"
    assert client.head(location, headers=TUS).status_code == 404
    assert count(engine, attachments) == 0 and count(engine, uploads) == 0 and parts(storage_dir) == []


def test_no_room_to_join_the_parts_is_a_503_that_keeps_the_upload(client, engine, storage_dir, photo, monkeypatch):
    """The last PATCH's body fits in the web's temporary directory but the parts joined do not: a 503 whose retry
    finishes the upload. A full disk ended the upload and removed the bytes its 204s had acknowledged (an
    adversarial review); closing the joined spool then raised ENOSPC again, in place of the 503."""
    location = create(client, len(photo)).headers["Location"]
    first = len(photo) - 5000
    assert patch(client, location, 0, photo[:first]).status_code == 204
    with small_filesystem(16 * 1024) as tmp:  # the last 5,000 bytes take two pages; the joined file, nine
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        state = client.application.extensions["attache"]  # no floor: the write that fails is refused
        monkeypatch.setattr(state, "settings", dataclasses.replace(state.settings, spool_min_free_bytes=0))
        refused = patch(client, location, first, photo[first:])
        assert refused.status_code == 503 and refused.json["error"] == "spool_unavailable"
        assert "Retry-After" in refused.headers
        assert list(tmp.iterdir()) == [], "the request's spools are removed"
        monkeypatch.undo()
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == str(first)
    assert count(engine, attachments) == 0
    done = patch(client, location, first, photo[first:])
    assert done.status_code == 204 and done.headers["Upload-Offset"] == str(len(photo))
    assert count(engine, attachments) == 1 and parts(storage_dir) == []


def _end_the_patchs_session(engine) -> int:
    """End the sessions idle in a transaction (the PATCH's, holding its row's lock): a failover, a frozen machine
    whose session the server dropped."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' AND pid <> pg_backend_pid()")).scalar()


def test_a_connection_lost_in_the_last_patch_commits_nothing_and_its_retry_finishes_the_upload(
        client, engine, storage_dir, photo, monkeypatch):
    """The last byte's attachment, job and outbox row are written in the PATCH's own transaction: its connection
    lost (a failover, a pooler restarted) leaves neither an attachment nor a completed upload, nor staged bytes,
    and the client's retry finishes it. (When the handoff committed on a connection of its own, the row's update
    could be lost after it; and a PATCH whose session had ended could make an attachment of bytes another PATCH's
    204 had contradicted.)"""
    real = intake.record

    def lose_the_connection_then_record(conn, *args, **kwargs):
        assert _end_the_patchs_session(engine) == 1
        return real(conn, *args, **kwargs)

    location = create(client, len(photo)).headers["Location"]
    assert patch(client, location, 0, photo[:1000]).status_code == 204
    monkeypatch.setattr(intake, "record", lose_the_connection_then_record)
    lost = patch(client, location, 1000, photo[1000:])
    assert lost.status_code == 503 and lost.json["error"] == "database_unavailable", lost.json
    monkeypatch.undo()
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == "1000"
    assert count(engine, attachments) == 0 and not list((storage_dir / "staging").glob("*"))
    assert len(parts(storage_dir)) == 1, "the acknowledged part stays; the lost PATCH's went with its rollback"
    last = patch(client, location, 1000, photo[1000:])
    assert last.status_code == 204 and last.headers["Attachment-Id"], last.json
    assert client.head(location, headers=TUS).headers["Attachment-Id"] == last.headers["Attachment-Id"]
    assert count(engine, attachments) == 1 and parts(storage_dir) == []


def test_a_creation_with_upload_whose_database_went_away_keeps_the_upload_and_says_where_it_is(
        client, engine, storage_dir, photo, monkeypatch):
    """A creation-with-upload of the whole file whose transaction's outcome is unknown (its COMMIT's answer lost, the
    database gone a while) was answered 503 with no Location and the upload cancelled: its attachment, made after
    all, was one the client could never learn of, and its retry made a second (an adversarial run). Now the 503
    names the upload, whose HEAD says where it stands: here its connection was lost before the COMMIT, so nothing
    of it landed, and the client finishes it."""
    real = intake.record

    def lose_the_connection_then_record(conn, *args, **kwargs):
        assert _end_the_patchs_session(engine) == 1
        return real(conn, *args, **kwargs)

    monkeypatch.setattr(intake, "record", lose_the_connection_then_record)
    lost = create(client, len(photo), data=photo, content_type=PART)
    monkeypatch.undo()
    assert lost.status_code == 503 and lost.headers.get("Location"), (lost.status_code, dict(lost.headers))
    assert client.head(lost.headers["Location"], headers=TUS).headers["Upload-Offset"] == "0"
    done = patch(client, lost.headers["Location"], 0, photo)
    assert done.status_code == 204 and done.headers["Attachment-Id"], done.json
    assert count(engine, attachments) == 1 and count(engine, uploads) == 1


def test_a_last_patch_that_lost_its_session_while_joining_makes_no_attachment(client, engine, storage_dir, photo,
                                                                             monkeypatch):
    """A last PATCH paused while it joins the parts (a frozen machine) whose session ends meanwhile has lost the
    row's lock: another PATCH sends other bytes at its offset and is answered 204. Thawed, the last PATCH made an
    attachment of its own bytes, contradicting that 204, and completed the upload past its offset (an adversarial
    run), when its handoff committed in a transaction of its own. Now it commits nothing, and the upload goes on
    from the 204's offset."""
    first, second = 1000, 3000
    location = create(client, len(photo)).headers["Location"]
    assert patch(client, location, 0, photo[:first]).status_code == 204
    paused, thaw = threading.Event(), threading.Event()
    real = resumable._copy_parts

    def pausing(*args, **kwargs):
        if not paused.is_set():
            paused.set()
            assert thaw.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(resumable, "_copy_parts", pausing)
    other = photo[first:-2000] + bytes(255 - b for b in photo[-2000:-2]) + photo[-2:]  # an image still, other bytes
    answers = {}
    auth = {"Authorization": client.environ_base["HTTP_AUTHORIZATION"]}
    thawed = threading.Thread(target=lambda: answers.setdefault(
        "last", patch(client.application.test_client(), location, first, other, auth)))
    thawed.start()
    try:
        assert paused.wait(30)
        assert _end_the_patchs_session(engine) == 1
        acknowledged = patch(client, location, first, photo[first:second])
        assert acknowledged.status_code == 204, acknowledged.json
    finally:
        thaw.set()
        thawed.join(30)
    monkeypatch.undo()
    assert answers["last"].status_code == 503, answers["last"].json
    assert count(engine, attachments) == 0, "before: an attachment of the paused PATCH's bytes"
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == str(second)
    done = patch(client, location, second, photo[second:])
    assert done.status_code == 204, done.json
    with engine.connect() as conn:
        made = conn.execute(select(attachments.c.sha256, attachments.c.staging_key)).one()
    assert made.sha256 == hashlib.sha256(photo).hexdigest()
    assert parts(storage_dir) == [], "the paused PATCH's part and staged bytes went with its rollback"
    assert [str(p.relative_to(storage_dir)) for p in (storage_dir / "staging").glob("*")] == [made.staging_key]


@pytest.mark.parametrize("slow", ["joining the parts", "storing a part and the staged bytes"])
def test_a_last_patch_on_slow_storage_outlasts_the_idle_bound_of_its_transaction(client, storage_dir, photo,
                                                                               monkeypatch, slow):
    """The web's transactions may idle 120 s at most (a process paused in one is gone, its locks freed). A last
    PATCH reads the parts from storage and stages the whole under its row's lock, in its transaction: on storage
    slower than 0.4 MB/s a 50 MB upload's join outlasted the bound every time, and every retry of the PATCH was
    answered 503. A working process keeps its transaction alive; here the bound is 2 s and storage 3 s slow."""
    from app.adapters.postgres.db import make_engine

    web = client.application.extensions["attache"]
    web.__dict__["engine"] = bounded = make_engine(web.database_url, process="web", idle_in_transaction_seconds=2)
    storage = web.storage
    slowed = {"joining the parts": (resumable, "_copy_parts"),
              "storing a part and the staged bytes": (storage, "adopt_file")}[slow]
    real = getattr(*slowed)

    def slowly(*args, **kwargs):
        time.sleep(3)
        return real(*args, **kwargs)

    try:
        location = create(client, len(photo)).headers["Location"]
        assert patch(client, location, 0, photo[:1000]).status_code == 204
        monkeypatch.setattr(*slowed, slowly)
        last = patch(client, location, 1000, photo[1000:])
        assert last.status_code == 204, f"before: cut by the idle bound: {last.status_code} {last.json}"
        monkeypatch.undo()
        with bounded.connect() as conn:
            made = conn.execute(select(attachments.c.sha256)).scalar_one()
        assert made == hashlib.sha256(photo).hexdigest()
        assert client.head(location, headers=TUS).headers["Upload-Offset"] == str(len(photo))
    finally:
        bounded.dispose()


def test_a_last_patch_whose_connection_is_lost_while_storage_works_is_a_503_and_stays_resumable(
        client, engine, storage_dir, photo, monkeypatch):
    """A re-attack of the beat above: PostgreSQL's connection lost while the join read slow storage (a failover, a
    proxy cut) failed the beat, and the PATCH's next statement raised SQLAlchemy's PendingRollbackError, which
    nothing translated: 500. Now a failed beat is the database's loss: 503, the upload where it was."""
    from app.adapters.postgres.db import make_engine

    web = client.application.extensions["attache"]
    web.__dict__["engine"] = bounded = make_engine(web.database_url, process="web", idle_in_transaction_seconds=2)
    real = resumable._copy_parts

    def lost_while_slow(*args, **kwargs):
        assert _end_the_patchs_session(engine) == 1
        time.sleep(1.5)  # storage at work; a beat fails meanwhile
        return real(*args, **kwargs)

    try:
        location = create(client, len(photo)).headers["Location"]
        assert patch(client, location, 0, photo[:1000]).status_code == 204
        monkeypatch.setattr(resumable, "_copy_parts", lost_while_slow)
        lost = patch(client, location, 1000, photo[1000:])
        assert lost.status_code == 503 and lost.json["error"] == "database_unavailable", \
            f"before: {lost.status_code} {lost.get_data(as_text=True)[:200]}"
        monkeypatch.undo()
        assert client.head(location, headers=TUS).headers["Upload-Offset"] == "1000"
        assert patch(client, location, 1000, photo[1000:]).status_code == 204
        assert count(engine, attachments) == 1
    finally:
        bounded.dispose()


def test_a_first_part_that_is_no_image_ends_the_upload_before_the_rest_is_sent(client, engine, storage_dir,
                                                                              data_file, photo):
    """Its first 64 bytes claim no accepted format: 415 at the first PATCH, not after the last of 10 MB."""
    svg = data_file("synthetic/vector_logo.svg").read_bytes()
    assert len(svg) > 64
    location = create(client, 10 * 1024 * 1024).headers["Location"]
    refused = patch(client, location, 0, svg)
    assert refused.status_code == 415 and refused.json["error"] == "unsupported_format"
    assert client.head(location, headers=TUS).status_code == 404
    assert count(engine, uploads) == 0 and parts(storage_dir) == []
    with_creation = create(client, 10 * 1024 * 1024, data=svg[:64], content_type=PART)
    assert with_creation.status_code == 415 and with_creation.json["error"] == "unsupported_format"
    assert count(engine, uploads) == 0 and parts(storage_dir) == []
    # an image's first 64 bytes are taken, and so is a first part too short to tell (the last byte decides)
    assert patch(client, create(client, len(photo)).headers["Location"], 0, photo[:64]).status_code == 204
    assert patch(client, create(client, len(photo)).headers["Location"], 0, svg[:63]).status_code == 204
    assert count(engine, attachments) == 0


def test_termination_removes_the_upload_and_its_bytes(client, engine, storage_dir, photo):
    location = create(client, len(photo)).headers["Location"]
    send(client, location, photo[:3000], 1000)
    assert len(parts(storage_dir)) == 3
    assert client.delete(location, headers=TUS).status_code == 204
    assert client.head(location, headers=TUS).status_code == 404
    assert patch(client, location, 3000, photo[3000:4000]).status_code == 404
    assert parts(storage_dir) == [] and count(engine, uploads) == 0


def test_an_upload_is_its_owners_only(client, photo):
    location = create(client, len(photo)).headers["Location"]
    bob = authed(client.application, OTHER_UPLOADER_TOKEN)
    assert bob.head(location, headers=TUS).status_code == 404
    assert patch(bob, location, 0, photo[:10]).status_code == 404
    assert bob.delete(location, headers=TUS).status_code == 404
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == "0"
    assert client.head(f"/v1/uploads/{uuid.uuid4()}", headers=TUS).status_code == 404


def test_another_uploaders_requests_never_meet_the_uploads_lock(client, engine, photo):
    """The lock was taken before the owner was looked at: another uploader's DELETE of an upload being written was
    ``423`` (its existence told: an unknown id is ``404``), and the DELETE's own moment under the lock was a ``423``
    to the owner's PATCH (an adversarial run)."""
    location = create(client, len(photo)).headers["Location"]
    upload_id = uuid.UUID(location.rsplit("/", 1)[1])
    bob = authed(client.application, OTHER_UPLOADER_TOKEN)
    with engine.begin() as conn:  # a request of the owner's, writing the upload
        conn.execute(select(uploads.c.id).where(uploads.c.id == upload_id).with_for_update())
        assert bob.delete(location, headers=TUS).status_code == 404
        assert patch(bob, location, 0, photo[:10]).status_code == 404
        assert client.delete(location, headers=TUS).status_code == 423, "the owner's own request meets the lock"
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == "0"


def test_a_browser_session_needs_its_csrf_token_to_write(client, photo):
    from tests.test_upload_page import csrf_meta, signed_in

    browser = signed_in(client.application)
    assert create(browser, len(photo)).status_code == 403
    csrf = csrf_meta(browser.get("/").text)
    created = create(browser, len(photo), headers={"X-CSRF-Token": csrf})
    assert created.status_code == 201
    location = created.headers["Location"]
    assert browser.head(location, headers=TUS).status_code == 200, "HEAD is safe: no token needed"
    assert patch(browser, location, 0, photo[:10]).status_code == 403
    assert patch(browser, location, 0, photo[:10], {"X-CSRF-Token": csrf}).status_code == 204


# --- concurrency and crashes ------------------------------------------------------------------


def test_two_patches_at_the_same_offset_never_both_append(client, engine, storage_dir, photo):
    """A PATCH finding another request writing the upload answers ``423`` at once (tus clients retry it) instead
    of waiting for the row's lock: waiters each held a database connection, and the last PATCH, which needs more
    for its handoff while it holds the lock, waited for the pool's whole timeout behind them (an adversarial run:
    25 PATCHes of one upload, every answer after 30 s, six 503s). Before: both waited, then 204 and 409."""
    location = create(client, len(photo)).headers["Location"]
    upload_id = uuid.UUID(location.rsplit("/", 1)[1])
    answers = {}

    def send_one(size):
        answers[size] = patch(client.application.test_client(), location, 0, photo[:size],
                              {"Authorization": client.environ_base["HTTP_AUTHORIZATION"]})

    with engine.connect() as holder:  # another request writing the upload
        holder.execute(select(uploads).where(uploads.c.id == upload_id).with_for_update())
        threads = [threading.Thread(target=send_one, args=(size,)) for size in (1000, 2000)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert not any(thread.is_alive() for thread in threads), "a PATCH waits for the row's lock"
        holder.rollback()
    assert sorted((a.status_code, a.json["error"]) for a in answers.values()) == [(423, "upload_locked")] * 2
    assert parts(storage_dir) == [] and client.head(location, headers=TUS).headers["Upload-Offset"] == "0"
    threads = [threading.Thread(target=send_one, args=(size,)) for size in (1000, 2000)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    statuses = sorted(a.status_code for a in answers.values())
    assert statuses in ([204, 409], [204, 423]), statuses
    winner = next(size for size, a in answers.items() if a.status_code == 204)
    assert client.head(location, headers=TUS).headers["Upload-Offset"] == str(winner)
    assert [(storage_dir / p).read_bytes() for p in parts(storage_dir)] == [photo[:winner]]


def test_a_patch_that_lost_its_session_while_storing_its_part_cannot_replace_an_acknowledged_one(
        client, engine, storage_dir, photo, monkeypatch):
    """A PATCH paused while it stores its part (a frozen machine) whose session ends meanwhile (the server drops a
    silent client; a failover) has lost the row's lock: another PATCH takes the offset and is answered 204. Parts
    were keyed by their offset alone, so the thawed PATCH replaced the acknowledged part with its own bytes, and the
    upload was accepted spliced: its original was bytes no 204 had acknowledged (an adversarial run; with S3 the
    window is the part's whole transfer). Now each part has a key of its own and only the parts the row names are
    joined."""
    from app.adapters.storage.filesystem import FilesystemStorage

    location = create(client, len(photo)).headers["Location"]
    first = len(photo) // 2
    other = photo[:64] + bytes(reversed(photo[64:first]))  # what the paused PATCH sends: same length, other bytes
    paused, thaw = threading.Event(), threading.Event()
    real = FilesystemStorage.adopt_file

    def pausing(self, key, path, content_type=None):
        if not paused.is_set():  # the first PATCH's only
            paused.set()
            assert thaw.wait(30)
        return real(self, key, path, content_type)

    monkeypatch.setattr(FilesystemStorage, "adopt_file", pausing)
    answers = {}
    auth = {"Authorization": client.environ_base["HTTP_AUTHORIZATION"]}
    thawed = threading.Thread(target=lambda: answers.setdefault(
        "paused", patch(client.application.test_client(), location, 0, other, auth)))
    thawed.start()
    try:
        assert paused.wait(30)
        with engine.connect() as conn:  # the paused PATCH's session ends: its lock on the row goes with it
            ended = conn.execute(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction' AND pid <> pg_backend_pid()"))
            assert ended.scalar() == 1
        acknowledged = patch(client, location, 0, photo[:first])
        assert acknowledged.status_code == 204, acknowledged.json
    finally:
        thaw.set()
        thawed.join(30)
    assert answers["paused"].status_code == 503, answers["paused"].json
    last = patch(client, location, first, photo[first:])
    assert last.status_code == 204, last.json
    with engine.connect() as conn:
        sha256 = conn.execute(select(attachments.c.sha256)).scalar_one()
    assert sha256 == hashlib.sha256(photo).hexdigest(), "the original is the bytes the 204s acknowledged"
    assert parts(storage_dir) == [], "the paused PATCH's part went with its failed transaction"


def test_a_retried_last_patch_after_a_lost_answer_makes_no_second_attachment(client, engine, storage_dir, photo):
    """The web died after the handoff committed but before the upload's row said so: the client retries."""
    location = create(client, len(photo)).headers["Location"]
    upload_id = uuid.UUID(location.rsplit("/", 1)[1])
    half = len(photo) // 2
    send(client, location, photo[:half], 1 << 20)
    first = patch(client, location, half, photo[half:])
    attachment_id = first.headers["Attachment-Id"]
    with engine.begin() as conn:  # the rows as they were before the lost COMMIT
        conn.execute(update(uploads).where(uploads.c.id == upload_id).values(upload_offset=half, attachment_id=None))
        conn.execute(delete(upload_parts).where(upload_parts.c.upload_id == upload_id, upload_parts.c.offset > 0))
        token = conn.execute(select(upload_parts.c.token)).scalar_one()
    (storage_dir / resumable.part_key(upload_id, 0, token)).write_bytes(photo[:half])

    retried = patch(client, location, half, photo[half:])
    assert retried.status_code == 204 and retried.headers["Attachment-Id"] == attachment_id
    assert count(engine, attachments) == 1 and count(engine, jobs) == 1
    with engine.connect() as conn:
        assert conn.execute(select(idempotency_keys.c.key)).scalar_one() == resumable.handoff_key(upload_id)


# --- expiry and the staging cleanup -------------------------------------------------------


def test_an_expired_upload_is_gone_and_the_staging_cleanup_removes_its_bytes(client, services, engine, storage_dir,
                                                                           photo):
    expiring = create(client, len(photo)).headers["Location"]
    send(client, expiring, photo[:2000], 1000)
    live = create(client, len(photo)).headers["Location"]
    send(client, live, photo[:1000], 1000)
    finished = create(client, len(photo), data=photo, content_type=PART)
    expiring_id = uuid.UUID(expiring.rsplit("/", 1)[1])
    with engine.begin() as conn:
        conn.execute(update(uploads).where(uploads.c.id == expiring_id)
                     .values(expires_at=func.now() - text("interval '1 second'")))
    assert client.head(expiring, headers=TUS).status_code == 410
    assert patch(client, expiring, 2000, photo[2000:3000]).status_code == 410
    # a leftover part of the finished upload, and one of an upload nobody remembers
    finished_id = uuid.UUID(finished.headers["Location"].rsplit("/", 1)[1])
    services.storage.put_bytes(resumable.part_key(finished_id, 0), b"left behind")
    services.storage.put_bytes(resumable.part_key(uuid.uuid4(), 0), b"orphan")

    cleanup = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=3600))
    assert cleanup.run_once(dry_run=True)["uploads_expired"] == 1
    assert len(parts(storage_dir)) == 5
    counts = cleanup.run_once()
    assert (counts["uploads_expired"], counts["parts_removed"]) == (1, 2)
    kept, = parts(storage_dir)
    assert kept.startswith(f"partial/{live.rsplit('/', 1)[1]}/{0:020d}."), "the live upload keeps its bytes"
    assert client.head(expiring, headers=TUS).status_code == 404
    assert client.head(live, headers=TUS).headers["Upload-Offset"] == "1000"
    assert client.head(finished.headers["Location"], headers=TUS).headers["Attachment-Id"] == \
        finished.headers["Attachment-Id"]
    assert count(engine, attachments) == 1


def test_an_upload_made_before_its_parts_were_named_is_finished_from_its_offset_keyed_parts(client, engine,
                                                                                          storage_dir, photo):
    """An upload whose first PATCHes an earlier release stored (parts keyed by offset alone, no upload_parts row)
    goes on from where it was after the upgrade, and its bytes are joined whole."""
    location = create(client, len(photo)).headers["Location"]
    upload_id = uuid.UUID(location.rsplit("/", 1)[1])
    half = len(photo) // 2
    with engine.begin() as conn:  # what an earlier release's PATCH left: the offset moved, the part under it
        conn.execute(update(uploads).where(uploads.c.id == upload_id).values(upload_offset=half))
    legacy = storage_dir / resumable.part_key(upload_id, 0)
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(photo[:half])
    done = patch(client, location, half, photo[half:])
    assert done.status_code == 204, done.json
    with engine.connect() as conn:
        assert conn.execute(select(attachments.c.sha256)).scalar_one() == hashlib.sha256(photo).hexdigest()
    assert parts(storage_dir) == []


def test_a_part_an_earlier_release_stored_in_a_new_upload_is_joined(client, engine, storage_dir, photo):
    """While a deploy replaces the webs, an earlier release's web may take a PATCH of an upload a new one made: it
    stores its part under the offset alone and names it nowhere. The new web's last PATCH joins it with the named
    ones (before: "bytes missing", and the upload was ended)."""
    location = create(client, len(photo)).headers["Location"]
    upload_id = uuid.UUID(location.rsplit("/", 1)[1])
    first, second = 1000, 3000
    assert patch(client, location, 0, photo[:first]).status_code == 204
    with engine.begin() as conn:  # what the earlier release's PATCH left: the offset moved, its part under it
        conn.execute(update(uploads).where(uploads.c.id == upload_id).values(upload_offset=second))
    (storage_dir / resumable.part_key(upload_id, first)).write_bytes(photo[first:second])
    done = patch(client, location, second, photo[second:])
    assert done.status_code == 204, done.json
    with engine.connect() as conn:
        assert conn.execute(select(attachments.c.sha256)).scalar_one() == hashlib.sha256(photo).hexdigest()


def test_the_staging_cleanup_removes_a_part_no_row_names_once_the_offset_has_passed_it(client, services, engine,
                                                                                     storage_dir, photo):
    """A part whose PATCH never committed (its session ended, its answer lost) is named by no row: once the
    upload's offset has passed it no PATCH writes there again, and the cleanup removes it within a round, not a day
    later with the upload. The named part and one at the offset (a PATCH may be storing it) stay."""
    location = create(client, len(photo)).headers["Location"]
    upload_id = uuid.UUID(location.rsplit("/", 1)[1])
    send(client, location, photo[:1000], 1000)
    named, = parts(storage_dir)
    stale = resumable.part_key(upload_id, 0, uuid.uuid4().hex)
    writing = resumable.part_key(upload_id, 1000, uuid.uuid4().hex)
    services.storage.put_bytes(stale, b"a PATCH that lost its session")
    services.storage.put_bytes(writing, b"a PATCH storing its part")

    counts = StagingCleanup(services.engine, services.storage, StagingCleanupConfig(grace_seconds=3600)).run_once()
    assert counts["parts_removed"] == 1
    assert parts(storage_dir) == sorted([named, writing])
    assert patch(client, location, 1000, photo[1000:]).status_code == 204
    with engine.connect() as conn:
        assert conn.execute(select(attachments.c.sha256)).scalar_one() == hashlib.sha256(photo).hexdigest()


def test_the_expiry_index_serves_the_cleanup(engine):
    from tests.test_maintenance import explain

    with engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")
        plan = explain(conn, select(uploads.c.id).where(uploads.c.expires_at <= func.now())
                       .order_by(uploads.c.expires_at).limit(200))
    assert "uploads_expires_idx" in plan and "Seq Scan" not in plan, plan


# --- a body cut short, against real gunicorn -----------------------------------------------


@pytest.mark.processes
def test_a_patch_cut_short_keeps_the_bytes_that_arrived(web, photo):
    import requests

    headers = {**TUS, "Authorization": f"Bearer {web.token}"}
    created = requests.post(web.url + "/v1/uploads", headers={**headers, "Upload-Length": str(len(photo))},
                            timeout=10)
    location = created.headers["Location"]
    sent = 7000
    _cut_short(web, f"PATCH {location}", "Upload-Offset: 0", photo, sent)  # the phone went into a tunnel

    def offset():
        return int(requests.head(web.url + location, headers=headers, timeout=10).headers["Upload-Offset"])

    assert wait_for(offset, timeout=20, message="the bytes that arrived to be kept") == sent
    _resumed(web, location, photo, sent)


def _cut_short(web, request: str, header: str, photo: bytes, sent: int) -> tuple[int, dict[str, str]]:
    """``request`` (method and path) with ``header``, declaring all of ``photo`` and sending ``sent`` bytes of it
    before the client stops sending; the answer."""
    import socket

    head = (f"{request} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {web.token}\r\n"
            f"Tus-Resumable: 1.0.0\r\n{header}\r\nContent-Type: {PART}\r\n"
            f"Content-Length: {len(photo)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
        sock.sendall(head.encode() + photo[:sent])
        sock.shutdown(socket.SHUT_WR)
        [answer] = _answers(sock, 1)
    return answer


def _resumed(web, location: str, photo: bytes, sent: int) -> None:
    """The rest of ``photo`` sent from ``sent``: the upload ends as an attachment of exactly its bytes."""
    import requests

    rest = requests.patch(web.url + location, data=photo[sent:], timeout=30,
                          headers={**TUS, "Authorization": f"Bearer {web.token}", "Upload-Offset": str(sent),
                                   "Content-Type": PART})
    assert rest.status_code == 204 and rest.headers["Attachment-Id"]
    assert web.status(rest.headers["Attachment-Id"])["sha256"] == hashlib.sha256(photo).hexdigest()


def test_a_chunked_patch_past_the_upload_length_says_how_many_bytes_remain(web):
    """Its 413 said "the upload is larger than the limit of 60 bytes": the bytes remaining, named as the upload
    limit (an adversarial run)."""
    import requests

    headers = {**TUS, "Authorization": f"Bearer {web.token}"}
    location = requests.post(web.url + "/v1/uploads", headers={**headers, "Upload-Length": "100"},
                             timeout=10).headers["Location"]
    assert requests.patch(web.url + location, data=b"x" * 40, timeout=10,
                          headers={**headers, "Upload-Offset": "0", "Content-Type": PART}).status_code == 204
    past = requests.patch(web.url + location, data=iter([b"\xff\xd8" + b"z" * 59]), timeout=10,
                          headers={**headers, "Upload-Offset": "40", "Content-Type": PART})
    assert past.status_code == 413 and "60 bytes remain" in past.json()["message"], past.text
    assert "limit" not in past.json()["message"]


@pytest.mark.parametrize("declared_more", [0, 10])
def test_a_last_patch_whose_framing_breaks_after_its_last_byte_never_ends_the_upload(web, data_file, declared_more):
    """A last PATCH sent chunked, every byte the upload lacked there but its framing cut: before its terminating
    chunk, or in a chunk that declared 10 bytes more. The upload was completed and went ``ready`` while the PATCH
    was answered ``400 incomplete_body`` (an adversarial run); then completed and answered ``204``, so a body that
    meant to go past Upload-Length (``413`` when it arrives whole) was taken cut at it (a re-attack). A cut body
    never ends an upload: nothing of it is kept, and the resume ends it."""
    import socket

    import requests

    photo = data_file("photos/hubble_deep_field.jpg").read_bytes()  # 265 KB
    headers = {**TUS, "Authorization": f"Bearer {web.token}"}
    location = requests.post(web.url + "/v1/uploads", headers={**headers, "Upload-Length": str(len(photo))},
                             timeout=10).headers["Location"]
    last = 2 * 65536  # the rest, a whole number of the body's reads: the end of the framing was read for
    first = requests.patch(web.url + location, data=photo[:-last], timeout=30,
                           headers={**headers, "Upload-Offset": "0", "Content-Type": PART})
    assert first.status_code == 204
    head = (f"PATCH {location} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {web.token}\r\n"
            f"Tus-Resumable: 1.0.0\r\nUpload-Offset: {len(photo) - last}\r\nContent-Type: {PART}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"%x\r\n" % (last + declared_more) + photo[-last:]
                     + (b"" if declared_more else b"\r\n"))  # no 0\r\n\r\n
        sock.shutdown(socket.SHUT_WR)
        [(status, answer)] = _answers(sock, 1)
    assert status == 400 and "attachment-id" not in answer, (status, answer)
    assert answer["upload-offset"] == str(len(photo) - last)  # where to resume (only in the message before)
    kept = requests.head(web.url + location, headers=headers, timeout=10)
    assert kept.headers["Upload-Offset"] == str(len(photo) - last) and "Attachment-Id" not in kept.headers
    _resumed(web, location, photo, len(photo) - last)


def test_a_creation_with_upload_cut_short_says_where_the_upload_is(web, photo):
    """The creation made the upload and kept the bytes that arrived, and its answer (``400 incomplete_body``)
    told the client to resume at their offset, but not where the upload was: no ``Location`` (an adversarial
    run). The upload could not be resumed, and its bytes waited a day for the expiry."""
    sent = 7000
    status, answer = _cut_short(web, "POST /v1/uploads", f"Upload-Length: {len(photo)}", photo, sent)
    assert status == 400 and "location" in answer, answer
    assert answer["upload-offset"] == str(sent)
    _resumed(web, answer["location"], photo, sent)


@pytest.mark.parametrize("coding", ["Chunked", "CHUNKED"])
def test_a_creation_with_upload_sent_chunked_in_any_case_takes_its_body(web, photo, coding):
    """``Transfer-Encoding`` is case-insensitive, as gunicorn reads it: a creation sent ``Chunked`` was answered
    201 with its body ignored (no Upload-Offset, nothing kept), and its Content-Type went unchecked (an
    adversarial run)."""
    import socket

    head = (f"POST /v1/uploads HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {web.token}\r\n"
            f"Tus-Resumable: 1.0.0\r\nUpload-Length: {len(photo)}\r\nTransfer-Encoding: {coding}\r\n")
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(photo), photo)
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
        sock.sendall(f"{head}Content-Type: text/plain\r\n\r\n".encode() + body)
        [(refused, _)] = _answers(sock, 1)
    assert refused == 415
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
        sock.sendall(f"{head}Content-Type: {PART}\r\nConnection: close\r\n\r\n".encode() + body)
        [(status, answer)] = _answers(sock, 1)
    assert (status, answer.get("upload-offset")) == (201, str(len(photo))), answer
    assert web.status(answer["attachment-id"])["sha256"] == hashlib.sha256(photo).hexdigest()


def _answers(sock, count: int) -> list[tuple[int, dict[str, str]]]:
    """``count`` HTTP/1.1 answers read off one connection: (status, headers) each; every body is JSON or empty."""
    answers, data = [], b""
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed after {len(answers)} answers"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(data) < length:
            data += sock.recv(65536)
        data = data[length:]
        answers.append((int(lines[0].split()[1]), headers))
    return answers


def _created_over_http(web, length: int) -> str:
    import requests

    created = requests.post(web.url + "/v1/uploads", timeout=10,
                            headers={**TUS, "Authorization": f"Bearer {web.token}", "Upload-Length": str(length)})
    assert created.status_code == 201, created.text
    return created.headers["Location"]


@pytest.mark.processes
def test_a_body_of_exactly_the_upload_limit_is_taken_and_the_next_request_on_its_connection_too(env, tmp_path,
                                                                                                  photo):
    """The limit itself is allowed (Tus-Max-Size): werkzeug's max-length stream refused a body that reached it
    exactly, when its reader asked for more to see it end. Two requests and a third sent back to back on one
    connection: reading the first body in blocks takes nothing of the next request."""
    import random
    import socket

    from tests.processes import Deployment

    limit = 1024 * 1024 + 4321  # past one 1 MiB read block (app.web.body)
    web = Deployment(env, tmp_path)
    web.start("web", ATTACHE_MAX_UPLOAD_BYTES=str(limit))
    try:
        files = [photo + random.Random(seed).randbytes(limit - len(photo)) for seed in (1, 2)]
        auth = f"Authorization: Bearer {web.token}\r\nTus-Resumable: 1.0.0\r\nContent-Type: {PART}\r\n"
        location = _created_over_http(web, limit)
        patch_whole = (f"PATCH {location} HTTP/1.1\r\nHost: x\r\n{auth}Upload-Offset: 0\r\n"
                       f"Content-Length: {limit}\r\n\r\n").encode() + files[0]
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(files[1][i:i + 300_000]), files[1][i:i + 300_000])
                          for i in range(0, limit, 300_000))
        create_whole = (f"POST /v1/uploads HTTP/1.1\r\nHost: x\r\n{auth}Upload-Length: {limit}\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n"
        health = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
            sock.sendall(patch_whole + create_whole + health)
            (patched, patched_headers), (created, created_headers), (healthy, _) = _answers(sock, 3)
        assert (patched, patched_headers.get("upload-offset")) == (204, str(limit)), patched_headers
        assert (created, created_headers.get("upload-offset")) == (201, str(limit)), created_headers
        assert healthy == 200
        for headers, data in ((patched_headers, files[0]), (created_headers, files[1])):
            assert web.status(headers["attachment-id"])["sha256"] == hashlib.sha256(data).hexdigest()
    finally:
        web.stop_all()


@pytest.mark.processes
def test_a_patch_from_a_client_gone_silent_keeps_what_arrived(env, tmp_path, photo):
    """Cut off after ATTACHE_BODY_IDLE_SECONDS, a PATCH keeps its bytes but those of the spool's last read
    (64 KiB, app.web.spool.CHUNK): gunicorn drops what it holds of a read that fails, so reading the body
    in 1 MiB blocks lost up to 1 MiB of every interrupted PATCH."""
    import random
    import socket

    import requests

    from app.web.spool import CHUNK
    from tests.processes import Deployment

    web = Deployment(env, tmp_path)
    web.start("web", ATTACHE_BODY_IDLE_SECONDS="1")
    try:
        data = photo + random.Random(3).randbytes(3 * 1024 * 1024 - len(photo))
        location = _created_over_http(web, len(data))
        sent = 1024 * 1024 + 600 * 1024
        with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
            sock.sendall((f"PATCH {location} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {web.token}\r\n"
                          f"Tus-Resumable: 1.0.0\r\nUpload-Offset: 0\r\nContent-Type: {PART}\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n").encode() + data[:sent])
            [(status, _)] = _answers(sock, 1)  # then silence
        assert status == 400
        headers = {**TUS, "Authorization": f"Bearer {web.token}"}
        kept = int(requests.head(web.url + location, headers=headers, timeout=10).headers["Upload-Offset"])
        assert sent - CHUNK < kept <= sent
        rest = requests.patch(web.url + location, data=data[kept:], timeout=30,
                              headers={**headers, "Upload-Offset": str(kept), "Content-Type": PART})
        assert rest.status_code == 204, rest.text
        assert web.status(rest.headers["Attachment-Id"])["sha256"] == hashlib.sha256(data).hexdigest()
    finally:
        web.stop_all()


def test_the_api_document_names_the_headers_of_every_answer(client, photo):
    """Schemathesis rarely reaches a live upload; here each success answer meets its documented headers."""
    from app.web.contract import document

    documented = document(client.application)["paths"]
    created = create(client, len(photo))
    location = created.headers["Location"]
    answers = {
        ("options", "/v1/uploads", "204"): client.application.test_client().options("/v1/uploads"),
        ("post", "/v1/uploads", "201"): created,
        ("patch", "/v1/uploads/{upload_id}", "204"): patch(client, location, 0, photo[:100]),
        ("head", "/v1/uploads/{upload_id}", "200"): client.head(location, headers=TUS),
        ("delete", "/v1/uploads/{upload_id}", "204"): client.delete(location, headers=TUS),
    }
    for (method, path, status), answer in answers.items():
        assert answer.status_code == int(status), (method, path)
        headers = documented[path][method]["responses"][status].get("headers", {})
        missing = [name for name, header in headers.items() if header.get("required") and name not in answer.headers]
        assert missing == [], (method, path, missing)
        assert answer.headers["Tus-Resumable"] == "1.0.0"


def test_a_post_with_x_http_method_override_is_that_method(client, photo):
    location = create(client, len(photo)).headers["Location"]
    override = client.post(location, data=photo[:100], headers={**TUS, "Upload-Offset": "0", "Content-Type": PART,
                                                                 "X-HTTP-Method-Override": "PATCH"})
    assert override.status_code == 204 and override.headers["Upload-Offset"] == "100"
    assert client.post(location, headers={**TUS, "X-HTTP-Method-Override": "DELETE"}).status_code == 204
    assert client.head(location, headers=TUS).status_code == 404
    assert client.post("/v1/attachments", headers={"X-HTTP-Method-Override": "DELETE"}).status_code == 400, \
        "ignored outside /v1/uploads"


def test_a_part_is_moved_into_storage_not_copied(client, storage_dir, photo, monkeypatch):
    """A part was copied from its spool: its bytes twice on the disk at once, which took a disk 23-28 MiB past the
    spool's floor with 24-60 PATCHes at once (an adversarial run). The fsynced spool file is now the part."""
    from app.web.spool import HashingSpool

    spooled = []
    finish = HashingSpool.finish

    def finish_and_note(self):
        received = finish(self)
        spooled.append(os.stat(received.path).st_ino)
        return received

    monkeypatch.setattr(HashingSpool, "finish", finish_and_note)
    location = create(client, len(photo)).headers["Location"]
    assert patch(client, location, 0, photo[:5000]).status_code == 204
    (stored,) = parts(storage_dir)
    assert os.stat(storage_dir / stored).st_ino == spooled[0]


def test_a_creation_sent_again_with_its_idempotency_key_answers_the_upload_it_made(client, engine, photo):
    """tus-js-client sends a creation whose answer was lost again: each made another upload, open and empty for a
    day and counted against the uploader's limits; half the answers lost, every creation was refused within about
    100 files (an adversarial run). The upload page sends each file's creation with a key of its own."""
    key = {"Idempotency-Key": "page-file-1"}
    first = create(client, len(photo), headers=key)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    assert patch(client, first.headers["Location"], 0, photo[:1000]).status_code == 204
    again = create(client, len(photo), headers=key)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert (again.headers["Location"], again.headers["Upload-Offset"]) == (first.headers["Location"], "1000")
    assert count(engine, uploads) == 1
    other = create(client, len(photo) + 1, headers=key)  # not what the key made
    assert (other.status_code, other.get_json()["error"]) == (422, "idempotency_key_reused")
    renamed = create(client, len(photo), filename="other.jpg", headers=key)  # answered the first upload's name
    assert (renamed.status_code, renamed.get_json()["error"]) == (422, "idempotency_key_reused")
    assert create(client, len(photo), headers={"Idempotency-Key": "a,b"}).status_code == 400
    assert create(client, len(photo), headers={"Idempotency-Key": "page-file-2"}).headers["Location"] != \
        first.headers["Location"]

    # a finished upload answers with what it made; one terminated, or expired, gives its key up
    done = patch(client, first.headers["Location"], 1000, photo[1000:])
    assert done.status_code == 204, done.get_json()
    replayed = create(client, len(photo), headers=key)
    assert replayed.headers["Location"] == first.headers["Location"]
    assert replayed.headers["Attachment-Id"] == done.headers["Attachment-Id"]
    third = create(client, len(photo), headers={"Idempotency-Key": "page-file-3"})
    assert client.delete(third.headers["Location"], headers=TUS).status_code == 204
    assert create(client, len(photo), headers={"Idempotency-Key": "page-file-3"}).headers["Location"] != \
        third.headers["Location"]
    fourth = create(client, len(photo), headers={"Idempotency-Key": "page-file-4"})
    with engine.begin() as conn:
        conn.execute(update(uploads).where(uploads.c.id == uuid.UUID(fourth.headers["Location"].rsplit("/", 1)[1]))
                     .values(expires_at=func.now() - text("interval '1 second'")))
    assert create(client, len(photo), headers={"Idempotency-Key": "page-file-4"}).headers["Location"] != \
        fourth.headers["Location"]


def test_a_replayed_creation_answers_at_once_while_its_upload_is_being_written(client, engine, photo):
    """A replay waited for the upload's row, held by a PATCH (a last one joining its parts on slow storage), and
    the uploader's other creations waited behind it, until its lock timeout and a 503 (a re-attack)."""
    first = create(client, len(photo), headers={"Idempotency-Key": "busy"})
    upload_id = uuid.UUID(first.headers["Location"].rsplit("/", 1)[1])
    with engine.connect() as writing:
        with writing.begin():
            writing.execute(select(uploads.c.id).where(uploads.c.id == upload_id).with_for_update())
            began = time.monotonic()
            again = create(client, len(photo), headers={"Idempotency-Key": "busy"})
            took = time.monotonic() - began
    assert again.status_code == 201 and again.headers["Location"] == first.headers["Location"]
    assert took < 2, took


def test_a_replay_keeps_the_key_of_an_expired_upload_its_last_patch_is_finishing(client, engine, photo):
    """The last PATCH of a 43 MB upload, begun just before its expiry, held its row while it joined the parts; the
    creation sent again with its key read the row (unfinished, expired), waited for it to free the key, and took
    it from the upload that PATCH had finished meanwhile (204, Attachment-Id): the creation was answered a new,
    empty upload, no replay (an adversarial run). Here the PATCH's transaction is this test's: the row locked,
    the upload finished, committed once the creation is answered or waits for the row."""
    key = {"Idempotency-Key": "finishing"}
    first = create(client, len(photo), headers=key)
    location = first.headers["Location"]
    upload_id = uuid.UUID(location.rsplit("/", 1)[1])
    assert patch(client, location, 0, photo[:1000]).status_code == 204
    made = send(client, create(client, len(photo)).headers["Location"], photo, chunk=len(photo))
    attachment_id = uuid.UUID(made.headers["Attachment-Id"])  # what the last PATCH makes, made beforehand
    with engine.begin() as conn:
        conn.execute(update(uploads).where(uploads.c.id == upload_id)
                     .values(expires_at=func.now() - text("interval '1 second'")))
    uploads_before = count(engine, uploads)
    answers = {}
    auth = {"Authorization": client.environ_base["HTTP_AUTHORIZATION"]}
    replaying = threading.Thread(target=lambda: answers.setdefault(
        "again", create(client.application.test_client(), len(photo), headers={**key, **auth})))
    with engine.connect() as finishing:
        with finishing.begin():  # the last PATCH: the row locked, the upload finished and its life extended
            finishing.execute(select(uploads.c.id).where(uploads.c.id == upload_id).with_for_update())
            holder = finishing.execute(text("SELECT pg_backend_pid()")).scalar()
            finishing.execute(update(uploads).where(uploads.c.id == upload_id).values(
                upload_offset=len(photo), attachment_id=attachment_id,
                expires_at=func.now() + text("interval '1 hour'")))
            replaying.start()
            with engine.connect() as watching:  # answered, or waiting for the row: either way, the PATCH commits
                waited = False
                deadline = time.monotonic() + 30
                while replaying.is_alive() and not waited and time.monotonic() < deadline:
                    waited = watching.execute(text(
                        "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() "
                        "AND :holder = ANY(pg_blocking_pids(pid))"), {"holder": holder}).scalar()
                    watching.rollback()
        replaying.join(30)
    assert not replaying.is_alive()
    again = answers["again"]
    assert again.status_code == 201, again.get_json()
    assert (again.headers["Location"], again.headers.get("Idempotent-Replayed")) == (location, "true"), \
        "before: a new, empty upload, the finished one's key taken from it"
    assert not waited, "a replay never waits for the upload's row"
    with engine.connect() as conn:
        assert conn.execute(select(uploads.c.creation_key).where(uploads.c.id == upload_id)).scalar() == "finishing"
    assert count(engine, uploads) == uploads_before
    replayed = create(client, len(photo), headers=key)
    assert (replayed.headers["Location"], replayed.headers["Attachment-Id"]) == (location, str(attachment_id))


class _HeldBody(io.RawIOBase):
    """A request body that stops after ``hold_at`` bytes until ``go`` is set (``reached`` says it stopped)."""

    def __init__(self, data: bytes, hold_at: int):
        super().__init__()
        self.data, self.hold_at, self.position = data, hold_at, 0
        self.reached, self.go = threading.Event(), threading.Event()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:  # the test client measures the body by seeking to its end and back
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = offset + (len(self.data) if whence == io.SEEK_END else 0)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer) -> int:
        if self.position >= self.hold_at and not self.go.is_set():
            self.reached.set()
            assert self.go.wait(60), "the test never let the body go on"
        end = min(len(self.data), self.position + len(buffer), self.hold_at if not self.go.is_set() else len(self.data))
        chunk = self.data[self.position:end]
        buffer[:len(chunk)] = chunk
        self.position = end
        return len(chunk)


def test_a_refused_creation_keeps_an_upload_its_replay_let_another_request_finish(client, engine, photo):
    """A creation replayed with its key while the first creation's body still arrived answered the upload's
    Location, and a PATCH there finished it (204, Attachment-Id); the first creation's own append was then refused
    (409: the offset had moved), and its refusal terminated the upload: HEAD 404, and the key free, so the client's
    retried creation made a second attachment of the file (an adversarial run)."""
    key = {"Idempotency-Key": "held-creation"}
    body = _HeldBody(photo, hold_at=len(photo) // 2)
    answers = {}

    def first_creation():
        answers["first"] = create(authed(client.application), len(photo), headers=key, input_stream=body,
                                  content_type=PART)

    creating = threading.Thread(target=first_creation)
    creating.start()
    try:
        assert body.reached.wait(30), "the first creation's body never started"
        again = create(client, len(photo), headers=key)
        assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true", again.get_json()
        location = again.headers["Location"]
        done = patch(client, location, 0, photo)
        assert done.status_code == 204 and done.headers["Attachment-Id"], done.get_json()
    finally:
        body.go.set()
        creating.join(60)
    first = answers["first"]
    assert first.status_code == 409 and first.headers["Location"] == location, (first.status_code, first.headers)
    assert first.headers["Attachment-Id"] == done.headers["Attachment-Id"], "the refusal says what the upload made"
    head = client.head(location, headers=TUS)
    assert head.status_code == 200 and head.headers["Attachment-Id"] == done.headers["Attachment-Id"]
    retried = create(client, len(photo), headers=key)
    assert retried.headers["Location"] == location and retried.headers["Attachment-Id"] == done.headers["Attachment-Id"]
    assert count(engine, uploads) == 1 and count(engine, attachments) == 1
