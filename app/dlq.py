"""The dead-letter toolkit: look at, requeue and purge ``<queue>.XQ``.

Used by the HTTP API and the CLI. Every method opens and closes its own
RabbitMQ connection (it runs in web request threads and in the CLI), and no
message stays unacknowledged once a method returns: a message that is only
looked at is fetched with ``basic_get`` (no auto-ack) and handed back with
``basic_nack(requeue=True)`` (classic queues put it back in its place).

Caveats an operator should know:

* while one call holds messages unacked, a concurrent call does not see them
  (:meth:`DeadLetters.messages` shows fewer, :meth:`DeadLetters.requeue`
  reports them ``not_found``); nothing is lost either way;
* :meth:`DeadLetters.requeue` publishes to the original queue with confirms
  and ``mandatory`` *before* it acks the dead letter, so a crash in between
  leaves a harmless duplicate (the workflow is idempotent), never a loss.

Why a message died is read from the AMQP ``x-death`` header and from the
``dead_letters`` table, which the worker's
:class:`~app.dead_letters.DeadLetterRecorder` fills.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from typing import Any, Iterator

import pika
import pika.exceptions
from sqlalchemy import select

from app import audit
from app.broker import PUBLISH_ERRORS, connection_parameters, xq_name
from app.db import transaction
from app.errors import BrokerUnavailable
from app.messages import ROUTES
from app.models import dead_letters

TRACEBACK_CHARS = 2000
REQUEUED_BY_HEADER = "x-attache-requeued-by"
#: a quorum queue's own redelivery counter: dropped on requeue, so the message gets a full delivery limit again
DROPPED_HEADERS = ("x-delivery-count",)
NOT_FOUND = 404


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _decode(body: bytes) -> Any:
    """The JSON of a message body, or its text when it is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")


def _message_id(decoded: Any, properties: pika.BasicProperties) -> str | None:
    if isinstance(decoded, dict) and isinstance(decoded.get("message_id"), str):
        return decoded["message_id"]
    return properties.message_id


def _deaths(properties: pika.BasicProperties) -> list[dict]:
    deaths = (properties.headers or {}).get("x-death") or []
    return [{"reason": _text(d.get("reason")), "queue": _text(d.get("queue")), "count": d.get("count"),
             "time": d["time"].isoformat() if isinstance(d.get("time"), datetime) else _text(d.get("time"))}
            for d in deaths if isinstance(d, dict)]


def _describe(body: bytes, properties: pika.BasicProperties) -> dict:
    """A dead letter decoded from its Dramatiq envelope (``recorded`` is filled in later)."""
    decoded = _decode(body)
    envelope = decoded if isinstance(decoded, dict) else {}
    options = envelope.get("options") if isinstance(envelope.get("options"), dict) else {}
    args = envelope.get("args")
    traceback = options.get("traceback")
    return {
        "message_id": _message_id(decoded, properties),
        "actor_name": envelope.get("actor_name", _text(properties.type)),
        "queue_name": envelope.get("queue_name"),
        "body": args[0] if isinstance(args, list) and args else decoded,
        "retries": options.get("retries", 0),
        "death": _deaths(properties),
        "recorded": None,
        "traceback": traceback[:TRACEBACK_CHARS] if isinstance(traceback, str) else None,
    }


class UnknownQueue(ValueError):
    """A queue name that is not one of attache's dead-letter queues."""


class DeadLetters:
    """Dead-letter queues of the step queues in :data:`app.messages.ROUTES`."""

    def __init__(self, broker_url: str, engine, *, socket_timeout: float = 5.0):
        self.parameters = connection_parameters(broker_url, socket_timeout=socket_timeout)
        self.engine = engine

    # --- helpers ------------------------------------------------------------

    @staticmethod
    def _resolve(queue: str) -> tuple[str, str]:
        """``(xq, original)`` for ``attache.inspect`` or ``attache.inspect.XQ``; ValueError for anything else."""
        original = queue[:-3] if isinstance(queue, str) and queue.endswith(".XQ") else queue
        if original not in {name for _, name in ROUTES.values()}:
            raise UnknownQueue(f"not an attache dead-letter queue: {queue!r}")
        return xq_name(original), original

    @contextlib.contextmanager
    def _connection(self, what: str) -> Iterator[pika.BlockingConnection]:
        """A fresh connection, closed on exit (which also requeues anything left unacked)."""
        try:
            connection = pika.BlockingConnection(self.parameters)
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(f"RabbitMQ unreachable ({what}): {type(exc).__name__}") from exc
        try:
            yield connection
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(f"RabbitMQ failed ({what}): {type(exc).__name__}") from exc
        finally:
            with contextlib.suppress(*PUBLISH_ERRORS):
                if connection.is_open:
                    connection.close()

    @staticmethod
    def _depth(connection: pika.BlockingConnection, queue: str) -> int | None:
        """Ready messages in ``queue`` (passive declare on its own channel), None if it does not exist."""
        channel = connection.channel()
        try:
            return channel.queue_declare(queue=queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == NOT_FOUND:
                return None
            raise
        finally:
            if channel.is_open:
                channel.close()

    def _recorded(self, message_ids: list[str]) -> dict[str, dict]:
        """The latest ``dead_letters`` row of each message id."""
        if not message_ids:
            return {}
        with transaction(self.engine) as conn:
            rows = conn.execute(select(dead_letters).where(dead_letters.c.message_id.in_(message_ids))
                                .order_by(dead_letters.c.id)).all()
        return {row.message_id: {"error_code": row.error_code, "reason": row.reason,
                                 "recorded_at": row.recorded_at.isoformat(),
                                 "job_id": str(row.job_id) if row.job_id else None}
                for row in rows}  # later rows win

    # --- API ----------------------------------------------------------------

    def queues(self) -> list[dict]:
        """Depth of every step queue's XQ (a missing XQ counts 0)."""
        with self._connection("queues") as connection:
            return [{"name": xq_name(queue), "queue": queue, "messages": self._depth(connection, xq_name(queue)) or 0}
                    for _, queue in ROUTES.values()]

    def messages(self, queue: str, limit: int = 50) -> list[dict]:
        """Up to ``limit`` dead letters, decoded, left in the queue in their order."""
        xq, _ = self._resolve(queue)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        items = []
        with self._connection(f"messages {xq}") as connection:
            if self._depth(connection, xq) is None:
                return []
            channel = connection.channel()
            while len(items) < limit:
                method, properties, body = channel.basic_get(xq, auto_ack=False)
                if method is None:
                    break
                items.append(_describe(body, properties))
            if items:
                channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
            channel.close()
        recorded = self._recorded([i["message_id"] for i in items if i["message_id"]])
        for item in items:
            item["recorded"] = recorded.get(item["message_id"])
        return items

    def requeue(self, queue: str, *, actor: str, message_ids: list[str] | None = None,
                reason: str | None = None) -> dict:
        """Move the chosen dead letters (all when ``message_ids`` is None) back to the original queue.

        Only the messages in the XQ when the call starts are considered (a
        message that dies again meanwhile is not chased). One audit row; if
        the broker fails halfway, the part already moved is audited and
        :class:`BrokerUnavailable` is raised.
        """
        xq, original = self._resolve(queue)
        wanted = None if message_ids is None else list(dict.fromkeys(message_ids))
        moved: list[str] = []
        failure: BrokerUnavailable | None = None
        with transaction(self.engine) as conn:  # PostgreSQL first: no broker change without its audit row
            try:
                self._move(xq, original, wanted, moved, actor)
            except BrokerUnavailable as exc:
                failure = exc
            if moved or failure is None:
                details: dict[str, Any] = {"message_ids": moved, "count": len(moved)}
                if failure is not None:
                    details["error"] = str(failure)
                audit.record(conn, actor=actor, action="dlq.requeue", target=xq, reason=reason, details=details)
        if failure is not None:
            raise failure
        return {"requeued": len(moved),
                "not_found": [] if wanted is None else [m for m in wanted if m not in moved]}

    def _move(self, xq: str, original: str, wanted: list[str] | None, moved: list[str], actor: str) -> None:
        with self._connection(f"requeue {xq}") as connection:
            depth = self._depth(connection, xq)
            if not depth:
                return
            source = connection.channel()
            target = connection.channel()
            target.confirm_delivery()
            remaining = None if wanted is None else set(wanted)
            held = 0  # fetched, not chosen, unacked until the end
            for _ in range(depth):
                if remaining is not None and not remaining:
                    break
                method, properties, body = source.basic_get(xq, auto_ack=False)
                if method is None:
                    break
                message_id = _message_id(_decode(body), properties)
                if remaining is not None and message_id not in remaining:
                    held += 1
                    continue
                headers = {k: v for k, v in (properties.headers or {}).items() if k not in DROPPED_HEADERS}
                headers[REQUEUED_BY_HEADER] = actor
                properties.headers = headers
                target.basic_publish(exchange="", routing_key=original, body=body, properties=properties,
                                     mandatory=True)  # raises unless confirmed and routed
                source.basic_ack(method.delivery_tag)
                moved.append(message_id)
                if remaining is not None:
                    remaining.discard(message_id)
            if held:
                source.basic_nack(delivery_tag=0, multiple=True, requeue=True)
            source.close()
            target.close()

    def purge(self, queue: str, *, actor: str, reason: str | None = None) -> dict:
        """Drop every ready message of the XQ (a missing XQ purges 0). One audit row."""
        xq, _ = self._resolve(queue)
        with transaction(self.engine) as conn:
            with self._connection(f"purge {xq}") as connection:
                if self._depth(connection, xq) is None:
                    purged = 0
                else:
                    channel = connection.channel()
                    purged = channel.queue_purge(xq).method.message_count
                    channel.close()
            audit.record(conn, actor=actor, action="dlq.purge", target=xq, reason=reason,
                         details={"count": purged})
        return {"purged": purged}


__all__ = ["DeadLetters"]
