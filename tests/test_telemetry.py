"""With an OpenTelemetry SDK configured, messaging spans join the upload's trace."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import select

from app.adapters.postgres.models import outbox
from app.core.workflow import Workflow
from tests.driver import upload

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def sdk():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    yield
    EXPORTER.clear()


def test_producer_and_consumer_spans_follow_the_messaging_conventions(services, engine, data_file):
    EXPORTER.clear()
    accepted = upload(services, data_file("photos/chelsea.jpg"))  # publishes the inspect message
    upload_trace_id = int("1" * 32, 16)  # tests.driver.upload sends trace id 111…1
    [producer] = [s for s in EXPORTER.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    assert producer.context.trace_id == upload_trace_id
    assert producer.attributes["messaging.system"] == "rabbitmq"
    assert producer.attributes["messaging.destination.name"] == "attache.inspect"
    assert producer.attributes["attache.job_id"] == str(accepted.job_id)
    with engine.connect() as conn:
        row = conn.execute(select(outbox)).one()
    assert producer.attributes["messaging.message.id"] == str(row.message_id)

    EXPORTER.clear()
    Workflow(services).handle(row.payload, step="inspect")
    consumers = [s for s in EXPORTER.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert len(consumers) == 1
    consumer = consumers[0]
    assert consumer.context.trace_id == upload_trace_id
    assert consumer.name == "process attache.inspect" and consumer.attributes["attache.attempt"] == 1
    assert [link.context.trace_id for link in consumer.links] == [upload_trace_id]
    # the inspect step announced the renders: each publish is a producer span in the same trace
    renders = [s for s in EXPORTER.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    assert len(renders) == 4 and {s.context.trace_id for s in renders} == {upload_trace_id}
