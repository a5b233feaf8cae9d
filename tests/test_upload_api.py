"""POST /v1/attachments through the real Flask app, real PostgreSQL, RabbitMQ and filesystem.

Every refusal must leave nothing visible: no attachment, job or outbox
row, and no staged object.
"""

import base64
import hashlib

import pytest
from sqlalchemy import func, select

from app.adapters.postgres.models import attachments, job_history, jobs, outbox
from app.web import create_app
from tests.conftest import authed
from tests.processes import wait_for


def counts(engine):
    with engine.connect() as conn:
        return {t.name: conn.execute(select(func.count()).select_from(t)).scalar() for t in (attachments, jobs, outbox)}


def stored_files(storage_dir):
    return sorted(p.relative_to(storage_dir).as_posix() for p in storage_dir.rglob("*") if p.is_file())


def post_file(client, path, name=None, **headers):
    with open(path, "rb") as fh:
        return client.post("/v1/attachments", data={"file": (fh, name or path.name)},
                           content_type="multipart/form-data", headers=headers)


def test_accepted_upload_is_durable_before_202(client, engine, storage_dir, data_file):
    path = data_file("photos/chelsea.jpg")
    response = post_file(client, path)
    assert response.status_code == 202, response.json
    body = response.json
    assert response.headers["Location"] == f"/v1/attachments/{body['id']}"
    assert body["state"] == "queued" and body["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    with engine.connect() as conn:
        job = conn.execute(select(jobs)).one()
        assert (str(job.id), job.state, job.attempt) == (body["job_id"], "queued", 0)
        assert conn.execute(select(outbox.c.job_id)).scalar_one() == job.id, "the message is durable before 202"
        assert conn.execute(select(job_history.c.to_state)).scalars().all() == ["queued"]

    def marked():  # published behind the answer (app.core.background_publisher)
        with engine.connect() as conn:
            return conn.execute(select(outbox.c.published_at)).scalar_one()

    wait_for(marked, timeout=10, message="the broker was up, so its confirm marks the row")
    assert stored_files(storage_dir) == [f"staging/{body['id']}"]
    assert (storage_dir / "staging" / body["id"]).read_bytes() == path.read_bytes()
    status = client.get(response.headers["Location"]).json
    assert status["state"] == "queued" and status["variants"] == {} and status["filename"] == "chelsea.jpg"


def test_raw_body_upload_with_digests(client, engine, data_file):
    data = data_file("photos/coffee.png").read_bytes()
    digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    response = client.post("/v1/attachments", data=data, content_type="application/octet-stream",
                           headers={"Content-Digest": f"sha-256=:{digest}:", "Content-MD5": md5,
                                    "Content-Disposition": 'attachment; filename="coffee.png"'})
    assert response.status_code == 202, response.json
    status = client.get(response.headers["Location"]).json
    assert status["content_type"] == "image/png", "type is sniffed from the bytes, not the client's header"
    assert status["filename"] == "coffee.png"


@pytest.mark.parametrize("relative,content_type,size", [
    ("pillow/avif_hopper.heif", "image/heic", (128, 128)),  # HEIC: refused as unsupported before pillow-heif
    ("phones/card_p3_orientation6.heic", "image/heic", (600, 400)),  # libheif reports it upright
    ("phones/card_p3_orientation6.avif", "image/avif", (400, 600)),  # stored size, orientation 6
])
def test_heic_and_avif_are_accepted(client, engine, storage_dir, data_file, relative, content_type, size):
    response = post_file(client, data_file(relative), name="IMG_0001.jpg")  # the name says nothing
    assert response.status_code == 202, response.json
    status = client.get(response.headers["Location"]).json
    assert (status["content_type"], status["width"], status["height"]) == (content_type, *size)
    assert stored_files(storage_dir) == [f"staging/{status['id']}"]


@pytest.mark.parametrize("relative,status,code", [
    ("synthetic/vector_logo.svg", 415, "unsupported_format"),
    ("synthetic/html_error_page.png", 415, "unsupported_format"),
    ("synthetic/jpeg_sof_65000x65000.jpg", 413, "decompression_bomb"),
    ("phones/heic_ispe_65000x65000.heic", 413, "decompression_bomb"),
    ("phones/avif_ispe_65000x65000.avif", 413, "decompression_bomb"),
    ("phones/avif_frame_9000x9000_ispe_256x256.avif", 413, "decompression_bomb"),
    ("phones/card_truncated60.heic", 415, "corrupt_image"),
    ("phones/card_truncated60.avif", 415, "corrupt_image"),
    ("synthetic/png_bomb_20000x20000.png", 413, "decompression_bomb"),
    ("pillow/decompression_bomb.gif", 413, "decompression_bomb"),
    ("pillow/png_decompression_dos.png", 413, "decompression_bomb"),
])
def test_refusals_leave_nothing_behind(client, engine, storage_dir, data_file, relative, status, code):
    response = post_file(client, data_file(relative))
    assert response.status_code == status, response.json
    assert response.json["error"] == code
    assert counts(engine) == {"attachments": 0, "jobs": 0, "outbox": 0}
    assert stored_files(storage_dir) == []


def test_empty_file_is_refused(client, engine, data_file):
    response = post_file(client, data_file("synthetic/empty.jpg"))
    assert response.status_code in (400, 415)
    assert counts(engine)["attachments"] == 0


def test_digest_mismatch_is_422_and_leaves_nothing(client, engine, storage_dir, data_file):
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    response = post_file(client, data_file("photos/chelsea.jpg"), **{"Content-Digest": f"sha-256=:{wrong}:"})
    assert response.status_code == 422 and response.json["error"] == "digest_mismatch"
    response = post_file(client, data_file("photos/chelsea.jpg"),
                         **{"Content-MD5": base64.b64encode(hashlib.md5(b"x").digest()).decode()})
    assert response.status_code == 422
    assert counts(engine)["attachments"] == 0 and stored_files(storage_dir) == []


def test_a_malformed_or_empty_digest_header_is_400_not_a_mismatch_or_no_header(client, engine, storage_dir,
                                                                               data_file):
    """A hex MD5 (32 characters, valid base64 of 24 bytes) was answered ``422 digest_mismatch``, as if the bytes
    were wrong; an empty Content-Digest was taken for none and the upload accepted unchecked, where one naming only
    another algorithm is refused (an adversarial run)."""
    path = data_file("photos/chelsea.jpg")
    for headers in ({"Content-MD5": hashlib.md5(path.read_bytes()).hexdigest()}, {"Content-MD5": "AAAA"},
                    {"Content-Digest": ""}, {"Content-MD5": ""}):
        response = post_file(client, path, **headers)
        assert (response.status_code, response.json["error"]) == (400, "bad_digest_header"), (headers, response.json)
    assert counts(engine)["attachments"] == 0 and stored_files(storage_dir) == []


def test_a_repr_digest_is_checked_and_a_digest_sent_twice_is_refused(client, engine, storage_dir, data_file):
    """A wrong ``Repr-Digest`` was ignored on a POST (a resumable upload's creation checks it), and of a
    ``Content-Digest`` sent twice, joined into one list, only the last was checked: wrong then right was accepted,
    right then wrong refused (an adversarial run)."""
    path = data_file("photos/chelsea.jpg")
    right = f"sha-256=:{base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()}:"
    wrong = f"sha-256=:{base64.b64encode(hashlib.sha256(b'other').digest()).decode()}:"
    refused = post_file(client, path, **{"Repr-Digest": wrong})
    assert (refused.status_code, refused.json["error"]) == (422, "digest_mismatch"), refused.json
    for twice in (f"{wrong}, {right}", f"{right}, {wrong}"):
        refused = post_file(client, path, **{"Content-Digest": twice})
        assert (refused.status_code, refused.json["error"]) == (400, "bad_digest_header"), refused.json
        assert "twice" in refused.json["message"]
    assert counts(engine)["attachments"] == 0 and stored_files(storage_dir) == []
    assert post_file(client, path, **{"Repr-Digest": right, "Content-Digest": f"{right}, {right}"}).status_code == 202


def test_a_digest_members_parameters_are_allowed_and_its_value_still_checked(client, engine, data_file):
    """RFC 8941 lets a dictionary member carry parameters; ``sha-256=:...:;x=1`` was refused ``400`` (an
    adversarial run). They are ignored, the value is checked."""
    path = data_file("photos/chelsea.jpg")
    digest = base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    for header in ("Content-Digest", "Repr-Digest"):
        refused = post_file(client, path, **{header: f'sha-256=:{wrong}:;x=1;note="a b"'})
        assert (refused.status_code, refused.json["error"]) == (422, "digest_mismatch"), refused.json
        members = f'sha-256=:{digest}:;x=1;y;z=?0;w=:AA==:;v=-1.5;note="a b", md5=:AAAA:'
        taken = post_file(client, path, **{header: members})
        assert taken.status_code == 202, taken.json
    assert post_file(client, path, **{"Content-Digest": f"sha-256=:{digest}:;=1"}).status_code == 400


def test_a_body_in_a_content_coding_is_refused_as_such(client, engine, storage_dir, data_file):
    """A gzipped JPEG was answered ``415 unsupported_format``, as if the file were no image (an adversarial run):
    the coding's bytes would be stored as sent, none decoded."""
    import gzip

    path = data_file("photos/chelsea.jpg")
    raw = client.post("/v1/attachments", data=gzip.compress(path.read_bytes()),
                      headers={"Content-Type": "image/jpeg", "Content-Encoding": "gzip"})
    assert (raw.status_code, raw.json["error"]) == (415, "unsupported_content_encoding"), raw.json
    assert "Content-Encoding 'gzip'" in raw.json["message"]
    assert post_file(client, path, **{"Content-Encoding": "br"}).json["error"] == "unsupported_content_encoding"
    assert post_file(client, path, **{"Transfer-Encoding": "gzip, chunked"}).json["error"] == \
        "unsupported_content_encoding"
    assert counts(engine)["attachments"] == 0 and stored_files(storage_dir) == []
    assert post_file(client, path, **{"Content-Encoding": "identity"}).status_code == 202


def test_an_md5_is_computed_only_for_a_content_md5_to_check(client, data_file, monkeypatch):
    """MD5 costs twice the SHA-256 here; an upload that sends no Content-MD5 does not pay for it."""
    from app.core import intake

    seen, accept = [], intake.accept

    def spy(services, received, **kwargs):
        seen.append(received.md5)
        return accept(services, received, **kwargs)

    monkeypatch.setattr(intake, "accept", spy)
    path = data_file("photos/chelsea.jpg")
    assert post_file(client, path).status_code == 202
    md5 = hashlib.md5(path.read_bytes()).digest()
    assert post_file(client, path, **{"Content-MD5": base64.b64encode(md5).decode()}).status_code == 202
    assert seen == [None, md5]


def test_malformed_requests_are_400(client, engine):
    assert client.post("/v1/attachments", data={"other": "x"}, content_type="multipart/form-data").status_code == 400
    assert client.post("/v1/attachments", data=b"", content_type="image/jpeg").status_code == 400
    response = client.post("/v1/attachments", data=b"x", content_type="image/jpeg",
                           headers={"Content-Digest": "sha-256=nonsense"})
    assert response.status_code == 400
    assert counts(engine)["attachments"] == 0


def test_size_limit_is_enforced_while_streaming(env, engine, storage_dir, data_file, tmp_path):
    import tempfile
    from pathlib import Path

    from app.config import Settings

    spools = lambda: set(Path(tempfile.gettempdir()).glob("attache-upload-*"))  # noqa: E731
    before = spools()
    app = create_app(Settings.from_env({**env, "ATTACHE_MAX_UPLOAD_BYTES": "10000"}))
    client = authed(app)
    response = post_file(client, data_file("photos/chelsea.jpg"))  # 35 KB
    assert response.status_code == 413 and response.json["error"] == "too_large"
    response = client.post("/v1/attachments", data=data_file("photos/chelsea.jpg").read_bytes(), content_type="image/jpeg")
    assert response.status_code == 413
    assert counts(engine)["attachments"] == 0 and stored_files(storage_dir) == []
    assert spools() <= before, "refused uploads leave no spool file"
    app.extensions["attache"].close()


@pytest.mark.parametrize("raw,expected", [
    ("../../etc/passwd", "passwd"),
    ("evil\x00name.jpg", "evilname.jpg"),
    ("a" * 10_000 + ".jpg", "a" * 251 + ".jpg"),
    ("/home/me/photo.jpg", "photo.jpg"),
    ("\u202egpj.exe", "gpj.exe"),
])
def test_absurd_filenames_are_only_sanitized_display_text(client, engine, storage_dir, data_file, raw, expected):
    data = data_file("pillow/hopper.jpg").read_bytes()
    import io

    response = client.post("/v1/attachments", data={"file": (io.BytesIO(data), raw)},
                           content_type="multipart/form-data")
    assert response.status_code == 202, response.json
    status = client.get(response.headers["Location"]).json
    assert status["filename"] == expected
    assert stored_files(storage_dir) == [f"staging/{status['id']}"], "the name never reaches a key"


def test_upload_is_accepted_while_rabbitmq_is_unreachable(env, engine, data_file):
    from app.config import Settings

    app = create_app(Settings.from_env({**env, "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
    client = authed(app)
    response = post_file(client, data_file("photos/chelsea.jpg"))
    assert response.status_code == 202

    def given_up():  # the publish behind the answer failed
        with engine.connect() as conn:
            row = conn.execute(select(outbox)).one()
        return row if row.last_error else None

    row = wait_for(given_up, timeout=10, message="the publisher to give the row up")
    assert row.published_at is None, "the row waits for the scheduler"
    app.extensions["attache"].close()


def test_database_down_is_503_with_retry_after_and_no_staging_left(env, storage_dir, data_file):
    from app.config import Settings

    app = create_app(Settings.from_env({**env, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/attache"}))
    response = post_file(authed(app), data_file("photos/chelsea.jpg"))
    assert response.status_code == 503 and response.headers["Retry-After"]
    assert stored_files(storage_dir) == []


def test_a_web_whose_database_connections_are_all_busy_answers_503_not_500(settings, storage_dir, data_file):
    """Long requests (an adversarial run: 44 operators' job lists at once on 300,000 jobs) held every connection
    of a web process's pool; the requests waiting for one past the pool's timeout got 500 (SQLAlchemy's pool
    TimeoutError reached no handler): an upload with an Idempotency-Key, a status read. Now 503 with
    Retry-After, as for a database that is down, and nothing staged."""
    from contextlib import ExitStack

    from app.adapters.postgres.db import make_engine

    app = create_app(settings)
    services = app.extensions["attache"]
    services.__dict__["engine"] = make_engine(settings.database_url, pool_size=1, pool_timeout=0.2)
    client = authed(app)
    with ExitStack() as busy:
        for _ in range(1 + 10):  # the pool's connection and its overflow, each held by a long request
            busy.enter_context(services.engine.connect())
        for response in (post_file(client, data_file("photos/chelsea.jpg"), **{"Idempotency-Key": "k1"}),
                         post_file(client, data_file("photos/chelsea.jpg")),
                         client.get("/v1/attachments/00000000-0000-4000-8000-000000000000")):
            assert response.status_code == 503 and response.headers["Retry-After"], response.get_data(as_text=True)
            assert response.json["error"] == "database_unavailable"
    assert stored_files(storage_dir) == []
    assert client.get("/v1/attachments/00000000-0000-4000-8000-000000000000").status_code == 404, "and back"
    services.close()


def test_unknown_attachment_is_404(client):
    assert client.get("/v1/attachments/00000000-0000-4000-8000-000000000000").status_code == 404
    assert client.get("/v1/attachments/not-a-uuid").status_code == 404


def test_formats_and_pixel_limits_are_configurable(env, engine, data_file):
    from app.config import Settings

    app = create_app(Settings.from_env({**env, "ATTACHE_ACCEPTED_FORMATS": "jpeg,webp",
                                        "ATTACHE_MAX_PIXELS": "1000000"}))
    client = authed(app)
    png = post_file(client, data_file("photos/coffee.png"))
    assert png.status_code == 415 and "not accepted" in png.json["message"]
    big = post_file(client, data_file("photos/chelsea_12mp_4247x2825.jpg"))
    assert big.status_code == 413 and big.json["error"] == "decompression_bomb"
    assert post_file(client, data_file("photos/chelsea.jpg")).status_code == 202
    assert counts(engine)["attachments"] == 1
    app.extensions["attache"].close()
