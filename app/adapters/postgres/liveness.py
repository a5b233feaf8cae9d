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

Each can be set in the database URL's query string
(``?keepalives_idle=30&tcp_user_timeout=60000``), which wins.
"""

from __future__ import annotations

from typing import Mapping

#: libpq connection parameters (names and units as libpq's: seconds, and milliseconds for tcp_user_timeout)
LIVENESS: Mapping[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}


def liveness_params(given: Mapping[str, object]) -> dict[str, str]:
    """The :data:`LIVENESS` parameters that ``given`` (the URL's query) does not set itself."""
    return {name: value for name, value in LIVENESS.items() if name not in given}
