"""Publishing behind the answer: the web answers an upload at its COMMIT, and a thread of its own publishes it.

An upload can no longer be lost once its COMMIT has landed: the staged
original, the rows and the outbox message are durable (the contract's
window 2; :mod:`app.core.intake`). Waiting for RabbitMQ's publisher confirm
before the ``202`` added a round trip and RabbitMQ's own flush to the
answer of every upload, for nothing the client needs. So the web hands
its uploads' outbox rows to a :class:`BackgroundPublisher`: one thread per
process, which publishes what has gathered as one batch, waits for the
confirms together and marks the confirmed rows in one transaction
(:meth:`~app.core.outbox.OutboxPublisher.publish_written`). Under load,
several uploads share one confirm wait and one marking commit.

A row the thread could not publish (the broker down or silent), or never
got to (the process died; its queue was full), stays unmarked, and the
scheduler's outbox relay publishes it (window 3, as before). A worker
process that stops gives the thread a few seconds to finish (``atexit``).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from typing import Sequence

from app.core.outbox import OutboxPublisher, Written
from app.errors import AttacheError

log = logging.getLogger("attache.outbox")

#: a unit of work's rows waiting for the thread; more are left to the relay (a broker down or silent for long)
CAPACITY = 10_000
#: rows published together at most: the confirms of one batch are waited for together
BATCH = 100
#: how long a process that exits waits for the rows already handed over
DRAIN_SECONDS = 5.0
_STOP = object()


class BackgroundPublisher:
    def __init__(self, publisher: OutboxPublisher, *, capacity: int = CAPACITY, batch: int = BATCH):
        self.publisher = publisher
        self.capacity = capacity
        self.batch = batch
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, rows: Sequence[Written]) -> bool:
        """Hand ``rows`` (committed) to the thread; False when its queue is full: the relay publishes them."""
        if not rows:
            return True
        pending = self._started()
        try:
            pending.put_nowait(list(rows))
        except queue.Full:
            log.warning("%d outbox row(s) left to the relay: the publishing queue is full", len(rows))
            return False
        return True

    def close(self, timeout: float = DRAIN_SECONDS) -> None:
        """Publish what was handed over, for at most ``timeout`` seconds, and stop the thread."""
        with self._lock:
            thread, pending = self._thread, self._queue
            self._thread = None
        if thread is None or self._pid != os.getpid():
            return
        pending.put(_STOP)
        thread.join(timeout)

    def _started(self) -> queue.Queue:
        """The queue of this process's thread, started on first use (and again in a forked child)."""
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._queue = queue.Queue(maxsize=self.capacity)
                self._thread = threading.Thread(target=self._run, args=(self._queue,),
                                                name="attache-outbox-publisher", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            return self._queue

    def _run(self, pending: queue.Queue) -> None:
        stopping = False
        while not stopping:
            first = pending.get()
            if first is _STOP:
                return
            rows = list(first)
            while len(rows) < self.batch:
                try:
                    more = pending.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stopping = True
                    break
                rows.extend(more)
            self._publish(rows)

    def _publish(self, rows: list[Written]) -> None:
        try:
            self.publisher.publish_written(rows)
        except AttacheError as exc:  # the rows are durable; the relay publishes them
            log.warning("publish after commit failed, %d row(s) left to the relay: %s", len(rows), exc)
        except Exception:  # never let the thread die: the next uploads still need it
            log.exception("publish after commit failed, %d row(s) left to the relay", len(rows))
