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
* ``step_runs`` - how long each step took and how it ended (for
  ``attache_step_duration_seconds``); best effort, written after the step.
* ``outbox`` - every message is born here, in the transaction of the state
  change it announces; ``published_at`` is set when RabbitMQ confirmed it.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from enum import StrEnum

from sqlalchemy.dialects.postgresql import JSONB, UUID

metadata = MetaData()



class JobState(StrEnum):
    """The values of ``jobs.state``; what each means and who moves a job in and out: :mod:`app.core.states`."""

    QUEUED = "queued"
    PROCESSING = "processing"
    READY = "ready"
    FAILED = "failed"


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

jobs = Table(
    "jobs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("attachment_id", UUID(as_uuid=True), ForeignKey("attachments.id"), nullable=False),
    Column("pipeline_version", Integer, nullable=False),
    Column("state", Text, nullable=False),
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
    UniqueConstraint("attachment_id", "pipeline_version", name="jobs_attachment_version_key"),
    CheckConstraint(f"state IN ({', '.join(repr(state.value) for state in JobState)})", name="jobs_state_check"),
    CheckConstraint(f"state <> '{JobState.FAILED}' OR error_code IS NOT NULL", name="jobs_failed_has_code"),
    CheckConstraint(f"state <> '{JobState.PROCESSING}' OR lease_expires_at IS NOT NULL",
                    name="jobs_processing_has_lease"),
    CheckConstraint("attempt >= 0", name="jobs_attempt_check"),
)
Index("jobs_lease_expiry_idx", jobs.c.lease_expires_at, postgresql_where=text(f"state = '{JobState.PROCESSING}'"))
Index("jobs_state_idx", jobs.c.state, jobs.c.pipeline_version)

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
)
Index("outbox_pending_idx", outbox.c.available_at, postgresql_where=text("published_at IS NULL"))
Index("outbox_job_idx", outbox.c.job_id, outbox.c.id)

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
)
Index("step_runs_finished_idx", step_runs.c.finished_at)
