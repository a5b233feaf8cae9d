"""The whole pipeline on S3: real web, worker and scheduler processes against moto.

moto's ``ThreadedMotoServer`` runs in this test process on 127.0.0.1 and a
port the kernel picked; the Procfile's processes reach it over real HTTP
through ``STORAGE_URL=s3://attache-e2e?endpoint=...``. Every check on the
store goes through the S3 API (the storage adapter), never the disk.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import socket
import threading
import uuid
from urllib.parse import parse_qs, unquote, urlparse

import pytest
import requests
from sqlalchemy import func, select

from app.adapters.postgres.models import attachments, jobs, outbox, variants
from app.adapters.storage import Storage, storage_from_url
from app.core import pipeline
from scheduler.object_gc import ObjectGc, ObjectGcConfig
from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig
from tests.processes import Deployment, wait_for
from tests.s3server import moto_server

pytestmark = pytest.mark.processes

BUCKET = "attache-e2e"
ACCESS_KEY = "test"
SECRET_KEY = "test-secret"
PHOTOS = ["photos/chelsea.jpg", "pillow/hopper_orientation_6.jpg"]


# --- fixtures ---------------------------------------------------------------


@pytest.fixture
def moto_endpoint():
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def env(env, moto_endpoint) -> dict[str, str]:
    """conftest's deployment environment, with the store moved to the moto bucket."""
    return {**env, "STORAGE_URL": f"s3://{BUCKET}?endpoint={moto_endpoint}",
            "S3_ACCESS_KEY": ACCESS_KEY, "S3_SECRET_KEY": SECRET_KEY}


@pytest.fixture
def store(env) -> Storage:
    store = storage_from_url(env["STORAGE_URL"], access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    store.ensure_bucket()
    return store


@pytest.fixture
def deployment(env, store, tmp_path):
    deployment = Deployment(env, tmp_path)
    yield deployment
    deployment.stop_all()
    print(deployment.logs())  # shown by pytest only when the test failed


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(store: Storage, key: str) -> bytes:
    return b"".join(store.open_stream(key))


def _published_keys(engine, attachment_id: str) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(select(variants.c.variant, variants.c.storage_key).where(
            variants.c.attachment_id == attachment_id, variants.c.published_at.is_not(None))).all()
    return {row.variant: row.storage_key for row in rows}


def _counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t.name: conn.execute(select(func.count()).select_from(t)).scalar()
                for t in (attachments, jobs, outbox)}


# --- tests ------------------------------------------------------------------


def test_uploads_become_ready_with_every_variant_in_s3(deployment, store, engine, data_file):
    deployment.start("web")
    deployment.start("worker")
    deployment.start("scheduler")

    uploads = {}
    for relative in PHOTOS:
        path = data_file(relative)
        response = deployment.upload(path)
        assert response.status_code == 202, response.text
        body = response.json()
        assert body["sha256"] == _sha256(path.read_bytes())
        uploads[body["id"]] = path

    for attachment_id, path in uploads.items():
        status = deployment.wait_state(attachment_id, timeout=90)
        assert status["state"] == "ready", (status["error_code"], status["error_reason"])
        upload = path.read_bytes()

        # every variant the status reports exists in the bucket with its size and sha256
        assert sorted(status["variants"]) == sorted(pipeline.get(1).variants)
        keys = _published_keys(engine, attachment_id)
        assert sorted(keys) == sorted(status["variants"])
        for name, reported in status["variants"].items():
            info = store.stat(keys[name])
            assert info is not None, f"{name}: no object {keys[name]}"
            assert info.size == reported["size"], name
            data = _read(store, keys[name])
            assert len(data) == reported["size"] and _sha256(data) == reported["sha256"], name

        # the bucket holds exactly the published objects under the attachment's prefix
        listed = {info.key: info.size for info in store.list_objects(f"attachments/{attachment_id}/")}
        assert listed == {keys[name]: status["variants"][name]["size"] for name in keys}

        # the original is the uploaded bytes, unchanged
        assert _read(store, keys["original"]) == upload
        assert status["variants"]["original"]["sha256"] == status["sha256"] == _sha256(upload)

        # staging is removed once ready
        wait_for(lambda: store.stat(f"staging/{attachment_id}") is None, timeout=20,
                 message=f"staging/{attachment_id} removed after ready")

        # the web streams the thumbnail from S3
        response = deployment.session.get(f"{deployment.url}/v1/attachments/{attachment_id}/variants/thumbnail", timeout=30)
        assert response.status_code == 200, response.text
        thumbnail = status["variants"]["thumbnail"]
        assert _sha256(response.content) == thumbnail["sha256"]
        assert len(response.content) == thumbnail["size"]
        assert response.content == _read(store, keys["thumbnail"])
        assert response.headers["Content-Type"].startswith(thumbnail["content_type"])

    assert list(store.list_keys("staging/")) == []


def test_unreachable_storage_refuses_uploads_with_503(deployment, engine, data_file):
    deployment.start("web", STORAGE_URL=f"s3://{BUCKET}?endpoint=http://127.0.0.1:{_closed_port()}")
    response = deployment.upload(data_file(PHOTOS[0]))
    assert response.status_code == 503, response.text
    assert response.headers.get("Retry-After"), response.headers
    assert response.json()["error"] == "storage_unavailable"
    assert _counts(engine) == {"attachments": 0, "jobs": 0, "outbox": 0}


def test_downloads_on_s3_redirect_to_a_short_lived_presigned_url(env, store, tmp_path, data_file):
    """The lifetime is the configured one; moto ignores expiry, so only the URL's claim is checked."""
    deployment = Deployment({**env, "ATTACHE_PRESIGN_SECONDS": "120"}, tmp_path)
    deployment.start("web")
    deployment.start("worker")
    try:
        path = data_file("photos/chelsea.jpg")
        uploaded = deployment.session.post(deployment.url + "/v1/attachments", timeout=30,
                                           files={"file": ("Chelsea the cat.png", path.read_bytes())})
        status = deployment.wait_state(uploaded.json()["id"])
        assert status["state"] == "ready"
        response = deployment.session.get(deployment.url + status["variants"]["original"]["url"],
                                          allow_redirects=False, timeout=10)
        assert response.status_code == 302
        location = response.headers["Location"]
        query = parse_qs(urlparse(location).query)
        assert query["X-Amz-Expires"] == ["120"] and "X-Amz-Signature" in query
        assert "test-secret" not in location, "the secret never appears in a URL"
        fetched = requests.get(location, timeout=10)
        assert fetched.status_code == 200 and fetched.content == path.read_bytes()
        # the store names and types the file as the web would have (a JPEG, whatever the client called it)
        assert fetched.headers["Content-Type"] == "image/jpeg"
        assert fetched.headers["Content-Disposition"] == (
            'attachment; filename="Chelsea_the_cat.jpg"; filename*=UTF-8\'\'Chelsea%20the%20cat.jpg')
    finally:
        deployment.stop_all()


class _LockedObjects(http.server.BaseHTTPRequestHandler):
    """A proxy in front of moto that answers the DELETE of a key in ``locked`` with ``403 AccessDenied``, as a
    bucket's Object Lock or policy does; every other request is moto's."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    locked: set = set()

    def log_message(self, *args):
        pass

    def _forward(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = unquote(urlparse(self.path).path).split("/", 2)[-1]
        if self.command == "DELETE" and key in self.locked:
            error = b"<Error><Code>AccessDenied</Code><Message>object is locked</Message></Error>"
            self.send_response(403)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        upstream = http.client.HTTPConnection(urlparse(self.upstream).netloc, timeout=30)
        upstream.request(self.command, self.path, body=body or None, headers=dict(self.headers.items()))
        answer = upstream.getresponse()
        data = answer.read()
        upstream.close()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD"
                         else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


def test_s3_objects_whose_delete_the_bucket_refuses_hold_up_no_other_removal(moto_endpoint, engine):
    """An adversarial run: a bucket refusing the DELETE of one key (403 AccessDenied: Object Lock, a bucket policy)
    kept 25 of 25 deletable orphans, round after round: the refused delete raised out of each cleanup's round. The
    403 is the object's own (not ``StorageUnavailable``): the round goes on, counts it (``not_removed``), and a
    round after the lock is lifted removes it."""
    handler = type("Handler", (_LockedObjects,), {"upstream": moto_endpoint, "locked": set()})
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        # a bucket of its own: moto's buckets outlive its server, with the objects of the tests before
        bucket = f"attache-locked-{uuid.uuid4().hex[:8]}"
        store = storage_from_url(f"s3://{bucket}?endpoint=http://127.0.0.1:{proxy.server_address[1]}",
                                 access_key=ACCESS_KEY, secret_key=SECRET_KEY)
        store.ensure_bucket()
        objects = [pipeline.variant_key(uuid.uuid4(), 1, "thumbnail", f"{n:064x}", "jpg") for n in range(5)]
        staged = [f"staging/{uuid.uuid4()}" for _ in range(4)]
        for key in objects + staged:
            store.put_bytes(key, b"orphan")
        handler.locked.update({objects[0], staged[0]})
        gc = ObjectGc(engine, store, ObjectGcConfig(grace_seconds=0, decision_grace_seconds=0))
        cleanup = StagingCleanup(engine, store, StagingCleanupConfig(grace_seconds=0))

        counts = gc.run_once()  # before: StorageError (AccessDenied) at the locked key, the others kept
        assert (counts["removed"], counts["not_removed"]) == (4, 1), counts
        counts = cleanup.run_once()
        assert (counts["removed"], counts["not_removed"]) == (3, 1), counts
        assert [key for key in objects + staged if store.stat(key) is not None] == [objects[0], staged[0]]
        assert gc.run_once()["not_removed"] == 1 and cleanup.run_once()["not_removed"] == 1, "still locked"

        handler.locked.clear()  # the retention ends
        assert (gc.run_once()["removed"], cleanup.run_once()["removed"]) == (1, 1)
        assert list(store.list_keys("attachments/")) == [] and list(store.list_keys("staging/")) == []
    finally:
        proxy.shutdown()
        proxy.server_close()
