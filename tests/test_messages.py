"""The message contract: jobs.schema.json, enforced on both sides."""

import json
import uuid

import pytest

from app.adapters.broker.rabbitmq import amqp_headers
from app.core import messages
from app.core.steps import Step
from app.errors import InvalidMessage
from app.observability.tracing import new_traceparent


def message(**overrides):
    payload = messages.build(job_id=uuid.uuid4(), attachment_id=uuid.uuid4(), pipeline_version=1, attempt=1,
                             step="inspect", traceparent=new_traceparent())
    payload.update(overrides)
    return payload


def test_built_messages_validate_and_carry_ids_only():
    payload = message()
    assert messages.validate(payload) is payload
    assert set(payload) == {"schema_version", "job_id", "attachment_id", "pipeline_version", "attempt", "step",
                            "traceparent", "created_at"}


@pytest.mark.parametrize("change", [
    {"url": "http://evil.example/x.jpg"},          # no URL ever
    {"path": "../../etc/passwd"},                   # no path ever
    {"filename": "cat.jpg"},                        # no client filename
    {"attempt": 0},                                 # attempts start at 1
    {"job_id": "not-a-uuid"},
    {"step": "explode"},
    {"traceparent": "garbage"},
    {"schema_version": 2},
    {"variant": "thumbnail"},                       # variant only on render
])
def test_schema_refuses(change):
    with pytest.raises(InvalidMessage):
        messages.validate(message(**change))


def test_render_requires_variant():
    with pytest.raises(InvalidMessage):
        messages.validate(message(step="render"))
    assert messages.validate(message(step="render", variant="thumbnail"))


def test_missing_required_field_is_refused():
    payload = message()
    del payload["attempt"]
    with pytest.raises(InvalidMessage):
        messages.validate(payload)


def test_amqp_headers_mirror_trace_carrier():
    payload = message(step="render", variant="crop", tracestate="vendor=1")
    headers = amqp_headers(payload)
    assert headers["traceparent"] == payload["traceparent"]
    assert headers["tracestate"] == "vendor=1"
    assert headers["x-attache-job-id"] == payload["job_id"]
    assert headers["x-attache-attempt"] == 1
    assert headers["x-attache-variant"] == "crop"


def test_the_schema_names_the_steps_of_the_step_enum():
    schema = json.loads(messages.SCHEMA_PATH.read_text())
    assert schema["properties"]["step"]["enum"] == [step.value for step in Step]
    [variant_rule] = schema["allOf"]
    assert variant_rule["if"]["properties"]["step"]["const"] in set(Step)


def test_a_built_message_carries_the_steps_plain_name():
    payload = messages.build(job_id=uuid.uuid4(), attachment_id=uuid.uuid4(), pipeline_version=1, attempt=1,
                             step=Step.PUBLISH, traceparent=new_traceparent())
    assert type(payload["step"]) is str and payload["step"] == "publish"
