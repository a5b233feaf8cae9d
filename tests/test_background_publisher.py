"""The web's publisher thread (``app.core.background_publisher``), on real PostgreSQL and RabbitMQ.

An upload is answered at its COMMIT; this thread publishes its outbox row
behind the answer. What must hold: rows handed over while it waits go out
together, one confirm wait and one marking commit for all; a failure
never stops it, and the rows waiting behind a failed batch are left to the
relay; rows that waited long are read back, so what the relay sent
meanwhile is not sent again; closing it publishes what it was given; rows
it cannot take are left, unmarked, to the relay.
"""

from __future__ import annotations

import contextlib
import threading

from sqlalchemy import func, select, text, update

from app.adapters.postgres.models import jobs, outbox
from app.core import outbox as outbox_rows
from app.core.background_publisher import BackgroundPublisher
from app.core.outbox import OutboxPublisher
from app.core.steps import Step
from app.core.unit_of_work import UnitOfWork
from tests.processes import wait_for
from tests.test_maintenance import seed


class Gated(OutboxPublisher):
    """The real publisher, held at a gate before each batch, recording the batches' sizes."""

    def __init__(self, engine, broker, *, failures: int = 0):
        super().__init__(engine, broker)
        self.gate = threading.Event()
        self.taken = threading.Event()
        self.batches: list[int] = []
        self.failures = failures

    def send(self, rows):
        self.taken.set()
        assert self.gate.wait(10)
        self.batches.append(len(rows))
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a bug in publishing")
        return super().send(rows)


def handed_over(services, publisher, count):
    """``count`` uploads' worth of committed rows, each handed to the thread by its unit of work."""
    unit_of_work = UnitOfWork(services.engine, publisher.publisher, publisher)
    _, job_id, _ = seed(services.engine, services.storage)
    with services.engine.connect() as conn:
        job = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
    ids = []
    for _ in range(count):
        with unit_of_work.begin(behind=True) as work:
            ids.append(outbox_rows.announce(work.conn, job, 1, Step.INSPECT))
        assert work.published == 0, "the unit of work returned at COMMIT"
    return ids


@contextlib.contextmanager
def running(gated, **options):
    """A publisher thread over ``gated``; the gate opened and the thread closed, whatever the test did."""
    background = BackgroundPublisher(gated, **options)
    try:
        yield background
    finally:
        gated.gate.set()
        background.close()


def held_then(services, background, gated, count):
    """One row taken by the thread and held at the gate, then ``count`` more handed over behind it."""
    first = handed_over(services, background, 1)
    assert gated.taken.wait(10)
    return first, handed_over(services, background, count)


def marked(engine, ids):
    with engine.connect() as conn:
        return [row.published_at for row in conn.execute(select(outbox.c.published_at).where(outbox.c.id.in_(ids)))]


def test_rows_handed_over_while_a_batch_is_out_are_published_together(services, engine):
    gated = Gated(engine, services.broker)
    with running(gated, stale_seconds=60) as background:
        first, later = held_then(services, background, gated, 3)
        assert marked(engine, first + later) == [None] * 4, "nothing is published before the gate opens"
        gated.gate.set()
        wait_for(lambda: all(marked(engine, first + later)), timeout=10, message="every row marked")
    assert gated.batches == [1, 3], "the three rows handed over meanwhile went out as one batch"
    assert services.broker.queue_depth("attache.inspect") == 4


def test_a_failed_batch_leaves_its_rows_to_the_relay_and_the_thread_goes_on(services, engine):
    gated = Gated(engine, services.broker, failures=1)
    gated.gate.set()
    with running(gated, stale_seconds=60) as background:
        failed = handed_over(services, background, 1)
        wait_for(lambda: gated.batches == [1], timeout=10, message="the failing batch")
        after = handed_over(services, background, 1)
        wait_for(lambda: all(marked(engine, after)), timeout=10, message="the next row published")
    assert marked(engine, failed) == [None], "the failed row stays for the relay"


def test_closing_publishes_what_was_handed_over(services, engine):
    gated = Gated(engine, services.broker)
    background = BackgroundPublisher(gated, stale_seconds=60)
    ids = handed_over(services, background, 3)
    assert gated.taken.wait(10)
    gated.gate.set()
    background.close()
    assert all(marked(engine, ids)), "close() returned before the rows were published"


def test_rows_beyond_its_capacity_are_left_to_the_relay(services, engine):
    gated = Gated(engine, services.broker)
    with running(gated, capacity=1, stale_seconds=60) as background:
        held = handed_over(services, background, 1)  # taken by the thread, held at the gate
        assert gated.taken.wait(10)
        queued = handed_over(services, background, 1)  # fills the queue
        refused = handed_over(services, background, 1)  # no room: not handed over, and the upload went on
        gated.gate.set()
        wait_for(lambda: all(marked(engine, held + queued)), timeout=10, message="the rows it took")
    assert marked(engine, refused) == [None]


def test_the_rows_waiting_behind_a_failed_batch_are_left_to_the_relay(services, engine):
    gated = Gated(engine, services.broker, failures=1)
    with running(gated, stale_seconds=60) as background:
        failed = handed_over(services, background, 1)
        assert gated.taken.wait(10)
        behind = handed_over(services, background, 2)  # queued while the failing batch is out
        gated.gate.set()
        wait_for(lambda: background._queue.empty() and gated.batches == [1], timeout=10, message="the queue dropped")
        after = handed_over(services, background, 1)
        wait_for(lambda: all(marked(engine, after)), timeout=10, message="the next row published")
    assert gated.batches == [1, 1], "the two rows behind the failed batch were never sent"
    assert marked(engine, failed + behind) == [None] * 3
    assert services.broker.queue_depth("attache.inspect") == 1


def test_rows_that_waited_long_are_read_back_and_what_the_relay_sent_is_not_sent_again(services, engine):
    gated = Gated(engine, services.broker)
    with running(gated, stale_seconds=0) as background:
        first, waiting = held_then(services, background, gated, 3)
        with engine.begin() as conn:  # the relay published one of them meanwhile
            conn.execute(update(outbox).where(outbox.c.id == waiting[0]).values(published_at=func.now()))
        gated.gate.set()
        wait_for(lambda: all(marked(engine, first + waiting)), timeout=10, message="every row marked")
    assert gated.batches == [1, 2], "the row the relay sent was read back and left out"
    assert services.broker.queue_depth("attache.inspect") == 3


def test_a_late_failure_leaves_the_relays_claim_and_publication_alone(quiet_services, engine):
    """The web's publish can fail after the relay claimed or published the same rows: its error mark must not
    release the relay's claim (another relay would send the row once more) nor stamp a published row."""
    claimed_job = seed(engine, quiet_services.storage)[1]
    published_job = seed(engine, quiet_services.storage)[1]
    with engine.begin() as conn:
        claimed = conn.execute(update(outbox).where(outbox.c.job_id == claimed_job).values(
            claimed_until=func.now() + text("interval '1 minute'")).returning(outbox)).one()
        published = conn.execute(update(outbox).where(outbox.c.job_id == published_job).values(
            published_at=func.now()).returning(outbox)).one()
    for row in (claimed, published):  # each fails alone: a batch stops at its first failure
        written = outbox_rows.Written(row.id, row.message_id, row.queue_name, row.actor_name, row.payload, True)
        assert quiet_services.publisher.publish_written([written]) == 0, "the broker is unreachable"
    with engine.connect() as conn:
        after = {row.id: row for row in conn.execute(select(outbox))}
    assert after[claimed.id].claimed_until == claimed.claimed_until, "the relay's claim stays"
    assert after[claimed.id].last_error, "the unpublished row records the failure"
    assert after[published.id].published_at == published.published_at and after[published.id].last_error is None
