"""One scheduler at a time per cleanup: a PostgreSQL advisory lock per service.

Row-level services (outbox relay, lease recovery) use ``SKIP LOCKED``
instead; the cleanups walk object storage, so two schedulers would only
repeat each other's listing. The second one skips its round. (Two at once
would be safe, only wasteful: each object's removal is decided under its
own lock, ``app/core/staging.py``, ``app/core/objects.py``.)

The lock is its transaction's, held in a transaction left open on a
connection of its own for the round, whose session a thread of the round
touches a few times per idle limit (:class:`Held`). A scheduler stopped
mid-round (SIGSTOP, a frozen VM) stops touching it, and PostgreSQL ends
its session after a lease (``idle_in_transaction_session_timeout``,
``app/services.py``), which frees the lock for the other schedulers.
Before, the lock was its session's, held by a connection idle outside a
transaction, which nothing ends while the process's kernel still answers:
one paused scheduler kept every other from cleaning for as long as it
stayed paused (an adversarial review: 90 rounds skipped in 90 s, 2,948
orphans kept). A round that outlives its lock's session fails at its next
batch; its work so far stands. (Touched only between batches, as first
written, a round whose batch took longer than a lease on a slow store lost
its lock every time: a review.)
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import zlib
from typing import Callable, Iterable, Iterator

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from app.errors import DatabaseUnavailable

_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(:k)")
_TOUCH = text("SELECT 1")
#: the session's idle-in-transaction limit, in ms (0: none)
_IDLE_LIMIT = text("SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'")


def lock_key(name: str) -> int:
    return zlib.crc32(f"attache:{name}".encode())


#: touches of the lock's session per idle limit while its round runs: a round's batch may take longer than a lease
BEATS_PER_IDLE_LIMIT = 3


class Held:
    """A cleanup's lock as :func:`exclusive` yields it: true when this process holds it.

    While the round runs, a thread of its own touches the lock's session a
    few times per idle limit, so a round's slow batch (a slow store, a
    backlog) keeps it; a stopped process's thread stops with it, and the
    session ends after the limit. :meth:`renew` checks it between batches."""

    def __init__(self, conn: Connection, name: str, held: bool):
        self.conn = conn
        self.name = name
        self.held = held
        self._using = threading.Lock()  # the session is used by one thread at a time
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None

    def __bool__(self) -> bool:
        return self.held

    def renew(self) -> None:
        """Between batches: raises :class:`DatabaseUnavailable` when PostgreSQL ended the lock's session (the
        round was stopped for longer than the idle limit, or the server restarted): the lock is gone, and another
        scheduler may be cleaning."""
        self._touch()
        if not self.held:
            raise DatabaseUnavailable(f"the {self.name} lock's session ended mid-round; the next round goes on")

    def _touch(self) -> None:
        with self._using:
            if not self.held:
                return
            try:
                self.conn.execute(_TOUCH)
            except SQLAlchemyError:
                self.held = False

    def _beat(self, every: float) -> None:
        while self.held and not self._stop.wait(every):
            self._touch()

    def start(self, idle_limit_seconds: float) -> None:
        if self.held and idle_limit_seconds > 0:
            every = idle_limit_seconds / BEATS_PER_IDLE_LIMIT
            self._beats = threading.Thread(target=self._beat, args=(every,), name=f"{self.name}-lock", daemon=True)
            self._beats.start()

    def stop(self) -> None:
        self._stop.set()
        if self._beats is not None:
            self._beats.join()
        self.held = False  # released with the transaction; nothing touches the connection once it is returned


@contextlib.contextmanager
def exclusive(engine: Engine, name: str) -> Iterator[Held]:
    """Yields a :class:`Held`, true if this process holds the lock for ``name`` (released on exit)."""
    with engine.connect() as conn:
        held = bool(conn.execute(_TRY_LOCK, {"k": lock_key(name)}).scalar())
        lock = Held(conn, name, held)
        try:
            if held:
                lock.start(int(conn.execute(_IDLE_LIMIT).scalar() or 0) / 1000)
            yield lock
        finally:
            lock.stop()
            with contextlib.suppress(SQLAlchemyError):  # a session already ended freed the lock with it
                conn.rollback()


def sweep_storage(lock: Held, objects: Iterable, batch: int, process: Callable[[list], None]) -> None:
    """The common shape of the storage cleanups, under ``lock``: hand listed objects on in batches, touching the
    lock before each."""
    listing = iter(objects)
    while chunk := list(itertools.islice(listing, batch)):
        lock.renew()
        process(chunk)
