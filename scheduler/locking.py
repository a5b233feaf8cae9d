"""One scheduler at a time per cleanup: a PostgreSQL advisory lock per service.

Row-level services (outbox relay, lease recovery) use ``SKIP LOCKED``
instead; the cleanups walk object storage, so two schedulers would only
repeat each other's listing. The second one skips its round. (Two at once
would be safe, only wasteful: each object's removal is decided under its
own lock, ``app/core/staging.py``, ``app/core/objects.py``.)

The lock is its transaction's, held in a transaction left open on a
connection of its own for the round, which :meth:`Held.renew` touches
between batches. A scheduler stopped mid-round (SIGSTOP, a frozen VM) is
idle in that transaction, and PostgreSQL ends its session after a lease
(``idle_in_transaction_session_timeout``, ``app/services.py``), which frees
the lock for the other schedulers. Before, the lock was its session's,
held by a connection idle outside a transaction, which nothing ends while
the process's kernel still answers: one paused scheduler kept every other
from cleaning for as long as it stayed paused (an adversarial review: 90
rounds skipped in 90 s, 2,948 orphans kept). A round that outlives its
lock's session fails at its next batch; its work so far stands.
"""

from __future__ import annotations

import contextlib
import itertools
import zlib
from typing import Callable, Iterable, Iterator

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from app.errors import DatabaseUnavailable

_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(:k)")
_TOUCH = text("SELECT 1")


def lock_key(name: str) -> int:
    return zlib.crc32(f"attache:{name}".encode())


class Held:
    """A cleanup's lock as :func:`exclusive` yields it: true when this process holds it."""

    def __init__(self, conn: Connection, name: str, held: bool):
        self.conn = conn
        self.name = name
        self.held = held

    def __bool__(self) -> bool:
        return self.held

    def renew(self) -> None:
        """Between batches: the lock's session still stands, and its idle time counts from here. Raises
        :class:`DatabaseUnavailable` when PostgreSQL ended it (the round was paused for a lease, or the server
        restarted): the lock is gone and another scheduler may be cleaning."""
        if not self.held:
            return
        try:
            self.conn.execute(_TOUCH)
        except SQLAlchemyError as exc:
            self.held = False
            raise DatabaseUnavailable(f"the {self.name} lock's session ended mid-round; the next round goes on") \
                from exc


@contextlib.contextmanager
def exclusive(engine: Engine, name: str) -> Iterator[Held]:
    """Yields a :class:`Held`, true if this process holds the lock for ``name`` (released on exit)."""
    with engine.connect() as conn:
        held = bool(conn.execute(_TRY_LOCK, {"k": lock_key(name)}).scalar())
        try:
            yield Held(conn, name, held)
        finally:
            with contextlib.suppress(SQLAlchemyError):  # a session already ended freed the lock with it
                conn.rollback()


def sweep_storage(lock: Held, objects: Iterable, batch: int, process: Callable[[list], None]) -> None:
    """The common shape of the storage cleanups, under ``lock``: hand listed objects on in batches, touching the
    lock before each."""
    listing = iter(objects)
    while chunk := list(itertools.islice(listing, batch)):
        lock.renew()
        process(chunk)
