"""The pipeline steps, named once: inspect -> render (one message per variant) -> publish.

Each :class:`Step` carries what the rest of attache needs to know about it:
its Dramatiq actor, its RabbitMQ queue (dead letters go to ``<queue>.XQ``)
and its retry backoff. The actors (``actors/``), the outbox's routing, the
workflow's dispatch and retry policies and the dead-letter tools derive
from it; the ``step`` enum of ``jobs.schema.json`` is the published
contract, and ``tests/test_messages.py`` checks that it names the same
steps.
"""

from __future__ import annotations

from enum import StrEnum

from app.core.retry import RetryPolicy

QUEUE_PREFIX = "attache."


class Step(StrEnum):
    """A pipeline step; its value is the ``step`` of a message."""

    # name, then its retry backoff (docs/retries.md): the first wait as a multiple of
    # ATTACHE_RETRY_INITIAL_SECONDS, the factor each later wait grows by, and the jitter
    INSPECT = "inspect", 1, 2.0, 0.2  # reads a header from storage: cheap, so retry soon
    RENDER = "render", 2, 3.0, 0.3  # decodes and writes objects: storage trouble tends to last, back off harder
    PUBLISH = "publish", 1, 2.0, 0.2  # one database transaction plus a staging delete

    def __new__(cls, name: str, first_wait: float, backoff_coefficient: float, jitter: float) -> Step:
        step = str.__new__(cls, name)
        step._value_ = name
        step.first_wait, step.backoff_coefficient, step.jitter = first_wait, backoff_coefficient, jitter
        return step

    @property
    def actor(self) -> str:
        """The Dramatiq actor that runs the step: named after it."""
        return self.value

    @property
    def queue(self) -> str:
        """The RabbitMQ queue the step's messages go to."""
        return QUEUE_PREFIX + self.value

    def retry_policy(self, initial_seconds: float, max_seconds: float) -> RetryPolicy:
        """This step's backoff from the configured first and longest waits (``ATTACHE_RETRY_*_SECONDS``)."""
        return RetryPolicy(initial_interval=initial_seconds * self.first_wait,
                           backoff_coefficient=self.backoff_coefficient, max_interval=max_seconds,
                           jitter=self.jitter)


#: Dramatiq's TimeLimit interrupts a step's Python code this long after ATTACHE_STEP_TIME_LIMIT_SECONDS (a quarter of
#: a shorter limit), by which time the step's heartbeat has recorded the attempt's timeout; a step still running as
#: long again is inside a call no exception reaches (C), and its worker process exits (``Workflow._lease_kept``)
STEP_INTERRUPT_GRACE_SECONDS = 30.0


def step_interrupt_grace(step_time_limit_seconds: float) -> float:
    return min(STEP_INTERRUPT_GRACE_SECONDS, step_time_limit_seconds / 4)
