"""pipeline versions: recorded fingerprints, retired variants

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipeline_versions",
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("fingerprint", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )
    op.add_column("variants", sa.Column("retired_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("variants", "retired_at")
    op.drop_table("pipeline_versions")
