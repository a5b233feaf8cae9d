"""The answer models of ``app/web/schemas.py`` write the JSON the API always wrote, and refuse a drifting shape."""

from __future__ import annotations

import json

import pytest
from flask import Flask, jsonify
from pydantic import ValidationError

from app.web import schemas
from app.web.responses import answer

ANSWER_MODELS = sorted({model for model in vars(schemas).values()
                        if isinstance(model, type) and issubclass(model, schemas.Body)
                        and model is not schemas.Body}, key=lambda model: model.__name__)


@pytest.fixture
def app_context():
    with Flask(__name__).app_context():
        yield


@pytest.mark.parametrize("model", ANSWER_MODELS, ids=lambda model: model.__name__)
def test_every_answer_model_is_closed_and_sends_every_field(model):
    schema = model.model_json_schema(mode="serialization")
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == set(schema["properties"])


JOB = {
    "job_id": "6f0c1b9e-3f51-4b9e-9c43-5d6f1a0b2c3d", "attachment_id": "0b6e7d52-93a4-4c1e-8f0a-2b3c4d5e6f70",
    "pipeline_version": 1, "state": "failed", "attempt": 2, "max_attempts": 5, "error_code": "corrupt_image",
    "error_reason": "truncated \u00e9", "lease_owner": None, "lease_expires_at": None,
    "next_attempt_at": "2026-12-01T10:00:00+00:00", "created_at": "2026-12-01T09:59:58.000120+00:00",
    "updated_at": "2026-12-01T10:00:01.500000+02:00", "ready_at": None,
    "trace": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": None},
    "history": [{"at": "2026-12-01T09:59:58.000120+00:00", "from": None, "to": "queued", "attempt": 0,
                 "who": "web:olga", "error_code": None, "reason": None}],
    "audit": [{"at": "2026-12-01T10:00:02+00:00", "actor": "operator:olga", "action": "job.replay", "reason": "x",
               "details": {"attempt": 2, "previous_error_code": "corrupt_image"}}],
    "variants": [{"variant": "original", "published": False, "content_type": "image/jpeg", "width": 4, "height": 3,
                  "size": 120, "sha256": "a" * 64, "provenance": {
                      "source": {"sha256": "a" * 64, "content_type": "image/jpeg", "size": 120},
                      "pipeline": {"version": 1, "fingerprint": "f" * 64}, "spec": None,
                      "copy": "the uploaded bytes, unchanged", "renderer": None, "libraries": None, "encoder": None,
                      "stripped": None}}],
}


@pytest.mark.parametrize(("model", "data"), [
    (schemas.Job, JOB),
    (schemas.OutboxStatus, {"pending": 0, "oldest_created_at": None, "oldest_age_seconds": 0.0}),
    (schemas.OutboxStatus, {"pending": 3, "oldest_created_at": "2026-12-01T10:00:00.250000+00:00",
                            "oldest_age_seconds": 12.0}),
    (schemas.LeaseStatus, {"processing": 1, "expired": 0, "next_expiry": "2026-12-01T10:00:06.123456+00:00"}),
    (schemas.BackfillEstimate, {"dry_run": True, "to_version": 2, "candidates": 0, "renders": 0,
                                "seconds_per_job": 0.0, "estimated_worker_seconds": 0.0}),
], ids=["job", "outbox-empty", "outbox", "leases", "estimate"])
def test_an_answer_through_its_model_is_byte_for_byte_the_dict(app_context, model, data):
    """Timestamps keep ``isoformat`` (``+00:00``, not pydantic's ``Z``), floats stay floats, ids stay text."""
    assert answer(model.model_validate(data)).get_data() == jsonify(data).get_data()


def test_a_shape_that_drifts_from_its_model_is_refused():
    with pytest.raises(ValidationError):
        schemas.Job.model_validate({**JOB, "new_field": 1})
    with pytest.raises(ValidationError):
        schemas.Job.model_validate({key: value for key, value in JOB.items() if key != "trace"})
    with pytest.raises(ValidationError):
        schemas.Job.model_validate({**JOB, "state": "paused"})


def test_a_malformed_dead_letter_is_listed_as_it_came(app_context):
    """Fields copied from a message are documented, not enforced: a junk message must stay listable (and purgeable)."""
    junk = {"message_id": None, "actor_name": 5, "queue_name": ["q"], "body": "not json", "retries": "many",
            "death": [{"reason": 1, "queue": None, "count": "2", "time": 1700000000}], "recorded": None,
            "job_state": None, "traceback": None}
    listing = {"queue": "attache.inspect", "depth": 1, "messages": [junk]}
    body = answer(schemas.DeadLetterMessages.model_validate(listing)).get_data()
    assert json.loads(body) == listing and body == jsonify(listing).get_data()
