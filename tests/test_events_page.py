"""``GET /v1/events``: the page is written from the stored documents' texts as they are: the same JSON, cheaply.

Built through pydantic event by event, a page of 1000 cost the web 25-33 ms of CPU: one uploader's 600 such requests
in 3 s took 19 s of a process's CPU while honest uploads waited seconds for their 202 (an adversarial run).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from sqlalchemy import insert

from app.adapters.postgres.models import events
from app.core import events as core_events
from app.web.responses import answer
from app.web.schemas import Event, EventPage
from tests.conftest import OPERATOR_TOKEN, authed
from tests.driver import upload

#: a page of this many events for the CPU measure (the most one page holds)
PAGE = core_events.MAX_PAGE
#: from the stored documents, the whole request costs a fraction of what pydantic alone costs for the same page
#: (before, the whole request 19.6-20.7 ms for 1000 on a loaded 2-core machine, pydantic 7.2-11.3 ms of it): at
#: most half of it, a margin for a loaded machine
AT_MOST_OF_THE_MODELS_CPU = 0.5
ROUNDS = 9


@pytest.fixture
def broker_kind() -> str:
    return "postgres"  # no RabbitMQ needed: no message is delivered here


@pytest.fixture
def stored(quiet_services, engine, data_file, client):
    """An attachment and its job for events to name (the events table's foreign keys)."""
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    return client.application, accepted.attachment_id, accepted.job_id


def _document(sequence: int, attachment_id, job_id, *, kind="attachment.ready", state="ready", error_code=None,
              uploader="alice", attachment_text=None) -> dict:
    attachment_text = attachment_text or str(attachment_id)
    return {"id": f"evt_{uuid.UUID(int=sequence).hex}", "sequence": sequence, "type": kind,
            "timestamp": "2026-12-08T00:00:00.123Z",
            "data": {"attachment_id": attachment_text, "job_id": str(job_id), "pipeline_version": 1, "state": state,
                     "error_code": error_code, "uploader": uploader,
                     "attachment_url": f"/v1/attachments/{attachment_id}?version=1"}}


def _store(engine, attachment_id, job_id, documents) -> None:
    with engine.begin() as conn:
        conn.execute(insert(events), [
            {"sequence": d["sequence"], "id": uuid.uuid4(), "type": d["type"], "attachment_id": attachment_id,
             "job_id": job_id, "owner": "alice", "document": d} for d in documents])


def test_the_page_is_the_json_it_always_was(stored, engine):
    """The stored documents, escapes and non-ASCII text among them, make the page the model made: the same JSON (its
    keys in ``jsonb``'s order, its text UTF-8), which the schema describes."""
    app, attachment_id, job_id = stored
    documents = [
        _document(1, attachment_id, job_id),
        _document(2, attachment_id, job_id, kind="attachment.failed", state="failed", error_code="corrupt_image"),
        _document(3, attachment_id, job_id, uploader='quote" back\\slash\ttab\x01 /'),
        _document(4, attachment_id, job_id, uploader="zoë 😀"),
        _document(5, attachment_id, job_id, kind="version.ready"),
    ]
    _store(engine, attachment_id, job_id, documents)
    ops = authed(app, OPERATOR_TOKEN)

    whole = ops.get("/v1/events?after=0&limit=10")
    assert whole.status_code == 200 and whole.mimetype == "application/json"
    assert json.loads(whole.data) == {"events": documents, "next_after": 5, "more": False}
    assert json.loads(whole.data) == json.loads(answer_of_the_model(app, {"events": documents, "next_after": 5,
                                                                          "more": False}))
    EventPage.model_validate(whole.json)  # the schema describes it
    assert json.loads(ops.get("/v1/events?after=0&limit=2").data) == {"events": documents[:2], "next_after": 2,
                                                                     "more": True}
    assert ops.get("/v1/events?after=5").data == b'{"events":[],"more":false,"next_after":5}\n'
    assert authed(app).get("/v1/events?after=3").json["events"] == documents[3:]  # alice's own


def answer_of_the_model(app, found: dict) -> bytes:
    """The page as the API wrote it before: through the model, then ``jsonify``."""
    with app.app_context():
        return answer(EventPage.model_validate(found)).get_data()


def _cpu_ms(work) -> float:
    """The median CPU of ``work`` (this thread's: the request runs in it, the process's other threads are not its) over
    :data:`ROUNDS` runs."""
    spent = []
    for _ in range(ROUNDS):
        started = time.thread_time()
        work()
        spent.append(time.thread_time() - started)
    return sorted(spent)[ROUNDS // 2] * 1000


def test_a_full_page_costs_a_fraction_of_what_the_model_costs(stored, engine):
    """Measured against what pydantic alone costs for the same page in the same test (a loaded machine slows both):
    before, the whole request cost more than the model's work, which was part of it."""
    app, attachment_id, job_id = stored
    _store(engine, attachment_id, job_id, [_document(n, attachment_id, job_id) for n in range(1, PAGE + 1)])
    ops = authed(app, OPERATOR_TOKEN)
    url = f"/v1/events?after=0&limit={PAGE}"
    page = ops.get(url)
    assert page.status_code == 200 and len(page.json["events"]) == PAGE
    found = json.loads(page.data)

    def through_the_model():
        return answer_of_the_model(app, found)

    assert json.loads(through_the_model()) == found
    request_ms = _cpu_ms(lambda: ops.get(url).get_data())
    model_ms = _cpu_ms(through_the_model)
    assert request_ms < AT_MOST_OF_THE_MODELS_CPU * model_ms, (request_ms, model_ms)
    assert [Event.model_validate(e).sequence for e in found["events"]] == list(range(1, PAGE + 1))
