"""initial schema: attachments, jobs, job_history, variants, outbox

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NOW = sa.text("now()")

READY_GUARD = """
CREATE OR REPLACE FUNCTION attache_ready_is_terminal() RETURNS trigger AS $$
BEGIN
    IF OLD.state = 'ready' AND NEW.state <> 'ready' THEN
        RAISE EXCEPTION 'job % is ready; ready never regresses', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""


def upgrade() -> None:
    op.create_table(
        "attachments",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("content_type", sa.Text, nullable=False),
        sa.Column("format", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("height", sa.Integer, nullable=False),
        sa.Column("staging_key", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    )
    op.create_table(
        "jobs",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("attachment_id", UUID(as_uuid=True), sa.ForeignKey("attachments.id"), nullable=False),
        sa.Column("pipeline_version", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True)),
        sa.Column("error_code", sa.Text),
        sa.Column("error_reason", sa.Text),
        sa.Column("traceparent", sa.Text, nullable=False),
        sa.Column("tracestate", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("ready_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("attachment_id", "pipeline_version", name="jobs_attachment_version_key"),
        sa.CheckConstraint("state IN ('queued', 'processing', 'ready', 'failed')", name="jobs_state_check"),
        sa.CheckConstraint("state <> 'failed' OR error_code IS NOT NULL", name="jobs_failed_has_code"),
        sa.CheckConstraint("state <> 'processing' OR lease_expires_at IS NOT NULL", name="jobs_processing_has_lease"),
        sa.CheckConstraint("attempt >= 0", name="jobs_attempt_check"),
    )
    op.create_index("jobs_lease_expiry_idx", "jobs", ["lease_expires_at"], postgresql_where=sa.text("state = 'processing'"))
    op.create_index("jobs_state_idx", "jobs", ["state", "pipeline_version"])
    op.create_table(
        "job_history",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("from_state", sa.Text),
        sa.Column("to_state", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("error_code", sa.Text),
        sa.Column("reason", sa.Text),
    )
    op.create_index("job_history_job_idx", "job_history", ["job_id", "id"])
    op.create_table(
        "variants",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("attachment_id", UUID(as_uuid=True), sa.ForeignKey("attachments.id"), nullable=False),
        sa.Column("pipeline_version", sa.Integer, nullable=False),
        sa.Column("variant", sa.Text, nullable=False),
        sa.Column("storage_key", sa.Text, nullable=False),
        sa.Column("content_type", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("height", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("published_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("attachment_id", "pipeline_version", "variant", name="variants_effect_key"),
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("message_id", UUID(as_uuid=True), nullable=False, unique=True),
        sa.Column("queue_name", sa.Text, nullable=False),
        sa.Column("actor_name", sa.Text, nullable=False),
        sa.Column("payload", JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("available_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("published_at", sa.DateTime(timezone=True)),
        sa.Column("publish_attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", sa.Text),
    )
    op.create_index("outbox_pending_idx", "outbox", ["available_at"], postgresql_where=sa.text("published_at IS NULL"))
    # Belt and braces for "ready never regresses": whatever the code does,
    # PostgreSQL refuses to move a job out of `ready`.
    op.execute(READY_GUARD)
    op.execute("CREATE TRIGGER jobs_ready_is_terminal BEFORE UPDATE OF state ON jobs "
               "FOR EACH ROW EXECUTE FUNCTION attache_ready_is_terminal()")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_ready_is_terminal ON jobs")
    op.execute("DROP FUNCTION IF EXISTS attache_ready_is_terminal()")
    for table in ("outbox", "variants", "job_history", "jobs", "attachments"):
        op.drop_table(table)
