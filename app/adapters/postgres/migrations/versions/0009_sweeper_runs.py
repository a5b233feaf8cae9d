"""sweeper_runs, sweeper_items: what each maintenance service did, and when it last succeeded

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeper_runs",
        sa.Column("service", sa.Text, primary_key=True),
        sa.Column("interval_seconds", sa.Float, nullable=False),
        sa.Column("runs_ok", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("runs_skipped", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("runs_failed", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("first_run_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("last_success_at", sa.DateTime(timezone=True)),
        sa.Column("last_duration_seconds", sa.Float, nullable=False, server_default=sa.text("0")),
    )
    op.create_table(
        "sweeper_items",
        sa.Column("service", sa.Text, primary_key=True),
        sa.Column("action", sa.Text, primary_key=True),
        sa.Column("total", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_table("sweeper_items")
    op.drop_table("sweeper_runs")
