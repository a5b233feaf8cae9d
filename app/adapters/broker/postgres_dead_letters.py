"""The dead-letter toolkit of the PostgreSQL broker: the same API, audit and refusals as RabbitMQ's.

``<queue>.XQ`` is the ``rejected`` rows of ``dramatiq.queue`` for the queue
and its delay queue: messages Dramatiq gave up on (``throws``, retries
spent) and messages the broker dead-lettered past its delivery limit.
:class:`PostgresDeadLetters` is a
:class:`~app.adapters.broker.dead_letter_tools.DeadLetters` whose broker
side is SQL, so choosing (ids, or all with the expected count), refusing
(:class:`MoreThanExpected`, nothing done) and auditing (the ``intent`` row
committed before the broker is touched, then ``completed`` or ``failed``)
are the very same code (:meth:`DeadLetters._act`).

Differences an operator may notice, none of them a loss:

* looking at dead letters does not touch them (no fetch and hand back);
* a requeue or purge is one transaction: all of the chosen messages move,
  or none do (RabbitMQ moves them one by one). A COMMIT whose answer was
  lost (the connection dropped just then) is checked on another
  connection: the messages gone from the ``.XQ``, it is done; still there,
  nothing was; neither to be told, :class:`~app.errors.OutcomeUnknown` and
  an audit row ``unknown`` naming them. It answered ``503
  broker_unavailable`` with an audit row saying nothing was done, after the
  server had purged or requeued them all (an adversarial run);
* a requeued message keeps its message id (it is the same row, queued
  again with a fresh delivery count), as RabbitMQ's requeue keeps the body.
"""

from __future__ import annotations

import contextlib
import json
from typing import Iterable, Iterator

from dramatiq.common import dq_name
from dramatiq.errors import DecodeError
from dramatiq.message import Message
from psycopg.types.json import Json

from app.adapters.broker.dead_letter_tools import REQUEUED_BY_HEADER, TRACEBACK_CHARS, DeadLetters
from app.adapters.broker.postgres import (
    DEAD_LETTERED,
    DELIVERY_COUNT,
    ENQUEUE,
    PUBLISH_ERRORS,
    TABLE,
    fresh,
    make_pool,
    xq_name,
)
from app.errors import BadSelection, BrokerUnavailable, OutcomeUnknown

REJECTED = f"""FROM {TABLE} WHERE "state" = 'rejected' AND queue_name IN (%s, %s)"""
#: how long the look after a COMMIT without answer waits for that COMMIT's transaction to end, should PostgreSQL
#: not have ended it yet (its row locks; then it cannot be told)
LANDED_LOCK_TIMEOUT_MS = 5000


def _describe(message_id: str, envelope, mtime) -> dict:
    if not isinstance(envelope, dict):  # not a Dramatiq message (written by hand): shown as it is (it was a 500)
        envelope = {"args": [envelope]}
    options = envelope.get("options") if isinstance(envelope.get("options"), dict) else {}
    args = envelope.get("args")
    traceback = options.get("traceback")
    return {
        "message_id": message_id,
        "actor_name": envelope.get("actor_name"),
        "queue_name": envelope.get("queue_name"),
        "body": args[0] if isinstance(args, list) and args else envelope,
        "retries": options.get("retries", 0),
        "death": [{"reason": options.get(DEAD_LETTERED, "rejected"), "queue": envelope.get("queue_name"),
                   "count": options.get(DELIVERY_COUNT), "time": mtime.isoformat() if mtime else None}],
        "recorded": None,
        "job_state": None,
        "traceback": traceback[:TRACEBACK_CHARS] if isinstance(traceback, str) else None,
    }


class PostgresDeadLetters(DeadLetters):
    """The dead letters of ``queues`` in the PostgreSQL broker of ``broker_url``."""

    def __init__(self, broker_url: str, engine, *, queues: Iterable[str], socket_timeout: float = 5.0):
        self.pool = make_pool(broker_url, timeout=socket_timeout, max_size=4)
        self.engine = engine
        self.step_queues = tuple(queues)

    def close(self) -> None:
        self.pool.close()

    @contextlib.contextmanager
    def _connection(self, what: str) -> Iterator:
        try:
            with self.pool.connection() as connection:
                connection.autocommit = True  # each statement its own; _take opens the one transaction it needs
                yield connection
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(f"PostgreSQL broker failed ({what}): {type(exc).__name__}") from exc

    @staticmethod
    def _queues_of(xq: str) -> tuple[str, str]:
        original = xq[:-3]
        return original, dq_name(original)

    def _depth(self, connection, queue: str) -> int:
        if connection.execute("SELECT to_regclass(%s)", (TABLE,)).fetchone()[0] is None:
            return 0  # nothing was ever enqueued: no broker table yet
        return connection.execute("SELECT count(*) " + REJECTED, self._queues_of(queue)).fetchone()[0]

    # --- API ----------------------------------------------------------------

    def queues(self) -> list[dict]:
        with self._connection("queues") as connection:
            return [{"name": xq_name(queue), "queue": queue, "messages": self._depth(connection, xq_name(queue))}
                    for queue in self.step_queues]

    def listing(self, queue: str, limit: int = 50) -> dict:
        xq, _ = self._resolve(queue)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        with self._connection(f"messages {xq}") as connection:
            depth = self._depth(connection, xq)
            rows = connection.execute(
                "SELECT message_id::text, message, mtime " + REJECTED + " ORDER BY mtime, position LIMIT %s",
                (*self._queues_of(xq), limit)).fetchall() if depth else []
        items = [_describe(message_id, envelope, mtime) for message_id, envelope, mtime in rows]
        return {"depth": depth, "messages": self._annotate(items)}

    def requeue(self, queue: str, *, actor: str, message_ids: list[str] | None = None,
                expected: int | None = None, reason: str | None = None) -> dict:
        """Queue the chosen dead letters again on their step queue, with a fresh delivery count."""
        xq, original = self._resolve(queue)

        def prepare(connection):
            def move(cursor, message_id: str, envelope: dict) -> None:
                try:
                    message = fresh(Message.decode(json.dumps(envelope).encode()))
                except DecodeError:  # it was a 500
                    raise BadSelection(f"dead letter {message_id} is not a Dramatiq message and cannot be "
                                       "requeued; purge it") from None
                message = message.copy(queue_name=original, options={REQUEUED_BY_HEADER: actor})
                message = Message(**{**message.asdict(), "options": {
                    k: v for k, v in message.options.items() if k not in ("eta", "traceback")}})
                cursor.execute(ENQUEUE, (original, message_id, Json(json.loads(message.encode())), 0))

            return move

        return self._act("requeue", xq, prepare, actor=actor, message_ids=message_ids, expected=expected,
                         reason=reason)

    def purge(self, queue: str, *, actor: str, message_ids: list[str] | None = None, expected: int | None = None,
              reason: str | None = None) -> dict:
        """Delete the chosen dead letters for good."""
        xq, _ = self._resolve(queue)

        def prepare(connection):
            def delete(cursor, message_id: str, envelope: dict) -> None:
                cursor.execute(f"DELETE FROM {TABLE} WHERE message_id = %s AND \"state\" = 'rejected'", (message_id,))

            return delete

        return self._act("purge", xq, prepare, actor=actor, message_ids=message_ids, expected=expected, reason=reason)

    def _take(self, connection, xq: str, depth: int, wanted: list[str] | None, handle,
              done: list[str | None], doubt: list[str | None]) -> None:
        """The chosen rows, oldest first and at most ``depth``, handled in one transaction.

        A COMMIT that failed after every statement succeeded may have landed: :meth:`_landed` looks. Landed, the
        rows are done; not, the error stands (nothing was done); not to be told, their ids go to ``doubt`` and
        :class:`OutcomeUnknown` is raised."""
        query = "SELECT message_id::text, message, mtime " + REJECTED
        args: tuple = self._queues_of(xq)
        if wanted is not None:
            query += " AND message_id::text = ANY(%s)"
            args += (list(wanted),)
        query += " ORDER BY mtime, position LIMIT %s FOR UPDATE SKIP LOCKED"
        taken: dict[str, object] = {}  # message id -> its row's mtime when taken
        committing = False
        try:
            with connection.transaction(), connection.cursor() as cursor:
                for message_id, envelope, mtime in cursor.execute(query, (*args, depth)).fetchall():
                    handle(cursor, message_id, envelope)
                    taken[message_id] = mtime
                committing = True  # every statement succeeded: an error from here on is the COMMIT's own
        except PUBLISH_ERRORS as exc:
            if not (committing and taken):
                raise
            landed = self._landed(xq, taken)
            if landed is False:
                raise
            if landed is None:
                doubt.extend(taken)  # their ids
                raise OutcomeUnknown(f"the COMMIT of the {len(taken)} dead letter(s) taken from {xq} got no answer "
                                     "and whether it landed cannot be told: they may have been requeued or purged "
                                     "as asked (the audit row lists them, status unknown); list the queue before "
                                     "doing it again") from exc
        done.extend(taken)  # their ids, oldest first

    def _landed(self, xq: str, taken: dict[str, object]) -> bool | None:
        """Whether the transaction that took ``taken`` (message id -> its row's mtime then) from ``xq`` committed,
        as another connection sees it: True when none of them is the dead letter it was any more, False when all
        still are (one transaction: all or none), None when it cannot be told. ``FOR SHARE`` waits for that
        transaction to end if PostgreSQL has not ended it yet (for :data:`LANDED_LOCK_TIMEOUT_MS`), and sees its rows
        as it left them. A row is the same dead letter while its ``mtime`` is: a message requeued, run by a worker
        and dead-lettered again before the look is a dead letter again, with a later ``mtime``; judged by its state
        alone, a requeue that landed was audited ``failed``, nothing done (a re-attack)."""
        try:
            with self._connection(f"check {xq}") as connection, connection.transaction():
                connection.execute(f"SET LOCAL lock_timeout = {LANDED_LOCK_TIMEOUT_MS}")
                rows = connection.execute("SELECT message_id::text, mtime " + REJECTED + " AND message_id::text = "
                                          "ANY(%s) FOR SHARE", (*self._queues_of(xq), list(taken))).fetchall()
        except BrokerUnavailable:
            return None
        left = [message_id for message_id, mtime in rows if taken[message_id] == mtime]
        return {0: True, len(taken): False}.get(len(left))


__all__ = ["PostgresDeadLetters"]
