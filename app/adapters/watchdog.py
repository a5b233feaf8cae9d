"""One thread a process that cuts the calls that have waited too long on a server: PostgreSQL's
(:class:`app.adapters.postgres.liveness.AnswerWatch`) and S3's (:mod:`app.adapters.storage.s3`).

A watch is any object with a ``cut_the_late()`` method, registered with :func:`watch`; the thread calls each
every :data:`WATCH_EVERY_SECONDS`. A cut shuts the call's socket down both ways (:func:`shut_down`), so the
waiting read returns and the call fails as a lost connection, whatever the server goes on sending.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import weakref

#: every live watch of this process (an engine's, a broker's, a store's; tests make many)
_watches: weakref.WeakSet = weakref.WeakSet()
_started = threading.Lock()
#: how often the thread looks (the shortest deadline watched is some seconds)
WATCH_EVERY_SECONDS = 1.0


def _forget_the_thread() -> None:  # a forked child has none of its parent's threads
    global _started
    _started = threading.Lock()


os.register_at_fork(after_in_child=_forget_the_thread)


def watch(watcher) -> None:
    """Have ``watcher.cut_the_late()`` called every :data:`WATCH_EVERY_SECONDS` for as long as it lives."""
    _watches.add(watcher)
    if not _started.acquire(blocking=False):
        return  # running already

    def run() -> None:
        while True:
            time.sleep(WATCH_EVERY_SECONDS)
            for each in list(_watches):
                each.cut_the_late()

    threading.Thread(target=run, name="attache-answer-watch", daemon=True).start()


def shut_down(fd: int) -> None:
    """End the TCP connection of ``fd`` both ways, leaving ``fd`` to its owner (who closes it)."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
