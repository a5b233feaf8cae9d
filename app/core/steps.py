"""The pipeline steps, named once: inspect -> render (one message per variant) -> publish.

Each :class:`Step` carries what the rest of attache needs to know about it:
its Dramatiq actor and its RabbitMQ queue (dead letters go to
``<queue>.XQ``). The actors (``actors/``), the outbox's routing, the
workflow's dispatch and the dead-letter tools derive from it; the ``step``
enum of ``jobs.schema.json`` is the published contract, and
``tests/test_messages.py`` checks that it names the same steps.
"""

from __future__ import annotations

from enum import StrEnum

QUEUE_PREFIX = "attache."


class Step(StrEnum):
    """A pipeline step; its value is the ``step`` of a message."""

    INSPECT = "inspect"
    RENDER = "render"
    PUBLISH = "publish"

    @property
    def actor(self) -> str:
        """The Dramatiq actor that runs the step: named after it."""
        return self.value

    @property
    def queue(self) -> str:
        """The RabbitMQ queue the step's messages go to."""
        return QUEUE_PREFIX + self.value
