"""The dead-letter toolkit against a real RabbitMQ vhost and PostgreSQL.

Messages are dead-lettered without a worker: published to ``attache.inspect``
like the outbox does, then rejected (``requeue=False``) so RabbitMQ itself
moves them to ``attache.inspect.XQ`` with an ``x-death`` header.
"""

from __future__ import annotations

import uuid

import pika
import pytest
from dramatiq.message import Message
from sqlalchemy import insert, select

from app.dlq import DeadLetters
from app.errors import BrokerUnavailable
from app.models import audit_log, dead_letters

XQ = "attache.inspect.XQ"


def depth(broker_url, queue):
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        return connection.channel().queue_declare(queue=queue, passive=True).method.message_count
    finally:
        connection.close()


def dead_letter_three(services, broker_url) -> list[str]:
    """Three job messages, enqueued to attache.inspect and rejected into its XQ; their message ids."""
    ids = []
    for n in range(3):
        payload = {"job_id": str(uuid.uuid4()), "step": "inspect", "attempt": 1, "n": n}
        message = Message(queue_name="attache.inspect", actor_name="inspect", args=(payload,), kwargs={},
                          options={"retries": n})
        services.broker.enqueue(message)
        ids.append(message.message_id)
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        channel = connection.channel()
        for _ in ids:
            method, _properties, _body = channel.basic_get("attache.inspect", auto_ack=False)
            channel.basic_reject(method.delivery_tag, requeue=False)
    finally:
        connection.close()
    assert depth(broker_url, "attache.inspect") == 0
    return ids


def audit_rows(engine):
    with engine.connect() as conn:
        return conn.execute(select(audit_log).order_by(audit_log.c.id)).all()


@pytest.fixture
def dlq(broker_url, engine):
    return DeadLetters(broker_url, engine, socket_timeout=5.0)


@pytest.fixture
def dead(services, broker_url, engine):
    ids = dead_letter_three(services, broker_url)
    with engine.begin() as conn:
        conn.execute(insert(dead_letters).values(
            message_id=ids[0], queue_name="attache.inspect", actor_name="inspect", job_id=None,
            error_code="invalid_message", reason="message does not match jobs.schema.json", retries=0))
    return ids


def by_queue(dlq):
    return {q["queue"]: q for q in dlq.queues()}


def test_queues_lists_every_step_xq_with_missing_ones_at_zero(dlq, dead):
    queues = dlq.queues()
    assert [q["name"] for q in queues] == ["attache.inspect.XQ", "attache.render.XQ", "attache.publish.XQ"]
    assert {q["queue"]: q["messages"] for q in queues} == {
        "attache.inspect": 3, "attache.render": 0, "attache.publish": 0}


def test_messages_are_decoded_and_left_in_place(dlq, dead, broker_url):
    first = dlq.messages("attache.inspect")
    assert [m["message_id"] for m in first] == dead
    for n, item in enumerate(first):
        assert item["actor_name"] == "inspect" and item["queue_name"] == "attache.inspect"
        assert item["body"]["n"] == n and item["body"]["step"] == "inspect"
        assert item["retries"] == n
        assert item["traceback"] is None
        [death] = item["death"]
        assert death["reason"] == "rejected" and death["queue"] == "attache.inspect" and death["count"] == 1
        assert death["time"]
    assert first[0]["recorded"]["error_code"] == "invalid_message"
    assert "jobs.schema.json" in first[0]["recorded"]["reason"]
    assert first[0]["recorded"]["recorded_at"] and first[0]["recorded"]["job_id"] is None
    assert first[1]["recorded"] is None and first[2]["recorded"] is None

    second = dlq.messages("attache.inspect.XQ")  # both spellings
    assert second == first, "nothing consumed, same order"
    assert depth(broker_url, XQ) == 3
    assert [m["message_id"] for m in dlq.messages(XQ, limit=2)] == dead[:2]
    assert depth(broker_url, XQ) == 3
    assert dlq.messages("attache.render") == []  # no XQ yet


def test_requeue_one_then_all(dlq, dead, broker_url, engine):
    result = dlq.requeue("attache.inspect", actor="ops:alice", message_ids=[dead[1], "nope"], reason="fixed")
    assert result == {"requeued": 1, "not_found": ["nope"]}
    assert depth(broker_url, XQ) == 2 and depth(broker_url, "attache.inspect") == 1
    assert [m["message_id"] for m in dlq.messages(XQ)] == [dead[0], dead[2]], "others kept, in order"

    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        method, properties, body = connection.channel().basic_get("attache.inspect", auto_ack=False)
        assert Message.decode(body).message_id == dead[1]
        assert properties.message_id == dead[1] and properties.delivery_mode == 2
        assert properties.headers["x-attache-requeued-by"] == "ops:alice"
        assert properties.headers["x-attache-step"] == "inspect", "original headers kept"
        assert properties.headers["x-death"][0]["reason"] == "rejected"
    finally:
        connection.close()  # back to the queue

    [row] = audit_rows(engine)
    assert (row.actor, row.action, row.target, row.reason) == ("ops:alice", "dlq.requeue", XQ, "fixed")
    assert row.details == {"message_ids": [dead[1]], "count": 1}

    assert dlq.requeue(XQ, actor="ops:bob") == {"requeued": 2, "not_found": []}
    assert depth(broker_url, XQ) == 0 and depth(broker_url, "attache.inspect") == 3
    last = audit_rows(engine)[-1]
    assert (last.actor, last.action, last.target) == ("ops:bob", "dlq.requeue", XQ)
    assert last.details == {"message_ids": [dead[0], dead[2]], "count": 2}

    assert dlq.requeue(XQ, actor="ops:bob", message_ids=[dead[0]]) == {"requeued": 0, "not_found": [dead[0]]}


def test_purge_empties_and_audits(dlq, dead, broker_url, engine):
    assert dlq.purge("attache.inspect.XQ", actor="ops:carol", reason="junk") == {"purged": 3}
    assert depth(broker_url, XQ) == 0
    assert by_queue(dlq)["attache.inspect"]["messages"] == 0
    [row] = audit_rows(engine)
    assert (row.actor, row.action, row.target, row.reason) == ("ops:carol", "dlq.purge", XQ, "junk")
    assert row.details == {"count": 3}


@pytest.mark.parametrize("name", ["attache.inspect.DQ", "attache.nope", "attache.nope.XQ", "", "amq.rabbitmq.log"])
def test_unknown_queue_is_refused(dlq, name):
    with pytest.raises(ValueError):
        dlq.messages(name)
    with pytest.raises(ValueError):
        dlq.requeue(name, actor="ops")
    with pytest.raises(ValueError):
        dlq.purge(name, actor="ops")


def test_unreachable_broker_is_broker_unavailable(engine):
    dlq = DeadLetters("amqp://guest:guest@127.0.0.1:1/%2F", engine, socket_timeout=1.0)
    with pytest.raises(BrokerUnavailable):
        dlq.queues()
    with pytest.raises(BrokerUnavailable):
        dlq.messages("attache.inspect")
    with pytest.raises(BrokerUnavailable):
        dlq.requeue("attache.inspect", actor="ops")
    with pytest.raises(BrokerUnavailable):
        dlq.purge("attache.inspect", actor="ops")
    assert audit_rows(engine) == [], "nothing done, nothing audited"
