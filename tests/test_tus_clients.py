"""Resumable uploads proven with clients nobody here wrote, while the web process is SIGKILLed mid-upload.

* ``tuspy`` (the tus project's Python client) uploads the 24 MP photo in
  chunks over a slow link; the web process is killed in the middle and
  started again; the client resumes from the offset the server reports and
  the attachment ends ``ready`` with the original byte for byte.
* The upload page's ``tus-js-client`` in a real Chromium does the same.

Real gunicorn, worker and scheduler processes from the Procfile, real
PostgreSQL, RabbitMQ and storage directory. The link (``tests.tcp.SlowLink``)
is slow so that the kill lands while bytes are still on their way.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import threading
import uuid

import pytest
import requests
from sqlalchemy import select

from app.adapters.postgres.models import attachments, uploads
from tests.conftest import UPLOADER_TOKEN
from tests.processes import Deployment, wait_for
from tests.tcp import SlowLink

pytestmark = pytest.mark.processes

PHOTO = "photos/coffee_24mp_6000x4000.jpg"  # 24 MP, 1.9 MB
CHUNK = 64 * 1024
LINK_BYTES_PER_SECOND = 160 * 1024  # about 12 s for the photo


@pytest.fixture
def deployment(env, tmp_path):
    spool = tmp_path / "spool"  # a web killed mid-upload leaves its spool file here, not in the machine's /tmp
    spool.mkdir()
    deployment = Deployment({**env, "ATTACHE_UPLOAD_CHUNK_BYTES": str(CHUNK), "TMPDIR": str(spool)}, tmp_path)
    yield deployment
    deployment.stop_all()


@pytest.fixture
def link(deployment):
    link = SlowLink(("127.0.0.1", deployment.port), LINK_BYTES_PER_SECOND)
    yield link
    link.close()


def upload_row(engine):
    with engine.connect() as conn:
        return conn.execute(select(uploads)).one_or_none()


def kill_web_in_the_middle(deployment: Deployment, engine, length: int) -> int:
    """Wait until between a fifth and two thirds of the bytes are in, SIGKILL web; the offset it stopped at."""
    wait_for(lambda: (row := upload_row(engine)) is not None and row.upload_offset >= length // 5,
             timeout=60, interval=0.05, message="a fifth of the upload to arrive")
    deployment.processes["web"].kill()
    # a COMMIT the dead process had already sent may still land: the offset it stopped at is the one that stays
    seen = []
    offset = wait_for(lambda: (seen.append(upload_row(engine).upload_offset) or len(seen) > 2)
                      and seen[-1] == seen[-2] == seen[-3] and seen[-1], timeout=10, interval=0.1,
                      message="the killed process's last offset to settle")
    assert 0 < offset < length * 2 // 3, f"the kill came too late to be in the middle ({offset} of {length})"
    return offset


def assert_ready_byte_for_byte(deployment: Deployment, engine, storage_dir, attachment_id: str, photo: bytes):
    status = deployment.wait_state(attachment_id, timeout=120)
    assert status["state"] == "ready", status
    assert status["sha256"] == hashlib.sha256(photo).hexdigest() and status["size"] == len(photo)
    original = deployment.session.get(f"{deployment.url}/v1/attachments/{attachment_id}/original", timeout=30)
    assert original.status_code == 200 and original.content == photo
    with engine.connect() as conn:
        rows = conn.execute(select(uploads.c.attachment_id)).scalars().all()
        assert rows == [uuid.UUID(attachment_id)], "one upload, resumed, not a second one started over"
        assert conn.execute(select(attachments.c.id)).scalars().all() == [uuid.UUID(attachment_id)]
    left = [p for p in (storage_dir / "partial").rglob("*") if p.is_file() and not p.name.startswith(".tmp-")]
    assert left == [], "the partial bytes are gone once the bytes are staged (a killed write's .tmp- aside)"


@pytest.mark.long  # make soak: waits out an outage or measures for long
def test_tuspy_resumes_after_the_web_process_is_killed(deployment, link, engine, storage_dir, data_file):
    from tusclient import client as tus

    photo_path = data_file(PHOTO)
    photo = photo_path.read_bytes()
    for name in ("web", "worker", "scheduler"):
        deployment.start(name)
    whole = base64.b64encode(hashlib.sha256(photo).digest()).decode()  # the joined parts are checked against it
    tus_client = tus.TusClient(f"http://127.0.0.1:{link.port}/v1/uploads",
                               headers={"Authorization": f"Bearer {UPLOADER_TOKEN}", "Repr-Digest": f"sha-256=:{whole}:"})
    uploader = tus_client.uploader(str(photo_path), chunk_size=CHUNK, retries=60, retry_delay=0.5,
                                   metadata={"filename": photo_path.name}, upload_checksum=True)
    reported = []  # every offset the server reported when the client asked where to resume
    ask = uploader.get_offset
    uploader.get_offset = lambda: reported.append(ask()) or reported[-1]
    outcome = {}

    def run():
        try:
            uploader.upload()
            outcome["headers"] = uploader.request.response_headers
        except Exception as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    stopped_at = kill_web_in_the_middle(deployment, engine, len(photo))
    assert reported == [], "the client has not had to ask yet"
    deployment.start("web")
    thread.join(timeout=120)
    assert not thread.is_alive() and "error" not in outcome, outcome
    # the first answer after the restart was where the killed process had stopped, and the client went on from it
    assert reported and reported[0] == stopped_at, (reported, stopped_at)
    attachment_id = outcome["headers"]["attachment-id"]
    assert int(outcome["headers"]["upload-offset"]) == len(photo)
    assert_ready_byte_for_byte(deployment, engine, storage_dir, attachment_id, photo)
    head = requests.head(f"{deployment.url}/v1/uploads/{upload_row(engine).id}", timeout=10,
                         headers={"Authorization": f"Bearer {UPLOADER_TOKEN}", "Tus-Resumable": "1.0.0"})
    assert head.headers["Attachment-Id"] == attachment_id, "a later HEAD names the attachment too"


@pytest.mark.long  # make soak: waits out an outage or measures for long
def test_the_upload_page_resumes_in_a_real_browser(deployment, link, engine, storage_dir, data_file, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    from tests.browser import browsing, waiting

    photo_path = data_file(PHOTO)
    photo = photo_path.read_bytes()
    page = f"http://127.0.0.1:{link.port}/"

    def row(driver):
        found = driver.find_elements(By.CSS_SELECTOR, f'li.upload[data-file-name="{photo_path.name}"]')
        return found[0] if found else None

    with browsing(deployment, tmp_path, "web", "worker", "scheduler") as driver:
        driver.get(page)
        waiting(driver).until(EC.visibility_of_element_located((By.ID, "token"))).send_keys(UPLOADER_TOKEN)
        driver.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()
        chooser = waiting(driver).until(EC.presence_of_element_located((By.ID, "file")))
        chooser.send_keys(str(photo_path))

        kill_web_in_the_middle(deployment, engine, len(photo))
        waiting(driver, 60).until(lambda d: row(d).get_attribute("data-resumed") == "true")
        message = row(driver).find_element(By.CSS_SELECTOR, ".message").text
        assert message.startswith("Connection lost; resuming"), message
        assert row(driver).get_attribute("data-state") == "uploading"
        deployment.start("web")

        waiting(driver, 180).until(lambda d: row(d).get_attribute("data-state") in ("ready", "failed", "refused",
                                                                                      "error"))
        done = row(driver)
        assert done.get_attribute("data-state") == "ready", done.text
        assert done.find_element(By.CSS_SELECTOR, ".message").text == ""
        thumbnail = done.find_element(By.CSS_SELECTOR, "img.thumbnail")
        waiting(driver).until(lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth",
                                                         thumbnail) > 0)
        errors = [entry for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]
        assert errors == [], "the page runs without breaking its CSP"
        driver.save_screenshot(str(tmp_path / "resumed.png"))
        attachment_id = upload_row(engine).attachment_id
        assert attachment_id is not None
        assert_ready_byte_for_byte(deployment, engine, storage_dir, str(attachment_id), photo)


@pytest.mark.long  # make soak: a browser over a slow link
def test_the_upload_page_resumes_after_the_link_stalls_past_the_body_idle_bound(env, tmp_path, engine, storage_dir,
                                                                              data_file):
    """A link that stops passing bytes mid-PATCH for longer than ``ATTACHE_BODY_IDLE_SECONDS`` (a train in a
    tunnel): the web keeps what arrived and answers ``400 incomplete_body`` with the offset to resume at. The page
    took that answer as a refusal and gave the upload up, though it could resume (an adversarial run)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    from tests.browser import browsing, waiting

    photo_path = data_file(PHOTO)
    photo = photo_path.read_bytes()
    spool = tmp_path / "spool"
    spool.mkdir()
    deployment = Deployment({**env, "ATTACHE_UPLOAD_CHUNK_BYTES": str(4 * CHUNK), "ATTACHE_BODY_IDLE_SECONDS": "2",
                             "TMPDIR": str(spool)}, tmp_path)
    link = SlowLink(("127.0.0.1", deployment.port), LINK_BYTES_PER_SECOND)

    def mid_body() -> bool:  # a PATCH's body is arriving: its spool holds some of it
        return any(p.stat().st_size > 0 for p in spool.glob("attache-upload-*"))

    try:
        def row(driver):
            found = driver.find_elements(By.CSS_SELECTOR, f'li.upload[data-file-name="{photo_path.name}"]')
            return found[0] if found else None

        with browsing(deployment, tmp_path, "web", "worker", "scheduler") as driver:
            driver.get(f"http://127.0.0.1:{link.port}/")
            waiting(driver).until(EC.visibility_of_element_located((By.ID, "token"))).send_keys(UPLOADER_TOKEN)
            driver.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()
            waiting(driver).until(EC.presence_of_element_located((By.ID, "file"))).send_keys(str(photo_path))
            wait_for(lambda: (found := upload_row(engine)) is not None and found.upload_offset >= len(photo) // 5,
                     timeout=60, interval=0.05, message="a fifth of the upload to arrive")

            def stalled_mid_body() -> bool:
                wait_for(mid_body, timeout=30, interval=0.01, message="a PATCH mid-body")
                link.flowing.clear()
                if mid_body():
                    return True
                link.flowing.set()  # it ended meanwhile: stall the next one
                return False

            try:
                wait_for(stalled_mid_body, timeout=60, interval=0, message="a stall in the middle of a PATCH")
                # the web cuts the PATCH it waits on, keeps what arrived and answers 400 (held by the link)
                wait_for(lambda: not mid_body(), timeout=30, message="the web to cut the stalled PATCH")
            finally:
                link.flowing.set()
            waiting(driver, 180).until(lambda d: row(d).get_attribute("data-state") in ("ready", "failed",
                                                                                          "refused", "error"))
            done = row(driver)
            assert done.get_attribute("data-state") == "ready", done.text
            assert done.get_attribute("data-resumed") == "true"
            assert_ready_byte_for_byte(deployment, engine, storage_dir, str(upload_row(engine).attachment_id), photo)
    finally:
        link.close()
        deployment.stop_all()


def test_the_readmes_three_lines_upload_as_written(web, engine, data_file, tmp_path, monkeypatch):
    """The README's tuspy lines, run as they are (only the address changed), make a ready-to-process attachment."""
    import re

    from tests.processes import REPO

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Resumable uploads (tus)"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) == 3, code
    (tmp_path / "photo.jpg").write_bytes(data_file("photos/chelsea.jpg").read_bytes())
    monkeypatch.chdir(tmp_path)
    exec(code.replace("http://127.0.0.1:8000", web.url), {"TOKEN": UPLOADER_TOKEN})
    with engine.connect() as conn:
        row = conn.execute(select(uploads)).one()
        filename = conn.execute(select(attachments.c.filename).where(attachments.c.id == row.attachment_id)).scalar()
    assert filename == "photo.jpg"


def _open_signed_in(driver, url: str) -> None:
    """The upload page at ``url``, signed in as the uploader."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    from tests.browser import waiting

    driver.get(url)
    waiting(driver).until(EC.visibility_of_element_located((By.ID, "token"))).send_keys(UPLOADER_TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()


def _choose(driver, path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    from tests.browser import waiting

    waiting(driver).until(EC.presence_of_element_located((By.ID, "file"))).send_keys(str(path))


def _settled(driver, path, seconds: float):
    """The row of ``path`` once it has ended: ready, failed, refused or in error."""
    from selenium.webdriver.common.by import By

    from tests.browser import waiting

    row = (By.CSS_SELECTOR, f'li.upload[data-file-name="{path.name}"]')
    waiting(driver, seconds).until(lambda d: d.find_element(*row).get_attribute("data-state") in (
        "ready", "failed", "refused", "error"))
    return driver.find_element(*row)


@contextlib.contextmanager
def _page_through(link_policy, env, tmp_path):
    """The upload page in a browser, signed in, reaching a deployment of its own (web, worker, scheduler) through
    an :class:`~tests.http_link.HttpLink` with ``link_policy``: (driver, link)."""
    from tests.browser import browsing
    from tests.http_link import HttpLink

    deployment = Deployment(env, tmp_path)
    link = HttpLink(("127.0.0.1", deployment.port), link_policy)
    try:
        with browsing(deployment, tmp_path, "web", "worker", "scheduler") as driver:
            _open_signed_in(driver, f"http://127.0.0.1:{link.port}/")
            yield driver, link
    finally:
        link.close()


def _page_upload_over(link_policy, env, tmp_path, engine, photo) -> list:
    """The upload page sends ``photo`` through an :class:`~tests.http_link.HttpLink` with ``link_policy``; it must
    end ``ready``, as one upload and one attachment. What the link saw."""
    with _page_through(link_policy, env, tmp_path) as (driver, link):
        _choose(driver, photo)
        settled = _settled(driver, photo, 120)
        assert settled.get_attribute("data-state") == "ready", settled.text
    with engine.connect() as conn:
        made = conn.execute(select(attachments.c.id)).scalars().all()
        opened = conn.execute(select(uploads.c.id)).scalars().all()
    assert len(made) == 1 and len(opened) == 1, (made, opened, link.seen)
    return link.seen


@pytest.mark.processes
def test_the_upload_page_resumes_when_a_lost_last_answer_is_followed_by_a_bad_gateway(env, tmp_path, engine,
                                                                                       data_file):
    """The last PATCH's answer is lost, and the page's HEAD that asks where the upload stands meets the front
    proxy's 502 (the web restarting) or a 503 (PostgreSQL away). tus-js-client takes any HEAD answer but 2xx and
    423 for "the upload is gone" and starts a new one: the file was sent again and made a second attachment, and
    an upload cut so mid-way was left open for a day (an adversarial run). The page tries the HEAD again."""
    from tests.http_link import LOSE_ANSWER, PASS, bad_gateway

    happened = {"lost": False, "refused": False}

    def policy(method: str, path: str, answer_head: bytes | None):
        if answer_head is None:
            if method == "HEAD" and happened["lost"] and not happened["refused"]:
                happened["refused"] = True
                return bad_gateway()
            return PASS
        if method == "PATCH" and b"attachment-id" in answer_head.lower() and not happened["lost"]:
            happened["lost"] = True
            return LOSE_ANSWER
        return PASS

    seen = _page_upload_over(policy, env, tmp_path, engine, data_file("photos/chelsea.jpg"))
    assert happened == {"lost": True, "refused": True}, seen


@pytest.mark.processes
def test_the_upload_page_makes_one_upload_when_its_creations_answer_is_lost(env, tmp_path, engine, data_file):
    """The creation's answer lost, tus-js-client sent it again and made a second upload; the first stayed open
    and empty for a day, counted against the uploader's limits (half the answers lost: every creation refused
    within about 100 files, an adversarial run). The page sends the creation with a key of its own."""
    from tests.http_link import LOSE_ANSWER, PASS

    lost = []

    def policy(method: str, path: str, answer_head: bytes | None):
        if answer_head is not None and method == "POST" and path == "/v1/uploads" and not lost:
            lost.append(path)
            return LOSE_ANSWER
        return PASS

    seen = _page_upload_over(policy, env, tmp_path, engine, data_file("photos/chelsea.jpg"))
    assert lost and [what for method, path, what in seen if method == "POST" and path == "/v1/uploads"] == [
        "answer lost", "201"], seen


@pytest.mark.processes
def test_the_page_reloaded_after_lost_creation_answers_resumes_with_the_same_key(env, tmp_path, engine, data_file):
    """The creation's key was made anew each time the file was chosen: after a reload, an upload made by a
    creation whose answer was lost stayed open and empty for a day (a re-attack). It is kept with the file's
    fingerprint until the upload ends."""
    from tests.http_link import LOSE_ANSWER, PASS

    photo = data_file("photos/chelsea.jpg")
    losing = threading.Event()
    losing.set()

    def policy(method: str, path: str, answer_head: bytes | None):
        if answer_head is not None and method == "POST" and path == "/v1/uploads" and losing.is_set():
            return LOSE_ANSWER
        return PASS

    with _page_through(policy, env, tmp_path) as (driver, link):
        _choose(driver, photo)
        wait_for(lambda: sum(what == "answer lost" for _, _, what in link.seen) >= 2, timeout=30,
                 message="two creations' answers lost")
        with engine.connect() as conn:
            assert conn.execute(select(uploads.c.id)).scalars().all() != []  # made, its answer lost
        driver.refresh()
        losing.clear()
        _choose(driver, photo)
        settled = _settled(driver, photo, 120)
        assert settled.get_attribute("data-state") == "ready", settled.text
        assert driver.execute_script("return Object.keys(window.localStorage).filter("
                                     "function (k) { return k.indexOf('attache-creation') === 0; })") == []
    with engine.connect() as conn:
        made = conn.execute(select(attachments.c.id)).scalars().all()
        opened = conn.execute(select(uploads.c.id)).scalars().all()
    assert len(made) == 1 and len(opened) == 1, (made, opened, link.seen)


@pytest.mark.processes
def test_a_file_changed_while_the_page_sends_it_is_given_up_and_its_upload_ended(env, tmp_path, engine, data_file):
    """A file changed on the device mid-upload: Chromium refuses to read it again (``ERR_UPLOAD_FILE_CHANGED``), and
    tus-js-client took that for a lost connection. The row said "resuming" for some two minutes, then that the
    upload had not reached the service, and the upload stayed open for a day, counted against the uploader's limits
    (an adversarial run). The page now says the file changed and ends the upload at once."""
    from tests.http_link import PASS

    photo = tmp_path / "changing.png"
    photo.write_bytes(data_file("photos/astronaut.png").read_bytes())  # 415 KiB: seven PATCHes of 64 KiB
    patches, hold = [], threading.Event()

    def policy(method: str, path: str, answer_head: bytes | None):
        if answer_head is None and method == "PATCH":
            patches.append(path)
            if len(patches) == 2:
                hold.wait(30)  # the second PATCH waits while the file changes on the device
        return PASS

    with _page_through(policy, {**env, "ATTACHE_UPLOAD_CHUNK_BYTES": str(CHUNK)}, tmp_path) as (driver, link):
        _choose(driver, photo)
        wait_for(lambda: len(patches) >= 2, timeout=30, message="the second PATCH")
        with engine.connect() as conn:
            assert len(conn.execute(select(uploads.c.id)).scalars().all()) == 1
        photo.write_bytes(photo.read_bytes()[::-1])  # the same size, other bytes, a later modification time
        later = photo.stat().st_mtime + 60
        os.utime(photo, (later, later))
        hold.set()
        settled = _settled(driver, photo, 30)
        assert settled.get_attribute("data-state") == "refused", settled.text
        assert "changed" in settled.text and "choose it again" in settled.text, settled.text
        wait_for(lambda: driver.execute_script(
            "return Object.keys(window.localStorage).filter(function (k) {"
            " return k.indexOf('attache-creation') === 0 || k.indexOf('tus::') === 0; }).length") == 0,
            timeout=10, message="the page forgets the upload")
        with engine.connect() as conn:
            wait_for(lambda: conn.execute(select(uploads.c.id)).scalars().all() == [], timeout=10,
                     message="the upload ended on the service")
            assert conn.execute(select(attachments.c.id)).scalars().all() == []
    assert ("DELETE", patches[0], "204") in link.seen, link.seen


@pytest.mark.processes
def test_a_file_changed_after_its_last_answer_was_lost_is_the_attachment_it_made(env, tmp_path, engine, data_file):
    """The last PATCH made the attachment and its answer was lost; the file then changed. The page ended the
    finished upload (DELETE) and said the upload was not accepted, though its attachment was made: chosen again,
    the file made a second (a re-attack). The page asks where the upload stands before it gives it up."""
    from tests.http_link import LOSE_ANSWER, PASS

    photo = tmp_path / "touched.jpg"
    photo.write_bytes(data_file("photos/chelsea.jpg").read_bytes())
    lost = []

    def policy(method: str, path: str, answer_head: bytes | None):
        if answer_head is not None and method == "PATCH" and b"attachment-id" in answer_head.lower() and not lost:
            later = photo.stat().st_mtime + 60
            os.utime(photo, (later, later))  # changed on the device while the answer was on its way
            lost.append(path)
            return LOSE_ANSWER
        return PASS

    seen = _page_upload_over(policy, env, tmp_path, engine, photo)
    assert lost and not [what for method, _, what in seen if method == "DELETE"], seen


@pytest.mark.long  # make soak: the page's retries run out (about two minutes)
@pytest.mark.processes
def test_the_page_says_the_service_is_away_when_its_questions_keep_failing(env, tmp_path, engine, data_file):
    """Every HEAD after a lost answer met the front proxy's 502 until the retries ran out: the row said the upload
    "did not reach the service; check the connection", though its bytes had and the service's proxy answered (a
    re-attack). It says the service is away, and the file chosen again resumes it."""
    from selenium.webdriver.common.by import By

    from tests.http_link import LOSE_ANSWER, PASS, bad_gateway

    photo = data_file("photos/chelsea.jpg")
    lost = []

    def policy(method: str, path: str, answer_head: bytes | None):
        if answer_head is None:
            return bad_gateway() if method == "HEAD" and lost else PASS
        if method == "PATCH" and not lost:
            lost.append(path)
            return LOSE_ANSWER
        return PASS

    with _page_through(policy, env, tmp_path) as (driver, _link):
        _choose(driver, photo)
        settled = _settled(driver, photo, 240)
        assert settled.find_element(By.CSS_SELECTOR, ".message").text == (
            "The service is busy or away; choose the file again in a while to resume"), settled.text
