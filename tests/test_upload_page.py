"""``/``, the upload page: sign-in, the session as API credentials (with CSRF), and a real browser run."""

from __future__ import annotations

import hashlib
import re
import time

import pytest
from sqlalchemy import func, select

from app.adapters.postgres.models import attachments, ended_sessions, uploads
from app.config import Settings
from app.core.auth import Token
from app.web import create_app
from app.web.page import limit_in_mb
from tests.conftest import OPERATOR_TOKEN, OTHER_UPLOADER_TOKEN, UPLOADER_TOKEN, authed

CSP = ("default-src 'self'; img-src 'self' data: blob: *; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "form-action 'self'; frame-ancestors 'none'")


@pytest.fixture
def app(settings):
    app = create_app(settings)
    yield app
    app.extensions["attache"].close()


def csrf_field(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "page has no CSRF field"
    return found.group(1)


def csrf_meta(html: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', html)
    assert found, "page has no CSRF meta tag for its script"
    return found.group(1)


def sign_in(client, token: str):
    form = client.get("/")
    assert form.status_code == 200 and 'id="sign-in"' in form.text
    return client.post("/", data={"token": token, "csrf_token": csrf_field(form.text)})


def signed_in(app, token: str = UPLOADER_TOKEN):
    client = app.test_client()
    response = sign_in(client, token)
    assert response.status_code == 303 and response.headers["Location"] == "/"
    return client


def post_photo(client, data_file, name="photos/chelsea.jpg", headers=None):
    with open(data_file(name), "rb") as fh:
        return client.post("/v1/attachments", data={"file": (fh, name.rsplit("/", 1)[-1])},
                           content_type="multipart/form-data", headers=headers or {})


def count_attachments(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(attachments)).scalar_one()


# --- the page and its sign-in ---------------------------------------------------------


def test_without_a_session_the_page_is_a_labelled_sign_in_form(app):
    client = app.test_client()
    page = client.get("/")
    assert page.status_code == 200
    assert "<title>" in page.text and "<h1>Sign in to upload photos</h1>" in page.text
    assert '<label for="token">' in page.text and 'id="token" name="token"' in page.text
    assert 'type="file"' not in page.text
    with client.session_transaction() as session:
        assert session["csrf"] == csrf_field(page.text)
        assert "principal" not in session
    assert page.headers["Content-Security-Policy"] == CSP
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["X-Content-Type-Options"] == "nosniff"


def test_uploader_signs_in_and_sees_the_upload_page(app, settings):
    client = app.test_client()
    before = csrf_field(client.get("/").text)
    response = sign_in(client, UPLOADER_TOKEN)
    assert response.status_code == 303 and response.headers["Location"] == "/"
    assert "HttpOnly" in response.headers["Set-Cookie"] and UPLOADER_TOKEN not in response.headers["Set-Cookie"]
    with client.session_transaction() as session:
        assert (session["principal"], session["role"]) == ("alice", "uploader")
        assert session["csrf"] != before, "a fresh CSRF token after sign-in"
        assert UPLOADER_TOKEN not in repr(dict(session))
        csrf = session["csrf"]

    page = client.get("/")
    assert page.status_code == 200 and "<h1>Upload photos</h1>" in page.text
    assert 'id="principal">alice<' in page.text
    assert re.search(r'<label for="file"[^>]*>\s*<span class="title">Drop photos here or choose files</span>',
                     page.text)
    assert re.search(r'<input type="file" id="file" name="file" multiple', page.text)
    assert 'aria-live="polite"' in page.text
    assert '<script src="/static/upload.js" defer></script>' in page.text
    assert csrf_meta(page.text) == csrf
    assert f'data-max-bytes="{settings.max_upload_bytes}"' in page.text and 'data-max-mb="50"' in page.text
    assert "up to 50 MB each" in page.text
    assert page.headers["Content-Security-Policy"] == CSP

    script = client.get("/static/upload.js")
    assert script.status_code == 200 and "javascript" in script.mimetype
    assert "X-CSRF-Token" in script.text and "onProgress" in script.text and "tus.Upload" in script.text
    script.close()
    assert '<script src="/static/tus.min.js" defer></script>' in page.text
    assert f'data-chunk-bytes="{settings.upload_chunk_bytes}"' in page.text and 'data-resumable-url="/v1/uploads"' \
        in page.text
    vendored = client.get("/static/tus.min.js")
    assert vendored.status_code == 200 and "javascript" in vendored.mimetype
    vendored.close()
    licence = client.get("/static/tus.min.js.LICENSE.txt")
    assert licence.status_code == 200 and "tus-js-client 4.3.1" in licence.text and "MIT License" in licence.text
    licence.close()


def test_operator_may_sign_in_too_and_bad_sign_ins_change_nothing(app):
    assert sign_in(app.test_client(), OPERATOR_TOKEN).status_code == 303
    client = app.test_client()
    wrong = sign_in(client, "not-a-valid-token")
    assert wrong.status_code == 401 and "not valid" in wrong.text and 'id="sign-in"' in wrong.text
    assert client.post("/", data={"token": UPLOADER_TOKEN}).status_code == 400, "no CSRF token"
    assert client.post("/", data={"token": UPLOADER_TOKEN, "csrf_token": "forged"}).status_code == 400
    with client.session_transaction() as session:
        assert "principal" not in session
    assert 'type="file"' not in client.get("/").text


def test_sign_out_needs_the_csrf_token(app):
    client = signed_in(app)
    page = client.get("/")
    assert client.post("/sign-out", data={"csrf_token": "forged"}).status_code == 303
    assert 'type="file"' in client.get("/").text, "a forged sign-out changes nothing"
    assert client.post("/sign-out", data={"csrf_token": csrf_meta(page.text)}).status_code == 303
    assert 'id="sign-in"' in client.get("/").text


def test_an_uploader_session_does_not_open_the_operator_console(app):
    assert signed_in(app).get("/ops").status_code == 302


# --- the session as API credentials -----------------------------------------------------


def test_session_reads_its_own_attachments_only(app, data_file):
    upload = post_photo(authed(app, UPLOADER_TOKEN), data_file)
    assert upload.status_code == 202
    attachment_id = upload.json["id"]
    alice = signed_in(app)
    status = alice.get(f"/v1/attachments/{attachment_id}")
    assert status.status_code == 200 and status.json["id"] == attachment_id
    assert alice.get(f"/v1/attachments/{attachment_id}/variants/thumbnail").status_code == 409, "not ready yet"
    bob = signed_in(app, OTHER_UPLOADER_TOKEN)
    assert bob.get(f"/v1/attachments/{attachment_id}").status_code == 404
    assert signed_in(app, OPERATOR_TOKEN).get(f"/v1/attachments/{attachment_id}").status_code == 200
    assert app.test_client().get(f"/v1/attachments/{attachment_id}").status_code == 401, "no session, no header"


def test_session_post_needs_the_csrf_header(app, engine, data_file):
    client = signed_in(app)
    for headers in ({}, {"X-CSRF-Token": "forged"}, {"X-CSRF-Token": ""}):
        response = post_photo(client, data_file, headers=headers)
        assert response.status_code == 403 and response.json["error"] == "csrf", headers
    assert count_attachments(engine) == 0

    csrf = csrf_meta(client.get("/").text)
    accepted = post_photo(client, data_file, headers={"X-CSRF-Token": csrf})
    assert accepted.status_code == 202
    with engine.connect() as conn:
        assert conn.execute(select(attachments.c.owner)).scalar_one() == "alice"


def test_a_bearer_header_wins_over_the_session(app, data_file):
    client = signed_in(app)
    response = client.get("/v1/ops/jobs", headers={"Authorization": "Bearer not-a-valid-token"})
    assert response.status_code == 401, "a bad header is never rescued by a session"
    assert client.get("/v1/ops/jobs").status_code == 403, "an uploader session has the uploader role"
    assert signed_in(app, OPERATOR_TOKEN).get("/v1/ops/jobs").status_code == 200


def test_revoking_the_token_ends_the_session_for_the_api_and_the_page(app, data_file):
    client = signed_in(app)
    app.extensions["attache_tokens"] = tuple(t for t in app.extensions["attache_tokens"]
                                             if t.identity.principal != "alice")
    assert client.get("/v1/ops/outbox").status_code == 401
    assert 'id="sign-in"' in client.get("/").text


def test_replacing_the_token_ends_the_sessions_it_signed_in(app):
    """The principal keeps its name and role with a new token: a session signed in with the old one is refused
    (an adversarial run: the old token's bearer got 401 and its console cookie kept full powers)."""
    client = signed_in(app, OPERATOR_TOKEN)
    assert client.get("/v1/ops/outbox").status_code == 200
    app.extensions["attache_tokens"] = tuple(
        Token("a-new-token-of-olga", t.identity) if t.secret == OPERATOR_TOKEN else t
        for t in app.extensions["attache_tokens"])
    assert client.get("/v1/ops/outbox").status_code == 401
    assert 'id="sign-in"' in client.get("/").text
    assert signed_in(app, "a-new-token-of-olga").get("/v1/ops/outbox").status_code == 200


def test_a_copy_of_the_cookie_is_refused_once_its_session_signed_out(app, engine):
    client = signed_in(app, OPERATOR_TOKEN)
    copy = app.test_client()
    copy.set_cookie("session", client.get_cookie("session").value)
    assert copy.get("/v1/ops/outbox").status_code == 200
    page = client.get("/")
    assert client.post("/sign-out", data={"csrf_token": csrf_field(page.text)}).status_code == 303
    assert client.get("/v1/ops/outbox").status_code == 401
    assert copy.get("/v1/ops/outbox").status_code == 401, "the copy outlived the sign-out"
    assert 'id="sign-in"' in copy.get("/").text
    other = signed_in(app, OPERATOR_TOKEN)
    assert other.get("/v1/ops/outbox").status_code == 200, "a new sign-in of the same principal is not ended"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ended_sessions)).scalar() == 1


def test_a_sign_out_the_database_cannot_record_says_so_and_leaves_the_session(app, database_url):
    """A re-attack: with the database unable to write, signing out answered JSON, and the session, said to be
    ended, was not. Now the page says it is still signed in (503, Retry-After), on the page and the console."""
    from tests.processes import read_only

    page_client = signed_in(app, OPERATOR_TOKEN)
    token = csrf_field(page_client.get("/").text)
    with read_only(database_url):
        answer = page_client.post("/sign-out", data={"csrf_token": token})
        assert answer.status_code == 503 and answer.headers["Retry-After"], answer.text
        assert "still signed in" in answer.text and 'id="principal">olga<' in answer.text
        console = page_client.post("/ops/logout", data={"csrf_token": token})
        assert console.status_code == 503 and "still signed in" in console.text and "<h1>" in console.text
    assert page_client.get("/v1/ops/outbox").status_code == 200, "still signed in, as it was told"


def test_a_session_cookie_with_a_made_up_id_or_time_is_refused_not_a_500(app):
    """A re-attack (with the signing key): a session id with a NUL answered 500 on every route; a sign-in time far
    in the future never expired, and signing out answered 500."""
    client = signed_in(app, OPERATOR_TOKEN)
    fresh = app.test_client()  # signed in by a web whose clock is a minute ahead of this one's: still good
    fresh.set_cookie("session", client.get_cookie("session").value)
    with fresh.session_transaction() as session:
        session["since"] = int(time.time()) + 60
    assert fresh.get("/v1/ops/outbox").status_code == 200
    for change in ({"sid": "a\x00" * 16}, {"sid": "short"}, {"since": 10**20}, {"since": 1e20}, {"since": "1"},
                   {"since": int(time.time()) + 3600}):
        forged = app.test_client()
        forged.set_cookie("session", client.get_cookie("session").value)
        with forged.session_transaction() as session:
            session.update(change)
        assert forged.get("/v1/ops/outbox").status_code == 401, change
        token = csrf_field(forged.get("/").text)
        assert forged.post("/sign-out", data={"csrf_token": token}).status_code == 303, change


def test_development_mode_signs_the_local_user_in_without_typing(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dev = {k: v for k, v in env.items() if k != "ATTACHE_API_TOKENS"}
    app = create_app(Settings.from_env({**dev, "ATTACHE_DEV": "1"}))
    local = app.test_client()
    page = local.get("/")
    assert page.status_code == 200 and 'type="file"' in page.text and 'id="principal">dev<' in page.text
    with local.session_transaction() as session:
        assert (session["principal"], session["role"]) == ("dev", "operator")
    remote = app.test_client().get("/", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert remote.status_code == 200 and 'id="sign-in"' in remote.text, "only the local user is signed in"
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"):
        assert 'id="principal">dev<' in app.test_client().get("/", headers={"Host": host}).text, host
    # a page of another site whose name resolves to 127.0.0.1 (DNS rebinding) reaches the server from this machine
    # with its own name: it must not be signed in as the operator (an adversarial run purged a DLQ that way)
    for host in ("attacker.example:8000", "attacker.example", "localhost.attacker.example", "[::1"):
        rebound = app.test_client()
        page = rebound.get("/", headers={"Host": host})
        assert 'id="sign-in"' in page.text, host
        assert rebound.get("/ops/login", headers={"Host": host}).status_code == 200, host
        assert rebound.get("/v1/ops/jobs", headers={"Host": host}).status_code == 401, host
    app.extensions["attache"].close()
    prod = create_app(Settings.from_env(env))
    assert 'id="sign-in"' in prod.test_client().get("/").text, "outside development mode, a sign-in is needed"
    prod.extensions["attache"].close()


def test_the_limit_is_said_in_megabytes():
    assert limit_in_mb(50 * 1024 * 1024) == "50"
    assert limit_in_mb(5 * 1024 * 1024 // 2) == "2.5"
    assert limit_in_mb(512 * 1024) == "0.5"


# --- a real browser against real web, worker and scheduler processes ------------------


@pytest.mark.processes
def test_person_uploads_photos_in_a_real_browser(env, engine, data_file, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.browser import browsing
    from tests.processes import Deployment

    photo = data_file("photos/chelsea_12mp_4247x2825.jpg")
    corrupt = data_file("pillow/truncated_jpeg.jpg")
    vector = data_file("synthetic/vector_logo.svg")
    deployment = Deployment(env, tmp_path)
    driver = None  # the browser, once started below

    def row(path):
        return driver.find_element(By.CSS_SELECTOR, f'li.upload[data-file-name="{path.name}"]')

    def settled(path, states=("ready", "failed", "refused", "error")):
        def check(_driver):
            found = _driver.find_elements(By.CSS_SELECTOR, f'li.upload[data-file-name="{path.name}"]')
            return found and found[0].get_attribute("data-state") in states and found[0]
        return check

    with browsing(deployment, tmp_path, "web", "worker", "scheduler") as driver:
        wait = WebDriverWait(driver, 20)
        slow = WebDriverWait(driver, 120)

        driver.get(deployment.url + "/")
        token_field = wait.until(EC.visibility_of_element_located((By.ID, "token")))
        assert driver.find_element(By.CSS_SELECTOR, "label[for=token]").text == "Your API token"
        token_field.send_keys(UPLOADER_TOKEN)
        driver.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()

        chooser = wait.until(EC.presence_of_element_located((By.ID, "file")))
        assert driver.find_element(By.TAG_NAME, "h1").text == "Upload photos"
        assert "Drop photos here or choose files" in driver.find_element(By.CSS_SELECTOR, "label[for=file]").text
        assert driver.find_element(By.ID, "uploads").get_attribute("aria-live") == "polite"
        chooser.send_keys("\n".join(str(p) for p in (photo, corrupt)))

        ready = slow.until(settled(photo))
        assert ready.get_attribute("data-state") == "ready", ready.text
        assert ready.find_element(By.CSS_SELECTOR, ".state").text == "Ready"
        thumbnail = ready.find_element(By.CSS_SELECTOR, "img.thumbnail")
        assert thumbnail.get_attribute("alt") == f"Thumbnail of {photo.name}"
        assert "/variants/thumbnail" in thumbnail.get_attribute("src")
        wait.until(lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth",
                                              thumbnail) > 0)
        assert ready.find_element(By.TAG_NAME, "progress").is_displayed() is False

        failed = slow.until(settled(corrupt))
        assert failed.get_attribute("data-state") == "failed", failed.text
        message = failed.find_element(By.CSS_SELECTOR, ".message").text
        assert message.startswith("Processing failed:") and "could not be decoded" in message, message
        assert "corrupt_image" in message
        assert failed.find_elements(By.TAG_NAME, "img") == []

        driver.find_element(By.ID, "file").send_keys(str(vector))
        refused = wait.until(settled(vector))
        assert refused.get_attribute("data-state") == "refused", refused.text
        assert refused.find_element(By.CSS_SELECTOR, ".message").text == (
            "Not an image we process (JPEG, PNG, WebP, GIF, TIFF, BMP, HEIC or AVIF)")
        assert len(driver.find_elements(By.CSS_SELECTOR, "li.upload")) == 3
        driver.save_screenshot(str(tmp_path / "upload-page.png"))  # for a human to look at
        print(f"screenshot: {tmp_path / 'upload-page.png'}")

    from app.adapters.postgres.models import jobs

    with engine.connect() as conn:
        rows = conn.execute(select(attachments.c.filename, jobs.c.state).join(
            jobs, jobs.c.attachment_id == attachments.c.id).where(attachments.c.owner == "alice")).all()
    assert dict(rows) == {photo.name: "ready", corrupt.name: "failed"}, rows
    with engine.connect() as conn:
        promised = conn.execute(select(uploads.c.filename, uploads.c.expected_sha256)).all()
    assert dict(promised) == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (photo, corrupt)}, \
        "the page sent each file's Repr-Digest, checked against the joined pieces"
