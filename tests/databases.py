"""Test databases made ahead and dropped in batches, on a thread of their own, while the tests run.

Each test that touches PostgreSQL gets a database of its own, cloned from a
migrated template (``conftest.database_url``). A thousand tests cloned one
and dropped it in turn, and PostgreSQL 15 makes every ``DROP DATABASE``
request an immediate checkpoint and wait for it: a checkpoint per test,
flushing whatever the tests running beside it had dirtied (seconds while
the server is busy), and after each one the next write of every page
logged whole again. Here one thread keeps :data:`AHEAD` clones ready (a
test that finds none clones its own) and drops used ones
:data:`DROP_BATCH` at a time, back to back, so their checkpoints find
little to flush. A drop that fails (a test has stopped the server) is
tried again; the session waits for every drop at its end, so a run leaves
no database behind.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid

from sqlalchemy import create_engine

log = logging.getLogger("tests.databases")
#: clones kept ready
AHEAD = 2
#: used databases dropped together (some 10 MB each on the disk meanwhile)
DROP_BATCH = 32
#: how long a drop is retried while the server is down (a test that stops it starts it again in a finally)
RETRY_SECONDS = 180.0
_STOP = object()


class DatabaseClones:

    def __init__(self, admin_url: str, template: str):
        self.template = template
        self.admin = create_engine(admin_url.replace("postgresql://", "postgresql+psycopg2://"),
                                   isolation_level="AUTOCOMMIT", pool_pre_ping=True, pool_size=2)
        self.ready: queue.Queue = queue.Queue()
        self.used: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="test-databases", daemon=True)
        self.thread.start()

    def take(self) -> str:
        try:
            return self.ready.get_nowait()
        except queue.Empty:
            return self._clone()

    def give_back(self, name: str) -> None:
        self.used.put(name)

    def close(self) -> None:
        """Drop every database made, used or not (waiting for it), then stop."""
        self.used.put(_STOP)
        self.thread.join(RETRY_SECONDS * 2)
        self.admin.dispose()

    def _clone(self) -> str:
        name = f"attache_test_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as conn:
            # a test database lost to a crash is no loss: not waiting for the flush halves the copy (0.5 s to 0.2)
            conn.exec_driver_sql("SET synchronous_commit = off")
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name

    def _drop(self, name: str) -> None:
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            try:
                with self.admin.connect() as conn:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except Exception as exc:  # the server is down or restarting: a test stopped it
                if time.monotonic() > deadline:
                    log.error("test database %s not dropped: %s", name, exc)
                    return
                time.sleep(0.5)

    def _run(self) -> None:
        used: list[str] = []
        stopping = False
        while not stopping:
            if self.ready.qsize() < AHEAD:
                try:
                    self.ready.put(self._clone())
                    continue
                except Exception:  # the server is down: tests clone their own meanwhile
                    pass
            try:
                name = self.used.get(timeout=0.5)
            except queue.Empty:
                continue
            if name is _STOP:
                stopping = True
                while not self.ready.empty():
                    used.append(self.ready.get_nowait())
            else:
                used.append(name)
            if stopping or len(used) >= DROP_BATCH:
                for name in used:
                    self._drop(name)
                used.clear()
