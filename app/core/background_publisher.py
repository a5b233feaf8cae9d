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
scheduler's outbox relay publishes it (window 3, as before). So that the
thread does not send again what the relay sent meanwhile, once a batch
fails the rows waiting behind it are left to the relay, and rows that
waited in the queue for more than :data:`STALE_SECONDS` are read back
first: only those still unpublished and unclaimed are sent. A process
that stops gives the thread a few seconds to finish (``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import threading
import time
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
#: rows handed over longer ago than this are read back before they are sent (the relay may have sent them)
STALE_SECONDS = 1.0
_STOP = object()


class BackgroundPublisher:
    def __init__(self, publisher: OutboxPublisher, *, capacity: int = CAPACITY, batch: int = BATCH,
                 stale_seconds: float = STALE_SECONDS):
        self.publisher = publisher
        self.capacity = capacity
        self.batch = batch
        self.stale_seconds = stale_seconds
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
            pending.put_nowait((time.monotonic(), list(rows)))
        except queue.Full:
            log.warning("%d outbox row(s) left to the relay: the publishing queue is full", len(rows))
            return False
        # Let the thread send them now: the worker is waiting for the message, and the answer can wait the
        # fraction of a millisecond the send takes, not the confirm. Without this the thread waited for the GIL
        # until the request's own Python was done (a small photo's upload -> ready p50 +3-8 ms).
        time.sleep(0)
        return True

    def close(self, timeout: float = DRAIN_SECONDS) -> None:
        """Publish what was handed over, for at most ``timeout`` seconds, and stop the thread."""
        with self._lock:
            thread, pending = self._thread, self._queue
            self._thread = None
        if thread is None or self._pid != os.getpid():
            return
        with contextlib.suppress(queue.Full):  # full: the thread is not told, and the join times out
            pending.put_nowait(_STOP)
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
            oldest, rows = first[0], list(first[1])
            while len(rows) < self.batch:
                try:
                    more = pending.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stopping = True
                    break
                rows.extend(more[1])
            if not self._publish(rows, stale=time.monotonic() - oldest > self.stale_seconds):
                stopping = self._leave_to_relay(pending) or stopping

    def _publish(self, rows: list[Written], *, stale: bool) -> bool:
        """Send ``rows`` (read back first when ``stale``); whether every row sent was confirmed."""
        try:
            if stale:
                unsent = self.publisher.unsent(row.id for row in rows)
                return self.publisher.send(unsent) == len(unsent)
            return self.publisher.publish_written(rows) == sum(row.due for row in rows)
        except AttacheError as exc:  # the rows are durable; the relay publishes them
            log.warning("publish after commit failed, %d row(s) left to the relay: %s", len(rows), exc)
        except Exception:  # never let the thread die: the next uploads still need it
            log.exception("publish after commit failed, %d row(s) left to the relay", len(rows))
        return False

    @staticmethod
    def _leave_to_relay(pending: queue.Queue) -> bool:
        """After a failed batch, the rows waiting behind it are the relay's: sending them would wait for the same
        broker, and the relay may send them first. Returns whether the thread was told to stop meanwhile."""
        left, stopping = 0, False
        while True:
            try:
                item = pending.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stopping = True
            else:
                left += len(item[1])
        if left:
            log.warning("%d outbox row(s) left to the relay after a failed publish", left)
        return stopping
