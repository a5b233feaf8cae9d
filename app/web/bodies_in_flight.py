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
    def __init__(self, limit: int):
        self.limit = limit
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
                raise TooManyUploadsAtOnce(f"{sending} of your uploads are arriving at this server at once, the most "
                                           "one uploader may send together; send this one when one of them is done")
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
    """:meth:`BodiesInFlight.hold` of the current app's count (``create_app`` makes it)."""
    return current_app.extensions["attache_bodies"].hold(owner)
