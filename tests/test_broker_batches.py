"""``AttacheBroker.enqueue_many``: a batch is sent at once and its confirms are waited for together.

RabbitMQ confirms by delivery tag, possibly several at once; a ``mandatory``
message no queue takes is returned before its ack. The broker must count
only what a queue took, in order, and say what stopped the rest.
"""

from __future__ import annotations

import subprocess
import uuid

import pika
import pytest
from dramatiq.message import Message

from app.adapters.broker.rabbitmq import CONSUMER_HEARTBEAT_SECONDS, PUBLISHER_HEARTBEAT_SECONDS, AttacheBroker
from app.errors import BrokerUnavailable
from tests.processes import wait_for


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


def _connections(vhost: str) -> set[str]:
    listed = subprocess.run(["rabbitmqctl", "-q", "list_connections", "vhost", "name"], capture_output=True,
                            text=True, check=True, timeout=60).stdout
    return {line.split("\t", 1)[1] for line in listed.splitlines()[1:] if line.split("\t", 1)[0] == vhost}


def test_a_connection_rabbitmq_closed_while_its_thread_was_idle_is_replaced_at_the_next_publish(broker_url):
    """pika's blocking connection answers heartbeats only when its thread calls into it, so RabbitMQ closes the
    connection of a thread idle for two heartbeats (60 s in production: a step waiting out a PostgreSQL outage).

    Before, the next publish failed and was not retried: a Dramatiq retry's message was lost, a step's follow-up
    waited for the relay. Here with a heartbeat of 1 s.
    """
    vhost = broker_url.rsplit("/", 1)[1]
    broker = AttacheBroker(url=broker_url)
    broker.parameters.heartbeat = 1
    try:
        before = _connections(vhost)
        assert broker.enqueue_many([message("attache.render", 0)]) == (1, None)
        # listing connections may take rabbitmqctl longer than two heartbeats on a loaded machine, so ours may be
        # closed already when the list comes (a run of the suite beside other work)
        ours = _connections(vhost) - before
        assert len(ours) <= 1, ours
        wait_for(lambda: not ours & _connections(vhost), timeout=60, interval=0.5,
                 message="RabbitMQ closing the idle connection")
        assert broker.enqueue_many([message("attache.render", 1)]) == (1, None)
        broker.enqueue(message("attache.render", 2))
        assert drain(broker_url, "attache.render") == [0, 1, 2]
    finally:
        broker.close()


def _heartbeats(vhost: str) -> list[int]:
    """The heartbeat RabbitMQ agreed with each connection of ``vhost``, in seconds."""
    listed = subprocess.run(["rabbitmqctl", "-q", "list_connections", "vhost", "timeout"], capture_output=True,
                            text=True, check=True, timeout=60).stdout
    return sorted(int(line.split("\t")[1]) for line in listed.splitlines()[1:] if line.split("\t")[0] == vhost)


@pytest.mark.parametrize("query, consumer, publisher", [
    ("", CONSUMER_HEARTBEAT_SECONDS, PUBLISHER_HEARTBEAT_SECONDS),
    ("?heartbeat=7", 7, 7),  # the URL's own wins, as DATABASE_URL's libpq parameters do
])
def test_a_consumer_connection_beats_faster_than_a_publisher_and_the_url_wins(broker_url, query, consumer, publisher):
    """A consumer's connection holds its worker's unacked messages, which RabbitMQ gives to another worker two to
    three heartbeats after the worker went silent: with one heartbeat for every connection (30 s), a job waited
    about 90 s for a silent worker's render message (tests/test_silent_network.py)."""
    vhost = broker_url.rsplit("/", 1)[1]
    broker = AttacheBroker(url=broker_url + query)
    receiving = None
    try:
        broker.enqueue(message("attache.render", 0))  # this thread's publishing connection
        receiving = broker.consume("attache.render", prefetch=1, timeout=100)
        assert _heartbeats(vhost) == sorted([consumer, publisher])
    finally:
        if receiving is not None:
            receiving.close()
        broker.close()


def test_a_look_at_the_queues_on_a_connection_rabbitmq_closed_while_idle_opens_a_fresh_one(broker_url):
    """The reconciler looks at the queues' depth before it re-announces anything. The scheduler's rounds take
    turns on ten threads, so a round often comes to a thread whose connection RabbitMQ closed for missed
    heartbeats: before, that look failed and the reconciler skipped its round (an adversarial run: every 30 s,
    while jobs waited to be re-announced). Here with a heartbeat of 1 s."""
    vhost = broker_url.rsplit("/", 1)[1]
    broker = AttacheBroker(url=broker_url)
    broker.parameters.heartbeat = 1
    try:
        before = _connections(vhost)
        broker.declare_queue("attache.render", ensure=True)
        assert broker.queue_depth("attache.render") == 0
        # listing connections may take rabbitmqctl longer than two heartbeats on a loaded machine, so ours may be
        # closed already when the list comes (a run of the suite beside other work)
        ours = _connections(vhost) - before
        assert len(ours) <= 1, ours
        wait_for(lambda: not ours & _connections(vhost), timeout=60, interval=0.5,
                 message="RabbitMQ closing the idle connection")
        assert broker.queue_depth("attache.render") == 0
        assert broker.queue_depth("attache.nothing") is None
        broker.ping()
    finally:
        broker.close()
