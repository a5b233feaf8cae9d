"""The PostgreSQL broker: Dramatiq over ``dramatiq-postgres``, with RabbitMQ mode's guarantees.

``dramatiq-postgres`` keeps every message as a row of ``dramatiq.queue``
(its own schema, created here on first use): a worker claims due rows with
``SELECT … FOR UPDATE SKIP LOCKED``, ``LISTEN/NOTIFY`` wakes it when one is
enqueued, an ack deletes the row, a nack marks it ``rejected``. A worker
writes a heartbeat row; the messages it held are queued again once it has
been silent for :data:`HEARTBEAT_TTL_SECONDS` (a SIGKILLed worker's
messages come back, as RabbitMQ's do when the connection drops).

What :class:`PostgresBroker` adds, so this mode keeps RabbitMQ mode's contract:

1. **A delivery limit.** Each claim counts a delivery in the message
   (``options.x_delivery_count``, the quorum queue's ``x-delivery-count``);
   a message already delivered more than ``delivery_limit`` times is not
   handed out again but dead-lettered (``rejected``, with
   ``options.dead_lettered = "delivery_limit"``): a message that kills
   every worker that takes it stops looping.
2. **Dead letters kept until an operator acts.** ``<queue>.XQ`` is the
   ``rejected`` rows of the queue (and of its delay queue); the library's
   age-based purge is off, as RabbitMQ keeps ``.XQ`` until it is purged
   (:class:`~app.adapters.broker.dead_letter_tools.PostgresDeadLetters`).
3. **Publishing like the RabbitMQ broker.** One ``INSERT`` committed before
   :meth:`enqueue` returns (the commit is the confirm), bounded by the
   publish timeout and raising :class:`BrokerUnavailable` (no retry loop:
   the outbox relay retries); every publish is a fresh delivery count; the
   window-3 fault point dies after the commit.
4. :meth:`queue_depth` and :meth:`ping`, as the reconciler and ``/readyz`` use them.
5. **No worker judged dead for a silence everyone shared.** After a
   PostgreSQL outage (or a pause of this process) every worker's heartbeat
   is old; the library's upkeep, run by the first worker back, queued the
   messages the others still held again, and they ran twice. A worker now
   runs the upkeep only once it has itself been heard without a gap for
   :data:`HEARTBEAT_TTL_SECONDS`, time enough for every live worker to
   beat again (:meth:`PostgresBroker.maybe_maintenance`).

The broker shares the database only by URL: it has its own psycopg 3
connection pool, and its rows are written in their own transactions (see
``docs/architecture.md``, "The PostgreSQL broker", for why the outbox does
not enqueue in the job's transaction).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from textwrap import dedent
from typing import Iterator
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import psycopg
from dramatiq.common import current_millis, dq_name, q_name, xq_name
from dramatiq.errors import DecodeError
from dramatiq.message import Message
from dramatiq_postgres import PostgresBroker as LibraryBroker
from dramatiq_postgres import init as init_schema
from dramatiq_postgres.broker import PostgresConsumer
from dramatiq_postgres.utils import raise_connection_error, tidy4json, transaction
from psycopg import Error as PsycopgError
from psycopg.types.json import Json
from psycopg_pool import ConnectionPool, PoolTimeout

from app import faults
from app.adapters.postgres.db import SESSION_READ_ONLY
from app.adapters.postgres.liveness import AnswerWatch, check_the_client, liveness_params
from app.errors import BrokerUnavailable

log = logging.getLogger("attache.broker")

SCHEMA = "dramatiq"
TABLE = f"{SCHEMA}.queue"
#: the option a claim counts deliveries in (RabbitMQ's quorum queues: the x-delivery-count header)
DELIVERY_COUNT = "x_delivery_count"
#: the option that says why a message was dead-lettered by the broker itself
DEAD_LETTERED = "dead_lettered"
#: a worker heartbeats this often while it consumes
HEARTBEAT_SECONDS = 2.0
#: a worker silent this long is dead: the messages it held are queued again
HEARTBEAT_TTL_SECONDS = 10.0
#: PostgreSQL ends a broker session whose transaction has waited this long for its client. The broker's
#: transactions are a few statements on PostgreSQL alone; one idle this long belongs to a process stopped inside
#: it (SIGSTOP, a debugger, ``docker pause``; a frozen VM's session ends only by keepalives), whose row locks held,
#: for as long as it stayed stopped: the message a web had inserted and the relay's publish of it (which blocked
#: every row behind it), the messages a worker was claiming (skipped by the others, and counted as a backlog, so
#: the reconciler announced nothing anywhere), or the upkeep's lock (a dead worker's messages never requeued;
#: an adversarial run: uploads queued for the whole 45-150 s pause). The engine's sessions have theirs
#: (``app/services.py``).
IDLE_IN_TRANSACTION_SECONDS = HEARTBEAT_TTL_SECONDS
#: how often (about) one worker of the deployment requeues dead workers' messages
MAINTENANCE_SECONDS = 3.0
#: a consumer with nothing to do looks again after this long even without a NOTIFY
POLL_SECONDS = 1.0

#: everything a publish or an inspection can raise when PostgreSQL is away
PUBLISH_ERRORS = (PsycopgError, PoolTimeout, OSError)

#: a message with no options object, or a delivery count that is not a small integer, was not written by a
#: producer of this broker: it is dead-lettered as it is (``deliveries`` NULL) rather than fail every claim of its
#: queue (one such row, written by hand, stopped the step's queue for good and showed in no dead-letter listing:
#: an adversarial run)
CLAIM = dedent(f"""\
    WITH next AS (
        SELECT message_id,
               CASE WHEN jsonb_typeof(message) = 'object' AND jsonb_typeof(message->'options') = 'object'
                         AND COALESCE(message->'options'->>'{DELIVERY_COUNT}', '0') ~ '^[0-9]{{1,9}}$'
                    THEN COALESCE((message->'options'->>'{DELIVERY_COUNT}')::int, 0) END AS deliveries
        FROM {TABLE}
        WHERE queue_name = %(queue)s AND "state" = 'queued' AND available_at <= NOW()
        ORDER BY available_at, position
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), judged AS (
        SELECT message_id, deliveries, deliveries IS NULL OR deliveries > %(delivery_limit)s AS dead FROM next
    )
    UPDATE {TABLE} AS q SET
        "state" = CASE WHEN judged.dead THEN 'rejected'::{SCHEMA}.state ELSE 'consumed'::{SCHEMA}.state END,
        worker_id = CASE WHEN judged.dead THEN NULL ELSE %(worker)s::uuid END,
        consumed_at = CASE WHEN judged.dead THEN NULL ELSE NOW() END,
        mtime = NOW(),
        message = CASE WHEN judged.deliveries IS NULL THEN q.message
                       WHEN judged.dead THEN jsonb_set(q.message, '{{options,{DEAD_LETTERED}}}', '"delivery_limit"')
                       ELSE jsonb_set(q.message, '{{options,{DELIVERY_COUNT}}}', to_jsonb(judged.deliveries + 1)) END
    FROM judged
    WHERE q.message_id = judged.message_id
    RETURNING q.message_id::text, q."state"::text, q.message::text
    """)
#: a claimed row that is no Dramatiq message after all: dead-lettered, in the claim's transaction
REJECT = f"""UPDATE {TABLE} SET "state" = 'rejected', worker_id = NULL, consumed_at = NULL, mtime = NOW()
             WHERE message_id = %s"""

ENQUEUE = dedent(f"""\
    WITH enqueued AS (
        INSERT INTO {TABLE} (queue_name, message_id, "state", message, available_at)
        VALUES (%s, %s, 'queued', %s, NOW() + make_interval(secs => %s / 1000.0))
        ON CONFLICT (message_id) DO UPDATE SET
            "state" = 'queued', message = EXCLUDED.message, queue_name = EXCLUDED.queue_name,
            available_at = EXCLUDED.available_at, worker_id = NULL, consumed_at = NULL, mtime = NOW()
        RETURNING queue_name
    )
    SELECT pg_notify('dramatiq.' || queue_name || '.enqueue', '') FROM enqueued
    """)


@contextlib.contextmanager
def cursor(pool: ConnectionPool) -> Iterator:
    """A cursor in one transaction on a pooled connection, waiting at most the pool's timeout for it.

    Not ``dramatiq_postgres.utils.transaction``: that retries a lost
    connection for minutes, where a publish must fail within its timeout.
    """
    with pool.connection() as connection, connection.transaction(), connection.cursor() as curs:
        yield curs


def libpq_url(database_url: str) -> str:
    """A ``postgresql://`` URL psycopg 3 accepts: no SQLAlchemy driver suffix."""
    scheme, rest = database_url.split("://", 1)
    return "postgresql://" + rest if scheme.startswith("postgresql") else database_url


#: connections the broker's pool may hold
POOL_MAX_SIZE = 16


def watched_connections(watch: AnswerWatch) -> type[psycopg.Connection]:
    """psycopg 3 connections each of whose waits for the server (a statement, a COMMIT, the pool's check, a
    ``notifies`` poll of 2 s) ``watch`` cuts once it has lasted its deadline. Behind a proxy whose backend went
    silent and lost their bytes, the broker's claims and heartbeats waited for good and the worker took no
    message until it was restarted (an adversarial run)."""

    class WatchedConnection(psycopg.Connection):
        def wait(self, gen, *args, **kwargs):
            with watch.waiting(self):
                return super().wait(gen, *args, **kwargs)

    return WatchedConnection


def make_pool(url: str, *, timeout: float, max_size: int = POOL_MAX_SIZE,
              answer: AnswerWatch | None = None) -> ConnectionPool:
    """Connections opened on demand; a checkout (or a connect) waits at most ``timeout`` seconds.

    A connection that could not be opened is retried with a growing delay (1, 2, 4, 8... s), for at most twice
    ``timeout`` (psycopg_pool's ``reconnect_timeout``, 5 minutes by default); then the next checkout starts a
    fresh attempt, which tries at once. With the default, after an outage of minutes every connection the pool
    may open waited out a delay of a minute or more: the pool gave none for some 70 s after PostgreSQL was back.
    """
    parts = urlsplit(libpq_url(url))
    kwargs = dict(parse_qsl(parts.query))
    kwargs.setdefault("connect_timeout", str(max(1, int(timeout * 2))))
    kwargs.setdefault("application_name", "attache-broker")
    kwargs.update(liveness_params(kwargs, {"idle_in_transaction_session_timeout": int(
        IDLE_IN_TRANSACTION_SECONDS * 1000)}))
    # no server-side prepared statements: behind a pooler in transaction mode they were made on one server
    # session and used on another (DuplicatePreparedStatement, InvalidSqlStatementName, "bind message supplies 4
    # parameters": 20-29 consumer errors in 12 uploads, an adversarial run through PgBouncer); the broker's
    # statements are a few short ones, parsed each time for some microseconds
    kwargs["prepare_threshold"] = None
    return ConnectionPool(urlunsplit(parts._replace(query="")), kwargs=kwargs, min_size=0, max_size=max_size,
                          connection_class=watched_connections(answer) if answer else psycopg.Connection,
                          configure=check_the_client if answer else None, open=True, timeout=timeout,
                          reconnect_timeout=2 * timeout, check=check_writable)


def check_writable(connection) -> None:
    """The pool's check of a connection at checkout (one round trip, as psycopg_pool's own): alive, and its
    session takes writes. A session opened while PostgreSQL was read-only (a demoted primary, a hot standby,
    ``default_transaction_read_only``) stays read-only for its life: the pool kept such sessions for up to an
    hour after the database took writes again, and every claim and heartbeat on them failed (an adversarial run:
    single-node mode stood still for the two minutes it was watched). Such a session is closed here, and the
    pool opens another."""
    autocommit = connection.autocommit
    connection.autocommit = True
    try:
        read_only = connection.execute(SESSION_READ_ONLY).fetchone()[0]
    finally:
        with contextlib.suppress(Exception):  # a closed connection must not hide the error above
            connection.autocommit = autocommit
    if read_only != "off":
        connection.close()  # the pool keeps a connection that failed its check unless it is closed
        raise psycopg.OperationalError("the session is read-only (opened while PostgreSQL took no writes)")


def fresh(message: Message) -> Message:
    """``message`` as a new publish: no delivery count, not dead-lettered."""
    options = {k: v for k, v in message.options.items() if k not in (DELIVERY_COUNT, DEAD_LETTERED)}
    return Message(**{**message.asdict(), "options": options})


class PostgresBroker(LibraryBroker):
    def __init__(self, *, url: str, delivery_limit: int = 20, socket_timeout: float = 5.0,
                 middleware: list | None = None, answer: AnswerWatch | None = None):
        """``answer``: cuts a wait for the server's answer on its connections (:func:`watched_connections`)."""
        self.own_pool = make_pool(url, timeout=socket_timeout, answer=answer)
        super().__init__(pool=self.own_pool, results=False, listen=True, notify=True, poll_interval=POLL_SECONDS,
                         heartbeat_interval=HEARTBEAT_SECONDS, heartbeat_ttl=HEARTBEAT_TTL_SECONDS,
                         maintenance_interval=MAINTENANCE_SECONDS, purge_maxage=None, middleware=middleware)
        self.delivery_limit = delivery_limit
        self.answer_timeout = socket_timeout
        self._heard_lock = threading.Lock()
        self._answered_at: float | None = None
        self._heard_since: float | None = None
        self._schema_ready = False
        self._schema_lock = threading.Lock()

    # --- the schema ---------------------------------------------------------

    def ensure_schema(self) -> None:
        """Create ``dramatiq.queue`` and its tables if missing (idempotent, serialized on an advisory lock)."""
        if self._schema_ready:
            return
        with self._schema_lock:
            if not self._schema_ready:
                with cursor(self.pool) as curs:
                    curs.execute("SET LOCAL lock_timeout = '30s'")
                    init_schema(curs, SCHEMA, "")
                self._schema_ready = True

    def consume(self, queue_name, prefetch=1, timeout=30000):
        self.ensure_schema()
        return LimitedConsumer(broker=self, queue_name=queue_name, prefetch=prefetch, timeout=timeout)

    # --- heartbeats and upkeep --------------------------------------------------

    def maybe_heartbeat(self, conn):
        """The library's heartbeat; each consumer calls it about once a second while PostgreSQL answers, and a
        silence of more than two beats (an outage, a pause) starts this process's time of being heard again."""
        super().maybe_heartbeat(conn)  # raises while PostgreSQL is away
        now = time.monotonic()
        with self._heard_lock:
            if self._answered_at is None or now - self._answered_at > 2 * self.heartbeat_interval:
                self._heard_since = now
            self._answered_at = now

    def maybe_maintenance(self, conn):
        """The library's upkeep (requeue the messages of workers silent for the TTL), once this process has been
        heard for the TTL: its silence may have been everyone's, and the others need that long to beat again."""
        with self._heard_lock:
            heard_since = self._heard_since
        if heard_since is None or time.monotonic() - heard_since < self.heartbeat_ttl:
            return
        super().maybe_maintenance(conn)

    # --- publishing -----------------------------------------------------------

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """One committed INSERT (the commit is the confirm); :class:`BrokerUnavailable` if PostgreSQL is away."""
        message = fresh(message)
        try:
            self.ensure_schema()
            self.emit_before("enqueue", message, delay)
            if delay:
                message = message.copy(queue_name=dq_name(message.queue_name),
                                       options={"eta": current_millis() + delay})
            with cursor(self.pool) as curs:
                curs.execute(f"SET LOCAL statement_timeout = {int(self.answer_timeout * 1000)}")
                curs.execute(ENQUEUE, (message.queue_name, message.message_id, Json(tidy4json(message)),
                                       delay or 0))
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(f"publish to {message.queue_name} not committed: {type(exc).__name__}") from exc
        faults.point("after_publish")  # window 3: committed, the producer dies before it marks its outbox row
        self.emit_after("enqueue", message, delay)
        return message

    def enqueue_many(self, messages: list[Message]) -> tuple[int, BrokerUnavailable | None]:
        """Each message committed in turn (as :meth:`AttacheBroker.enqueue_many`: how many, and what stopped the rest)."""
        for sent, message in enumerate(messages):
            try:
                self.enqueue(message)
            except BrokerUnavailable as exc:
                return sent, exc
        return len(messages), None

    # --- inspection -----------------------------------------------------------

    def queue_depth(self, queue_name: str) -> int | None:
        """Messages ready in a queue; for ``<queue>.XQ`` its dead letters (the rejected rows of the queue)."""
        if queue_name.endswith(".XQ"):
            original = q_name(queue_name[:-3])
            where, args = """"state" = 'rejected' AND queue_name IN (%s, %s)""", (original, dq_name(original))
        else:
            where, args = """"state" = 'queued' AND queue_name = %s""", (queue_name,)
        try:
            self.ensure_schema()
            with cursor(self.pool) as curs:
                curs.execute(f"SELECT count(*) FROM {TABLE} WHERE {where}", args)
                return curs.fetchone()[0]
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(f"cannot inspect {queue_name}: {type(exc).__name__}") from exc

    def ping(self) -> None:
        """One round trip on a pooled connection."""
        try:
            with cursor(self.pool) as curs:
                curs.execute("SELECT 1")
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(f"PostgreSQL broker unreachable: {type(exc).__name__}") from exc

    def close(self):
        super().close()
        self.own_pool.close()


class LimitedConsumer(PostgresConsumer):
    """Claims like the library's consumer, counting deliveries and dead-lettering past the limit."""

    @raise_connection_error
    def claim(self, limit):
        claimed = []
        with transaction(self.get_consume_conn()) as curs:
            curs.execute(CLAIM, {"queue": self.queue_name, "limit": limit, "worker": self.broker.worker_id,
                                 "delivery_limit": self.broker.delivery_limit})
            for message_id, state, payload in curs.fetchall():
                if state == "rejected":
                    log.warning("message dead-lettered: past %s deliveries, or not a message of this broker",
                                self.broker.delivery_limit + 1,
                                extra={"message_id": message_id, "queue": self.queue_name})
                    continue
                try:
                    claimed.append(Message.decode(payload.encode("utf-8")))
                except DecodeError:  # an object with options, and not a Dramatiq message all the same
                    log.warning("message dead-lettered: not a Dramatiq message",
                                extra={"message_id": message_id, "queue": self.queue_name})
                    curs.execute(REJECT, (message_id,))
        self.buffer.extend(claimed)


__all__ = ["DEAD_LETTERED", "DELIVERY_COUNT", "PostgresBroker", "TABLE", "fresh", "libpq_url", "make_pool",
           "xq_name"]
