"""Dramatiq actors: one per pipeline step, each a one-line hand-off to :class:`Workflow`.

Run with ``dramatiq actors`` (the Procfile's ``worker``). Importing this
module builds the broker from the environment and registers the actors.

Dramatiq's own retries (the ``Retries`` middleware, bounded by
``ATTACHE_BROKER_RETRIES``; the worker's middleware is set up in
:mod:`app.services`) are used only when a step could not record its
outcome at all; while PostgreSQL does not answer, the step first waits for
it (``ATTACHE_DATABASE_WAIT_SECONDS``) and runs again. After the retries the
message is dead-lettered to ``<queue>.XQ``. Errors whose class is not retryable
(poison messages, missing effects) are the actors' ``throws`` and go to
``.XQ`` at once, unprocessed.
"""

from __future__ import annotations

import dramatiq

from app.adapters import imaging
from app.adapters.imaging.malloc_arenas import cap_malloc_arenas
from app.core.steps import Step, step_interrupt_grace
from app.core.workflow import Workflow
from app.errors import NOT_RETRYABLE
from app.observability import logs
from app.services import Services, exit_on_config_error, exit_stuck_worker, settings_or_exit

cap_malloc_arenas()  # before the worker's threads start: pixel buffers are reused, not faulted in again
settings = settings_or_exit("worker")
logs.configure("worker")

services = Services(settings, pool_size=8, consumer=True, process="worker")
broker = services.broker  # consumes the steps' queues and publishes their follow-up messages
dramatiq.set_broker(broker)
workflow = Workflow(services, stopping=services.stopping,  # a step stuck in C past its limit: a fresh process
                    stuck=lambda: exit_stuck_worker(step_interrupt_grace(settings.step_time_limit_seconds)))
# loaded at boot, before the process says it is ready: its first jobs neither pay for them nor wait on the GIL
with exit_on_config_error("worker"):  # a STORAGE_URL with parameters it does not take stops the worker here
    services.storage  # the backend (S3's client takes 0.16 s of CPU to import)
imaging.load_codecs()


def _actor(step: Step):
    def run(payload):
        workflow.handle(payload, step=step)

    run.__name__ = step.actor
    return dramatiq.actor(run, actor_name=step.actor, queue_name=step.queue, throws=NOT_RETRYABLE)


inspect = _actor(Step.INSPECT)
render = _actor(Step.RENDER)
publish = _actor(Step.PUBLISH)
