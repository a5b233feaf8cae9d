"""dead_letters: why each dead-lettered message died

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.Text, nullable=False),
        sa.Column("queue_name", sa.Text, nullable=False),
        sa.Column("actor_name", sa.Text, nullable=False),
        sa.Column("job_id", UUID(as_uuid=True)),
        sa.Column("error_code", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("retries", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("body", JSONB),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )
    op.create_index("dead_letters_message_idx", "dead_letters", ["message_id"])


def downgrade() -> None:
    op.drop_table("dead_letters")
