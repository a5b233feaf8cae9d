"""RabbitMQ through Dramatiq, with the four things Dramatiq's broker lacks.

:class:`AttacheBroker` is a small subclass of Dramatiq's ``RabbitmqBroker``:

1. **Native AMQP headers and properties.** Dramatiq publishes a bare body.
   We copy the W3C trace carrier (``traceparent``/``tracestate``) and the
   job identifiers from the message body into AMQP headers, and set
   ``message_id``, ``content_type``, ``type``, ``app_id`` and ``timestamp``
   (the field mapping is in ``docs/contract.md``).
2. **Publisher confirms with ``mandatory``** on every publish: ``enqueue``
   returns only after RabbitMQ confirmed the message was routed to a queue
   and persisted, and raises :class:`BrokerUnavailable` otherwise.
   ``enqueue_many`` sends a batch at once and waits for its confirms
   together (:class:`Confirms`): a step's fan-out costs one round trip to
   RabbitMQ, not one per message. The wait
   is bounded (:func:`answered_within`): connecting takes at most twice the
   publish timeout (pika's ``stack_timeout``), and every answer after that
   (the queue declare, the confirm) must come within the publish timeout,
   else the connection is dropped and the caller leaves its outbox row to
   the scheduler's relay. pika's own bound would be the heartbeat (30 s,
   then up to twice that). A thread's connection that RabbitMQ closed
   while the thread was idle (pika answers heartbeats only when called) is
   replaced, and what it had not confirmed is sent once more on the new one.
3. **Quorum queues with a delivery limit.** The main queues are declared
   ``x-queue-type: quorum`` with ``x-delivery-limit``: a message that kills
   every worker that takes it is dead-lettered to ``<queue>.XQ`` after that
   many deliveries instead of looping forever (the job's lease recovery
   then decides its fate in PostgreSQL).
4. **A consumer's own heartbeat.** A worker's consuming connections hold
   its unacked messages, which RabbitMQ gives to another worker only when
   the connection misses its heartbeats: they beat every
   :data:`CONSUMER_HEARTBEAT_SECONDS`, the publishing ones every
   :data:`PUBLISHER_HEARTBEAT_SECONDS`; a ``heartbeat`` in the URL wins.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Callable, Iterator, TypeVar

import pika
import pika.exceptions
from dramatiq import errors as dramatiq_errors
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer, dq_name, q_name, xq_name
from dramatiq.common import current_millis
from dramatiq.message import Message
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from app import faults
from app.errors import BrokerUnavailable

log = logging.getLogger("attache.broker")

#: everything a publish can raise when RabbitMQ is away; AMQPConnectorException is a failed (or timed out)
#: connection handshake, which pika raises as is, outside its AMQPError tree
PUBLISH_ERRORS = (pika.exceptions.AMQPError, AMQPConnectorException, OSError,
                  dramatiq_errors.BrokerConnectionError)


T = TypeVar("T")


class AnswerTimeout(pika.exceptions.AMQPConnectionError):
    """RabbitMQ did not answer (a confirm, a declare) within the publish timeout."""


def _stale(failure: BaseException | None) -> bool:
    """Whether a publish failed because its connection was gone (closed, reset), not slow or refused."""
    return isinstance(failure, PUBLISH_ERRORS) and not isinstance(
        failure, (AnswerTimeout, pika.exceptions.UnroutableError, pika.exceptions.NackError))


@contextmanager
def answered_within(connection: pika.BlockingConnection, seconds: float) -> Iterator[None]:
    """Drop ``connection`` if a blocking call inside the block waits more than ``seconds`` for RabbitMQ.

    pika's blocking calls wait for an answer with no deadline of their own.
    This arms a timer on the connection's I/O loop, which runs while a call
    waits, and ends the stream the way pika's own
    ``blocked_connection_timeout`` does (``Connection._terminate_stream``):
    the waiting call then raises :class:`AnswerTimeout`.
    """
    impl = connection._impl  # noqa: SLF001 - pika has no public deadline for a blocking call
    timer = impl._adapter_call_later(seconds, lambda: impl._terminate_stream(
        AnswerTimeout(f"no answer from RabbitMQ within {seconds:g}s")))
    try:
        yield
    finally:
        impl._adapter_remove_timeout(timer)


#: AMQP heartbeat of a consumer's connection, which holds its worker's unacked messages: RabbitMQ gives them to
#: another worker two to three heartbeats after the worker went silent (a cut network, a frozen VM, SIGSTOP).
#: A job whose worker's network went silent mid-step was ready through another worker 29.6 s after the cut; with
#: 30 s, 89.5 s (tests/test_silent_network.py). Below 5 s RabbitMQ warns of false alarms; a consumer's thread
#: answers them every Dramatiq worker timeout (1 s) whenever it gets the GIL, which the renders release.
CONSUMER_HEARTBEAT_SECONDS = 10
#: AMQP heartbeat of a connection that only publishes: it holds no messages, and one RabbitMQ closed while its
#: thread was idle is replaced at the next publish (``AttacheBroker._publish``)
PUBLISHER_HEARTBEAT_SECONDS = 30


def connection_parameters(url: str, *, socket_timeout: float,
                          heartbeat: int = PUBLISHER_HEARTBEAT_SECONDS) -> pika.URLParameters:
    """pika's parameters for ``url``; a ``heartbeat`` in the URL's query string wins over ``heartbeat``."""
    params = pika.URLParameters(url)
    params.socket_timeout = socket_timeout
    params.stack_timeout = socket_timeout * 2
    params.blocked_connection_timeout = socket_timeout * 2
    params.connection_attempts = 1
    if params.heartbeat is None:  # pika's "not in the URL"
        params.heartbeat = heartbeat
    params.client_properties = {"connection_name": "attache"}
    return params


#: message body field -> AMQP header (the mapping in docs/contract.md)
HEADER_FIELDS = {
    "traceparent": "traceparent",
    "tracestate": "tracestate",
    "job_id": "x-attache-job-id",
    "attempt": "x-attache-attempt",
    "step": "x-attache-step",
    "variant": "x-attache-variant",
    "schema_version": "x-attache-schema-version",
}


def amqp_headers(payload: object) -> dict[str, Any] | None:
    """The AMQP headers mirroring a job message body; fields absent from the body are left out."""
    if not isinstance(payload, dict):
        return None
    headers = {header: payload[field] for field, header in HEADER_FIELDS.items()
               if isinstance(payload.get(field), (str, int)) and not isinstance(payload.get(field), bool)}
    return headers or None


class Confirms:
    """The publisher confirms of one channel, kept by delivery tag.

    pika's ``BlockingChannel`` in confirm mode waits for each publish's
    confirm before it returns, so N messages cost N round trips to RabbitMQ
    and N waits for its disk. This channel's confirms are collected as they
    arrive instead, so a batch is sent at once and waited for together.
    RabbitMQ numbers a channel's publishes from 1; an ack or nack settles one
    tag, or with ``multiple`` every pending tag up to it. A ``mandatory``
    message nobody could take is returned before its ack: it counts as not
    confirmed.
    """

    def __init__(self, channel: pika.adapters.blocking_connection.BlockingChannel):
        self.channel = channel
        self.sent = 0
        self.pending: set[int] = set()
        self.settled: dict[int, bool] = {}  # delivery tag -> acked (and not returned)
        self.returned: set[str] = set()  # message ids
        self.selected = False
        impl = channel._impl  # noqa: SLF001 - BlockingChannel waits for each confirm; its channel does not
        impl.add_on_return_callback(lambda _channel, _method, properties, _body:
                                    self.returned.add(properties.message_id))
        impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_select_ok)

    def _on_select_ok(self, _frame) -> None:
        self.selected = True

    def _on_confirm(self, frame) -> None:
        method = frame.method
        acked = isinstance(method, pika.spec.Basic.Ack)
        tags = [tag for tag in self.pending if tag <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        for tag in tags:
            self.pending.discard(tag)
            self.settled[tag] = acked

    def publish(self, routing_key: str, body: bytes, properties: pika.BasicProperties) -> int:
        self.channel._impl.basic_publish(exchange="", routing_key=routing_key, body=body,  # noqa: SLF001
                                         properties=properties, mandatory=True)
        self.sent += 1
        self.pending.add(self.sent)
        return self.sent

    def wait(self, until: Callable[[], bool]) -> None:
        """Process the connection's I/O until ``until()``; raises if the channel or its connection closes.

        (``BlockingConnection.process_data_events`` would wait for an event of
        its own, which these callbacks are not.)
        """
        while not until():
            self.channel._flush_output(until)  # noqa: SLF001


class HeartbeatConsumer(_RabbitmqConsumer):
    """Dramatiq's consumer, on a connection with the consumer's heartbeat (:data:`CONSUMER_HEARTBEAT_SECONDS`).

    Dramatiq opens a consumer's connection with its broker's ``parameters``,
    which are the publishers'; the consumer's own are handed to it for that.
    """

    def __init__(self, broker: "AttacheBroker", queue_name: str, prefetch: int, timeout: int):
        super().__init__(SimpleNamespace(parameters=broker.consumer_parameters), queue_name, prefetch, timeout)
        self.broker = broker


class AttacheBroker(RabbitmqBroker):
    def __init__(self, *, url: str, delivery_limit: int = 20, socket_timeout: float = 5.0,
                 middleware: list | None = None):
        super().__init__(url=url, confirm_delivery=True, middleware=middleware)
        self.parameters = connection_parameters(url, socket_timeout=socket_timeout)
        self.consumer_parameters = connection_parameters(url, socket_timeout=socket_timeout,
                                                         heartbeat=CONSUMER_HEARTBEAT_SECONDS)
        self.answer_timeout = socket_timeout
        self.delivery_limit = delivery_limit

    @property
    def consumer_class(self):
        return HeartbeatConsumer

    # --- queues -----------------------------------------------------------

    def _declare_queue(self, queue_name):
        arguments = self._build_queue_arguments(queue_name)
        arguments["x-queue-type"] = "quorum"
        arguments["x-delivery-limit"] = self.delivery_limit
        return self.channel.queue_declare(queue=queue_name, durable=True, arguments=arguments)

    # --- publishing -------------------------------------------------------

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """Publish with confirms, ``mandatory`` and native headers.

        Raises :class:`BrokerUnavailable` when RabbitMQ cannot be reached or
        does not confirm; the caller (the outbox) then leaves its row
        unmarked for the scheduler to publish later.
        """
        if delay is not None:
            message = message.copy(queue_name=dq_name(message.queue_name),
                                   options={"eta": current_millis() + delay})
        _, error = self._publish([message], delay)
        if error is not None:
            raise error
        return message

    def enqueue_many(self, messages: list[Message]) -> tuple[int, BrokerUnavailable | None]:
        """Publish ``messages`` at once and wait for their confirms together.

        Returns how many of them, from the first, RabbitMQ confirmed, and the
        error that stopped the rest (``None`` when all were confirmed). A
        message confirmed after one that was not is counted as not
        confirmed: its outbox row is published again, a duplicate that
        consumers take as one.
        """
        return self._publish(messages, None)

    def _publish(self, messages: list[Message], delay: int | None) -> tuple[int, BrokerUnavailable | None]:
        """Publish on this thread's connection; if that connection is one kept from before and it failed, the
        messages not yet confirmed once more on a fresh one.

        pika's blocking connection answers RabbitMQ's heartbeats only while its thread calls into it, so a
        thread that published nothing for two heartbeats (60 s: a step waiting out a PostgreSQL outage, a quiet
        web thread) holds a connection RabbitMQ has closed; Dramatiq's own ``enqueue`` retries the same way. A
        message sent on the dead connection may arrive twice: consumers take a duplicate as one. An answer that
        did not come in time is not retried (RabbitMQ is slow, not the connection stale), nor a refusal.
        """
        reused = self._kept_connection()
        confirmed, error = self._publish_once(messages, delay)
        if error is not None and reused and _stale(error.__cause__):
            log.info("publishing again on a fresh connection: %s", type(error.__cause__).__name__)
            more, error = self._publish_once(messages[confirmed:], delay)
            confirmed += more
        return confirmed, error

    def _publish_once(self, messages: list[Message], delay: int | None) -> tuple[int, BrokerUnavailable | None]:
        tags: list[int] = []
        failure: BaseException | None = None
        try:
            with answered_within(self.connection, self.answer_timeout):
                confirms = self._confirms()
                for message in messages:
                    self.declare_queue(q_name(message.queue_name), ensure=True)
                    self.emit_before("enqueue", message, delay)
                    body, properties = message.encode(), self._properties(message)
                    if faults.armed("after_publish"):
                        self._publish_then_die(message.queue_name, body, properties)
                    tags.append(confirms.publish(message.queue_name, body, properties))
                confirms.wait(lambda: not confirms.pending.intersection(tags))
        except PUBLISH_ERRORS as exc:
            del self.connection
            failure = exc
        acked, returned = [], set()
        if tags:  # every tag's outcome leaves the channel's books
            acked = [confirms.settled.pop(tag, False) for tag in tags]
            returned = confirms.returned.intersection(message.message_id for message in messages)
            confirms.returned -= returned
        confirmed = 0
        for message, ack in zip(messages, acked):
            if message.message_id in returned:  # mandatory: no queue took it
                self.queues_pending.add(q_name(message.queue_name))
                failure = failure or pika.exceptions.UnroutableError([])
            if failure is not None or not ack:
                break
            self.emit_after("enqueue", message, delay)
            confirmed += 1
        if confirmed == len(messages):
            return confirmed, None
        reason = type(failure).__name__ if failure is not None else "nacked"
        error = BrokerUnavailable(f"publish to {messages[confirmed].queue_name} not confirmed: {reason}")
        error.__cause__ = failure
        return confirmed, error

    def _confirms(self) -> Confirms:
        """This thread's publishing channel, in confirm mode (opened with the connection, and again after it)."""
        confirms = getattr(self.state, "confirms", None)
        if confirms is None or not confirms.channel.is_open or confirms.channel.connection is not self.connection:
            confirms = self.state.confirms = Confirms(self.connection.channel())
            confirms.wait(lambda: confirms.selected)
        return confirms

    @staticmethod
    def _properties(message: Message) -> pika.BasicProperties:
        return pika.BasicProperties(
            delivery_mode=2,
            content_type="application/json",
            message_id=message.message_id,
            type=message.actor_name,
            app_id="attache",
            timestamp=int(time.time()),
            headers=amqp_headers(message.args[0] if message.args else None),
        )

    def _publish_then_die(self, routing_key: str, body: bytes, properties: pika.BasicProperties) -> None:
        """Window 3: the bytes go to RabbitMQ, the process dies before any confirm."""
        channel = self.connection.channel()  # a channel without confirm mode
        channel.basic_publish(exchange="", routing_key=routing_key, body=body, properties=properties)
        faults.point("after_publish")

    # --- inspection -------------------------------------------------------

    def queue_depth(self, queue_name: str) -> int | None:
        """Messages ready in a queue (passive declare), None if it does not exist."""
        def depth() -> int | None:
            channel = self.connection.channel()
            try:
                return channel.queue_declare(queue=queue_name, passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker:
                return None
            finally:
                if channel.is_open:
                    channel.close()

        return self._round_trip(depth, f"cannot inspect {queue_name}")

    def ping(self) -> None:
        """One round trip on this thread's connection (opened once, then reused; reopened once if it died)."""
        self._round_trip(lambda: self.channel.exchange_declare(exchange="amq.direct", passive=True),
                         "RabbitMQ unreachable")  # amq.direct is always there

    def _round_trip(self, call: Callable[[], T], failure: str) -> T:
        """``call`` on this thread's connection, within the answer timeout; a kept connection found closed is
        replaced once (as :meth:`_publish` does), any other failure is :class:`BrokerUnavailable`.

        pika's blocking connection answers heartbeats only when its thread calls into it, so RabbitMQ closes the
        connection of a thread left idle for two heartbeats: the scheduler's rounds take turns on ten threads.
        Before, the reconciler's look at the queues found such a connection dead and skipped its round, every
        round that came to an idle thread."""
        while True:
            reused = self._kept_connection()
            try:
                with answered_within(self.connection, self.answer_timeout):
                    return call()
            except PUBLISH_ERRORS as exc:
                del self.connection
                if not (reused and _stale(exc)):  # a fresh connection failed, or RabbitMQ is slow: it is away
                    raise BrokerUnavailable(f"{failure}: {type(exc).__name__}") from exc

    def _kept_connection(self) -> bool:
        """Whether this thread holds a connection opened before (which RabbitMQ may have closed since)."""
        return getattr(self.state, "connection", None) is not None

__all__ = ["CONSUMER_HEARTBEAT_SECONDS", "PUBLISHER_HEARTBEAT_SECONDS", "AnswerTimeout", "AttacheBroker",
           "HeartbeatConsumer", "amqp_headers", "answered_within", "connection_parameters", "dq_name",
           "q_name", "xq_name"]
