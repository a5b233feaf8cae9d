"""Safe downloads: ETag/304, ranges, headers; presigned redirects on S3."""

from __future__ import annotations

import hashlib

import pytest

from app.core import states
from app.core.workflow import Workflow
from app.web import create_app
from tests.conftest import authed
from tests.driver import run, upload
from tests.processes import wait_for

#: a download's place that raised in __del__ (a refused one never held one) is an error here, not a warning
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def ready(quiet_services, engine, data_file, settings):
    path = data_file("photos/chelsea.jpg")
    accepted = upload(quiet_services, path)
    run(Workflow(quiet_services), engine, accepted.job_id)
    app = create_app(settings)
    yield app, accepted, path.read_bytes()
    app.extensions["attache"].close()


def owned_client(app):
    client = authed(app, "olga-operator-token")  # the in-process upload belongs to "t"; operators see all
    return client


def test_headers_etag_and_304(ready):
    app, accepted, data = ready
    client = owned_client(app)
    response = client.get(f"/v1/attachments/{accepted.attachment_id}/original")
    assert response.status_code == 200 and response.data == data
    assert response.headers["ETag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    assert response.headers["Content-Disposition"] == 'attachment; filename="chelsea.jpg"; filename*=UTF-8\'\'chelsea.jpg'
    again = client.get(f"/v1/attachments/{accepted.attachment_id}/original",
                       headers={"If-None-Match": response.headers["ETag"]})
    assert again.status_code == 304 and again.data == b""


def test_conditional_and_range_edges_follow_rfc_9110(ready):
    """``If-None-Match: *`` and weak tags match (13.1.2); an invalid range-spec is ignored, not refused (14.2)."""
    app, accepted, data = ready
    client = owned_client(app)
    path = f"/v1/attachments/{accepted.attachment_id}/original"
    etag = client.get(path).headers["ETag"]
    assert client.get(path, headers={"If-None-Match": "*"}).status_code == 304
    assert client.get(path, headers={"If-None-Match": f'"other", W/{etag}'}).status_code == 304
    assert client.get(path, headers={"If-None-Match": '"other"'}).status_code == 200
    for invalid in ("bytes=5-3", "bytes=--5", "bytes=-", "bytes=a-b"):
        response = client.get(path, headers={"Range": invalid})
        assert (response.status_code, response.data == data) == (200, True), invalid
    assert client.get(path, headers={"Range": "bytes=0-0"}).data == data[:1]
    assert client.get(path, headers={"Range": "bytes=-0"}).status_code == 416
    # numbers of 4,301 digits or more, which int() refuses: each answered 500 (an adversarial run)
    many = "9" * 5000
    assert client.get(path, headers={"Range": f"bytes={many}-"}).status_code == 416
    for whole in (f"bytes=0-{many}", f"bytes=-{many}"):
        response = client.get(path, headers={"Range": whole})
        assert response.status_code == 206 and response.data == data, whole
    assert client.get(path, headers={"Range": "bytes=" + "0" * 5000 + "1-1"}).data == data[1:2], "leading zeros"


def test_ranges_on_originals(ready):
    app, accepted, data = ready
    client = owned_client(app)
    path = f"/v1/attachments/{accepted.attachment_id}/original"
    part = client.get(path, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.data == data[100:200]
    assert part.headers["Content-Range"] == f"bytes 100-199/{len(data)}"
    tail = client.get(path, headers={"Range": "bytes=-50"})
    assert tail.status_code == 206 and tail.data == data[-50:]
    open_ended = client.get(path, headers={"Range": f"bytes={len(data) - 10}-"})
    assert open_ended.data == data[-10:]
    unsatisfiable = client.get(path, headers={"Range": f"bytes={len(data)}-"})
    assert unsatisfiable.status_code == 416 and unsatisfiable.data == b""
    assert "Content-Type" not in unsatisfiable.headers, "no body, nothing to type (it came as text/html)"
    not_modified = client.get(path, headers={"If-None-Match": part.headers["ETag"]})
    assert not_modified.status_code == 304 and "Content-Type" not in not_modified.headers
    stale = client.get(path, headers={"Range": "bytes=0-9", "If-Range": '"other"'})
    assert stale.status_code == 200 and stale.data == data, "If-Range mismatch: the whole, current body"


def test_disposition_of_an_unusual_display_name(quiet_services, engine, settings, data_file, tmp_path):
    odd = tmp_path / "Ünïcødé \"quoted\" ;name.jpg"
    odd.write_bytes(data_file("photos/chelsea.jpg").read_bytes())
    accepted = upload(quiet_services, odd)
    run(Workflow(quiet_services), engine, accepted.job_id)
    app = create_app(settings)
    disposition = owned_client(app).get(f"/v1/attachments/{accepted.attachment_id}/variants/thumbnail").headers[
        "Content-Disposition"]
    assert disposition.startswith('attachment; filename="') and "\n" not in disposition
    fallback = disposition.split('filename="')[1].split('"')[0]
    assert fallback.isascii() and '"' not in fallback and ";" not in fallback
    assert "filename*=UTF-8''%C3%9Cn%C3%AFc%C3%B8d%C3%A9%20%22quoted%22%20%3Bname-thumbnail.jpg" in disposition
    app.extensions["attache"].close()


def test_unversioned_urls_revalidate_and_pinned_urls_are_immutable(quiet_services, engine, settings, data_file):
    """Without ``?version`` a URL follows the newest ready version, so it must never be cached as immutable."""
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    workflow = Workflow(quiet_services)
    run(workflow, engine, accepted.job_id)  # version 1 ready
    app = create_app(settings)
    client = owned_client(app)
    url = f"/v1/attachments/{accepted.attachment_id}/variants/thumbnail"
    v1 = client.get(url)
    assert v1.status_code == 200 and v1.headers["Cache-Control"] == "private, no-cache"
    not_modified = client.get(url, headers={"If-None-Match": v1.headers["ETag"]})
    assert not_modified.status_code == 304 and not_modified.headers["Cache-Control"] == "private, no-cache"
    pinned = client.get(url + "?version=1")
    assert pinned.headers["Cache-Control"] == "private, max-age=31536000, immutable"
    assert pinned.data == v1.data and pinned.headers["ETag"] == v1.headers["ETag"]
    original = client.get(f"/v1/attachments/{accepted.attachment_id}/original")
    assert original.headers["Cache-Control"] == "private, no-cache"

    with engine.begin() as conn:  # version 2 becomes ready: the unversioned URL now serves its bytes
        v2_job, _ = states.create_job(conn, attachment_id=accepted.attachment_id, pipeline_version=2,
                                      max_attempts=1, traceparent="00-" + "3" * 32 + "-" + "4" * 16 + "-01",
                                      tracestate=None, actor="test", room_bytes=0)
    run(workflow, engine, v2_job)
    revalidated = client.get(url, headers={"If-None-Match": v1.headers["ETag"]})
    assert revalidated.status_code == 200, "the cached v1 thumbnail is stale: the revalidation gets v2"
    assert revalidated.headers["ETag"] != v1.headers["ETag"] and revalidated.data != v1.data
    still_v1 = client.get(url + "?version=1", headers={"If-None-Match": v1.headers["ETag"]})
    assert still_v1.status_code == 304 and "immutable" in still_v1.headers["Cache-Control"]
    app.extensions["attache"].close()


def test_a_download_is_named_with_the_extension_of_its_real_format(quiet_services, engine, settings, data_file,
                                                                   tmp_path):
    misnamed = tmp_path / "photo.png"  # a JPEG, whatever the client called it
    misnamed.write_bytes(data_file("photos/chelsea.jpg").read_bytes())
    accepted = upload(quiet_services, misnamed)
    run(Workflow(quiet_services), engine, accepted.job_id)
    app = create_app(settings)
    client = owned_client(app)
    original = client.get(f"/v1/attachments/{accepted.attachment_id}/original")
    assert original.headers["Content-Type"] == "image/jpeg"
    assert original.headers["Content-Disposition"] == "attachment; filename=\"photo.jpg\"; filename*=UTF-8''photo.jpg"
    thumbnail = client.get(f"/v1/attachments/{accepted.attachment_id}/variants/thumbnail")
    assert 'filename="photo-thumbnail.jpg"' in thumbnail.headers["Content-Disposition"]
    app.extensions["attache"].close()


def test_a_clients_downloads_at_once_are_bounded_and_each_gives_its_place_back(ready):
    """A third adversarial run: 100 downloads of one uploader's, never read, held every thread of a web process.
    One client is sent at most ATTACHE_MAX_DOWNLOADS_PER_CLIENT (16) at once; an answer's place comes back when the
    server closes it, read or not (tests/test_hostile_clients.py cuts the reader that stops)."""
    app, accepted, data = ready
    client, answers = owned_client(app), app.extensions["attache_answers"]
    url = f"/v1/attachments/{accepted.attachment_id}/original"
    held = [client.get(url, buffered=False) for _ in range(app.extensions["attache"].settings.max_downloads_per_client)]
    refused = client.get(url)
    assert refused.status_code == 429 and refused.json["error"] == "too_many_downloads_at_once"
    assert refused.headers["Retry-After"]
    assert authed(app).get(url).status_code != 429, "another client's downloads are its own"
    assert held[0].get_data() == data
    for response in held:
        response.close()  # read or not
    assert answers.sending("olga") == 0
    assert client.get(url).data == data and client.head(url).status_code == 200
    assert answers.sending("olga") == 0


def test_downloads_waiting_on_a_silent_store_count_against_the_clients_bound(ready, monkeypatch):
    """A download took its place among the client's once its stream was open: downloads waiting on a store that did
    not answer (S3 black-holed, 90 s a call) were not counted, and one client's 40 held every thread of a web process,
    ``/healthz`` timing out (an adversarial run). The place is taken before storage is asked anything, and given
    back whatever the answer."""
    import threading

    app, accepted, data = ready
    storage, answers = app.extensions["attache"].storage, app.extensions["attache_answers"]
    bound = app.extensions["attache"].settings.max_downloads_per_client
    silent, waiting = threading.Event(), []
    real_open = storage.open_stream

    def open_stream(*args, **kwargs):
        waiting.append(1)
        silent.wait(30)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(storage, "open_stream", open_stream)
    url = f"/v1/attachments/{accepted.attachment_id}/original"
    got = []
    threads = [threading.Thread(target=lambda: got.append(owned_client(app).get(url)), daemon=True)
               for _ in range(bound)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(waiting) == bound, timeout=10, message="the client's downloads waiting on the store")
        refused = owned_client(app).get(url)  # answered at once, not one more thread waiting on the store
        assert refused.status_code == 429 and refused.json["error"] == "too_many_downloads_at_once"
        assert len(waiting) == bound
    finally:
        silent.set()
        for thread in threads:
            thread.join(10)
    assert [response.status_code for response in got] == [200] * bound
    for response in got:
        response.close()
    assert answers.sending("olga") == 0
    monkeypatch.setattr(storage, "open_stream", real_open)
    monkeypatch.setattr(storage, "presigned_url", lambda *args, **kwargs: "https://store.example/o")
    assert owned_client(app).get(url).status_code == 302 and answers.sending("olga") == 0  # a redirect gives it back


@pytest.mark.parametrize("asked", ["abc", "1_000", "%201", "1.0", "-1", "%C2%B9", "", "1234567890"])
def test_a_version_that_is_not_digits_is_400_not_the_newest(ready, asked):
    """werkzeug's ``type=int`` left ``abc`` unasked, so the newest version answered as if none had been asked, and
    read ``1_000`` and `` 1`` as numbers (an adversarial run)."""
    app, accepted, _ = ready
    client = owned_client(app)
    for url in (f"/v1/attachments/{accepted.attachment_id}", f"/v1/attachments/{accepted.attachment_id}/original",
                f"/v1/attachments/{accepted.attachment_id}/variants/thumbnail"):
        response = client.get(f"{url}?version={asked}")
        assert (response.status_code, response.json["error"]) == (400, "bad_request"), (url, response.status_code)
        assert client.get(f"{url}?version=1").status_code == 200
