"""The pipeline steps: inspect -> render (one message per variant) -> publish.

Actors (``actors/``) are thin: they hand the message body to
:meth:`Workflow.handle`, which validates it and runs the step. A step's
opening transaction fences (or claims) the job and checks the message
against it; only when its attempt does not hold the job is the job read
again, to tell a ready job (verified), a failed one (ignored) and a stale
message apart (:meth:`Workflow._unheld`). Every outcome is recorded through :mod:`app.core.states`;
only a failure to record an outcome at all (PostgreSQL down) escapes as
:class:`DatabaseUnavailable`: while PostgreSQL does not answer, the step
waits for it and runs again (:meth:`Workflow._outlasting_outages`); after
that, Dramatiq's bounded retries.

Idempotency, per step:

* ``inspect`` claims the job (or continues the same attempt after a
  redelivery), re-checks the staged original's header and announces the
  render messages for every variant not yet recorded, or the publish
  message when all are: a recovered job resumes at its first unfinished
  step. An image of at most ``ATTACHE_ONE_STEP_MAX_PIXELS`` (by default
  every image) has those variants made by inspect itself, recorded as the
  render steps would record them, and is published by inspect's outcome
  transaction, as the publish step would publish it.
* A step holds the job's lease while it runs (a heartbeat renews it) and
  hands off when it has committed its outcome: the job then waits for the
  next message with no owner, which never expires, so messages waiting
  behind a backlog cost no attempt (:func:`app.core.states.hand_off`).
* ``render`` writes the object under a content-addressed key (a rerun
  writes the same key with the same bytes), then records the variant row
  fenced by ``(job_id, attempt)``; the effect key is unique, so a variant
  is recorded once. The render that completes the set announces publish.
* ``publish`` flips the job to ``ready`` and publishes every variant in one
  transaction; staging is removed after that COMMIT, unless another job of
  the attachment (another version, a replay) is not done: it may be reading
  staging (:func:`app.core.states.another_unfinished`).
* A message for a ``ready`` job verifies the effect (rows and objects with
  their recorded sizes) and is acked; a missing object raises
  :class:`EffectMissing`, which dead-letters the message for an operator.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from sqlalchemy import Text, bindparam, cast, func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Row

from app import faults
from app.adapters import imaging
from app.adapters.imaging.shared import content_key
from app.adapters.postgres import db
from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import JobState, attachments, object_taints, step_runs, variants
from app.core import messages, objects, outbox, pipeline, provenance, staging, states
from app.core.identity import identity
from app.core.needs import ImageProducer
from app.core.retry import RetryPolicy
from app.core.steps import Step, step_interrupt_grace
from app.errors import (
    AttacheError,
    DatabaseUnavailable,
    EffectMissing,
    InvalidMessage,
    ObjectNotFound,
    OriginalCorrupted,
    PoisonMessage,
    RemovalUnderWay,
    StagingMissing,
    StepTimedOut,
    StorageError,
    StorageUnavailable,
    StorageWaitInterrupted,
    UnknownJob,
    VersionUnknownHere,
    error_code,
    retryable,
    sanitized_reason,
)
from app.observability import telemetry
from app.observability.logs import bound
from app.observability.tracing import trace_id

log = logging.getLogger("attache.workflow")

T = TypeVar("T")

#: how often a step runs again while PostgreSQL is short of disk, memory or connections (within its database wait)
SHORT_OF_RESOURCES_RETRY_SECONDS = 1.0
#: how often a claim that met the object GC removing one of its attachment's objects is tried again (a removal is
#: one storage call; within the step's database wait)
REMOVAL_RETRY_SECONDS = 0.2
#: how soon a heartbeat that could not be written is tried again (one that was, a third of the lease later): a
#: lease that lapsed in an outage is renewed within a second of PostgreSQL taking writes again (states.held_by)
HEARTBEAT_RETRY_SECONDS = 1.0
#: how long a step first waits to try a storage call again that found storage unavailable, and at most (doubling)
STORAGE_RETRY_FIRST_SECONDS = 1.0
STORAGE_RETRY_MAX_SECONDS = 30.0
#: threads that make an image's variants in its inspect step (the encoders, libvips and resampling release the GIL)
INLINE_THREADS = 2


#: built once (see app.core.states): the statements every step runs
#: with its tainted keys (``taints``: a list, or None), whose variants are written under others (app/core/objects.py)
_ATTACHMENT = select(attachments, select(func.array_agg(object_taints.c.key))
                     .where(object_taints.c.owner == cast(attachments.c.id, Text)).scalar_subquery().label("taints"),
                     staging.kept_original(attachments.c.id).label("kept_original")
                     ).where(attachments.c.id == bindparam("b_id"))
_VARIANT_RECORDED = select(variants.c.id).where(
    variants.c.attachment_id == bindparam("b_attachment_id"), variants.c.pipeline_version == bindparam("b_version"),
    variants.c.variant == bindparam("b_variant"))
_RECORD_VARIANT = pg_insert(variants).on_conflict_do_nothing(constraint="variants_effect_key")
_PUBLISHED_VARIANTS = select(variants).where(variants.c.job_id == bindparam("b_job_id"),
                                             variants.c.published_at.is_not(None))
#: finished when written: clock_timestamp(), not now() (the transaction's start, which a step's outcome transaction
#: began before its fence and records: a timeline's start, finished_at minus seconds, came out that much early)
_RECORD_RUN = insert(step_runs).values(finished_at=func.clock_timestamp())


@dataclass(frozen=True)
class Outcome:
    """What a step did, for logs and tests."""

    status: str
    detail: str = ""


@dataclass(frozen=True)
class Unheld:
    """A step's opening found that the message's attempt does not hold its job (``job``: the row as it is)."""

    job: Row


@dataclass
class _Run:
    """The step a worker thread is running: what :meth:`Workflow._ran` records of it."""

    body: dict
    began: float
    #: until when its storage calls are tried again while storage is unavailable (``ATTACHE_STORAGE_WAIT_SECONDS``
    #: from the step's start: its waits for PostgreSQL and for storage overlap, within the step's time limit)
    storage_deadline: float
    #: when the step has run for ``ATTACHE_STEP_TIME_LIMIT_SECONDS`` (from when its thread took it; a wait for
    #: PostgreSQL does not move it): its heartbeat then records the attempt's timeout instead of renewing the lease
    deadline: float = float("inf")
    recorded: bool = False
    #: the storage error a call of this step met, once its deadline has passed: later calls raise it at once
    storage_failed: StorageUnavailable | None = None

    def values(self, outcome: Outcome) -> dict:
        body = self.body
        return dict(job_id=uuid.UUID(body["job_id"]), step=body["step"], variant=body.get("variant"),
                    attempt=body["attempt"], outcome=outcome.status, seconds=time.monotonic() - self.began,
                    worker=identity("worker"))


_running: ContextVar[_Run | None] = ContextVar("attache_step_run", default=None)


def _check(job: Row, body: dict) -> None:
    if str(job.attachment_id) != body["attachment_id"] or job.pipeline_version != body["pipeline_version"]:
        raise InvalidMessage("message does not match the job it names")


class Workflow:
    def __init__(self, services: ImageProducer, policies: dict[Step, RetryPolicy] | None = None, *,
                 stopping: threading.Event | None = None, stuck: Callable[[], None] | None = None):
        """``stopping``: set when the worker shuts down; a step waiting out a PostgreSQL outage stops waiting.
        ``stuck``: called when a step is still running well past its time limit, inside a call no exception
        reaches (the worker exits its process: ``app.services.exit_stuck_worker``); by default only logged."""
        self.services = services
        self.stopping = stopping or threading.Event()
        self.stuck = stuck or (lambda: None)
        settings = services.settings
        self.policies = policies or {step: step.retry_policy(settings.retry_initial_seconds, settings.retry_max_seconds)
                                     for step in Step}

    # --- entry point --------------------------------------------------------

    def handle(self, payload: object, *, step: Step | str) -> Outcome:
        """Run the step a message asks for; ``step`` is the actor that received it."""
        step = Step(step)
        try:
            body = messages.validate(payload)
            if body["step"] != step:
                raise InvalidMessage(f"a {body['step']} message reached the {step} actor")
        except InvalidMessage as error:
            log.error("poison message: %s", error, extra={"actor": step})
            raise
        with bound(job_id=body["job_id"], attempt=body["attempt"], step=body["step"],
                   trace_id=trace_id(body["traceparent"]), variant=body.get("variant")), \
                telemetry.consuming(body, step.queue):
            began, settings = time.monotonic(), self.services.settings
            run = _Run(body, began, began + settings.storage_wait_seconds, began + settings.step_time_limit_seconds)
            token = _running.set(run)
            try:
                outcome = self._outlasting_outages(body)
            finally:
                _running.reset(token)
            log.info("step %s: %s %s", body["step"], outcome.status, outcome.detail)
            if not run.recorded:
                self._record_run(run, outcome)
            return outcome

    def _record_run(self, run: _Run, outcome: Outcome) -> None:
        """The timing of a step that committed no outcome of its own (stale, ignored, verified, failed).

        Best effort: a lost timing must never fail a step whose outcome is
        recorded. Its commit does not wait for the WAL flush
        (``synchronous_commit = off``): a timing lost to a PostgreSQL crash
        costs the record of one attempt, not work.
        """
        try:
            with transaction(self.services.engine) as conn:
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                conn.execute(_RECORD_RUN, run.values(outcome))
        except Exception:
            log.warning("step timing not recorded", exc_info=True)

    def _ran(self, conn, outcome: Outcome) -> Outcome:
        """A step's timing, written in the transaction that commits its outcome (no commit of its own).

        Its seconds end here, before that COMMIT and the publishing of the
        messages it announced.
        """
        run = _running.get()
        if run is not None:
            conn.execute(_RECORD_RUN, run.values(outcome))
            run.recorded = True
        return outcome

    def _outlasting_outages(self, body: dict) -> Outcome:
        """The step, run again each time PostgreSQL was unreachable and answers again, within
        ``ATTACHE_DATABASE_WAIT_SECONDS`` of waiting.

        An outage is not the message's fault: without the wait, each of
        Dramatiq's few retries was spent within seconds against the dead
        server, and an outage of some 20 s dead-lettered every message the
        worker took meanwhile (the reconciler announced their jobs again
        minutes later). While the step waits its message stays unacked, so the
        worker takes no more; running it again is a redelivery, which every
        step is made for. ``DatabaseUnavailable`` with PostgreSQL answering (a
        lost connection, a deadlock) is raised at once, for Dramatiq's retries,
        as is one whose wait ran out or was ended by the worker's shutdown. A
        PostgreSQL short of disk, memory or connections (SQLSTATE class 53)
        answers a ``SELECT`` but takes no write: the step runs again every
        second within the same wait. Before, its disk full for 20 s sent the
        steps through Dramatiq's retries to the dead letters and left a job
        waiting minutes for the reconciler (an adversarial run).
        A claim that meets the object GC removing one of its attachment's
        objects (:class:`RemovalUnderWay`, ``app/core/objects.py``) runs again
        every ``REMOVAL_RETRY_SECONDS`` within the same wait.
        The step's timing (``step_runs``) is the run's after the wait: the
        wait is in the worker's log, not in the step's duration.
        """
        engine = self.services.engine
        deadline = time.monotonic() + self.services.settings.database_wait_seconds
        short = waited_for_removal = False
        while True:
            try:
                return self._handle(body)
            except RemovalUnderWay as error:
                if not waited_for_removal:
                    log.info("%s: the step waits for it", error)
                waited_for_removal = True
                if time.monotonic() >= deadline or self.stopping.wait(REMOVAL_RETRY_SECONDS):
                    raise
                continue
            except DatabaseUnavailable as error:
                if time.monotonic() >= deadline:
                    raise
                if db.short_of_resources(error):  # it answers, and takes no write until disk or memory is freed
                    if not short:
                        log.warning("PostgreSQL is short of disk, memory or connections: the step runs again "
                                    "every %g s until it is not", SHORT_OF_RESOURCES_RETRY_SECONDS)
                    short = True
                    if self.stopping.wait(SHORT_OF_RESOURCES_RETRY_SECONDS):
                        raise
                else:
                    if db.reachable(engine):
                        raise
                    log.warning("PostgreSQL is unreachable or read-only: the step waits for it")
                    if not db.wait_until_reachable(engine, deadline - time.monotonic(), self.stopping):
                        raise
                    log.info("PostgreSQL answers and takes writes again: the step runs again")
                run = _running.get()
                if run is not None:  # its duration is the run's that records the outcome, not the wait's
                    run.began = time.monotonic()

    def _handle(self, body: dict) -> Outcome:
        job_id = uuid.UUID(body["job_id"])
        attempt = body["attempt"]
        # inspect is its attempt's one running step; render steps of one attempt run side by side
        lease = states.Lease(identity("worker"), self.services.settings.lease_seconds,
                             sole=body.get("step") == Step.INSPECT.value)
        try:
            match Step(body["step"]):
                case Step.INSPECT:
                    outcome = self.inspect(body, attempt, lease)
                case Step.RENDER:
                    outcome = self.render(body, attempt, body["variant"], lease)
                case Step.PUBLISH:
                    outcome = self.publish(body, attempt, lease)
        except (PoisonMessage, DatabaseUnavailable, StorageWaitInterrupted, RemovalUnderWay, VersionUnknownHere):
            raise
        except Exception as error:  # every other error becomes a recorded outcome
            return self.record_failure(job_id, attempt, body["step"], error, lease.owner)
        if isinstance(outcome, Unheld):
            return self._unheld(outcome.job, attempt)
        return outcome

    # --- the job a message names ----------------------------------------------

    def _held(self, conn, body: dict, job: Row | None) -> Row | Unheld:
        """A step's opening: ``job`` is the row its fence (or claim) returned, ``None`` if it took nothing.

        In the same transaction: a message naming no job, or not the job it
        names, raises (rolling back whatever the fence took).
        """
        if job is None:
            return Unheld(self._named(conn, body))
        _check(job, body)
        return job

    def _named(self, conn, body: dict, *, lock: bool = False) -> Row:
        job = states.get(conn, uuid.UUID(body["job_id"]), lock=lock)
        if job is None:
            raise UnknownJob(f"no job {body['job_id']}")
        _check(job, body)
        return job

    @staticmethod
    def _version(job: Row) -> pipeline.PipelineVersion:
        """The job's pipeline version, looked up in the step's opening transaction once the message was checked
        against the job. One this worker's release does not register raises :class:`VersionUnknownHere`, which
        rolls the claim or fence back: the message goes back to the broker for a worker of the release that made
        the job, which is not charged an attempt."""
        try:
            return pipeline.get(job.pipeline_version)
        except LookupError:
            raise VersionUnknownHere(
                f"pipeline version {job.pipeline_version} is not registered in this worker's release (it registers "
                f"{', '.join(map(str, pipeline.REGISTRY))}): the message goes back for a worker that registers it"
            ) from None

    def _unheld(self, job, attempt: int) -> Outcome:
        """A message whose attempt does not hold its job: a ready job is verified, never redone."""
        if job.state == JobState.READY:
            return self.verify_ready(job)
        if job.state == JobState.FAILED:
            return Outcome("ignored", "job is failed")
        return Outcome("stale", f"attempt {attempt} does not hold the job")

    # --- steps --------------------------------------------------------------

    def inspect(self, body: dict, attempt: int, lease: states.Lease) -> Outcome | Unheld:
        job_id = uuid.UUID(body["job_id"])
        with transaction(self.services.engine) as conn:
            job = self._held(conn, body, states.claim(conn, job_id, attempt, lease)
                             or states.fence(conn, job_id, attempt, lease))
            if isinstance(job, Unheld):
                return job
            version = self._version(job)
            attachment = self._attachment(conn, job.attachment_id)
            source = self._source_key(attachment)
            one_step = attachment.width * attachment.height <= self.services.settings.one_step_max_pixels
            recorded = states.recorded(conn, job.id) if one_step else set()
        here = self._made_here(version, recorded) if one_step else []
        with self._lease_kept(job.id, attempt, lease), self._staged(source, attachment.sha256) as path:
            imaging.probe(path, self.services.limits)  # fetching a large original from S3 may take a while
            made, failed = self._make_objects(attachment, version, here, path)
        if made:
            faults.point("after_object_write")
        if failed is not None and not made:
            return self._render_failed(job.id, attempt, failed, lease)
        published = False
        with self.services.unit_of_work.begin() as work:
            if states.fence(work.conn, job.id, attempt, lease, take=False) is None:
                return Outcome("stale", "lease lost during inspect" + (
                    "; the objects it made stay unreferenced" if made else ""))
            self._record_variants(work.conn, job, attempt, made)
            if failed is None and one_step:  # every variant is recorded: published here, as the publish step would
                published = states.publish_ready(work.conn, job.id, attempt, version.variants, lease.owner)
            if published:
                outcome = self._ran(work.conn, Outcome(JobState.READY, f"{len(made)} variant(s) made, "
                                                       f"{len(version.variants)} published"))
            elif failed is None:
                announced = self._announce_next(work.conn, job, attempt)
                self._hand_off(work.conn, job.id, attempt, lease)
                outcome = self._ran(work.conn, Outcome("inspected", (f"{len(made)} variant(s) made, " if made else "")
                                                       + f"{len(announced)} message(s) announced"))
        if failed is not None:  # what was made stays recorded, as each render step's would: the retry makes the rest
            return self._render_failed(job.id, attempt, failed, lease)
        if published:
            faults.point("after_result_commit")
            self._release_staging(job, attachment)
        return outcome

    def _render_failed(self, job_id, attempt: int, error: Exception, lease: states.Lease) -> Outcome:
        """A render inspect ran failed: recorded as its render step's failure would be (its code, the render's
        backoff); poison, a lost database and a storage wait ended by shutdown are raised as from any step."""
        if isinstance(error, (PoisonMessage, DatabaseUnavailable, StorageWaitInterrupted)):
            raise error
        return self.record_failure(job_id, attempt, Step.INSPECT, error, lease.owner, policy=Step.RENDER)

    @staticmethod
    def _made_here(version: pipeline.PipelineVersion, recorded: set[str]) -> list[str]:
        """The variants inspect makes itself, for an image of at most ``ATTACHE_ONE_STEP_MAX_PIXELS``.

        Every variant not yet recorded is made in this step, from the
        original it already holds, and recorded in its outcome's
        transaction, which also publishes the job (``states.publish_ready``,
        as the publish step does). A step's own cost
        (two transactions, a message, a hand-off) is several times the
        render of a small image's variant; and a large image's variants of
        one size (v2's ``optimized`` and ``webp``) are made from one decode
        only when one process makes both (:mod:`app.adapters.imaging.shared`),
        which separate render messages do not ensure. Above the setting an
        image gets a render message per variant, which the worker's threads
        and other workers run side by side (``docs/performance.md``).
        """
        return [name for name in version.costliest_first(version.variants) if name not in recorded]

    def render(self, body: dict, attempt: int, variant: str, lease: states.Lease) -> Outcome | Unheld:
        with transaction(self.services.engine) as conn:
            job = self._held(conn, body, states.fence(conn, uuid.UUID(body["job_id"]), attempt, lease))
            if isinstance(job, Unheld):
                return job
            version = self._version(job)  # the message names it: checked against the job
            if variant not in version.variants:  # rolls back the fence
                raise InvalidMessage(f"variant {variant!r} is not in pipeline version {version.version}")
            attachment = self._attachment(conn, job.attachment_id)
            done = conn.execute(_VARIANT_RECORDED, {"b_attachment_id": job.attachment_id,
                                                    "b_version": job.pipeline_version,
                                                    "b_variant": variant}).first() is not None
            source = None if done or variant == pipeline.ORIGINAL else self._source_key(attachment)
        if not done:
            faults.point("during_render")
            with self._lease_kept(job.id, attempt, lease), self._staged_or_none(source, attachment.sha256) as path:
                faults.point("render_hangs")
                effect = self._make_object(attachment, version, variant, path)
            faults.point("after_object_write")
        with self.services.unit_of_work.begin() as work:
            conn = work.conn
            if states.fence(conn, job.id, attempt, lease, take=False) is None:
                return Outcome("stale", "lease lost during render; the object stays unreferenced")
            if not done:
                self._record_variants(conn, job, attempt, {variant: effect})
            self._announce_publish_if_complete(conn, job, attempt, version)
            self._hand_off(conn, job.id, attempt, lease)
            outcome = self._ran(conn, Outcome("rendered" if not done else "already_rendered", variant))
        return outcome

    def publish(self, body: dict, attempt: int, lease: states.Lease) -> Outcome | Unheld:
        with transaction(self.services.engine) as conn:
            job = self._named(conn, body, lock=True)  # a second publish waits, then finds it ready
            if job.state != JobState.PROCESSING:
                return Unheld(job)
            version = self._version(job)
            if not states.publish_ready(conn, job.id, attempt, version.variants, lease.owner):
                return Outcome("stale", f"attempt {attempt} cannot publish")
            attachment = self._attachment(conn, job.attachment_id)
            outcome = self._ran(conn, Outcome(JobState.READY, f"{len(version.variants)} variants published"))
        faults.point("after_result_commit")
        self._release_staging(job, attachment)
        return outcome

    def _release_staging(self, job, attachment) -> None:
        """After the ready COMMIT: staging is removed, unless another job of the attachment is unfinished.

        At best: the job is ready whatever happens here. A storage error is
        logged and the object left to the scheduler's staging cleanup, which
        removes the staging of an attachment with a ready job and none
        unfinished. Raised, it failed the step of a ready job: a redelivered
        message's verification was retried and dead-lettered while storage
        refused writes (``make soak``).
        """
        with transaction(self.services.engine) as conn:  # a fresh look, after the COMMIT (see another_unfinished)
            keep_staging = states.another_unfinished(conn, job.attachment_id, job.id)
        if keep_staging:
            return
        try:
            self.services.storage.delete(attachment.staging_key)
        except StorageError as error:
            log.warning("staging not removed, left to the staging cleanup: %s", sanitized_reason(error))

    # --- ready: verify, never redo -------------------------------------------

    def verify_ready(self, job) -> Outcome:
        version = self._version(job)
        with transaction(self.services.engine) as conn:
            rows = conn.execute(_PUBLISHED_VARIANTS, {"b_job_id": job.id}).all()
            attachment = self._attachment(conn, job.attachment_id)
        found = {row.variant: row for row in rows}
        missing = [name for name in version.variants if name not in found]
        for row in rows:
            if row.retired_at is not None:  # superseded and collected on purpose: nothing left to verify
                continue
            info = self.services.storage.stat(row.storage_key)
            if info is None or info.size != row.size:
                missing.append(f"{row.variant} object")
        if missing:
            log.error("ready job's effect is incomplete: %s", ", ".join(missing))
            raise EffectMissing(f"ready job {job.id} is missing: {', '.join(missing)}")
        self._release_staging(job, attachment)
        return Outcome("already_ready", "effect verified")

    # --- failures ------------------------------------------------------------

    def record_failure(self, job_id, attempt: int, step: str, error: BaseException, actor: str, *,
                       policy: Step | None = None) -> Outcome:
        """Not retryable -> ``failed``; otherwise ``queued`` with the step's backoff (or ``failed`` once spent).

        ``policy``: the step whose backoff applies, if not ``step`` (a render
        run by inspect). The next attempt's message waits in the outbox until
        it is due; the scheduler publishes it then.
        """
        code, reason = error_code(error), sanitized_reason(error)
        if not isinstance(error, AttacheError):
            log.error("unexpected %s in step", type(error).__name__, exc_info=error)
        delay = self.policies[policy or Step(step)].delay(attempt)
        with transaction(self.services.engine) as conn:
            if retryable(error):  # and attempts left: the job row's max_attempts decides (states.retry_later)
                new_state = states.retry_later(conn, job_id, attempt, code, reason, delay, actor)
            else:
                new_state = JobState.FAILED if states.fail(conn, job_id, attempt, code, reason, actor) else None
        return Outcome(new_state or "stale", f"{code}: {reason}")

    # --- helpers ---------------------------------------------------------------

    def _attachment(self, conn, attachment_id):
        return conn.execute(_ATTACHMENT, {"b_id": attachment_id}).one()

    @staticmethod
    def _source_key(attachment) -> str:
        """Where the original's bytes are (:func:`app.core.staging.source_of`), read with the attachment's row
        (``_ATTACHMENT``) in the step's opening transaction, with its fence."""
        return staging.source_of(attachment.kept_original, attachment.staging_key)

    def _outlasting_storage(self, call: Callable[[], T]) -> T:
        """``call()``, a storage call of a step, made again while it finds storage unavailable (a full disk, S3
        unreachable or refusing), first a second later, then twice as long each time up to 30 s, until the step's
        storage deadline (``ATTACHE_STORAGE_WAIT_SECONDS`` from its start); then the error is the step's, and costs
        the job an attempt (a managed retry), and the step's other calls fail at once (one call to a hung S3
        endpoint can take 90 s: each made past the deadline took the step toward its time limit). Steps call
        storage inside :meth:`_lease_kept`, so the wait holds the lease; the render is not made again, only the
        call. A worker that begins to shut down ends the wait with :class:`StorageWaitInterrupted`: the message
        goes back to the broker and the job keeps its attempt (a managed retry there cost one per stop).

        Before, a full disk cost an attempt per try: the managed retries (4 + 12 + 36 + 108 s by default) were spent
        in less than three minutes, and every upload accepted before the disk filled ended ``failed`` however soon
        it was freed (an adversarial run: 200 s full, three of three failed; one client trickling a large body held
        the web's spool on the same disk full)."""
        run = _running.get() or _Run({}, time.monotonic(),
                                     time.monotonic() + self.services.settings.storage_wait_seconds)
        pause = STORAGE_RETRY_FIRST_SECONDS
        while True:
            if run.storage_failed is not None:  # one call of a hung store can take minutes: no more of them
                raise run.storage_failed
            try:
                return call()
            except StorageUnavailable as error:
                remaining = run.storage_deadline - time.monotonic()
                if remaining <= 0:
                    run.storage_failed = error
                    raise
                log.warning("storage unavailable, tried again in %g s: %s", min(pause, remaining), error)
                if self.stopping.wait(min(pause, remaining)):
                    raise StorageWaitInterrupted(error.detail, where=error.where) from error
                pause = min(pause * 2, STORAGE_RETRY_MAX_SECONDS)

    @contextlib.contextmanager
    def _staged(self, source_key: str, sha256: str) -> Iterator:
        """The original's bytes as a local file, checked against the SHA-256 taken at upload.

        A disk can lose what it said it had written: a thin-provisioned
        volume whose backing filled zeroed staged originals whose fsync had
        succeeded, and their jobs published a damaged ``original`` (an
        adversarial review). Hashing costs about 3 ms of CPU for 5 MB.
        """
        try:
            with contextlib.ExitStack() as fetched:
                path = self._outlasting_storage(
                    lambda: fetched.enter_context(self.services.storage.fetch_to_path(source_key)))
                found = content_key(path)
                if found != sha256:
                    raise OriginalCorrupted(f"the stored original's SHA-256 is {found[:12]}…, not the upload's "
                                            f"{sha256[:12]}…: its bytes were damaged in storage")
                yield path
        except ObjectNotFound:
            raise StagingMissing("the staged original is missing") from None

    def _make_objects(self, attachment, version: pipeline.PipelineVersion, names: list[str],
                      path) -> tuple[dict[str, dict], Exception | None]:
        """Make ``names`` (costliest first) on two threads: the encoders and the resampling release the GIL.

        Each variant is made as its own render step would make it. Returns
        what was made and, once all have stopped, the error to record if any
        failed: one that retrying cannot help (a corrupt image) before one
        that may heal (a storage blip in a costlier variant's write), as
        separate render steps would each have recorded theirs.
        """
        def make(name: str) -> dict:
            with bound(variant=name):
                faults.point("during_render")
                faults.point("render_hangs")
                return self._make_object(attachment, version, name, path)

        if not names:
            return {}, None
        with ThreadPoolExecutor(max_workers=INLINE_THREADS, thread_name_prefix="inline-render") as pool:
            futures = {name: pool.submit(contextvars.copy_context().run, make, name) for name in names}
        raised = {name: future.exception() for name, future in futures.items()}
        made = {name: futures[name].result() for name, error in raised.items() if error is None}
        # stable: the permanent ones first, each kind in costliest-first order
        errors = sorted((error for error in raised.values() if error is not None), key=retryable)
        for other in errors[1:]:
            log.info("inline render also failed: %s: %s", error_code(other), sanitized_reason(other))
        return made, errors[0] if errors else None

    def _staged_or_none(self, source_key: str | None, sha256: str):
        return self._staged(source_key, sha256) if source_key is not None else contextlib.nullcontext()

    def _record_variants(self, conn, job, attempt: int, made: dict[str, dict]) -> None:
        """The effects' rows, fenced by the caller, in one statement (a small image's inspect records five: one
        round trip each cost its outcome transaction some 2 ms); the effect key makes a second row for a variant a
        no-op."""
        if made:
            conn.execute(_RECORD_VARIANT, [dict(job_id=job.id, attachment_id=job.attachment_id,
                                                pipeline_version=job.pipeline_version, variant=variant,
                                                attempt=attempt, **effect) for variant, effect in made.items()])

    def _make_object(self, attachment, version: pipeline.PipelineVersion, variant: str, path) -> dict:
        """Write ``variant``'s object: the ``original`` is copied from staging, the others rendered from ``path``."""
        storage = self.services.storage
        taints = frozenset(attachment.taints or ())  # keys a frozen GC may still delete: written under others
        if variant == pipeline.ORIGINAL:
            key = objects.untainted(pipeline.original_key(attachment.id, attachment.sha256), taints)
            info = self._outlasting_storage(lambda: storage.stat(key))  # kept by an earlier version or try
            if info is None or info.size != attachment.size:
                try:
                    info = self._outlasting_storage(lambda: storage.copy(attachment.staging_key, key))
                except ObjectNotFound:
                    raise StagingMissing("the staged original is missing") from None
            return dict(storage_key=key, content_type=attachment.content_type, size=info.size,
                        sha256=attachment.sha256, width=attachment.width, height=attachment.height,
                        provenance=provenance.of_original(attachment, version))
        rendered = imaging.render(path, version.specs[variant], self.services.limits, sha256=attachment.sha256)
        stripped = imaging.stripped_metadata(path, self.services.limits.max_decode_bytes)
        digest = hashlib.sha256(rendered.data).hexdigest()
        key = objects.untainted(pipeline.variant_key(attachment.id, version.version, variant, digest,
                                                     rendered.extension), taints)
        self._outlasting_storage(lambda: storage.put_bytes(key, rendered.data, content_type=rendered.content_type))
        return dict(storage_key=key, content_type=rendered.content_type, size=len(rendered.data), sha256=digest,
                    width=rendered.width, height=rendered.height,
                    provenance=provenance.of_render(attachment, version, variant, rendered, stripped))

    def _announce_next(self, conn, job, attempt: int) -> list[int]:
        version = pipeline.get(job.pipeline_version)
        recorded = states.recorded(conn, job.id)
        todo = [name for name in version.variants if name not in recorded]
        if not todo:
            return [outbox.announce(conn, job, attempt, Step.PUBLISH)]
        return [outbox.announce(conn, job, attempt, Step.RENDER, variant=name)
                for name in version.costliest_first(todo)]

    def _announce_publish_if_complete(self, conn, job, attempt: int, version) -> list[int]:
        # fence() locked the job row, so concurrent renders of one job
        # serialize here and exactly one of them sees the set complete
        # (redeliveries may announce again: harmless duplicates).
        if set(version.variants) <= states.recorded(conn, job.id):
            return [outbox.announce(conn, job, attempt, Step.PUBLISH)]
        return []

    def _time_out(self, job_id, attempt: int, lease: states.Lease, run: _Run) -> None:
        """The step ran past its time limit: its attempt's outcome is :class:`StepTimedOut` (raises while
        PostgreSQL does not take it: the heartbeat tries again)."""
        limit = self.services.settings.step_time_limit_seconds
        step = run.body["step"]
        outcome = self.record_failure(job_id, attempt, step, StepTimedOut(
            f"the {step} step ran longer than its time limit of {limit:g} s"), lease.owner)
        log.log(logging.INFO if outcome.status == "stale" else logging.ERROR,
                "step ran longer than its time limit of %g s: its attempt is %s (%s); the thread running it stays "
                "busy until its call returns", limit, outcome.status, outcome.detail)

    def _hand_off(self, conn, job_id, attempt: int, lease: states.Lease) -> None:
        """The step is done: the job waits for its next message without a short lease (see states.hand_off)."""
        states.hand_off(conn, job_id, attempt, lease.owner)

    @contextlib.contextmanager
    def _lease_kept(self, job_id, attempt: int, lease: states.Lease) -> Iterator[None]:
        """Heartbeat: extend the lease every third of its length while a long step runs; a missed beat is tried
        again every second (:data:`HEARTBEAT_RETRY_SECONDS`).

        Past the step's time limit (:attr:`_Run.deadline`) the heartbeat renews no more: it records the attempt's
        outcome, :class:`StepTimedOut` (retried as a lost worker is), and stops. The step's thread cannot be
        interrupted inside a call into C (a decoder, an encoder; Dramatiq's ``TimeLimit`` raises only between
        Python bytecodes, and an image made in inspect is waited for in a thread pool's join): before, a render
        that never returned renewed its lease for ever and its job stayed ``processing``. Should the call return,
        the step's fence finds the attempt taken back and it commits nothing (its objects are the object GC's).
        """
        stop = threading.Event()
        run = _running.get()
        deadline = run.deadline if run is not None else float("inf")

        every = states.heartbeat_seconds(lease.seconds)
        missed, holding = False, True

        def pause() -> float | None:
            """Until the next beat (a missed one, or the timeout's record: a second), or the deadline."""
            if missed:
                return min(HEARTBEAT_RETRY_SECONDS, every)
            if deadline == float("inf"):
                return every if holding else None
            left = max(0.0, deadline - time.monotonic())
            return min(every, left) if holding else left

        def beat() -> None:
            nonlocal missed, holding
            while not stop.wait(pause()):
                try:
                    if time.monotonic() >= deadline:
                        self._time_out(job_id, attempt, lease, run)
                        # Dramatiq's interrupt frees a step in Python; one still running as long again is in C
                        if not stop.wait(2 * step_interrupt_grace(self.services.settings.step_time_limit_seconds)):
                            log.critical("a step is still running %g s past its time limit, inside a call no "
                                         "exception reaches: its thread is lost to this worker process",
                                         time.monotonic() - deadline)
                            self.stuck()
                        return
                    # a lease this step no longer holds (a sibling render of its attempt handed off, or lease
                    # recovery took the attempt back) is not renewed, but the step's time limit still holds
                    if holding:
                        with transaction(self.services.engine) as conn:
                            holding = states.renew(conn, job_id, attempt, lease)
                except Exception:  # a missed beat is not fatal; the fence decides at commit
                    if not missed:
                        log.warning("lease heartbeat failed; tried again every %g s", HEARTBEAT_RETRY_SECONDS,
                                    exc_info=True)
                    missed = True
                else:
                    missed = False

        # the step's context (its log fields: job, attempt, step, variant) in the heartbeat's records too
        thread = threading.Thread(target=contextvars.copy_context().run, args=(beat,), name="lease-heartbeat",
                                  daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            # not a bounded wait: a timeout the heartbeat is recording must commit before the step's outcome
            # transaction fences (a step that went on after 5 s had its committed outcome taken back by it)
            thread.join()
