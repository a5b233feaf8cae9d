"""Each client's reads in flight in one web process are bounded (``ATTACHE_MAX_READS_PER_CLIENT``).

An adversarial review: one uploader's token sent 600 pages of 1000 events in 3 s, each on a connection closed at
once; the web spent 19 s of CPU on them and an honest upload's 202 took 1.7-3.3 s instead of 12-40 ms. Uploads and
downloads had bounds per client, reads none.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from app.config import Settings
from app.core import events
from app.web import create_app
from tests.conftest import OPERATOR_TOKEN, OTHER_UPLOADER_TOKEN, UPLOADER_TOKEN, authed
from tests.processes import wait_for

#: the bound these tests set (the default is 4)
BOUND = 3
WAIT_SECONDS = 10


@pytest.fixture
def broker_kind() -> str:
    return "postgres"  # no RabbitMQ needed: nothing is published here


@pytest.fixture
def app(env):
    app = create_app(Settings.from_env({**env, "ATTACHE_MAX_READS_PER_CLIENT": str(BOUND)}))
    yield app
    app.extensions["attache"].close()


def _refused(response) -> bool:
    return response.status_code == 429 and response.json["error"] == "too_many_reads_at_once" \
        and response.headers["Retry-After"] == "5"


@pytest.fixture
def held_pages(app, monkeypatch):
    """``hold(n)``: n reads of alice's ``/v1/events`` held inside the view (its page waits) until the block ends."""
    release, waiting, answers = threading.Event(), [], []
    real_page = events.page

    def page(conn, *, after, limit, owner):
        if owner == "alice":
            waiting.append(1)
            release.wait(WAIT_SECONDS)
        return real_page(conn, after=after, limit=limit, owner=owner)

    monkeypatch.setattr(events, "page", page)

    def read():
        response = authed(app, UPLOADER_TOKEN).get("/v1/events")
        answers.append(response.status_code)
        response.close()

    class Hold:
        def __init__(self, n: int):
            self.threads = [threading.Thread(target=read, daemon=True) for _ in range(n)]

        def __enter__(self):
            for thread in self.threads:
                thread.start()
            wait_for(lambda: len(waiting) == len(self.threads), timeout=WAIT_SECONDS,
                     message="alice's reads held in the view")
            return answers

        def __exit__(self, *exc):
            release.set()
            for thread in self.threads:
                thread.join(WAIT_SECONDS)

    return Hold


def test_one_more_read_than_the_bound_is_429_at_once_and_others_read_on(app, held_pages):
    alice, bob, olga = (authed(app, token) for token in (UPLOADER_TOKEN, OTHER_UPLOADER_TOKEN, OPERATOR_TOKEN))
    with held_pages(BOUND) as answers:
        refused = alice.get("/v1/events")
        assert _refused(refused), (refused.status_code, refused.data)
        assert _refused(alice.get(f"/v1/attachments/{uuid.uuid4()}")), "every read of hers counts, whatever its route"
        assert alice.head("/v1/events").status_code == 429
        assert bob.get("/v1/events").status_code == 200, "another principal's reads are its own"
        assert olga.get("/v1/events").status_code == 200
        assert alice.get(f"/v1/attachments/{uuid.uuid4()}/original").status_code == 404, "downloads: their own bound"
        assert alice.post("/v1/attachments").status_code != 429, "uploads: their own bound"
        for public in ("/healthz", "/v1/openapi.json"):
            assert alice.get(public).status_code == 200
        assert app.extensions["attache_reads"].sending("alice") == BOUND
    assert answers == [200] * BOUND
    assert app.extensions["attache_reads"].sending("alice") == 0
    assert alice.get("/v1/events").status_code == 200


def test_an_answer_made_whole_gives_its_place_back_unread(app):
    """Held until the server closed it, a page whose answer object nobody closed at once (a test client's, left to
    the collector) kept its place, and the fifth page of a run of the tests was 429: the view's work is done once
    its answer is made, and the answer's writing is bounded as every answer's is."""
    alice = authed(app, UPLOADER_TOKEN)
    unread = [alice.get("/v1/events", buffered=False) for _ in range(BOUND + 1)]
    assert [answer.status_code for answer in unread] == [200] * (BOUND + 1)
    assert app.extensions["attache_reads"].sending("alice") == 0
    for answer in unread:
        answer.close()


def test_a_read_that_raises_gives_its_place_back(app, monkeypatch):
    def broken(conn, **kwargs):
        raise RuntimeError("a bug in the view")

    monkeypatch.setattr(events, "page", broken)
    alice = authed(app, UPLOADER_TOKEN)
    for _ in range(BOUND + 1):  # answered 500: the answer gives it back
        failed = alice.get("/v1/events")
        assert failed.status_code == 500
        failed.close()
    app.config["PROPAGATE_EXCEPTIONS"] = True  # no answer at all: the request's end gives it back
    for _ in range(BOUND + 1):
        with pytest.raises(RuntimeError):
            alice.get("/v1/events")
    assert app.extensions["attache_reads"].sending("alice") == 0
    monkeypatch.undo()
    assert alice.get("/v1/events").status_code == 200


def test_operators_have_the_bound_on_the_console_and_the_ops_api(app):
    """An operator's places taken (as by reads in flight), its next console page and ``/v1/ops`` read are refused,
    the console's as a page; its downloads, ``/metrics`` and the probes are not reads counted here."""
    olga = authed(app, OPERATOR_TOKEN)
    holds = [app.extensions["attache_reads"].hold("olga") for _ in range(BOUND)]
    for hold in holds:
        hold.__enter__()
    try:
        page = olga.get("/ops/jobs")
        assert page.status_code == 429 and page.headers["Retry-After"] == "5" and page.mimetype == "text/html"
        assert "Too many pages at once" in page.text
        assert page.headers["Content-Security-Policy"].startswith("default-src 'self'")  # a console page still
        assert _refused(olga.get("/v1/ops/jobs"))
        assert olga.get("/metrics").status_code == 200
        assert olga.get("/readyz").status_code in (200, 503)
        assert authed(app, UPLOADER_TOKEN).get("/v1/events").status_code == 200
    finally:
        for hold in holds:
            hold.__exit__(None, None, None)
    assert olga.get("/ops/jobs").status_code == 200 and olga.get("/v1/ops/jobs").status_code == 200


def test_the_bound_and_its_refusal_are_documented(app):
    document = authed(app).get("/v1/openapi.json").json
    listed = document["paths"]["/v1/events"]["get"]["responses"]["429"]
    assert listed == {"$ref": "#/components/responses/TooManyReadsAtOnce"}
    shared = document["components"]["responses"]["TooManyReadsAtOnce"]
    assert "Retry-After" in shared["headers"]
    assert shared["content"]["application/json"]["schema"]["allOf"][1]["properties"]["error"] == {
        "const": "too_many_reads_at_once"}
    assert "429" in document["paths"]["/v1/ops/jobs"]["get"]["responses"]
    assert "429" in document["paths"]["/v1/attachments/{attachment_id}"]["get"]["responses"]
    download = document["paths"]["/v1/attachments/{attachment_id}/original"]["get"]["responses"]["429"]
    assert "too_many_downloads_at_once" in str(download) and "too_many_reads_at_once" not in str(download)
    assert "429" not in document["paths"]["/healthz"]["get"]["responses"]


def test_no_limit_when_the_setting_is_0(env, monkeypatch):
    app = create_app(Settings.from_env({**env, "ATTACHE_MAX_READS_PER_CLIENT": "0"}))
    try:
        alice = authed(app, UPLOADER_TOKEN)
        unread = [alice.get("/v1/events", buffered=False) for _ in range(BOUND + 2)]
        assert alice.get("/v1/events").status_code == 200
        for answer in unread:
            answer.close()
    finally:
        app.extensions["attache"].close()
