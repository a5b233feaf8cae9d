"""``AttacheBroker.enqueue_many``: a batch is sent at once and its confirms are waited for together.

RabbitMQ confirms by delivery tag, possibly several at once; a ``mandatory``
message no queue takes is returned before its ack. The broker must count
only what a queue took, in order, and say what stopped the rest.
"""

from __future__ import annotations

import uuid

import pika
import pytest
from dramatiq.message import Message

from app.errors import BrokerUnavailable


def message(queue: str, n: int) -> Message:
    return Message(queue_name=queue, actor_name="test", args=({"n": n},), kwargs={}, options={},
                   message_id=str(uuid.uuid4()))


def drain(broker_url: str, queue: str) -> list[int]:
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        channel, bodies = connection.channel(), []
        while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
            bodies.append(Message.decode(got[2]).args[0]["n"])
        return bodies
    finally:
        connection.close()


def test_a_batch_is_confirmed_whole_and_arrives_in_order(services, broker_url):
    assert services.broker.enqueue_many([message("attache.render", n) for n in range(6)]) == (6, None)
    assert services.broker.enqueue_many([message("attache.render", n) for n in range(6, 8)]) == (2, None)
    assert drain(broker_url, "attache.render") == list(range(8))


def test_a_returned_message_stops_the_count_where_it_stands_and_its_queue_is_declared_again(services, broker_url):
    broker = services.broker
    assert broker.enqueue_many([message("attache.inspect", 0)]) == (1, None)  # declares the queue
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        connection.channel().queue_delete("attache.inspect")  # the broker still believes it is there
    finally:
        connection.close()
    batch = [message("attache.render", 1), message("attache.inspect", 2), message("attache.render", 3)]
    confirmed, error = broker.enqueue_many(batch)
    assert confirmed == 1
    assert isinstance(error, BrokerUnavailable) and "attache.inspect" in str(error) and "Unroutable" in str(error)
    assert broker.enqueue_many([message("attache.inspect", 4)]) == (1, None), "the queue was declared again"
    assert drain(broker_url, "attache.inspect") == [4]
    assert drain(broker_url, "attache.render") == [1, 3], "what a queue took stays (a duplicate at worst)"


def test_a_single_enqueue_raises_what_stopped_it(services, broker_url):
    broker = services.broker
    broker.enqueue(message("attache.publish", 0))
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        connection.channel().queue_delete("attache.publish")
    finally:
        connection.close()
    with pytest.raises(BrokerUnavailable, match="not confirmed"):
        broker.enqueue(message("attache.publish", 1))
