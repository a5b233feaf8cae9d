"""Nothing a request spools outlives it, and a body too large for its route is 413, against real gunicorn.

Only the upload route spools file parts (``attache-upload-*`` files in the
temporary directory); every other route drops them. The web process gets a
private ``TMPDIR`` so the test sees exactly what it leaves behind.
"""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
import requests

from app.config import Settings
from app.web import create_app
from app.web.request import SIGN_IN_FORM_MAX_BYTES
from tests.conftest import OPERATOR_TOKEN
from tests.processes import Deployment

pytestmark = pytest.mark.processes

UPLOAD_LIMIT = 2 * 1024 * 1024
#: above the upload limit, and above every other route's body limit
OVERSIZED = b"\xff\xd8" + b"\x00" * (UPLOAD_LIMIT + 512 * 1024)
SMALL = b"\xff\xd8" + b"\x00" * 50_000


@pytest.fixture
def web(env, tmp_path):
    temp = tmp_path / "web-tmp"
    temp.mkdir()
    deployment = Deployment(env, tmp_path)
    deployment.start("web", TMPDIR=str(temp), ATTACHE_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT))
    deployment.temp = temp
    yield deployment
    deployment.stop_all()


def left_behind(web) -> list[str]:
    return sorted(p.name for p in web.temp.iterdir())


def post_routes(env) -> list[str]:
    """Every POST route of the app, with a made-up id for path parameters."""
    app = create_app(Settings.from_env(env))
    try:
        rules = [rule.rule for rule in app.url_map.iter_rules() if "POST" in rule.methods]
    finally:
        app.extensions["attache"].close()
    return sorted(re.sub(r"<(?:[^:<>]+:)?[^<>]+>", "00000000-0000-4000-8000-000000000000", rule) for rule in rules)


def test_file_parts_sent_to_any_route_leave_nothing_in_the_temp_directory(web, env, data_file):
    assert left_behind(web) == []
    routes = post_routes(env)
    assert {"/", "/ops/login", "/sign-out", "/v1/attachments"} <= set(routes)
    files = {"file": ("photo.jpg", SMALL, "image/jpeg"), "other": ("x.bin", SMALL, "application/octet-stream")}
    for route in routes:
        for headers in ({}, {"Authorization": f"Bearer {OPERATOR_TOKEN}"}):
            # one connection each (a route that answers without reading the body leaves gunicorn draining it)
            response = requests.post(web.url + route, files=files, data={"csrf_token": "x"}, timeout=30,
                                     headers={**headers, "Connection": "close"}, allow_redirects=False)
            assert response.status_code < 500, (route, response.status_code, response.text[:300])
    # the upload route's own refusals, and an accepted upload
    photo = data_file("photos/chelsea.jpg").read_bytes()
    refusals = [
        ({"other": ("x.jpg", photo)}, {}, 400),                             # no `file` part
        ({"file": ("x.svg", data_file("synthetic/vector_logo.svg").read_bytes())}, {}, 415),
        ({"file": ("x.jpg", photo)}, {"Content-Digest": "sha-256=:" + base64.b64encode(
            hashlib.sha256(b"other").digest()).decode() + ":"}, 422),
        ({"file": ("x.jpg", photo)}, {"Idempotency-Key": "k" * 300}, 400),
        ({"file": ("a.jpg", photo), "also": ("b.jpg", photo)}, {}, 202),
    ]
    for files, headers, status in refusals:
        response = web.session.post(web.url + "/v1/attachments", files=files, headers=headers, timeout=30)
        assert response.status_code == status, response.text
    assert left_behind(web) == [], "every request removed what it spooled"


@pytest.mark.parametrize("route", ["/", "/ops/login", "/v1/attachments"])
def test_an_oversized_part_is_413_on_every_route(web, route):
    response = web.session.post(web.url + route, files={"file": ("big.jpg", OVERSIZED, "image/jpeg")},
                                data={"csrf_token": "x"}, timeout=60)
    assert response.status_code == 413, response.text[:300]
    assert response.json()["error"] == "too_large"
    assert left_behind(web) == []


@pytest.mark.parametrize("route", ["/", "/ops/login", "/v1/attachments"])
def test_an_oversized_chunked_body_is_refused_on_every_route(web, route):
    """No Content-Length to refuse up front: the limit is enforced while the parts stream in (413); the sign-in
    forms take no chunked body at all (411, before a byte of it is read: app/web/request.py)."""
    boundary = "attache-test-boundary"
    payload = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jpg\"\r\n"
               f"Content-Type: image/jpeg\r\n\r\n").encode() + OVERSIZED + f"\r\n--{boundary}--\r\n".encode()

    def chunks():  # a generator body: requests sends it with Transfer-Encoding: chunked
        for start in range(0, len(payload), 256 * 1024):
            yield payload[start:start + 256 * 1024]

    response = web.session.post(web.url + route, data=chunks(), timeout=60,
                                headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert response.status_code == (413 if route == "/v1/attachments" else 411), response.text[:300]
    assert left_behind(web) == []


def test_form_routes_take_a_body_up_to_their_limit(web):
    """The page's sign-in form still works next to a file part below the limit (the sign-in forms' own, 16 KiB,
    since anyone may post them: app/web/request.py): the part is dropped."""
    part = b"\x00" * (SIGN_IN_FORM_MAX_BYTES // 2)
    response = requests.post(web.url + "/", files={"file": ("x.bin", part)}, data={"csrf_token": "x"}, timeout=30)
    assert response.status_code == 400 and "CSRF" in response.text, "the form was read; its CSRF field is wrong"
    assert left_behind(web) == []


def test_a_temporary_directory_removed_under_the_web_is_made_again(web, data_file):
    """The object GC removed an empty temporary directory under the storage root (a tmp cleaner may do as much):
    every upload was 503 spool_unavailable until the web restarted, /readyz ready all along (an adversarial run)."""
    assert web.upload(data_file("photos/chelsea.jpg")).status_code == 202
    assert left_behind(web) == []
    web.temp.rmdir()
    response = web.upload(data_file("photos/coffee.jpg"))
    assert response.status_code == 202, response.text
    assert web.temp.is_dir() and left_behind(web) == []


def test_a_spool_its_process_holds_is_never_swept_however_old_and_one_whose_process_died_is(tmp_path):
    """The sweep judged a spool by its age alone, and the body is read a block (1 MiB) at a time, the spool written
    only when a block is whole: a client sending steadily at under a block per ten idle periods saw its spool
    removed while it sent, and its whole body answered 503 (an adversarial run). A live spool is held (a lock its
    process keeps while it has the file open); a killed process's is not, and goes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from app.web.spool import SPOOL_PREFIX, HashingSpool, remove_abandoned_spools

    mine = HashingSpool(1_000_000, str(tmp_path))
    mine.write(b"x" * 1000)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom app.web.spool import HashingSpool\n"
        f"spool = HashingSpool(1_000_000, {str(tmp_path)!r})\nspool.write(b'y' * 1000)\nspool.flush()\n"
        "print(spool.path, flush=True)\ntime.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        theirs = holder.stdout.readline().strip()
        long_ago = time.time() - 3600
        for path in tmp_path.glob(SPOOL_PREFIX + "*"):
            os.utime(path, (long_ago, long_ago))
        assert remove_abandoned_spools(60, str(tmp_path)) == 0, "a spool a live process holds is swept"
        assert {str(p) for p in tmp_path.glob(SPOOL_PREFIX + "*")} == {str(mine.path), theirs}
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert remove_abandoned_spools(60, str(tmp_path)) == 1
        assert [str(p) for p in tmp_path.glob(SPOOL_PREFIX + "*")] == [str(mine.path)]
    finally:
        holder.kill()
        holder.wait(10)
        mine.discard()
    assert list(tmp_path.iterdir()) == []
