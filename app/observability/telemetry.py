"""OpenTelemetry spans for messaging, through ``opentelemetry-api`` only.

Without an SDK configured these are no-ops. With one, publishing a message
makes a ``PRODUCER`` span and processing it a ``CONSUMER`` span, both in the
trace of the upload request (the message's ``traceparent``), the consumer
also *linked* to it, with the messaging semantic-convention attributes.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind

tracer = trace.get_tracer("attache")


def _context(payload: dict):
    carrier = {"traceparent": payload.get("traceparent", "")}
    if payload.get("tracestate"):
        carrier["tracestate"] = payload["tracestate"]
    return propagate.extract(carrier)


def _attributes(payload: dict, queue: str, message_id: str | None, operation: str) -> dict:
    attributes = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": operation,
        "messaging.destination.name": queue,
        "attache.job_id": str(payload.get("job_id", "")),
        "attache.attempt": int(payload.get("attempt", 0) or 0),
        "attache.step": str(payload.get("step", "")),
    }
    if message_id:
        attributes["messaging.message.id"] = message_id
    if payload.get("variant"):
        attributes["attache.variant"] = payload["variant"]
    return attributes


@contextlib.contextmanager
def producing(payload: dict, queue: str, message_id: str) -> Iterator[None]:
    with tracer.start_as_current_span(f"send {queue}", context=_context(payload), kind=SpanKind.PRODUCER,
                                      attributes=_attributes(payload, queue, message_id, "send")):
        yield


@contextlib.contextmanager
def consuming(payload: dict, queue: str, message_id: str | None = None) -> Iterator[None]:
    context = _context(payload)
    parent = trace.get_current_span(context).get_span_context()
    links = [Link(parent)] if parent.is_valid else []
    with tracer.start_as_current_span(f"process {queue}", context=context, kind=SpanKind.CONSUMER, links=links,
                                      attributes=_attributes(payload, queue, message_id, "process")):
        yield
