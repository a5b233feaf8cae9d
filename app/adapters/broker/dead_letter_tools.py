"""The dead-letter toolkit: look at, requeue and purge ``<queue>.XQ``.

Used by the HTTP API and the CLI. Every method opens and closes its own
RabbitMQ connection (it runs in web request threads and in the CLI), and no
message stays unacknowledged once a method returns: a message that is only
looked at is fetched with ``basic_get`` (no auto-ack) and handed back with
``basic_nack(requeue=True)`` (classic queues put it back in its place).

Requeue and purge act only on what the operator chose: the message ids
they saw in the listing, or "all" with the count they saw, refused
(:class:`MoreThanExpected`, nothing done) when the queue holds more. Each is
audited *before* the broker is touched: an ``audit_log`` row with
``details.status = "intent"`` is committed first and completed afterwards
(see :meth:`DeadLetters._act`).

Caveats an operator should know:

* while one call holds messages unacked, a concurrent call does not see them
  (:meth:`DeadLetters.messages` shows fewer, requeue and purge report them
  ``not_found``); nothing is lost either way;
* a message looked at and handed back keeps its place and its content; only
  AMQP's ``redelivered`` flag is set;
* :meth:`DeadLetters.requeue` publishes to the original queue with confirms
  and ``mandatory`` *before* it acks the dead letter, so a crash in between
  leaves a harmless duplicate (the workflow is idempotent), never a loss.

Why a message died is read from the AMQP ``x-death`` header and from the
``dead_letters`` table, which the worker's
:class:`~app.adapters.broker.dead_letter_recorder.DeadLetterRecorder` fills.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

import pika
import pika.exceptions
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from app import faults
from app.adapters.broker.dead_letter_recorder import job_id_of
from app.adapters.broker.rabbitmq import PUBLISH_ERRORS, connection_parameters, xq_name
from app.adapters.postgres import audit
from app.adapters.postgres.db import lock_not_available, once_reachable, transaction
from app.adapters.postgres.models import dead_letters, jobs
from app.errors import (
    BadSelection,
    BrokerUnavailable,
    DatabaseUnavailable,
    MoreThanExpected,
    OutcomeUnknown,
    QueueBusy,
    UnknownQueue,
)

TRACEBACK_CHARS = 2000
#: what a message's handling raises when it surely sent nothing: RabbitMQ refused the requeue's publish, or the
#: queue's lock was lost before it began (``_alone``'s ``held``)
NOT_SENT = (pika.exceptions.UnroutableError, pika.exceptions.NackError, DatabaseUnavailable)
REQUEUED_BY_HEADER = "x-attache-requeued-by"
#: a quorum queue's own redelivery counter: dropped on requeue, so the message gets a full delivery limit again
DROPPED_HEADERS = ("x-delivery-count",)
NOT_FOUND = 404
#: message ids one requeue or purge may name
MAX_MESSAGE_IDS = 1000
#: the largest count an "all" requeue or purge may confirm (beyond it: rabbitmqctl)
MAX_EXPECTED = 100_000

log = logging.getLogger("attache.dlq")


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _decode(body: bytes) -> Any:
    """The JSON of a message body, or its text when it is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")


def _message_id(decoded: Any, properties: pika.BasicProperties) -> str | None:
    """The message's id, its characters that are not printable escaped (``\\x00``): anyone may publish a message
    (a NUL in its id made the queue's listing, requeue and purge fail with its audit row left at ``intent``: an
    adversarial review), and an operator names a message by this text."""
    if isinstance(decoded, dict) and isinstance(decoded.get("message_id"), str):
        return audit.storable(decoded["message_id"], printable=True)
    return audit.storable(properties.message_id, printable=True) if properties.message_id else properties.message_id


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
        "job_state": None,
        "traceback": traceback[:TRACEBACK_CHARS] if isinstance(traceback, str) else None,
    }


#: the advisory locks of the dead-letter tools (one a queue: :meth:`DeadLetters._alone`)
NAMESPACE = 727278
#: how long an action's audit row waits for PostgreSQL to answer, to be written again: the ids the action took are
#: known only to this process. An action that lost PostgreSQL (the queue's lock with it) tried once, at once, and
#: left its row at ``intent``, without the ids of the 58-79 messages it had moved (an adversarial run)
AUDIT_COMPLETION_SECONDS = 60.0
AUDIT_COMPLETION_PAUSE_SECONDS = 1.0
_ALONE = text("SELECT pg_advisory_xact_lock(:ns, hashtext(:queue))")
_NO_IDLE_BOUND = text("SET LOCAL idle_in_transaction_session_timeout = 0")
_STILL_HELD = text("SELECT 1")


class DeadLetters:
    """The dead-letter queues of ``queues``, the step queues (``[step.queue for step in Step]``), in RabbitMQ.

    :class:`~app.adapters.broker.postgres_dead_letters.PostgresDeadLetters`
    is the same toolkit over the PostgreSQL broker: it replaces the broker
    side (``_connection``, ``_depth``, ``_take``, ``listing``) and keeps the
    choosing, refusing and auditing of :meth:`_act`.
    """

    def __init__(self, broker_url: str, engine, *, queues: Iterable[str], socket_timeout: float = 5.0):
        self.parameters = connection_parameters(broker_url, socket_timeout=socket_timeout)
        self.engine = engine
        self.step_queues = tuple(queues)

    def close(self) -> None:
        """Nothing held between calls (each opens and closes its own connection)."""

    # --- helpers ------------------------------------------------------------

    def _resolve(self, queue: str) -> tuple[str, str]:
        """``(xq, original)`` for ``attache.inspect`` or ``attache.inspect.XQ``; ValueError for anything else."""
        original = queue[:-3] if isinstance(queue, str) and queue.endswith(".XQ") else queue
        if original not in self.step_queues:
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

    @contextlib.contextmanager
    def _alone(self, xq: str) -> Iterator[Callable[[], None]]:
        """One listing, requeue or purge of ``xq`` at a time, in every process (a transaction-level advisory lock
        held meanwhile). A listing holds the messages it reads unacked until it hands them back, and RabbitMQ
        counts only the ready ones: a purge of "all, N expected" beside another operator's listing counted fewer
        than the queue held, went ahead and took messages nobody had seen (an adversarial run). Nothing else
        consumes a dead-letter queue. The lock's transaction sits idle for as long as RabbitMQ takes, so it has
        no idle bound (the web's, 120 s, ended a long requeue's lock under it, and its audit said ``failed``
        after everything was moved: a re-attack).

        Yields ``held()``, which raises :class:`DatabaseUnavailable` once the lock's session is gone: PostgreSQL
        frees the lock of a session it lost, and a requeue went on taking messages while another operator's
        purge, which had taken the lock, took them too (a two-second outage: an adversarial run). A caller that
        does not get the lock within its engine's lock bound gets :class:`QueueBusy`, nothing done."""
        with transaction(self.engine) as conn:
            conn.execute(_NO_IDLE_BOUND)
            try:
                conn.execute(_ALONE, {"ns": NAMESPACE, "queue": xq})
            except OperationalError as exc:
                if lock_not_available(exc):
                    raise QueueBusy(f"another listing, requeue or purge of {xq} is under way; nothing was done: "
                                    "try again when it is over") from None
                raise

            def held() -> None:
                try:
                    conn.execute(_STILL_HELD)
                except DBAPIError as exc:
                    raise DatabaseUnavailable(f"PostgreSQL lost the lock on {xq}; nothing more was done") from exc

            yield held

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

    def _annotate(self, items: list[dict]) -> list[dict]:
        """Add to each listed dead letter why the worker recorded it died, and where its job is now.

        ``job_state`` is the current state of the job the message names: a
        dead letter whose job is ``ready`` or ``failed`` has nothing left to
        do (after a PostgreSQL outage, for one, the reconciler announced such
        jobs again and they finished while their first messages sat here).
        """
        recorded = self._recorded([i["message_id"] for i in items if i["message_id"]])
        job_ids = [job_id_of(item["body"]) for item in items]
        states = self._job_states([job_id for job_id in job_ids if job_id is not None])
        for item, job_id in zip(items, job_ids):
            item["recorded"] = recorded.get(item["message_id"])
            item["job_state"] = states.get(job_id)
        return items

    def _job_states(self, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
        if not job_ids:
            return {}
        with transaction(self.engine) as conn:
            return dict(conn.execute(select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(job_ids))).all())

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
                    for queue in self.step_queues]

    def messages(self, queue: str, limit: int = 50) -> list[dict]:
        """Up to ``limit`` dead letters, decoded, left in the queue in their order."""
        return self.listing(queue, limit)["messages"]

    def listing(self, queue: str, limit: int = 50) -> dict:
        """``{"depth": N, "messages": [...]}``: the first ``limit`` dead letters and how many the queue holds.

        ``depth`` is counted while the listed messages are still held (the
        ready ones left plus those held), so it is the count an operator
        confirms for an "all" requeue or purge.
        """
        xq, _ = self._resolve(queue)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        items = []
        with self._alone(xq), self._connection(f"messages {xq}") as connection:  # (a lost lock: handed back)
            if self._depth(connection, xq) is None:
                return {"depth": 0, "messages": []}
            channel = connection.channel()
            while len(items) < limit:
                method, properties, body = channel.basic_get(xq, auto_ack=False)
                if method is None:
                    break
                items.append(_describe(body, properties))
            depth = len(items) + (self._depth(connection, xq) or 0)
            if items:
                channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
            channel.close()
        return {"depth": depth, "messages": self._annotate(items)}

    def requeue(self, queue: str, *, actor: str, message_ids: list[str] | None = None,
                expected: int | None = None, reason: str | None = None) -> dict:
        """Move dead letters back to the original queue: the chosen ``message_ids``, or all with ``expected``.

        See :meth:`_act` for what is chosen, what is refused and how it is
        audited. Each message is published to the original queue (confirmed,
        ``mandatory``) before its dead letter is acked, so a crash in between
        leaves a harmless duplicate, never a loss.
        """
        xq, original = self._resolve(queue)

        def prepare(connection: pika.BlockingConnection):
            target = connection.channel()
            target.confirm_delivery()

            def move(source, method, properties, body) -> None:
                headers = {k: v for k, v in (properties.headers or {}).items() if k not in DROPPED_HEADERS}
                headers[REQUEUED_BY_HEADER] = actor
                properties.headers = headers
                target.basic_publish(exchange="", routing_key=original, body=body, properties=properties,
                                     mandatory=True)  # raises unless confirmed and routed
                source.basic_ack(method.delivery_tag)

            return move

        return self._act("requeue", xq, prepare, actor=actor, message_ids=message_ids, expected=expected,
                         reason=reason)

    def purge(self, queue: str, *, actor: str, message_ids: list[str] | None = None, expected: int | None = None,
              reason: str | None = None) -> dict:
        """Delete dead letters for good: the chosen ``message_ids``, or all with ``expected``.

        Messages are taken one by one (never ``queue.purge``), so a message
        that was not chosen, or that arrived after the operator looked, is
        never removed. See :meth:`_act`.
        """
        xq, _ = self._resolve(queue)

        def prepare(connection: pika.BlockingConnection):
            return lambda source, method, properties, body: source.basic_ack(method.delivery_tag)

        return self._act("purge", xq, prepare, actor=actor, message_ids=message_ids, expected=expected, reason=reason)

    # --- the one way an action is chosen, done and audited -----------------

    @staticmethod
    def _selection(message_ids: list[str] | None, expected: int | None) -> dict:
        """What the operator chose, as recorded: ``{"message_ids": [...]}`` or ``{"all": True, "expected": N}``."""
        if message_ids is not None and expected is not None:
            raise BadSelection("choose message ids or all (with the expected count), not both")
        if message_ids is not None:
            wanted = list(dict.fromkeys(message_ids))
            if not wanted or not all(isinstance(m, str) and m for m in wanted):
                raise BadSelection("message_ids must be a non-empty list of message ids")
            if not all(m.isprintable() for m in wanted):  # the audit log (JSONB) holds no NUL: the console's 500,
                raise BadSelection("message ids are printable text: no control characters")  # the CLI's traceback
            if len(wanted) > MAX_MESSAGE_IDS:
                raise BadSelection(f"at most {MAX_MESSAGE_IDS} message ids per call")
            return {"message_ids": wanted}
        if expected is None:
            raise BadSelection("choose message ids, or all with the count you expect (nothing chosen: nothing done)")
        if isinstance(expected, bool) or not isinstance(expected, int) or not 1 <= expected <= MAX_EXPECTED:
            raise BadSelection(f"expected must be an integer between 1 and {MAX_EXPECTED}")
        return {"all": True, "expected": expected}

    def _act(self, verb: str, xq: str, prepare, *, actor: str, message_ids: list[str] | None,
             expected: int | None, reason: str | None) -> dict:
        """Apply ``prepare(connection)`` to each chosen dead letter of ``xq``, audited before and after.

        Chosen means either

        * ``message_ids``: exactly those ids. Every message of the queue is
          looked at (up to its depth when the call starts, stopping once all
          are found); one that is not chosen is held unacked and handed back
          with ``basic_nack(requeue=True)`` at the end, in its place and
          unchanged but for AMQP's ``redelivered`` flag. Ids not met are
          reported ``not_found``.
        * ``expected`` ("all"): the operator confirms the count they saw. If
          the queue holds more, :class:`MoreThanExpected` is raised and
          nothing is done (nor audited: nothing was attempted). Otherwise at
          most the depth read at the start is taken, oldest first, so a
          message dead-lettered meanwhile is not touched.

        The audit row is committed *before* the broker is touched, with
        ``details.status`` ``intent`` (what was chosen and the depth seen);
        afterwards the same row becomes ``completed`` (what was done, count,
        ids not found) or ``failed`` (what was done before the error), or
        ``unknown`` when the broker cannot tell whether it did what was
        asked (:class:`OutcomeUnknown`: its ``unknown`` ids may have been
        done). A row left at ``intent`` means the process died, or lost
        PostgreSQL, in between: its ids say what may have been done.
        """
        selection = self._selection(message_ids, expected)
        wanted = selection.get("message_ids")
        action = f"dlq.{verb}"
        done: list[str | None] = []
        doubt: list[str | None] = []  # taken, and whether the broker did it cannot be told
        audit_id: int | None = None
        depth = 0
        try:
            with self._alone(xq) as held, self._connection(f"{verb} {xq}") as connection:
                depth = self._depth(connection, xq) or 0
                if expected is not None and depth > expected:
                    raise MoreThanExpected(xq, depth, expected)
                with transaction(self.engine) as conn:
                    audit_id = audit.record(conn, actor=actor, action=action, target=xq, reason=reason,
                                            details={"status": "intent", **selection, "depth": depth})
                faults.point("dlq_after_intent")
                if depth:
                    handle = prepare(connection)

                    def alone_handle(*message) -> None:  # each message only while the queue is still ours
                        held()
                        handle(*message)

                    self._take(connection, xq, depth, wanted, alone_handle, done, doubt)
        except Exception as exc:
            if audit_id is not None:
                self._complete(audit_id, verb, selection, depth, done, wanted, error=exc, doubt=doubt)
            raise
        self._complete(audit_id, verb, selection, depth, done, wanted)
        return {f"{verb}d": len(done), "message_ids": done,
                "not_found": [] if wanted is None else [m for m in wanted if m not in done]}

    def _take(self, connection, xq: str, depth: int, wanted: list[str] | None, handle,
              done: list[str | None], doubt: list[str | None]) -> None:
        """The chosen messages handled one by one, each in ``done`` once RabbitMQ has its ack.

        An ack is not answered: RabbitMQ has it once it answers a later call on the channel (the next ``basic.get``,
        the channel's close), as it handles a channel's calls in order. A message acked just before the connection
        failed goes to ``doubt``, not ``done``: it may still be in the queue (requeued, it was published to its step
        queue too). It was listed as done, and the audit row of a purge whose connection dropped as its ack was sent
        said "purged" of a message still in the queue (an adversarial run)."""
        source = connection.channel()
        remaining = None if wanted is None else set(wanted)
        held = 0  # fetched, not chosen: unacked until the end, then handed back in place
        known = len(done)  # how many of ``done`` RabbitMQ is known to have
        handling = None  # the message being handled: a requeue's publish, or an ack, may have been sent
        try:
            try:
                for _ in range(depth):
                    if remaining is not None and not remaining:
                        break
                    method, properties, body = source.basic_get(xq, auto_ack=False)
                    known = len(done)
                    if method is None:
                        break
                    message_id = _message_id(_decode(body), properties)
                    if remaining is not None and message_id not in remaining:
                        held += 1
                        continue
                    handling = message_id
                    handle(source, method, properties, body)
                    done.append(message_id)
                    handling = None
                    if remaining is not None:
                        remaining.discard(message_id)
            finally:
                if held and source.is_open:
                    source.basic_nack(delivery_tag=0, multiple=True, requeue=True)
            source.close()
        except BaseException as exc:
            doubt.extend(done[known:])
            del done[known:]
            if handling is not None and not isinstance(exc, NOT_SENT):
                # a requeue cut while its publish waited for the confirm: the message was in the step queue and
                # still a dead letter, and the audit row named neither (a re-attack)
                doubt.append(handling)
            raise

    def _complete(self, audit_id: int, verb: str, selection: dict, depth: int, done: list, wanted,
                  error: Exception | None = None, doubt: list | None = None) -> None:
        status = "completed" if error is None else "unknown" if isinstance(error, OutcomeUnknown) else "failed"
        details: dict[str, Any] = {"status": status, **selection,
                                   "depth": depth, f"{verb}d": done,
                                   "count": len(done),
                                   "completed_at": datetime.now(timezone.utc).isoformat()}
        if wanted is not None and error is None:
            details["not_found"] = [m for m in wanted if m not in done]
        if doubt:
            details["unknown"] = doubt
        if error is not None:
            details["error"] = f"{type(error).__name__}: {error}"[:500]

        def write() -> None:
            with transaction(self.engine) as conn:
                audit.complete(conn, audit_id, details)

        try:  # the ids taken are known only here: written again once PostgreSQL answers
            once_reachable(self.engine, AUDIT_COMPLETION_SECONDS, write, interval=AUDIT_COMPLETION_PAUSE_SECONDS)
        except Exception:
            log.error("audit row %s not completed; it stays at status intent", audit_id,
                      extra={"audit_id": audit_id, "done": len(done)})
            if error is None:
                raise


#: the RabbitMQ toolkit by the name that says so (the PostgreSQL broker's: ``postgres_dead_letters``)
RabbitDeadLetters = DeadLetters

__all__ = ["DeadLetters", "RabbitDeadLetters"]
