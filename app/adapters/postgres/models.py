"""The database schema (SQLAlchemy Core). PostgreSQL is the only source of truth.

Migrations in ``app/adapters/postgres/migrations/versions`` create exactly these tables; a
test compares the two so they cannot drift.

* ``attachments`` - one uploaded original: who owns it, the sanitized display
  name, what was sniffed and the server-generated storage keys.
* ``jobs`` - one logical piece of work ``(attachment_id, pipeline_version)``;
  the state machine in :mod:`app.core.states` is the only writer of ``state``.
* ``job_history`` - append-only audit trail, one row per transition.
* ``variants`` - the effects. ``(attachment_id, pipeline_version, variant)``
  is unique, so a variant can be recorded once and only once. A row with
  ``published_at IS NULL`` is a finished render step waiting for the
  publish step; rows become visible only when the publish transaction sets
  ``published_at`` together with flipping the job to ``ready``.
* ``dead_letters`` - why a message was dead-lettered (Dramatiq's dead
  letters carry no failure details): written by the worker's
  :class:`~app.adapters.broker.dead_letter_recorder.DeadLetterRecorder` when it gives up on one.
* ``audit_log`` - every operator action (replay, dead-letter requeue and
  purge): who, what, on which target, why.
* ``pipeline_versions`` - the fingerprint of each pipeline version's
  definition when its first job was made (see :mod:`app.core.pipeline`).
* ``idempotency_keys`` - ``Idempotency-Key`` of an upload per principal:
  a retried POST returns the attachment its first try created.
* ``step_runs`` - how long each step took, who ran it and how it ended (for
  ``attache_step_duration_seconds`` and a job's timeline); best effort,
  written after the step.
* ``uploads`` - a resumable (tus) upload in progress: who, how long, how
  far, its metadata and when it expires; ``attachment_id`` once its last
  byte went through the durable handoff (see :mod:`app.core.resumable`).
* ``outbox`` - every message is born here, in the transaction of the state
  change it announces; ``published_at`` is set when RabbitMQ confirmed it;
  ``claimed_until`` holds off other relays while one publishes the row.
* ``sweeper_runs`` - one row per maintenance service of the scheduler: its
  interval, how many rounds ended ok, skipped or failed, its first run and
  last success (for ``attache_sweeper_*``); upserted after every round.
* ``events`` - the completion events (``attachment.ready``, ``attachment.failed``,
  ``version.ready``), each written in the transaction of the transition it
  tells of; ``sequence`` is gapless and in commit order, assigned from the
  one row of ``event_counter`` (see :mod:`app.core.events`).
* ``webhook_subscriptions`` - the endpoints operators registered; ``last_sequence``
  is the per-subscription counter its deliveries are numbered from.
* ``webhook_deliveries`` - one event for one subscription, born with the event:
  pending, delivered or failed, with its attempts (see :mod:`app.core.webhooks`).
* ``sweeper_items`` - what each maintenance service did, added up over its
  rounds: one row per ``(service, action)``, e.g. ``(outbox_relay, published)``.
"""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

metadata = MetaData()



class JobState(StrEnum):
    """The values of ``jobs.state``; what each means and who moves a job in and out: :mod:`app.core.states`."""

    QUEUED = "queued"
    PROCESSING = "processing"
    READY = "ready"
    FAILED = "failed"


#: the states of a job that is not done: it may still read its attachment's staged original
UNFINISHED = (JobState.QUEUED, JobState.PROCESSING)


attachments = Table(
    "attachments",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("owner", Text, nullable=False),
    Column("filename", Text, nullable=False),
    Column("content_type", Text, nullable=False),
    Column("format", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("sha256", Text, nullable=False),
    Column("width", Integer, nullable=False),
    Column("height", Integer, nullable=False),
    Column("staging_key", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("attachments_staging_key_idx", attachments.c.staging_key)  # staging cleanup: who owns this object?
Index("attachments_created_idx", attachments.c.created_at)  # charts: uploads per minute; search: newest first
Index("attachments_owner_idx", attachments.c.owner, attachments.c.created_at)  # search and job lists by uploader
Index("attachments_sha256_idx", attachments.c.sha256,  # search: a sha256 or its start (LIKE 'abc%')
      postgresql_ops={"sha256": "text_pattern_ops"})
Index("attachments_filename_trgm_idx", attachments.c.filename,  # search: a filename fragment (ILIKE '%x%'), pg_trgm
      postgresql_using="gin", postgresql_ops={"filename": "gin_trgm_ops"})

jobs = Table(
    "jobs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("attachment_id", UUID(as_uuid=True), ForeignKey("attachments.id"), nullable=False),
    Column("pipeline_version", Integer, nullable=False),
    Column("state", Text, nullable=False),
    # the attachment's owner, copied when the job is created (it never changes): an uploader's job list by index
    Column("owner", Text, nullable=False),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False),
    Column("lease_owner", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("next_attempt_at", DateTime(timezone=True)),
    Column("error_code", Text),
    Column("error_reason", Text),
    Column("traceparent", Text, nullable=False),
    Column("tracestate", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("ready_at", DateTime(timezone=True)),
    # what the job was counted to write to storage when it was made (``app/core/room.py``); NULL for a job made
    # before migration 0030, whose need the room check sums from its attachment
    Column("room_bytes", BigInteger),
    UniqueConstraint("attachment_id", "pipeline_version", name="jobs_attachment_version_key"),
    CheckConstraint(f"state IN ({', '.join(repr(state.value) for state in JobState)})", name="jobs_state_check"),
    CheckConstraint(f"state <> '{JobState.FAILED}' OR error_code IS NOT NULL", name="jobs_failed_has_code"),
    CheckConstraint(f"state <> '{JobState.PROCESSING}' OR lease_expires_at IS NOT NULL",
                    name="jobs_processing_has_lease"),
    CheckConstraint("attempt >= 0", name="jobs_attempt_check"),
)
Index("jobs_lease_expiry_idx", jobs.c.lease_expires_at, postgresql_where=text(f"state = '{JobState.PROCESSING}'"))
Index("jobs_state_idx", jobs.c.state, jobs.c.pipeline_version)
# job lists, newest first, keyset-paginated on (created_at, id): unfiltered, by state, by error code
Index("jobs_created_idx", jobs.c.created_at, jobs.c.id)
Index("jobs_state_created_idx", jobs.c.state, jobs.c.created_at, jobs.c.id)
Index("jobs_owner_created_idx", jobs.c.owner, jobs.c.created_at, jobs.c.id)  # migration 0014
Index("jobs_room_uncounted_idx", jobs.c.id,  # migration 0030: the jobs the room triggers do not count
      postgresql_where=text(f"room_bytes IS NULL AND state IN ('{JobState.QUEUED}', '{JobState.PROCESSING}')"))
Index("jobs_error_code_idx", jobs.c.error_code, jobs.c.created_at, jobs.c.id,
      postgresql_where=text("error_code IS NOT NULL"))
Index("jobs_ready_idx", jobs.c.ready_at, postgresql_where=text("ready_at IS NOT NULL"))  # charts: ready per minute

job_history = Table(
    "job_history",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id"), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("from_state", Text),
    Column("to_state", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("actor", Text, nullable=False),
    Column("error_code", Text),
    Column("reason", Text),
)
Index("job_history_job_idx", job_history.c.job_id, job_history.c.id)
Index("job_history_errors_idx", job_history.c.at,  # charts: failures and retries by error code
      postgresql_where=text("error_code IS NOT NULL"))

variants = Table(
    "variants",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id"), nullable=False),
    Column("attachment_id", UUID(as_uuid=True), ForeignKey("attachments.id"), nullable=False),
    Column("pipeline_version", Integer, nullable=False),
    Column("variant", Text, nullable=False),
    Column("storage_key", Text, nullable=False),
    Column("content_type", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("sha256", Text, nullable=False),
    Column("width", Integer, nullable=False),
    Column("height", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("published_at", DateTime(timezone=True)),
    Column("retired_at", DateTime(timezone=True)),
    #: what made it (source, pipeline, renderer, encoder, stripped metadata); a trigger refuses changing it once
    #: published (migration 0013); null for variants recorded before
    Column("provenance", JSONB),
    UniqueConstraint("attachment_id", "pipeline_version", "variant", name="variants_effect_key"),
)
Index("variants_storage_key_idx", variants.c.storage_key)  # object GC, retirement: who references this key?
Index("variants_job_idx", variants.c.job_id)  # a job's effects (every step, the redelivery check)
Index("variants_live_version_idx", variants.c.pipeline_version,  # retirement: the oldest version still served
      postgresql_where=text("published_at IS NOT NULL AND retired_at IS NULL"))

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id"), nullable=False),
    Column("message_id", UUID(as_uuid=True), nullable=False, unique=True),
    Column("queue_name", Text, nullable=False),
    Column("actor_name", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("available_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("published_at", DateTime(timezone=True)),
    Column("publish_attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_error", Text),
    #: the relay's claim on an unpublished row while it publishes it (another relay skips it until then)
    Column("claimed_until", DateTime(timezone=True)),
)
Index("outbox_pending_idx", outbox.c.available_at, postgresql_where=text("published_at IS NULL"))
Index("outbox_job_idx", outbox.c.job_id, outbox.c.id)
Index("outbox_published_idx", outbox.c.published_at, outbox.c.created_at)  # charts: the backlog over time

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("message_id", Text, nullable=False),
    Column("queue_name", Text, nullable=False),
    Column("actor_name", Text, nullable=False),
    Column("job_id", UUID(as_uuid=True)),
    Column("error_code", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("retries", Integer, nullable=False, server_default=text("0")),
    Column("body", JSONB),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("dead_letters_message_idx", dead_letters.c.message_id)
Index("dead_letters_recorded_idx", dead_letters.c.recorded_at)  # charts: dead letters per queue

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("reason", Text),
    Column("details", JSONB),
)
Index("audit_log_target_idx", audit_log.c.target, audit_log.c.id)

pipeline_versions = Table(
    "pipeline_versions",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("fingerprint", Text, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

#: staged objects the staging cleanup decided to remove, from before its delete to after it (migration 0015)
staging_removals = Table(
    "staging_removals",
    metadata,
    Column("key", Text, primary_key=True),
    Column("decided_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

#: the object GC's decisions to remove an object under ``attachments/``, committed before it deletes and forgotten
#: after (``app/core/objects.py``); ``owner`` is the object's attachment id (or its key, for a key of no attachment)
object_removals = Table(
    "object_removals",
    metadata,
    Column("key", Text, primary_key=True),
    Column("owner", Text, nullable=False),
    Column("decided_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("object_removals_owner_idx", object_removals.c.owner)

#: keys whose removal another GC had to finish: the GC that decided it may still delete them, so the steps write
#: those variants under another key (``app/core/objects.py``, migration 0020)
object_taints = Table(
    "object_taints",
    metadata,
    Column("key", Text, primary_key=True),
    Column("owner", Text, nullable=False),
    Column("tainted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("object_taints_owner_idx", object_taints.c.owner)

# An upload's job until it is ready or failed (app/core/pending.py): what ATTACHE_MAX_PENDING_PER_UPLOADER counts.
# Backfills and replays are the operators' work and are not counted.
pending_uploads = Table(
    "pending_uploads",
    metadata,
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("owner", Text, nullable=False),
)
Index("pending_uploads_owner_idx", pending_uploads.c.owner)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("principal", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("request_sha256", Text, nullable=False),
    Column("attachment_id", UUID(as_uuid=True), ForeignKey("attachments.id"), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

step_runs = Table(
    "step_runs",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("step", Text, nullable=False),
    Column("variant", Text),
    Column("attempt", Integer, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("seconds", Float, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("worker", Text),  # who ran it (null for runs recorded before migration 0011)
)
Index("step_runs_finished_idx", step_runs.c.finished_at)
Index("step_runs_job_idx", step_runs.c.job_id, step_runs.c.id)  # a job's timeline

#: how a maintenance round ended; ``sweeper_runs`` has a ``runs_<outcome>`` counter for each
SWEEPER_OUTCOMES = ("ok", "skipped", "failed")

sweeper_runs = Table(
    "sweeper_runs",
    metadata,
    Column("service", Text, primary_key=True),
    Column("interval_seconds", Float, nullable=False),
    Column("runs_ok", BigInteger, nullable=False, server_default=text("0")),
    Column("runs_skipped", BigInteger, nullable=False, server_default=text("0")),
    Column("runs_failed", BigInteger, nullable=False, server_default=text("0")),
    Column("first_run_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_run_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_success_at", DateTime(timezone=True)),
    Column("last_duration_seconds", Float, nullable=False, server_default=text("0")),
)

#: ``job_history`` counted by transition (and whether a lease recovery wrote it), for ``/metrics``: what
#: ``counter_fold`` moved in (``app/adapters/postgres/transition_counts.py``), plus ``transition_deltas``, which
#: a trigger on ``job_history`` appends to per insert statement (migration 0019)
transition_counts = Table(
    "transition_counts",
    metadata,
    Column("from_state", Text, primary_key=True),
    Column("to_state", Text, primary_key=True),
    Column("worker_lost", Boolean, primary_key=True),
    Column("total", BigInteger, nullable=False),
)

transition_deltas = Table(
    "transition_deltas",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("from_state", Text, nullable=False),
    Column("to_state", Text, nullable=False),
    Column("worker_lost", Boolean, nullable=False),
    Column("rows", BigInteger, nullable=False),
)

#: the duration histograms of ``/metrics`` by histogram (``job``, ``attempt``, ``step``), label (a step's name, else
#: empty) and bucket (its upper bound, ``duration_bucket()``): what ``counter_fold`` moved in
#: (``app/adapters/postgres/duration_counts.py``), plus ``duration_deltas``, which triggers on ``job_history`` and
#: ``step_runs`` append to per insert statement (migration 0026)
duration_counts = Table(
    "duration_counts",
    metadata,
    Column("histogram", Text, primary_key=True),
    Column("label", Text, primary_key=True),
    Column("le", Float, primary_key=True),
    Column("total", BigInteger, nullable=False),
    Column("microseconds", BigInteger, nullable=False),
)

duration_deltas = Table(
    "duration_deltas",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("histogram", Text, nullable=False),
    Column("label", Text, nullable=False),
    Column("le", Float, nullable=False),
    Column("rows", BigInteger, nullable=False),
    Column("microseconds", BigInteger, nullable=False),
)

#: what the unfinished jobs still write to storage (``app/core/room.py``): what ``counter_fold`` moved in, plus
#: ``room_deltas``, which triggers on ``jobs`` append to per statement that changes it (migration 0030)
room_total = Table(
    "room_total",
    metadata,
    Column("id", SmallInteger, primary_key=True, server_default=text("1")),
    Column("bytes", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="room_total_one_row"),
)

room_deltas = Table(
    "room_deltas",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("bytes", BigInteger, nullable=False),
)

#: the attachments ever inserted, for ``/metrics``: what ``counter_fold`` moved in
#: (``app/adapters/postgres/row_counts.py``), plus ``upload_deltas``, which a trigger on ``attachments`` appends to
#: per insert statement (migration 0031)
upload_total = Table(
    "upload_total",
    metadata,
    Column("id", SmallInteger, primary_key=True, server_default=text("1")),
    Column("total", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="upload_total_one_row"),
)

upload_deltas = Table(
    "upload_deltas",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("rows", BigInteger, nullable=False),
)

#: the jobs per state and pipeline version, for ``/metrics``: what ``counter_fold`` moved in, plus ``job_deltas``,
#: which triggers on ``jobs`` append to per insert or delete statement and per job moved (migration 0031)
job_counts = Table(
    "job_counts",
    metadata,
    Column("state", Text, primary_key=True),
    Column("pipeline_version", Integer, primary_key=True),
    Column("total", BigInteger, nullable=False),
)

job_deltas = Table(
    "job_deltas",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("state", Text, nullable=False),
    Column("pipeline_version", Integer, nullable=False),
    Column("rows", BigInteger, nullable=False),
)

sweeper_items = Table(
    "sweeper_items",
    metadata,
    Column("service", Text, primary_key=True),
    Column("action", Text, primary_key=True),
    Column("total", BigInteger, nullable=False, server_default=text("0")),
)

uploads = Table(
    "uploads",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("owner", Text, nullable=False),
    Column("upload_length", BigInteger, nullable=False),
    Column("upload_offset", BigInteger, nullable=False, server_default=text("0")),
    Column("upload_metadata", Text),
    Column("filename", Text, nullable=False),
    Column("attachment_id", UUID(as_uuid=True), ForeignKey("attachments.id")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    # the whole upload's SHA-256 (hex) its creation's Repr-Digest promised, checked at the last byte (migration 0022)
    Column("expected_sha256", Text),
    #: the Idempotency-Key its creation was sent with: a creation sent again with it answers this upload (0029)
    Column("creation_key", Text),
    CheckConstraint("upload_length > 0 AND upload_offset BETWEEN 0 AND upload_length",
                    name="uploads_offset_check"),
    CheckConstraint("attachment_id IS NULL OR upload_offset = upload_length", name="uploads_complete_check"),
)
Index("uploads_expires_idx", uploads.c.expires_at)  # the staging cleanup: which uploads have expired?
Index("uploads_open_owner_idx", uploads.c.owner,  # a creation: the uploader's unfinished uploads (migration 0023)
      postgresql_where=text("attachment_id IS NULL"))
Index("uploads_creation_key", uploads.c.owner, uploads.c.creation_key, unique=True,
      postgresql_where=text("creation_key IS NOT NULL"))

#: the part each committed PATCH of a resumable upload stored: ``partial/{upload_id}/{offset:020d}.{token}``
#: (app.core.resumable; migration 0024). An upload with bytes and no row here was made before 0024: its parts are
#: keyed by offset alone.
upload_parts = Table(
    "upload_parts",
    metadata,
    Column("upload_id", UUID(as_uuid=True), ForeignKey("uploads.id", ondelete="CASCADE"), primary_key=True),
    Column("offset", BigInteger, primary_key=True),
    Column("token", Text, nullable=False),
)

#: the one row whose ``last_sequence`` numbers the events, gapless and in commit order
event_counter = Table(
    "event_counter",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("last_sequence", BigInteger, nullable=False, server_default=text("0")),
    CheckConstraint("id = 1", name="event_counter_one_row"),
)

events = Table(
    "events",
    metadata,
    Column("sequence", BigInteger, primary_key=True, autoincrement=False),
    Column("id", UUID(as_uuid=True), nullable=False, unique=True),
    Column("type", Text, nullable=False),
    Column("attachment_id", UUID(as_uuid=True), ForeignKey("attachments.id"), nullable=False),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id"), nullable=False),
    Column("owner", Text, nullable=False),
    #: the event exactly as webhooks deliver it and ``GET /v1/events`` returns it
    Column("document", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("events_owner_idx", events.c.owner, events.c.sequence)  # an uploader's replay cursor

webhook_subscriptions = Table(
    "webhook_subscriptions",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("url", Text, nullable=False),
    Column("events", ARRAY(Text), nullable=False),
    Column("uploader", Text),
    Column("secret", Text, nullable=False),
    Column("created_by", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("disabled_at", DateTime(timezone=True)),
    #: the event counter when it was disabled: its later events have no delivery until ``enable`` makes them
    Column("disabled_after_event", BigInteger),
    Column("last_sequence", BigInteger, nullable=False, server_default=text("0")),
)

#: the deliverer's own record of each subscription's endpoint (written by the deliverer only, so a claim never waits
#: on the subscription's row, which every event's transaction updates): when it last took one of its deliveries, and
#: the time before which the endpoint asked to be left alone (``Retry-After``, ``429``/``502``/``503``/``504``)
webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("subscription_id", UUID(as_uuid=True), ForeignKey("webhook_subscriptions.id"), primary_key=True),
    Column("last_claimed_at", DateTime(timezone=True)),
    Column("resume_at", DateTime(timezone=True)),
)

#: the states of ``webhook_deliveries.state``
WEBHOOK_DELIVERY_STATES = ("pending", "delivered", "failed")

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("subscription_id", UUID(as_uuid=True), ForeignKey("webhook_subscriptions.id"), nullable=False),
    Column("event_sequence", BigInteger, ForeignKey("events.sequence"), nullable=False),
    #: gapless per subscription, assigned in the transaction that wrote the event
    Column("sequence", BigInteger, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("claimed_until", DateTime(timezone=True)),
    Column("last_status", Integer),
    Column("last_error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("delivered_at", DateTime(timezone=True)),
    UniqueConstraint("subscription_id", "sequence", name="webhook_deliveries_sequence_key"),
    UniqueConstraint("subscription_id", "event_sequence", name="webhook_deliveries_event_key"),
    CheckConstraint(f"state IN ({', '.join(repr(s) for s in WEBHOOK_DELIVERY_STATES)})",
                    name="webhook_deliveries_state_check"),
)
Index("webhook_deliveries_due_idx", webhook_deliveries.c.next_attempt_at,
      postgresql_where=text("state = 'pending'"))
Index("webhook_deliveries_state_idx", webhook_deliveries.c.subscription_id, webhook_deliveries.c.state,
      webhook_deliveries.c.id)
#: the deliverer's claim (app/core/webhooks.py ``_CLAIM``, migration 0027): each subscription's earliest due
#: delivery, and whether one is in flight
Index("webhook_deliveries_pending_idx", webhook_deliveries.c.subscription_id, webhook_deliveries.c.next_attempt_at,
      webhook_deliveries.c.sequence, postgresql_where=text("state = 'pending'"))
Index("webhook_deliveries_claimed_idx", webhook_deliveries.c.subscription_id, webhook_deliveries.c.claimed_until,
      postgresql_where=text("state = 'pending' AND claimed_until IS NOT NULL"))

#: the retention of delivered ones (scheduler/delivery_retention.py, migration 0028), oldest first
Index("webhook_deliveries_delivered_idx", webhook_deliveries.c.delivered_at, postgresql_where=text("state = 'delivered'"))

#: browser sessions signed out before their cookie's age ran out (app.web.access, migration 0025): the cookie is
#: signed, not stored, so a copy of it stays valid until ``expires_at`` unless its session is named here
ended_sessions = Table(
    "ended_sessions",
    metadata,
    Column("id", Text, primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)
