"""RabbitMQ through Dramatiq, with the three things Dramatiq's broker lacks.

:class:`AttacheBroker` is a small subclass of Dramatiq's ``RabbitmqBroker``:

1. **Native AMQP headers and properties.** Dramatiq publishes a bare body.
   We copy the W3C trace carrier (``traceparent``/``tracestate``) and the
   job identifiers from the message body into AMQP headers, and set
   ``message_id``, ``content_type``, ``type``, ``app_id`` and ``timestamp``
   (the field mapping is in ``docs/contract.md``).
2. **Publisher confirms with ``mandatory``** on every publish: ``enqueue``
   returns only after RabbitMQ confirmed the message was routed to a queue
   and persisted, and raises :class:`BrokerUnavailable` otherwise. The wait
   is bounded (:func:`answered_within`): connecting takes at most twice the
   publish timeout (pika's ``stack_timeout``), and every answer after that
   (the queue declare, the confirm) must come within the publish timeout,
   else the connection is dropped and the caller leaves its outbox row to
   the scheduler's relay. pika's own bound would be the heartbeat (30 s,
   then up to twice that).
3. **Quorum queues with a delivery limit.** The main queues are declared
   ``x-queue-type: quorum`` with ``x-delivery-limit``: a message that kills
   every worker that takes it is dead-lettered to ``<queue>.XQ`` after that
   many deliveries instead of looping forever (the job's lease recovery
   then decides its fate in PostgreSQL).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Iterator

import pika
import pika.exceptions
from dramatiq import errors as dramatiq_errors
from dramatiq.brokers.rabbitmq import RabbitmqBroker, dq_name, q_name, xq_name
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


class AnswerTimeout(pika.exceptions.AMQPConnectionError):
    """RabbitMQ did not answer (a confirm, a declare) within the publish timeout."""


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


def connection_parameters(url: str, *, socket_timeout: float) -> pika.URLParameters:
    params = pika.URLParameters(url)
    params.socket_timeout = socket_timeout
    params.stack_timeout = socket_timeout * 2
    params.blocked_connection_timeout = socket_timeout * 2
    params.connection_attempts = 1
    params.heartbeat = 30
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


class AttacheBroker(RabbitmqBroker):
    def __init__(self, *, url: str, delivery_limit: int = 20, socket_timeout: float = 5.0,
                 middleware: list | None = None):
        super().__init__(url=url, confirm_delivery=True, middleware=middleware)
        self.parameters = connection_parameters(url, socket_timeout=socket_timeout)
        self.answer_timeout = socket_timeout
        self.delivery_limit = delivery_limit

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
        canonical = message.queue_name
        routing_key = canonical
        if delay is not None:
            routing_key = dq_name(canonical)
            message = message.copy(queue_name=routing_key, options={"eta": current_millis() + delay})

        payload = message.args[0] if message.args else None
        properties = pika.BasicProperties(
            delivery_mode=2,
            content_type="application/json",
            message_id=message.message_id,
            type=message.actor_name,
            app_id="attache",
            timestamp=int(time.time()),
            headers=amqp_headers(payload),
        )
        body = message.encode()
        try:
            with answered_within(self.connection, self.answer_timeout):
                self.declare_queue(canonical, ensure=True)
                self.emit_before("enqueue", message, delay)
                if faults.armed("after_publish"):
                    self._publish_then_die(routing_key, body, properties)
                self.channel.basic_publish(
                    exchange="", routing_key=routing_key, body=body, properties=properties, mandatory=True)
            self.emit_after("enqueue", message, delay)
            return message
        except PUBLISH_ERRORS as exc:
            del self.connection
            if isinstance(exc, pika.exceptions.UnroutableError):
                self.queues_pending.add(q_name(routing_key))
            raise BrokerUnavailable(f"publish to {routing_key} not confirmed: {type(exc).__name__}") from exc

    def _publish_then_die(self, routing_key: str, body: bytes, properties: pika.BasicProperties) -> None:
        """Window 3: the bytes go to RabbitMQ, the process dies before any confirm."""
        channel = self.connection.channel()  # a channel without confirm mode
        channel.basic_publish(exchange="", routing_key=routing_key, body=body, properties=properties)
        faults.point("after_publish")

    # --- inspection -------------------------------------------------------

    def queue_depth(self, queue_name: str) -> int | None:
        """Messages ready in a queue (passive declare), None if it does not exist."""
        try:
            with answered_within(self.connection, self.answer_timeout):
                channel = self.connection.channel()
                try:
                    frame = channel.queue_declare(queue=queue_name, passive=True)
                    return frame.method.message_count
                finally:
                    if channel.is_open:
                        channel.close()
        except pika.exceptions.ChannelClosedByBroker:
            return None
        except PUBLISH_ERRORS as exc:
            del self.connection
            raise BrokerUnavailable(f"cannot inspect {queue_name}: {type(exc).__name__}") from exc

    def ping(self) -> None:
        """One round trip on this thread's connection (opened once, then reused; reopened once if it died)."""
        while True:
            reused = getattr(self.state, "connection", None) is not None
            try:
                with answered_within(self.connection, self.answer_timeout):
                    self.channel.exchange_declare(exchange="amq.direct", passive=True)  # always there
                return
            except PUBLISH_ERRORS as exc:
                del self.connection
                if not reused:  # a fresh connection failed: RabbitMQ is away
                    raise BrokerUnavailable(f"RabbitMQ unreachable: {type(exc).__name__}") from exc


__all__ = ["AnswerTimeout", "AttacheBroker", "amqp_headers", "answered_within", "connection_parameters", "dq_name",
           "q_name", "xq_name"]
