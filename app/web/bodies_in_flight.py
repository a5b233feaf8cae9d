"""How many upload bodies one uploader is sending to this web process at once, and the limit on them.

A body holds one of the process's threads for as long as it takes to
arrive, and ``ATTACHE_BODY_IDLE_SECONDS`` bounds only the silence between
its bytes: one token sending 40 bodies a byte every 5 s held every thread
of a web process (``/healthz`` timed out for as long as they went on, and
another uploader's upload with it; an adversarial run).
``ATTACHE_MAX_BODIES_PER_UPLOADER`` bounds the threads one uploader's
bodies take in each process; one more is refused with ``429
too_many_uploads_at_once`` before a byte of it is read. Counted in the
process, not in PostgreSQL: the bound is on the process's own threads,
and a body must not wait for a query to start.
"""

from __future__ import annotations

import contextlib
import threading
from typing import ContextManager, Iterator

from flask import current_app

from app.errors import TooManyUploadsAtOnce


class BodiesInFlight:
    """Each principal's transfers in flight in this process, at most ``limit`` (0: no limit); one more raises
    ``refusal`` (a ``429`` error class) with ``what`` they are."""

    def __init__(self, limit: int, refusal: type = TooManyUploadsAtOnce,
                 what: str = "uploads arriving at this server at once"):
        self.limit, self.refusal, self.what = limit, refusal, what
        self._lock = threading.Lock()
        self._sending: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, owner: str) -> Iterator[None]:
        """Count a body of ``owner``'s while the block runs; :class:`TooManyUploadsAtOnce` past the limit (0: none)."""
        if not self.limit:
            yield
            return
        with self._lock:
            sending = self._sending.get(owner, 0)
            if sending >= self.limit:
                raise self.refusal(f"{sending} of your {self.what}, the most one client may have; ask again when "
                                   "one of them is done")
            self._sending[owner] = sending + 1
        try:
            yield
        finally:
            with self._lock:
                if self._sending[owner] > 1:
                    self._sending[owner] -= 1
                else:
                    del self._sending[owner]

    def sending(self, owner: str) -> int:
        with self._lock:
            return self._sending.get(owner, 0)


def held(owner: str) -> ContextManager[None]:
    """:meth:`BodiesInFlight.hold` of the current app's count of upload bodies (``create_app`` makes it)."""
    return current_app.extensions["attache_bodies"].hold(owner)


class AnswerPlace:
    """One of ``principal``'s downloads in flight in this process, taken before storage is asked anything: taken
    once the download's stream was open, a client's downloads waiting on a store that did not answer (90 s a call)
    were not counted, and one client's 40 held every thread of a process (``/healthz`` timed out: an adversarial
    run). :class:`TooManyDownloadsAtOnce` when the principal has its fill. Given back by :meth:`release`, at once
    or by the :class:`HeldAnswer` it is handed to, or by whatever closes the answer.

    ``counts``: the app's count it is taken in (``attache_answers``, the downloads'; ``attache_reads``, the reads'
    of :mod:`app.web.reads_in_flight`), whose refusal it raises past the limit."""

    def __init__(self, principal: str, counts: str = "attache_answers"):
        self._hold = None  # a refused place is collected too
        hold = current_app.extensions[counts].hold(principal)
        hold.__enter__()  # raises past the limit: nothing held, nothing to give back
        self._hold = hold

    def release(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.__exit__(None, None, None)

    def __del__(self) -> None:  # a place an error left behind
        self.release()


class HeldAnswer:
    """A download's chunks that hold their :class:`AnswerPlace` until the server closes them (a download read slowly
    holds its thread as an upload sent slowly does: 100 of one uploader's, never read, held every thread of a
    process, an adversarial run)."""

    def __init__(self, chunks, place: AnswerPlace, source=None):
        """``source``: what ``chunks`` read from, closed with them (a generator never started closes nothing)."""
        self._chunks, self._source, self._place = chunks, source, place

    def __iter__(self):
        return iter(self._chunks)

    def __del__(self) -> None:  # an answer the server never got (an error after it was made) gives its place back
        self.close()

    def close(self) -> None:
        """Called by the server once the answer is sent or abandoned, whether or not a chunk was read."""
        place, self._place = self._place, None
        if place is None:
            return
        try:
            for closing in (self._chunks, self._source):
                close = getattr(closing, "close", None)
                if close is not None:
                    close()
        finally:
            place.release()
