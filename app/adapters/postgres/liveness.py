"""How a connection finds that PostgreSQL has gone silent: libpq's TCP keepalives and ``tcp_user_timeout``.

A server can vanish without a word: a failover that moves its address, a
paused or frozen machine, a cable, a firewall that drops a connection's
state. With libpq's defaults the client waits on the kernel: a query
waiting for its answer until the first keepalive probe (``tcp_keepalive_time``,
2 hours on Linux), bytes left unacknowledged for the retransmissions
(``tcp_retries2``, about 15 minutes). Meanwhile a worker's thread holds its
message, the scheduler's sweeps stop and a web thread hangs; a long outage
strands uploads that a short one would not.

With these settings a silent server is found in about 10 s: a connection
idle for 5 s (waiting for a query's answer counts) is probed every 2 s, and
once 10 s pass with a probe or bytes unanswered the kernel drops it; the
caller gets a lost connection, which attache treats as the database being
unavailable, and asks again later. A healthy server's kernel answers probes
at once, even while a query runs for minutes, so long queries are not cut.
On a Unix socket libpq ignores them.

The server is asked for the same, for its side of each connection
(PostgreSQL's ``tcp_keepalives_*`` and ``tcp_user_timeout``, in the
connection's ``options``): a client whose machine froze or whose network
went silent is found by PostgreSQL in about 10 s and its session ended,
which rolls its transaction back and frees its row and advisory locks.
With the kernel's defaults the server kept such a session for over two
hours, and what it had locked (``FOR UPDATE SKIP LOCKED``: the outbox rows
a scheduler was publishing, the jobs it was recovering) was passed over by
every other process meanwhile (``tests/test_silent_database.py``).

Each can be set in the database URL's query string
(``?keepalives_idle=30&tcp_user_timeout=60000``), which wins on both sides;
the URL's own ``options`` come after attache's, so they win too.

Neither finds a server that is gone while something on the way still
acknowledges every byte: a pooler or a TCP proxy whose backend went silent,
a PostgreSQL process stopped on a live host. The kernel sees a healthy
peer, and a query waited for its answer for as long as the outage lasted
(an adversarial run: uploads in flight answered after 60 and 150 s, when
the outage ended; the ones that came meanwhile were refused with ``503``
at once). :class:`AnswerWatch` puts a deadline on each wait for an answer
on an engine (the web's): a statement, a COMMIT or a pool's ping still
waiting after that long has its socket shut down by a watchdog thread, so
libpq's blocked read returns and the statement fails as a lost connection.
Connecting keeps libpq's own ``connect_timeout`` and its failover between
the hosts of a URL (psycopg2's "green" mode, tried first, gave both up).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Iterator, Mapping

from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.adapters import watchdog

log = logging.getLogger("attache.database")

#: libpq connection parameters (names and units as libpq's: seconds, and milliseconds for tcp_user_timeout)
LIVENESS: Mapping[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}


#: the server's setting for each libpq parameter of :data:`LIVENESS` (same units)
SERVER_SETTINGS: Mapping[str, str] = {
    "keepalives_idle": "tcp_keepalives_idle",
    "keepalives_interval": "tcp_keepalives_interval",
    "keepalives_count": "tcp_keepalives_count",
    "tcp_user_timeout": "tcp_user_timeout",
}


def liveness_params(given: Mapping[str, object], server: Mapping[str, object] | None = None) -> dict[str, str]:
    """Connection parameters for ``given`` (the URL's query): the :data:`LIVENESS` ones it does not set itself, and
    ``options`` asking the server for the same values on its side (and for ``server``, more of its settings),
    followed by ``given``'s own ``options``."""
    params = {name: value for name, value in LIVENESS.items() if name not in given}
    effective = {**LIVENESS, **{name: str(given[name]) for name in LIVENESS if name in given}}
    settings = {setting: effective[name] for name, setting in SERVER_SETTINGS.items()
                if effective["keepalives"] != "0" or not setting.startswith("tcp_keepalives")}
    settings.update({name: str(value) for name, value in (server or {}).items()})
    options = [f"-c {setting}={value}" for setting, value in settings.items()]
    if given.get("options"):
        options.append(str(given["options"]))
    params["options"] = " ".join(options)
    return params


class AnswerWatch:
    """Cuts the connections of ``engine`` whose statement, COMMIT, ROLLBACK or ping has waited ``seconds`` for its
    answer: their sockets are shut down, the waiting call raises ``OperationalError`` ("server closed the connection
    unexpectedly"), and the pool discards the connection. One thread of the process looks every
    :data:`~app.adapters.watchdog.WATCH_EVERY_SECONDS`."""

    def __init__(self, engine: Engine | None, seconds: float, setting: str):
        """``engine``: whose calls are watched; None: a watch the caller brackets calls with itself
        (:meth:`waiting`: the PostgreSQL broker's psycopg 3 connections)."""
        self.seconds, self.setting = seconds, setting
        self._waiting: dict[int, tuple[int, float]] = {}  # id(DBAPI connection) -> (its socket's fd, since)
        self._lock = threading.Lock()
        watchdog.watch(self)
        if engine is not None:
            self._watch(engine)

    def _watch(self, engine: Engine) -> None:
        event.listen(engine, "connect", lambda dbapi_connection, record: check_the_client(dbapi_connection))
        dialect = engine.dialect
        for name in ("do_commit", "do_rollback", "do_ping"):
            setattr(dialect, name, self._watched(getattr(dialect, name)))
        event.listen(engine, "do_execute", self._execute)
        event.listen(engine, "do_execute_no_params", self._execute_no_params)
        event.listen(engine, "do_executemany", self._executemany)

    @contextlib.contextmanager
    def waiting(self, dbapi_connection) -> Iterator[None]:
        key = id(dbapi_connection)
        with self._lock:
            self._waiting[key] = (dbapi_connection.fileno(), time.monotonic())
        try:
            yield
        finally:
            with self._lock:  # the watchdog shuts a socket down only while its call is still waiting here
                self._waiting.pop(key, None)

    def _watched(self, call):
        def watched(dbapi_connection, *args, **kwargs):
            with self.waiting(dbapi_connection):
                return call(dbapi_connection, *args, **kwargs)
        return watched

    # the dialect's own calls, watched; True: done, no other listener or the dialect does it again
    def _execute(self, cursor, statement, parameters, context) -> bool:
        with self.waiting(cursor.connection):
            cursor.execute(statement, parameters)
        return True

    def _execute_no_params(self, cursor, statement, context) -> bool:
        with self.waiting(cursor.connection):
            cursor.execute(statement)
        return True

    def _executemany(self, cursor, statement, parameters, context) -> bool:
        with self.waiting(cursor.connection):
            cursor.executemany(statement, parameters)
        return True

    def cut_the_late(self) -> None:
        """Shut down the sockets of the calls that have waited ``seconds``."""
        now = time.monotonic()
        with self._lock:
            late = [(key, fd) for key, (fd, since) in self._waiting.items() if now - since >= self.seconds]
            for key, fd in late:
                self._waiting.pop(key, None)
                watchdog.shut_down(fd)
        for _ in late:
            log.warning("PostgreSQL sent no answer for %.0f s (%s): its connection is cut, and what waited on it "
                        "fails as a lost connection", self.seconds, self.setting)


#: how often PostgreSQL looks, while a statement of a watched connection runs, whether its client is still there
#: (``client_connection_check_interval``, PostgreSQL 14 and later): a cut shuts only the client's side, and a
#: statement waiting on the server (for a lock: a CREATE INDEX's) went on waiting there, holding its
#: transaction's locks and a connection slot, a new one a thread each deadline (22 after 150 s for one worker
#: process of 2 threads: an adversarial run; ten workers would take every slot). Now it ends in this much more.
CLIENT_CHECK_MILLISECONDS = 5000


def check_the_client(dbapi_connection) -> None:
    """Ask the server of a new connection (psycopg 2 or 3) to look for its client every
    :data:`CLIENT_CHECK_MILLISECONDS` while a statement runs, where it can (PostgreSQL 14 and later; an older one,
    which has no such setting, is left as it is), and leave the connection idle."""
    version = getattr(dbapi_connection, "server_version", None)
    if version is None:  # psycopg 3
        version = dbapi_connection.info.server_version
    if version < 140000:
        return
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"SET client_connection_check_interval = {CLIENT_CHECK_MILLISECONDS}")
    finally:
        cursor.close()
    dbapi_connection.commit()
