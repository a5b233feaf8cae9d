"""Commit, then publish: the one place a state change and the messages announcing it leave a process.

Every producer (the upload's intake, the workflow's steps, an operator's
replay, a backfill batch, lease recovery, the reconciler) writes its state
change and its outbox rows in ONE transaction opened by
:meth:`UnitOfWork.begin`. The unit of work collects the outbox rows written
in that transaction (:func:`app.core.outbox.collecting`) and, only after
COMMIT, publishes them (:meth:`app.core.outbox.OutboxPublisher.publish_written`)::

    with services.unit_of_work.begin() as work:
        states.replay(work.conn, ...)
    work.written, work.published    # the outbox rows it wrote, and how many RabbitMQ confirmed

Nothing is published when the block raises (the transaction rolled back).
A failure to publish after COMMIT is logged and left to the scheduler's
outbox relay: the work is already safe. Rows not yet due (a managed retry's
``available_at``) are left to the relay too. A unit of work with a
:class:`~app.core.background_publisher.BackgroundPublisher` (the web's)
hands the rows of a ``begin(behind=True)`` block to it instead, and returns
at COMMIT (an upload's ``202`` does not wait for RabbitMQ).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator

from sqlalchemy.engine import Connection, Engine

from app.adapters.postgres.db import transaction
from app.core import outbox
from app.core.background_publisher import BackgroundPublisher
from app.errors import AttacheError

log = logging.getLogger("attache.unit_of_work")


@dataclass
class Work:
    """One transaction: its connection, then what it wrote and what was published after its COMMIT."""

    conn: Connection
    #: the outbox rows written in this transaction
    written: list[outbox.Written] = field(default_factory=list)
    #: how many of them RabbitMQ confirmed after COMMIT (none when they were handed to the background publisher)
    published: int = 0


class UnitOfWork:
    def __init__(self, engine: Engine, publisher: outbox.OutboxPublisher,
                 background: BackgroundPublisher | None = None):
        self.engine = engine
        self.publisher = publisher
        self.background = background

    @contextlib.contextmanager
    def begin(self, *, after_commit: Callable[[], None] | None = None,
              landed: Callable[[Exception], bool] | None = None, behind: bool = False) -> Iterator[Work]:
        """``BEGIN``, the block, ``COMMIT``, then publish what the block wrote to the outbox.

        ``after_commit`` runs between COMMIT and publishing (the upload's
        fault points of window 2). An error raised by COMMIT itself, or by
        ``after_commit``, leaves the outcome unknown: with ``landed`` the
        unit of work asks it whether the transaction committed after all
        and, if so, publishes as usual; otherwise the error propagates and
        nothing is published (the relay publishes rows that did commit).
        With ``behind``, the rows go to the background publisher, if the unit
        of work has one, and the block returns at COMMIT.
        """
        committing = False
        try:
            with transaction(self.engine) as conn, outbox.collecting(conn) as written:
                work = Work(conn, written)
                yield work
                committing = True  # the block succeeded: an error from here on is the COMMIT's own
            if after_commit is not None:
                after_commit()
        except Exception as exc:
            if not (committing and landed is not None and landed(exc)):
                raise
        if behind and self.background is not None:
            self.background.submit(work.written)
        else:
            work.published = self._publish(work.written)

    def _publish(self, rows: list[outbox.Written]) -> int:
        if not rows:
            return 0
        try:
            return self.publisher.publish_written(rows)
        except AttacheError as exc:  # the rows are durable; the scheduler's relay publishes them
            log.warning("publish after commit failed: %s", exc)
            return 0
