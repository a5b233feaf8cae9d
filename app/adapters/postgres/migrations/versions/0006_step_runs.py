"""step_runs: duration and outcome of every pipeline step

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_runs",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("job_id", UUID(as_uuid=True), nullable=False),
        sa.Column("step", sa.Text, nullable=False),
        sa.Column("variant", sa.Text),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )
    op.create_index("step_runs_finished_idx", "step_runs", ["finished_at"])


def downgrade() -> None:
    op.drop_table("step_runs")
