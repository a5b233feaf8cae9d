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
at once). :func:`bound_answers` puts a deadline on each wait for the
server in a process (the web's): no byte for that long, and the connection
is closed and the statement fails as a lost connection.
"""

from __future__ import annotations

import select
from typing import Mapping

import psycopg2
from psycopg2 import extensions

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


#: the longest a wait for the server's next byte may take in a process that called :func:`bound_answers`
_answer_seconds: float | None = None


def _wait_with_a_deadline(conn) -> None:
    """psycopg2's wait callback (its "green" mode: each statement sent without blocking, then waited for here):
    :func:`psycopg2.extras.wait_select` with a deadline. psycopg2 closes a connection whose callback raised."""
    while True:
        state = conn.poll()
        if state == extensions.POLL_OK:
            return
        fd = conn.fileno()
        reading, writing = ([fd], []) if state == extensions.POLL_READ else ([], [fd])
        if not any(select.select(reading, writing, [], _answer_seconds)):
            raise psycopg2.OperationalError(f"PostgreSQL sent nothing for {_answer_seconds:g} s; taken as gone")


def bound_answers(seconds: float) -> None:
    """From now on every psycopg2 connection of this process waits at most ``seconds`` for each next byte of the
    server (its answer to a statement, the steps of a connect); then the connection is closed and the statement
    raises ``OperationalError``, which the pool takes for a lost connection. A statement that legitimately runs
    longer without a byte is cut too: ``seconds`` must exceed the process's slowest."""
    global _answer_seconds
    _answer_seconds = seconds
    extensions.set_wait_callback(_wait_with_a_deadline)
