"""PostgreSQL databases for tests, made from the migrated template ahead of the tests that take them.

Each test that uses PostgreSQL gets a database of its own, a copy of the
session's migrated template. ``CREATE DATABASE ... TEMPLATE`` costs about
0.3 s here (it writes the template's pages to the WAL and waits for the
disk), and some 400 tests take one: two minutes of a run spent waiting.
A thread makes the next ones while the tests run, and drops the used ones
(``WITH (FORCE)``: a test's processes may still be connected); a test then
waits only when it takes a database faster than they are made. Each
database is still used by exactly one test.
"""

from __future__ import annotations

import queue
import threading
import uuid

import psycopg2

#: databases made ahead of the tests that will take them
AHEAD = 2


class DatabasePool:
    """``take()`` a fresh copy of ``template``, ``give_back()`` it when the test is done; ``close()`` drops the rest.

    ``admin_dsn``: a libpq URL of a database to run ``CREATE``/``DROP DATABASE`` from.
    """

    def __init__(self, admin_dsn: str, template: str, *, ahead: int = AHEAD):
        self.admin_dsn = admin_dsn
        self.template = template
        self.made: queue.Queue = queue.Queue()  # names, or the error that stopped making them
        self.chores: queue.Queue = queue.Queue()  # ("make", None) or ("drop", name); None ends the thread
        self.undropped: list[str] = []
        self.thread = threading.Thread(target=self._work, name="test-databases", daemon=True)
        self.thread.start()
        for _ in range(ahead):
            self.chores.put(("make", None))

    def take(self) -> str:
        self.chores.put(("make", None))  # the one after the next
        made = self.made.get(timeout=120)
        if isinstance(made, BaseException):
            raise RuntimeError("a test database could not be made") from made
        return made

    def give_back(self, name: str) -> None:
        self.chores.put(("drop", name))

    def close(self) -> None:
        self.chores.put(None)
        self.thread.join(timeout=120)
        left = list(self.undropped)
        while not self.made.empty():
            made = self.made.get()
            if isinstance(made, str):
                left.append(made)
        for name in left:
            self._run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _work(self) -> None:
        while (chore := self.chores.get()) is not None:
            kind, name = chore
            try:
                if kind == "drop":
                    self._run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                else:
                    name = f"attache_test_{uuid.uuid4().hex[:10]}"
                    self._run(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
                    self.made.put(name)
            except Exception as exc:  # a make that failed is handed to the test that takes it
                if kind == "make":
                    self.made.put(exc)
                else:  # tried again by close()
                    self.undropped.append(name)

    def _run(self, statement: str) -> None:
        conn = psycopg2.connect(self.admin_dsn)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()
