"""indexes for the sweeps: variants.storage_key, variants.job_id, attachments.staging_key, live versions

Object GC and retirement look variants up by storage key, the staging
cleanup looks attachments up by staging key, and every step looks a job's
variants up by job id; without these indexes each lookup scanned its whole
table (``make bench`` prints both figures). Retirement starts its search
from the oldest pipeline version that still has live (published, not
retired) rows: a partial index holds exactly those rows.

A plain CREATE INDEX: it runs inside the release's migration transaction
(one advisory lock for concurrent releases) and holds off writes to the
table while it builds, about a second per million variant rows.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("variants_storage_key_idx", "variants", ["storage_key"])
    op.create_index("variants_job_idx", "variants", ["job_id"])
    op.create_index("attachments_staging_key_idx", "attachments", ["staging_key"])
    op.create_index("variants_live_version_idx", "variants", ["pipeline_version"],
                    postgresql_where=sa.text("published_at IS NOT NULL AND retired_at IS NULL"))


def downgrade() -> None:
    op.drop_index("variants_live_version_idx", table_name="variants")
    op.drop_index("attachments_staging_key_idx", table_name="attachments")
    op.drop_index("variants_job_idx", table_name="variants")
    op.drop_index("variants_storage_key_idx", table_name="variants")
