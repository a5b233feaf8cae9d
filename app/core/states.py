"""The job state machine: the only code that writes ``jobs.state``.

Every transition is ONE conditional ``UPDATE ... WHERE state = <from> ...``
in the caller's transaction plus an append to ``job_history`` (in the same
statement for the two every upload makes, :func:`create_job` and
:func:`claim`: :func:`_logged`); if the
``WHERE`` matches nothing the transition did not happen and the caller is
told so (``None``/``False``), never an exception. Each move to ``ready`` or
``failed`` also writes its completion event and webhook deliveries in the
same transaction (:func:`app.core.events.emit`), and a trigger ends an
upload's job's place in its uploader's pending count (:mod:`app.core.pending`). A database trigger
(migration 0001) refuses any UPDATE that moves a job out of ``ready``.

States (the contract's table, ``seed/contract.en.md``)
------------------------------------------------------
The values are :class:`~app.adapters.postgres.models.JobState` (named
with the ``jobs`` table, so every layer that reads the column can use them).

``queued``
    Durable intent to process. In: the upload's transaction
    (:func:`create_job`, web), a transient failure with attempts left
    (:func:`retry_later`, worker), an expired lease with attempts left
    (:func:`recover_expired`, scheduler). Out: :func:`claim` (worker).
    A ``queued`` job whose announcement was lost (dead-lettered, purged)
    is announced again by :func:`reannounce_stranded` (scheduler): a
    ``queued -> queued`` history row.
``processing``
    Claimed by attempt ``attempt`` with a lease until ``lease_expires_at``.
    Every write of a step is fenced by ``(job_id, attempt)`` and a live
    lease (:func:`fence`). Between steps the job waits for its next message
    with no lease owner (:func:`hand_off`); a lost message is announced
    again by :func:`reannounce_stranded` (a ``processing -> processing``
    history row). In: :func:`claim`. Out: :func:`publish_ready`,
    :func:`fail`, :func:`retry_later` (worker), :func:`recover_expired`
    (scheduler).
``ready``
    Every variant of the pipeline version is published; terminal, never
    regresses. In: :func:`publish_ready` (worker). Out: none.
``failed``
    Permanent error or attempts spent, with an ``error_code``. In:
    :func:`fail`, :func:`retry_later` on the last attempt (worker),
    :func:`recover_expired` with ``worker_lost`` (scheduler). Out: operator
    replay (:func:`replay`, web/CLI on an operator's request).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Interval, Text, and_, bindparam, func, insert, literal, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Row

from app.adapters.postgres.db import interval
from app.adapters.postgres.models import UNFINISHED, JobState, attachments, job_history, jobs, variants
from app.core import events, objects, outbox
from app.core.steps import Step

WORKER_LOST = "worker_lost"
#: the reason of the self-loop history rows (``queued -> queued``, ``processing -> processing``)
#: written by :func:`reannounce_stranded`, the only self-loops of the machine
REANNOUNCED = "re-announced"


@dataclass(frozen=True)
class Lease:
    owner: str
    seconds: float
    #: the attempt's one running step (``inspect``): a lease of its own that lapsed while nobody took the job back
    #: is still its own (:func:`held_by`). Render steps run side by side, one owner among them: a lapsed lease is
    #: theirs no more, and lease recovery takes the attempt back (a spell that kept one sibling's lease and
    #: dropped the others' left the job between steps with variants missing and no message: an adversarial run)
    sole: bool = False


def heartbeat_seconds(lease_seconds: float) -> float:
    """How often a running step renews a lease of ``lease_seconds``: three beats a lease (lease recovery's settle
    time too, ``scheduler/lease_recovery.py``)."""
    return lease_seconds / 3


# The statements a step runs are built once, here, with their values bound at execution: built and
# keyed anew on every call, a fence cost SQLAlchemy 740 us of CPU where it now costs 210 (docs/performance.md).
# A bound value named like a column the statement SETs would clash with SQLAlchemy's own: those start with b_.

def _lease_until():
    """``now()`` plus the lease, bound as ``b_lease`` (see :func:`_lease`)."""
    return func.now() + bindparam("b_lease", type_=Interval())


def _lease(lease: Lease) -> dict:
    return {"b_owner": lease.owner, "b_lease": timedelta(seconds=lease.seconds)}


def _logged(moved, from_state: JobState | None, to_state: JobState):
    """``moved`` (an ``INSERT`` or ``UPDATE`` of ``jobs`` returning the row it wrote) with the move's ``job_history``
    row appended by the same statement, for the job's attempt as written; the row, or none if it moved nothing.

    The actor, error code and reason are bound as ``b_actor``, ``b_error_code`` and ``b_reason``. One statement,
    not two: an upload's and a claim's transaction each spent a round trip on the history row (about 0.25 ms of
    wall time and 0.1 ms of the client's CPU here, on the small photo's path to ``ready``).
    """
    moved = moved.cte("moved")
    logged = insert(job_history).from_select(
        ["job_id", "from_state", "to_state", "attempt", "actor", "error_code", "reason"],
        select(moved.c.id, literal(from_state and from_state.value, Text), literal(to_state.value, Text),
               moved.c.attempt, bindparam("b_actor", type_=Text), bindparam("b_error_code", None, type_=Text),
               bindparam("b_reason", None, type_=Text)),
    ).cte("logged")
    return select(moved).add_cte(logged)


_HISTORY = insert(job_history)
_GET = select(jobs).where(jobs.c.id == bindparam("b_job_id"))
_ANOTHER_UNFINISHED = select(jobs.c.id).where(jobs.c.attachment_id == bindparam("b_attachment_id"),
                                              jobs.c.id != bindparam("b_job_id"), jobs.c.state.in_(UNFINISHED)).limit(1)
_GET_LOCKED = _GET.with_for_update()
_RECORDED = select(variants.c.variant).where(variants.c.job_id == bindparam("b_job_id"))
#: none -> queued: the job's owner is its attachment's (built once, as every upload makes a job)
_CREATE = _logged(pg_insert(jobs).values(
    id=bindparam("b_job_id"), attachment_id=bindparam("b_attachment_id"), state=JobState.QUEUED, attempt=0,
    owner=select(attachments.c.owner).where(attachments.c.id == bindparam("b_attachment_id")).scalar_subquery(),
    pipeline_version=bindparam("b_version"), max_attempts=bindparam("b_max_attempts"),
    traceparent=bindparam("b_traceparent"), tracestate=bindparam("b_tracestate"), room_bytes=bindparam("b_room"),
).on_conflict_do_nothing(constraint="jobs_attachment_version_key").returning(jobs), None, JobState.QUEUED)


def _history(conn: Connection, job_id, from_state, to_state, attempt, actor, error_code=None, reason=None) -> None:
    conn.execute(_HISTORY, dict(job_id=job_id, from_state=from_state, to_state=to_state, attempt=attempt,
                                actor=actor, error_code=error_code, reason=reason))


def create_job(conn: Connection, *, attachment_id: uuid.UUID, pipeline_version: int, max_attempts: int,
               traceparent: str, tracestate: str | None, actor: str, room_bytes: int,
               reason: str = "upload accepted") -> tuple[uuid.UUID, int] | None:
    """none -> queued, with the first message in the outbox. Returns (job_id, outbox_id).

    One job per ``(attachment_id, pipeline_version)``: if it exists already,
    nothing is written and ``None`` is returned (a backfill run twice).
    ``room_bytes``: what the job will write to storage (:func:`app.core.room.need`), counted by the room check
    while it is unfinished.
    """
    from app.core.pipeline import ensure_recorded

    ensure_recorded(conn, pipeline_version)
    job_id = uuid.uuid4()
    row = conn.execute(_CREATE, dict(
        b_job_id=job_id, b_attachment_id=attachment_id, b_version=pipeline_version, b_max_attempts=max_attempts,
        b_traceparent=traceparent, b_tracestate=tracestate, b_room=room_bytes, b_actor=actor, b_reason=reason,
    )).one_or_none()
    if row is None:
        return None
    return job_id, outbox.announce(conn, row, 1, Step.INSPECT)


def another_unfinished(conn: Connection, attachment_id, job_id) -> bool:
    """Whether a job of the attachment other than ``job_id`` (another pipeline version, a replay) is not done.

    Such a job may read the staged original until a version publishes the
    kept one, so staging stays while it runs: a publish asks after its ready
    COMMIT (a job made unfinished later reads the kept original), and the
    last job of the attachment to publish, or the staging cleanup, removes it.
    """
    return conn.execute(_ANOTHER_UNFINISHED, {"b_attachment_id": attachment_id, "b_job_id": job_id}).first() is not None


def get(conn: Connection, job_id, *, lock: bool = False) -> Row | None:
    return conn.execute(_GET_LOCKED if lock else _GET, {"b_job_id": job_id}).one_or_none()


def recorded(conn: Connection, job_id) -> set[str]:
    """The variants a job's render steps (or, for a small image, its inspect) have recorded so far."""
    return set(conn.execute(_RECORDED, {"b_job_id": job_id}).scalars())


_CLAIM = _logged(
    update(jobs)
    .where(jobs.c.id == bindparam("b_job_id"), jobs.c.state == JobState.QUEUED, jobs.c.attempt == bindparam("b_previous"),
           (jobs.c.next_attempt_at.is_(None)) | (jobs.c.next_attempt_at <= func.now()))
    .values(state=JobState.PROCESSING, attempt=bindparam("b_attempt"), lease_owner=bindparam("b_owner"),
            lease_expires_at=_lease_until(), next_attempt_at=None, error_code=None, error_reason=None,
            updated_at=func.now())
    .returning(jobs), JobState.QUEUED, JobState.PROCESSING)


def claim(conn: Connection, job_id, attempt: int, lease: Lease) -> Row | None:
    """queued -> processing for the message of attempt ``attempt`` (= stored attempt + 1).

    A message for any other attempt is stale and claims nothing. A job
    whose ``next_attempt_at`` lies in the future is not claimable yet. An
    attempt does not start while the object GC removes one of its
    attachment's objects (:func:`app.core.objects.await_removals` raises).
    """
    row = conn.execute(_CLAIM, {"b_job_id": job_id, "b_previous": attempt - 1, "b_attempt": attempt,
                                "b_actor": lease.owner, **_lease(lease)}).one_or_none()
    if row is not None:
        objects.await_removals(conn, row.attachment_id)
    return row


def held():
    """A ``processing`` job is held when a step holds a live lease, or it waits between steps.

    A job between steps has no lease owner (:func:`hand_off`); nobody is
    working on it, so there is nothing to expire: it waits for its next
    message however long a backlog is. Only a running step's lease expires.
    """
    return jobs.c.lease_owner.is_(None) | (jobs.c.lease_expires_at > func.now())


def held_by(owner):
    """:func:`held`, or the running step's lease is ``owner``'s own and lapsed with nobody taking the job back.

    A step's heartbeat cannot be written while PostgreSQL is down, read-only
    or out of disk: an outage longer than the lease lets every running
    step's lease lapse though its worker lives. The attempt's sole running
    step (``inspect``, :attr:`Lease.sole`) that owns the lapsed lease goes
    on (its heartbeat renews it, its fence and its publication take it)
    until lease recovery has taken the job back; from then on the
    state or the attempt differ and it is stale. Nobody else was given the
    job meanwhile, and effects are idempotent per effect key, so the step's
    result is as good as one committed a moment before the lease ran out;
    without this, every job in flight through an outage was charged an
    attempt, ``worker_lost``, and one on its last attempt failed. Lease
    recovery, for its part, takes a lapsed lease back only after watching
    PostgreSQL take its rounds without a break for a heartbeat period
    (``scheduler/lease_recovery.py``).
    """
    return held() | (jobs.c.lease_owner == owner)


def expired():
    """A running step's lease ran out: its worker died or hangs (the inverse of :func:`held`)."""
    return jobs.c.lease_owner.is_not(None) & (jobs.c.lease_expires_at <= func.now())


def _fence_statements(holding):
    """The fence's check and take, for a lease held as ``holding`` says (:func:`held`, or :func:`held_by`)."""
    fenced = (jobs.c.id == bindparam("b_job_id"), jobs.c.state == JobState.PROCESSING,
              jobs.c.attempt == bindparam("b_attempt"), holding)
    return (select(jobs).where(*fenced).with_for_update(),
            update(jobs).where(*fenced)
            .values(lease_owner=bindparam("b_owner"), lease_expires_at=_lease_until(), updated_at=func.now())
            .returning(jobs))


#: (check, take) by ``Lease.sole``
_FENCES = {False: _fence_statements(held()), True: _fence_statements(held_by(bindparam("b_owner")))}


def fence(conn: Connection, job_id, attempt: int, lease: Lease, *, take: bool = True) -> Row | None:
    """A step's fence: ``(job_id, attempt)`` is still ``processing`` and held, locked for this transaction.

    Returns the job or ``None`` when this attempt no longer owns the job:
    another attempt claimed it, a running step's lease expired (a lapsed
    lease of the asking step's own still holds: :func:`held_by`), or it is
    no longer ``processing``. A worker that gets ``None`` must write
    nothing visible. With ``take`` (a step starting) the step takes the
    lease for ``lease.seconds``; a redelivered message of the same attempt
    may take it over, since steps are idempotent per effect key.
    ``take=False`` (a step about to commit its outcome and hand off)
    checks and locks without taking the lease from a sibling still running.
    """
    check, take_over = _FENCES[lease.sole]
    if not take:
        return conn.execute(check, {"b_job_id": job_id, "b_attempt": attempt, "b_owner": lease.owner}).one_or_none()
    return conn.execute(take_over, {"b_job_id": job_id, "b_attempt": attempt, **_lease(lease)}).one_or_none()


#: a heartbeat, by ``Lease.sole``
_RENEWS = {sole: (update(jobs)
                  .where(jobs.c.id == bindparam("b_job_id"), jobs.c.state == JobState.PROCESSING,
                         jobs.c.attempt == bindparam("b_attempt"), jobs.c.lease_owner.is_not(None),
                         held_by(bindparam("b_owner")) if sole else held())
                  .values(lease_owner=bindparam("b_owner"), lease_expires_at=_lease_until(), updated_at=func.now())
                  .returning(jobs.c.id))
           for sole in (False, True)}


def renew(conn: Connection, job_id, attempt: int, lease: Lease) -> bool:
    """A running step's heartbeat: extend the lease while a step holds it.

    Unlike :func:`fence` it never takes a handed-off job back: a beat that
    lands after its own step (or the last running sibling) handed off must
    not leave a short lease that nobody renews.
    """
    return conn.execute(_RENEWS[lease.sole], {"b_job_id": job_id, "b_attempt": attempt,
                                              **_lease(lease)}).first() is not None


_HAND_OFF = (update(jobs)
             .where(jobs.c.id == bindparam("b_job_id"), jobs.c.state == JobState.PROCESSING,
                    jobs.c.attempt == bindparam("b_attempt"),
                    (jobs.c.lease_owner == bindparam("b_owner")) | jobs.c.lease_owner.is_(None))
             .values(lease_owner=None, updated_at=func.now())
             .returning(jobs.c.id))


def hand_off(conn: Connection, job_id, attempt: int, owner: str) -> bool:
    """A step finished and announced the next: the job now waits for a message, not for a worker.

    The lease guards a *running* step: a worker that dies or hangs in a step
    stops renewing it and lease recovery takes the attempt back. Between
    steps nobody runs, and the next messages may wait behind a backlog of
    any length; an expiring lease there cost an attempt per expiry until
    the job failed ``worker_lost`` with no worker lost (a livelock
    ``make soak`` found). So the step clears the owner: a job without one
    is held and never expires (:func:`held`), and the next step's fence
    takes the lease again. Lost messages of a waiting job are the
    reconciler's (:func:`reannounce_stranded`). Only the step that holds
    the lease (or none holds it) hands off, so a sibling that fenced after
    it keeps its short lease.
    """
    return conn.execute(_HAND_OFF, {"b_job_id": job_id, "b_attempt": attempt, "b_owner": owner}).first() is not None


def _leave_processing(conn: Connection, job_id, attempt: int, to_state: str, values: dict, *,
                      require_live_lease: bool, holder: str | None = None):
    conditions = [jobs.c.id == job_id, jobs.c.state == JobState.PROCESSING, jobs.c.attempt == attempt]
    if require_live_lease:
        conditions.append(held_by(holder))
    return conn.execute(
        update(jobs).where(and_(*conditions))
        .values(state=to_state, lease_owner=None, lease_expires_at=None, updated_at=func.now(), **values)
        .returning(jobs)
    ).one_or_none()


def publish_ready(conn: Connection, job_id, attempt: int, required: tuple[str, ...], actor: str) -> bool:
    """processing -> ready: publish every recorded variant and flip the job, atomically.

    Runs only if ``(job_id, attempt)`` still holds a live lease (or ``actor``'s own lapsed one: :func:`held_by`)
    and every required variant has been recorded by a render step.
    """
    if not set(required) <= recorded(conn, job_id):
        return False
    row = _leave_processing(conn, job_id, attempt, JobState.READY, {"ready_at": func.now(), "error_code": None,
                                                           "error_reason": None}, require_live_lease=True,
                            holder=actor)
    if row is None:
        return False
    conn.execute(update(variants).where(variants.c.job_id == job_id, variants.c.published_at.is_(None))
                 .values(published_at=func.now()))
    _history(conn, job_id, JobState.PROCESSING, JobState.READY, attempt, actor)
    events.emit(conn, row, events.ready_type(conn, row))
    return True


def fail(conn: Connection, job_id, attempt: int, error_code: str, reason: str, actor: str) -> bool:
    """processing -> failed with an error code an operator can act on."""
    row = _leave_processing(conn, job_id, attempt, JobState.FAILED, {"error_code": error_code, "error_reason": reason},
                            require_live_lease=False)
    if row is None:
        return False
    _history(conn, job_id, JobState.PROCESSING, JobState.FAILED, attempt, actor, error_code, reason)
    events.emit(conn, row, events.ATTACHMENT_FAILED)
    return True


def retry_later(conn: Connection, job_id, attempt: int, error_code: str, reason: str, delay_seconds: float,
                actor: str) -> str | None:
    """processing -> queued (attempts left) or -> failed (spent). Returns the new state.

    The next attempt's message goes to the outbox with ``available_at`` in
    the future; the scheduler publishes it when due (no broker-side delay).
    """
    job = get(conn, job_id, lock=True)
    if job is None or job.state != JobState.PROCESSING or job.attempt != attempt:
        return None
    if attempt >= job.max_attempts:
        spent = fail(conn, job_id, attempt, error_code, f"attempts exhausted: {reason}", actor)
        return JobState.FAILED if spent else None
    # on the database's clock, as every reader of it compares (the relay, claims): a worker's clock an hour ahead
    # delayed a 2 s retry by an hour, one an hour behind spent every attempt in seconds (an adversarial run)
    due = conn.execute(select(func.now() + interval(delay_seconds))).scalar_one()
    row = _leave_processing(conn, job_id, attempt, JobState.QUEUED,
                            {"error_code": error_code, "error_reason": reason, "next_attempt_at": due},
                            require_live_lease=False)
    if row is None:
        return None
    _history(conn, job_id, JobState.PROCESSING, JobState.QUEUED, attempt, actor, error_code, reason)
    outbox.announce(conn, row, attempt + 1, Step.INSPECT, available_at=due)
    return JobState.QUEUED


def lapsed(conn: Connection, *, batch: int) -> list[Row]:
    """``processing`` jobs whose running step's lease expired, oldest first, locked (``SKIP LOCKED``: two
    schedulers never take the same row; a read-only session cannot lock them)."""
    return conn.execute(
        select(jobs).where(jobs.c.state == JobState.PROCESSING, expired())
        .order_by(jobs.c.lease_expires_at).limit(batch).with_for_update(skip_locked=True)
    ).all()


def recover_expired(conn: Connection, *, batch: int, actor: str) -> dict[str, int]:
    """Scheduler: processing with an expired lease -> queued (or failed ``worker_lost``)."""
    return take_back(conn, lapsed(conn, batch=batch), actor=actor)


def take_back(conn: Connection, lost: list[Row], *, actor: str) -> dict[str, int]:
    """The jobs :func:`lapsed` locked -> queued, attempt counted (or failed ``worker_lost``, attempts spent)."""
    counts = {"requeued": 0, "failed": 0}
    for job in lost:
        if job.attempt >= job.max_attempts:
            reason = f"lease expired in attempt {job.attempt} of {job.max_attempts}; attempts spent"
            row = _leave_processing(conn, job.id, job.attempt, JobState.FAILED,
                                    {"error_code": WORKER_LOST, "error_reason": reason}, require_live_lease=False)
            _history(conn, job.id, JobState.PROCESSING, JobState.FAILED, job.attempt, actor, WORKER_LOST, reason)
            events.emit(conn, row, events.ATTACHMENT_FAILED)
            counts["failed"] += 1
        else:
            reason = f"lease of {job.lease_owner} expired"
            row = _leave_processing(conn, job.id, job.attempt, JobState.QUEUED,
                                    {"error_code": WORKER_LOST, "error_reason": reason},
                                    require_live_lease=False)
            _history(conn, job.id, JobState.PROCESSING, JobState.QUEUED, job.attempt, actor, WORKER_LOST, reason)
            outbox.announce(conn, row, job.attempt + 1, Step.INSPECT)
            counts["requeued"] += 1
    return counts


def reannounce_stranded(conn: Connection, *, after_seconds: float, max_doublings: int, batch: int,
                        actor: str) -> list[int]:
    """Scheduler: announce again every job that has no live path forward. Returns outbox ids.

    A job moves only when a message for it reaches a worker. It is stranded
    when that message is gone (dead-lettered after the retry budget, purged,
    lost with a broker's data):

    * ``queued`` and due (``next_attempt_at`` passed), or ``processing``
      between steps (:func:`hand_off` cleared the lease owner: no step runs);
    * no unpublished outbox row (pending, or a delayed retry);
    * nothing announced and no activity for ``after_seconds`` × 2^k, where k
      is how often it was re-announced for this attempt already, so a long
      backlog costs at most one duplicate per doubling period, never a storm.

    The fresh message is an inspect: for attempt + 1 of a ``queued`` job (it
    claims), for the current attempt of a waiting ``processing`` job (it
    fences, and announces the renders not yet recorded, or publish). The
    duplicate of a message that was merely slow is harmless. The job rows
    are locked ``FOR UPDATE SKIP LOCKED``: a claim racing this waits, and two
    schedulers never take the same job. No attempt is counted.
    """
    stranded = conn.execute(text("""
        SELECT j.*, j.attempt + CASE WHEN j.state = :queued THEN 1 ELSE 0 END AS next_attempt FROM jobs j
        CROSS JOIN LATERAL (
            SELECT max(greatest(o.created_at, o.available_at, o.published_at)) AS last_announced,
                   count(*) FILTER (WHERE o.payload->>'step' = :inspect AND (o.payload->>'attempt')::int
                                    = j.attempt + CASE WHEN j.state = :queued THEN 1 ELSE 0 END) AS announced
            FROM outbox o WHERE o.job_id = j.id) a
        WHERE ((j.state = :queued AND (j.next_attempt_at IS NULL OR j.next_attempt_at <= now()))
               OR (j.state = :processing AND j.lease_owner IS NULL))
          AND j.updated_at < now() - make_interval(secs => :after)
          AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.job_id = j.id AND p.published_at IS NULL)
          AND greatest(a.last_announced, j.updated_at)
              < now() - make_interval(secs => :after * power(2, least(greatest(a.announced - 1, 0), :doublings)))
        ORDER BY j.updated_at
        LIMIT :batch
        FOR UPDATE OF j SKIP LOCKED
    """), {"after": float(after_seconds), "doublings": int(max_doublings), "batch": int(batch),
           "queued": JobState.QUEUED.value, "processing": JobState.PROCESSING.value,
           "inspect": Step.INSPECT.value}).all()
    ids = []
    for job in stranded:
        conn.execute(update(jobs).where(jobs.c.id == job.id).values(updated_at=func.now()))
        _history(conn, job.id, job.state, job.state, job.attempt, actor, None,
                 f"{REANNOUNCED}: attempt {job.next_attempt} had no live message")
        ids.append(outbox.announce(conn, job, job.next_attempt, Step.INSPECT))
    return ids


def replay(conn: Connection, job_id, *, actor: str, reason: str, budget: int) -> Row | None:
    """failed -> queued by an operator, with ``budget`` fresh attempts and an audited reason.

    Variants already recorded stay (the effect key keeps them single), so
    the replayed job resumes at its first unfinished step.
    """
    row = conn.execute(
        update(jobs).where(jobs.c.id == job_id, jobs.c.state == JobState.FAILED)
        .values(state=JobState.QUEUED, max_attempts=jobs.c.attempt + budget, next_attempt_at=None, error_code=None,
                error_reason=None, updated_at=func.now())
        .returning(jobs)
    ).one_or_none()
    if row is None:
        return None
    _history(conn, job_id, JobState.FAILED, JobState.QUEUED, row.attempt, actor, None, reason)
    outbox.announce(conn, row, row.attempt + 1, Step.INSPECT)
    return row
