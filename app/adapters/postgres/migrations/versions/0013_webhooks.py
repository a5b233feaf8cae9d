"""webhooks: completion events, subscriptions and their deliveries; a provenance record per variant

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

PROVENANCE_IS_IMMUTABLE = """
CREATE OR REPLACE FUNCTION attache_provenance_is_immutable() RETURNS trigger AS $$
BEGIN
    -- unpublishing is refused too: otherwise unpublish, change, publish again would rewrite it
    IF OLD.published_at IS NOT NULL
       AND (NEW.provenance IS DISTINCT FROM OLD.provenance OR NEW.published_at IS NULL) THEN
        RAISE EXCEPTION 'variant % is published; its provenance never changes', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""


def upgrade() -> None:
    op.add_column("variants", sa.Column("provenance", JSONB))
    op.execute(PROVENANCE_IS_IMMUTABLE)
    op.execute("CREATE TRIGGER variants_provenance_is_immutable BEFORE UPDATE ON variants "
               "FOR EACH ROW EXECUTE FUNCTION attache_provenance_is_immutable()")
    op.create_table(
        "event_counter",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("last_sequence", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.CheckConstraint("id = 1", name="event_counter_one_row"),
    )
    op.execute("INSERT INTO event_counter (id, last_sequence) VALUES (1, 0)")
    op.create_table(
        "events",
        sa.Column("sequence", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("id", UUID(as_uuid=True), nullable=False, unique=True),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("attachment_id", UUID(as_uuid=True), sa.ForeignKey("attachments.id"), nullable=False),
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("document", JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )
    op.create_index("events_owner_idx", "events", ["owner", "sequence"])
    op.create_table(
        "webhook_subscriptions",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", ARRAY(sa.Text), nullable=False),
        sa.Column("uploader", sa.Text),
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("created_by", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("disabled_at", sa.DateTime(timezone=True)),
        sa.Column("last_sequence", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("subscription_id", UUID(as_uuid=True), sa.ForeignKey("webhook_subscriptions.id"),
                  nullable=False),
        sa.Column("event_sequence", sa.BigInteger, sa.ForeignKey("events.sequence"), nullable=False),
        sa.Column("sequence", sa.BigInteger, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("claimed_until", sa.DateTime(timezone=True)),
        sa.Column("last_status", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("delivered_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("subscription_id", "sequence", name="webhook_deliveries_sequence_key"),
        sa.UniqueConstraint("subscription_id", "event_sequence", name="webhook_deliveries_event_key"),
        sa.CheckConstraint("state IN ('pending', 'delivered', 'failed')", name="webhook_deliveries_state_check"),
    )
    op.create_index("webhook_deliveries_due_idx", "webhook_deliveries", ["next_attempt_at"],
                    postgresql_where=sa.text("state = 'pending'"))
    op.create_index("webhook_deliveries_state_idx", "webhook_deliveries", ["subscription_id", "state", "id"])


def downgrade() -> None:
    for table in ("webhook_deliveries", "webhook_subscriptions", "events", "event_counter"):
        op.drop_table(table)
    op.execute("DROP TRIGGER IF EXISTS variants_provenance_is_immutable ON variants")
    op.execute("DROP FUNCTION IF EXISTS attache_provenance_is_immutable()")
    op.drop_column("variants", "provenance")
