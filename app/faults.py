"""Named fault points: the contract's five failure windows, made reachable.

A process started with ``ATTACHE_FAULT=<name>`` SIGKILLs its whole process
group the first time execution reaches :func:`point` with that name, which
is what a power cut, an OOM kill or ``kill -9`` does at that instant. The
tests start real ``web``/``worker``/``scheduler`` processes in their own
session, arm one point, wait for the process to die, restart it without the
fault and check the invariants.

The points (window numbers from ``seed/contract.en.md``):

==============================  ==  ==============================================
name                            #   where
==============================  ==  ==============================================
``after_staging``               1   web: original staged, no database row yet
``after_commit``                2   web: upload committed, nothing published yet
``after_publish``               3   web: message handed to RabbitMQ, confirm not
                                    awaited (the row stays unmarked)
``after_object_write``          4   worker: a variant's object written, its row not
                                    committed
``after_result_commit``         5   worker: the job committed ``ready``, message
                                    not acked (and staging not yet removed)
``during_render``               -   worker: a render step started, nothing written
``during_object_write``         -   worker (any writer to file storage): an
                                    object's bytes in its ``.tmp-*`` file, not
                                    yet fsynced or renamed into place
``dlq_after_intent``            -   web/CLI: a dead-letter requeue or purge has
                                    committed its audit intent, the broker is not
                                    yet touched
``during_commit``               2   web: the upload's COMMIT reached the server and
                                    the answer was lost (raises, see below)
``object_gc_before_delete``     -   scheduler: the object GC committed its decision
                                    to remove an object, not yet deleted it
``render_hangs``                -   worker: where ``during_render`` is, a render
                                    that does not return (hangs, see below)
``before_upload_commit``        -   web: an upload's rows written in its
                                    transaction, the COMMIT not yet sent (the
                                    process stops, see below)
==============================  ==  ==============================================

Most points kill. A point in :data:`RAISES` instead raises its error, once
per process, and the process lives on: ``during_commit`` is the server
having committed while the client sees the connection drop, which is an
error the web must handle, not a crash. A point in :data:`HANGS` blocks
the thread that reaches it first in a call into C that does not return for
:data:`HANG_SECONDS` (a decoder caught in a loop), once per process: no
Python exception can reach that thread meanwhile, as none reaches a
render in libjpeg or libwebp. A point in :data:`STOPS` stops its process
(``SIGSTOP``) the first time it is reached, as a frozen VM or a debugger
does, until the test sends ``SIGCONT``.

Without ``ATTACHE_FAULT`` every point is a cheap no-op.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from app.errors import DatabaseUnavailable

POINTS = {
    "after_staging": 1,
    "after_commit": 2,
    "after_publish": 3,
    "after_object_write": 4,
    "after_result_commit": 5,
    # not a contract window: a worker dying in the middle of rendering
    # (a file that crashes the decoder, an OOM kill)
    "during_render": 0,
    # not a contract window: a write to file storage cut short (its temp file is left behind)
    "during_object_write": 0,
    # not a contract window: an operator's dead-letter action audited, not yet done
    "dlq_after_intent": 0,
    # window 2 entered with an error instead of a crash: the COMMIT's outcome is unknown to the web
    "during_commit": 2,
    # not a contract window: the object GC committed its decision to remove an object, not yet deleted it
    "object_gc_before_delete": 0,
    # not a contract window: a render that never returns (a decoder caught in a loop on a hostile file)
    "render_hangs": 0,
    # not a contract window: the web paused between an upload's last statement and its COMMIT (its client may go)
    "before_upload_commit": 0,
}

#: points that raise this error (once per process) instead of killing
RAISES = {
    "during_commit": lambda: DatabaseUnavailable("database connection lost during COMMIT (fault point)"),
}
#: points that block their first caller (once per process) instead of killing, for this long
HANGS = {"render_hangs"}
HANG_SECONDS = 3600.0
#: points that stop their process (``SIGSTOP``, once per process) instead of killing
STOPS = {"before_upload_commit"}
#: the raising, hanging and stopping points reached in this process: each acts once
_reached: set[str] = set()
_reached_lock = threading.Lock()

log = logging.getLogger("attache.faults")


def armed(name: str) -> bool:
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}")
    return os.environ.get("ATTACHE_FAULT", "") == name


def point(name: str) -> None:
    """Die here, at once and without cleanup, if this point is armed (or raise, for :data:`RAISES`)."""
    if not armed(name):
        return
    if name in RAISES or name in HANGS or name in STOPS:
        with _reached_lock:
            if name in _reached:
                return
            _reached.add(name)
    if name in RAISES:
        log.critical("fault point %s reached: raising", name, extra={"fault": name})
        raise RAISES[name]()
    if name in HANGS:
        log.critical("fault point %s reached: hanging for %g s", name, HANG_SECONDS, extra={"fault": name})
        time.sleep(HANG_SECONDS)  # one call into C: an asynchronous exception waits for its return
        return
    if name in STOPS:
        log.critical("fault point %s reached: stopping until SIGCONT", name, extra={"fault": name})
        # to this thread: a SIGSTOP sent to the process is taken by another thread, and this one ran on past the
        # point (its upload committed) before the whole process stopped
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        return
    log.critical("fault point %s reached: killing process group", name, extra={"fault": name})
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:
            pass
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(137)
