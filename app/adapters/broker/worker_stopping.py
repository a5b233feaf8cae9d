"""Telling the worker's steps that the worker is shutting down.

A step waiting out a PostgreSQL outage (:meth:`app.core.workflow.Workflow._outlasting_outages`)
would hold the worker's shutdown for as long as its wait; the event this
middleware sets ends the wait, and the step's message goes to Dramatiq's
retries as if the wait had run out.
"""

from __future__ import annotations

import threading

from dramatiq.middleware import Middleware


class WorkerStopping(Middleware):
    def __init__(self, event: threading.Event):
        self.event = event

    def before_worker_shutdown(self, broker, worker):
        self.event.set()
