"""gunicorn's lingering close taken off the worker's main thread.

gunicorn 27's gthread worker closes a connection it will not keep alive
(a ``Connection: close`` answer: every refusal given before the body was
read, ``app/web/connection.py``) as RFC 9112 section 9.6 asks: it shuts its
side and reads what the client still sends for up to 2 s before closing,
so that the kernel does not reset the connection under the answer. It does
that on the worker's main thread, the one that accepts connections and
hands requests to the threads: a client that keeps its side open holds
that thread for the 2 s. An adversarial run opened 150-300 connections
that each sent headers and a few bytes of body (with a bad token, or an
uploader's refused with ``429``) and never closed them: the process
accepted nothing for their 2 s each, one after another, and ``/healthz``
timed out for as long as they came.

:func:`install` makes each such close linger in a thread of its own, at
most :data:`MAX_LINGERING` at once (past them a connection is closed at
once: a reset under the answer, not a process that stops answering).
Under another server, or another gunicorn worker class, it does nothing.
"""

from __future__ import annotations

import sys
import threading

#: lingering closes at once per process; each holds a thread for at most gunicorn's 2 s
MAX_LINGERING = 64

_lingering = threading.BoundedSemaphore(MAX_LINGERING)


def install() -> bool:
    """Patch gunicorn's gthread connections, if this process is one of its workers; whether it did."""
    gthread = sys.modules.get("gunicorn.workers.gthread")
    connection = getattr(gthread, "TConn", None)
    if connection is None or getattr(connection.close, "attache_lingers_aside", False):
        return False
    from gunicorn import util

    if not callable(getattr(util, "close_graceful", None)):  # a gunicorn that lingers otherwise, or not at all
        return False

    def close(self, graceful=False):
        if not graceful or not _lingering.acquire(blocking=False):
            util.close(self.sock)
            return

        def linger():
            try:
                self.sock.setblocking(True)
                util.close_graceful(self.sock)
            except OSError:  # closed already (gunicorn's error path for an answer cut by its source closes it
                pass  # first): nothing to linger on; its "Bad file descriptor" was a traceback (an adversarial run)
            finally:
                _lingering.release()

        try:
            threading.Thread(target=linger, name="lingering-close", daemon=True).start()
        except RuntimeError:  # no thread to be had: closed at once, and the place given back
            _lingering.release()
            util.close(self.sock)

    close.attache_lingers_aside = True
    connection.close = close
    return True
