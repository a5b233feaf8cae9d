"""One read at a time, shared by the requests that arrive while it runs: what ``/metrics`` and the console's dashboard
read of PostgreSQL.

Both read enough to hold a thread and a connection for a while (a scrape 0.12-0.17 s at 500,000 transitions; the
dashboard's day some 0.5 s at 200,000 jobs), and requests that arrived together each made the same read: forty
scrapes at once took 3.6 s each, twenty dashboards at once made an upload's 202 take 1.7-2.3 s (adversarial runs).
A caller now waits for the next read and shares it: never a result read before it arrived, and never more than two
reads for any number of callers at once.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class SharedReads(Generic[T]):
    """One read at a time; a caller takes the outcome (its result, or its error) of the latest read that began after
    it arrived, or makes one. A failed read is shared too: PostgreSQL down, the scrapes waiting behind a read would
    otherwise each try again in turn, holding their threads for as many timeouts (an adversarial review)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._began = float("-inf")
        self._result: T | None = None
        self._error: Exception | None = None

    def get(self, read: Callable[[], T]) -> T:
        arrived = time.monotonic()
        with self._lock:
            if self._began < arrived:
                self._began = time.monotonic()
                try:
                    self._result, self._error = read(), None
                except Exception as exc:
                    self._error = exc
            if self._error is not None:
                raise self._error
            return self._result
