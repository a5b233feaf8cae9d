"""outbox_job_idx: the reconciler looks up each queued job's announcements

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("outbox_job_idx", "outbox", ["job_id", "id"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index("outbox_job_idx", table_name="outbox")
