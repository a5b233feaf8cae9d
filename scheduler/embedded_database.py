"""Embedded database: single-node mode's PostgreSQL started again when it is found down.

In single-node mode (``DATABASE_URL`` unset, ``app/adapters/postgres/embedded.py``) the first process
that needs the database starts an embedded server, and every process keeps its URL. A server killed
afterwards (``kill -9``, the OOM killer) was never started again: web, worker and scheduler stayed up,
answering ``503`` and retrying, until someone ran ``attache db upgrade`` (an adversarial run). Each
round looks for the server's postmaster and, if there is none, starts it again on the same data directory
and socket; every process's pool then reconnects on its own. A server stopped on purpose (``attache db
stop``, which empties the list of processes using it) stays stopped. Not built outside single-node mode.
"""

from __future__ import annotations

import logging

from app.adapters.postgres import embedded

log = logging.getLogger("attache.scheduler.embedded_database")


#: how often the scheduler looks (seconds): how long single-node mode stays without its database at most
INTERVAL_SECONDS = 5.0


class EmbeddedDatabase:
    name = "embedded_database"

    def __init__(self, data_dir: str):
        self.data_dir = data_dir

    def run_once(self) -> dict[str, int]:
        if embedded.running(self.data_dir) or not embedded.in_use(self.data_dir):  # stopped on purpose
            return {"started": 0}
        log.warning("the embedded PostgreSQL of %s is not running: starting it again", embedded.pgdata(self.data_dir))
        embedded.start_again(self.data_dir)
        return {"started": 1}
