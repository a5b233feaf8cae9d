"""Database access: one engine per process, migrations, and error translation."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.adapters.postgres.liveness import liveness_params
from app.errors import DatabaseUnavailable, QueryTimeout

T = TypeVar("T")

MIGRATIONS = Path(__file__).with_name("migrations")


def make_engine(database_url: str, *, pool_size: int = 5, process: str | None = None,
                idle_in_transaction_seconds: float | None = None, pool_timeout: float = 30.0,
                lock_timeout_seconds: float | None = None) -> Engine:
    """``process`` names the attache process in each connection's ``application_name`` (``attache worker``), so
    ``pg_stat_activity`` tells whose a connection is. ``idle_in_transaction_seconds``: PostgreSQL ends a session
    whose transaction waits that long for its client (``idle_in_transaction_session_timeout``), which rolls it
    back and frees its row locks. A server gone silent is found in about 10 s, and a client gone silent by the
    server (``liveness.py``). ``pool_timeout``: how long a caller waits for a free connection when the pool's
    ``pool_size`` + 10 are all in use; then :func:`transaction` raises :class:`DatabaseUnavailable`.
    ``lock_timeout_seconds``: the longest a statement waits for a lock another session holds
    (``lock_timeout``); then :func:`transaction` raises :class:`DatabaseUnavailable` too."""
    url = make_url(database_url).set(drivername="postgresql+psycopg2")
    server = {}
    if idle_in_transaction_seconds is not None:
        server["idle_in_transaction_session_timeout"] = max(1, int(idle_in_transaction_seconds * 1000))
    if lock_timeout_seconds is not None:
        server["lock_timeout"] = max(1, int(lock_timeout_seconds * 1000))
    engine = create_engine(url, pool_size=pool_size, max_overflow=10, pool_timeout=pool_timeout, pool_pre_ping=True,
                           connect_args=connect_args(url, process, server))
    event.listen(engine, "handle_error", _read_only_is_a_lost_server)
    return engine


def connect_args(url, process: str | None = None, server: dict | None = None) -> dict:
    """libpq's parameters for every connection attache opens to ``url`` (a SQLAlchemy URL): connecting given up
    after 5 s, the connection named for ``process``, a silent server found (``liveness.py``), and ``server``'s
    settings asked for. The release's own connections (:func:`ensure_database`, the migrations) had none of these,
    and ``attache db upgrade`` against a server that accepted the connection and never answered waited for good
    (an adversarial run)."""
    return {"connect_timeout": 5, "application_name": f"attache {process}" if process else "attache",
            **liveness_params(url.query, server)}


#: how long the release's migration transaction may wait for its client between statements (the migrations' own
#: Python work between them takes milliseconds)
RELEASE_IDLE_IN_TRANSACTION_SECONDS = 60


def release_connect_args(url) -> dict:
    """The release's connections (the migrations): :func:`connect_args`, and no deadline on an answer (a migration's
    statement may take long), but a release whose client stopped answering mid-migration (a frozen network,
    SIGSTOP) has its session ended by the server, and the locks it holds with it: one held ``step_runs`` locked,
    and every worker's step record waited, for as long as it stayed frozen (a re-attack)."""
    return connect_args(url, "release",
                        {"idle_in_transaction_session_timeout": RELEASE_IDLE_IN_TRANSACTION_SECONDS * 1000})


#: PostgreSQL's SQLSTATE for a write in a read-only session: a primary demoted by a failover, a hot standby, or
#: ``default_transaction_read_only`` set by an operator
READ_ONLY_SQL_TRANSACTION = "25006"
#: whether this session refuses writes: ``on`` or ``off`` (a session keeps what it started with)
SESSION_READ_ONLY = "SELECT current_setting('transaction_read_only')"


def _read_only_is_a_lost_server(context) -> None:
    """A session that cannot write is as good as a lost one: its connection, and the pool's others (opened to the
    same server), are replaced, and the error is a lost connection (:func:`transaction`: ``DatabaseUnavailable``).

    Before, the worker took it for a bug in the step: Dramatiq's retries, backing off, left jobs waiting minutes
    after a 15 s read-only spell had ended (up to 285 s, an adversarial run)."""
    if getattr(context.original_exception, "pgcode", None) == READ_ONLY_SQL_TRANSACTION:
        context.is_disconnect = True


def interval(seconds: float):
    """A PostgreSQL interval of ``seconds`` (to the millisecond), for ``now() + interval(...)`` in a statement."""
    return text(f"interval '{float(seconds):.3f} seconds'")


def hold_briefly(conn: Connection, *, idle_seconds: float, lock_seconds: float) -> None:
    """For a transaction that holds a row the whole pipeline may wait for, in a process whose engine has no such
    bounds (the web's): it ends (rolled back, its locks freed, its session closed) if its client leaves it idle
    for ``idle_seconds``, and each of its statements waits ``lock_seconds`` at most for a lock (then
    :func:`transaction` raises :class:`DatabaseUnavailable`). The second keeps a paused process's other
    transactions, queued in PostgreSQL behind the first, from taking the row in turn and each holding it idle."""
    idle_at_most(conn, idle_seconds)
    conn.execute(text(f"SET LOCAL lock_timeout = {max(1, int(lock_seconds * 1000))}"))


def idle_at_most(conn: Connection, seconds: float) -> None:
    """The rest of this transaction ends (rolled back, its locks freed, its session closed) if its client leaves it
    idle for ``seconds``, whatever the process's own bound."""
    conn.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {max(1, int(seconds * 1000))}"))


#: the session's idle bound, in milliseconds (0: none), as the transaction sees it (a SET LOCAL included)
_IDLE_BOUND_MS = text("SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'")
#: a beat sent this often within the bound: the first long before it, with room for a busy process's GIL
BEATS_PER_IDLE_BOUND = 4


@contextlib.contextmanager
def kept_alive(conn: Connection) -> Iterator[None]:
    """For work outside the database inside ``conn``'s transaction (storage calls under a row lock), which must
    not use ``conn`` meanwhile: a thread sends ``SELECT 1`` a quarter of the session's idle bound apart, so
    PostgreSQL does not end a transaction whose process is working rather than gone. A paused or frozen process
    sends none (its threads stop with it) and the bound ends its transaction as before. A tus upload's last PATCH
    joining 50 MB of parts from storage slower than 0.4 MB/s was cut by the web's 120 s bound every time, its
    client answered 503 at each retry. A beat that fails (the connection lost) stops the beating, and the block
    raises :class:`DatabaseUnavailable` when it ends."""
    bound_ms = conn.execute(_IDLE_BOUND_MS).scalar() or 0
    if bound_ms <= 0:
        yield
        return
    done = threading.Event()
    failed: list[BaseException] = []

    def beat() -> None:
        while not done.wait(bound_ms / 1000 / BEATS_PER_IDLE_BOUND):
            try:
                conn.exec_driver_sql("SELECT 1")
            except Exception as exc:  # noqa: BLE001 - raised as the database's loss when the block ends
                failed.append(exc)
                return

    beating = threading.Thread(target=beat, name="attache-transaction-beat", daemon=True)
    beating.start()
    try:
        yield
    finally:
        done.set()
        beating.join()  # no beat on the connection once the caller uses it again
    if failed:  # the transaction is gone: its next statement would raise what no caller translates (a re-attack:
        # SQLAlchemy's PendingRollbackError, answered 500)
        raise DatabaseUnavailable("the database connection was lost while the transaction waited") from failed[0]


@contextlib.contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """``BEGIN ... COMMIT`` that turns a lost database, or a pool with no connection free in time, into
    :class:`DatabaseUnavailable`."""
    try:
        with engine.begin() as conn:
            yield conn
    except OperationalError as exc:
        if lock_not_available(exc):
            raise DatabaseUnavailable("another session holds a lock this transaction needs; retry") from exc
        raise DatabaseUnavailable("database unavailable") from exc
    except PoolTimeout as exc:  # every connection of the process's pool in use for the pool's whole timeout
        raise DatabaseUnavailable("no database connection free") from exc
    except PendingRollbackError as exc:  # the connection was lost under a statement of another thread's
        raise DatabaseUnavailable("database connection lost") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise DatabaseUnavailable("database connection lost") from exc
        raise


#: PostgreSQL's SQLSTATE class "insufficient resources": disk full (53100), out of memory (53200), too many
#: connections (53300), a configured limit (53400)
INSUFFICIENT_RESOURCES = "53"


def short_of_resources(error: BaseException | None) -> bool:
    """Whether ``error``, or an error that caused it, is PostgreSQL refusing for want of disk, memory or
    connections: it may well answer a ``SELECT`` (:func:`reachable`), yet no write lands until some is freed."""
    while error is not None:
        code = getattr(getattr(error, "orig", None), "pgcode", None) or getattr(error, "pgcode", None)
        if code and code.startswith(INSUFFICIENT_RESOURCES):
            return True
        error = error.__cause__ or error.__context__
    return False


def reachable(engine: Engine) -> bool:
    """Whether PostgreSQL answers now and takes writes: a connection (checked out and pinged, or made) whose
    session is not read-only. A read-only session's connection is replaced, so the next call asks afresh (the
    server may be writable again, or a failover's new primary may answer)."""
    try:
        with engine.connect() as conn:
            if conn.exec_driver_sql(SESSION_READ_ONLY).scalar() == "off":
                return True
            conn.invalidate()
            return False
    except DBAPIError:
        return False


def wait_until_reachable(engine: Engine, seconds: float, stopping: threading.Event, *,
                         interval: float = 1.0) -> bool:
    """After PostgreSQL did not answer (or took no writes): ask it again every ``interval`` until it answers and
    takes writes (True), ``seconds`` pass or ``stopping`` is set (False)."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or stopping.wait(min(interval, remaining)):
            return False
        if reachable(engine):
            return True


def once_reachable(engine: Engine, seconds: float, call: Callable[[], T], *, interval: float = 1.0) -> T:
    """``call()``; if PostgreSQL did not answer it (:class:`DatabaseUnavailable`), ``call()`` once more as soon as
    PostgreSQL answers within ``seconds`` (:func:`wait_until_reachable`), else its error."""
    try:
        return call()
    except DatabaseUnavailable:
        if not wait_until_reachable(engine, seconds, threading.Event(), interval=interval):
            raise
    return call()


#: PostgreSQL's SQLSTATE for a lock not taken: ``NOWAIT``, or ``lock_timeout`` run out
LOCK_NOT_AVAILABLE = "55P03"


def lock_not_available(error: BaseException) -> bool:
    """Whether ``error`` is PostgreSQL refusing to wait (longer) for a lock another session holds."""
    return getattr(getattr(error, "orig", None), "pgcode", None) == LOCK_NOT_AVAILABLE


#: PostgreSQL's SQLSTATE for a statement cancelled by ``statement_timeout``
QUERY_CANCELED = "57014"


#: how often a block past its time asks PostgreSQL again to cancel what runs: a statement that began just as the
#: first cancel arrived (which PostgreSQL ignores between statements) is cancelled at the next
CANCEL_REPEAT_SECONDS = 0.05


@contextlib.contextmanager
def time_limit(conn: Connection, seconds: float) -> Iterator[None]:
    """The statements of this block on ``conn`` take ``seconds`` at most, together: :class:`QueryTimeout`.

    ``SET LOCAL statement_timeout`` alone bounded each statement, not the
    block: four statements of 0.9 s under a 1 s limit ran 3.6 s (an
    adversarial review). It stays as each statement's bound; a timer now
    also cancels the statement running when the block's time is up (the
    driver's cancel request, as from another session), and a statement
    started after that fails before it is sent. ``SET LOCAL``: the
    statement bound ends with the transaction, and the cancelled
    transaction is rolled back by whoever opened it.
    """
    conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(seconds * 1000))}")
    deadline = time.monotonic() + seconds
    canceller = _Canceller(conn.connection.dbapi_connection, seconds)

    def started(*_):
        if time.monotonic() >= deadline:
            raise _timed_out(seconds)

    event.listen(conn, "before_cursor_execute", started)
    canceller.start()
    try:
        yield
    except OperationalError as exc:
        if getattr(exc.orig, "pgcode", None) == QUERY_CANCELED:
            raise _timed_out(seconds) from exc
        raise
    finally:
        canceller.stop()
        event.remove(conn, "before_cursor_execute", started)


def _timed_out(seconds: float) -> QueryTimeout:
    return QueryTimeout(f"the queries ran longer than {seconds:g} s and were cancelled")


class _Canceller(threading.Thread):
    """After ``seconds``, cancels what ``dbapi_connection`` runs, every :data:`CANCEL_REPEAT_SECONDS` until stopped;
    none is sent once :meth:`stop` returns (a cancel that reached the block's COMMIT would undo finished work)."""

    def __init__(self, dbapi_connection, seconds: float):
        super().__init__(name="attache-time-limit", daemon=True)
        self._connection = dbapi_connection
        self._seconds = seconds
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def run(self) -> None:
        wait = self._seconds
        while not self._stopped.wait(wait):
            with self._lock:
                if self._stopped.is_set():
                    return
                try:
                    self._connection.cancel()
                except Exception:  # noqa: BLE001 - a connection lost meanwhile: its statement fails anyway
                    return
            wait = CANCEL_REPEAT_SECONDS

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()


#: SQLSTATEs of a CREATE DATABASE whose name another took first: the name checked, or the catalog's unique key
DUPLICATE_DATABASE, UNIQUE_VIOLATION = "42P04", "23505"


def ensure_database(database_url: str) -> bool:
    """Create the database named in the URL if it is missing. True if created.

    Processes that start together (``make up``: web, worker and scheduler)
    all call this; exactly one creates the database, and the others' CREATE
    fails on the name taken, which says it exists. No session-level lock:
    one taken around the CREATE (which cannot run in a transaction) was
    taken and released on different server sessions behind a pooler in
    transaction mode, and stayed held for good by an idle one, and every
    later start waited for it (an adversarial run, through PgBouncer).
    """
    url = make_url(database_url).set(drivername="postgresql+psycopg2")
    name = url.database
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT",
                          connect_args=release_connect_args(url))
    try:
        with admin.connect() as conn:
            if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar():
                return False
            try:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            except DBAPIError as exc:  # another process created it first
                if getattr(exc.orig, "pgcode", None) in (DUPLICATE_DATABASE, UNIQUE_VIOLATION):
                    return False
                raise
            return True
    finally:
        admin.dispose()


def alembic_config(database_url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", make_url(database_url).set(drivername="postgresql+psycopg2")
                        .render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def upgrade(database_url: str) -> None:
    """Apply every migration (idempotent; safe to run from two processes at once)."""
    from alembic import command

    command.upgrade(alembic_config(database_url), "head")
