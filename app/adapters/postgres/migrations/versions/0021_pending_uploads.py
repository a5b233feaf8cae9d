"""pending_uploads: each uploader's uploads not yet ready or failed

``ATTACHE_MAX_PENDING_PER_UPLOADER`` refuses an upload (``429``) while its
uploader has that many accepted uploads still to process: one uploader
could otherwise put any number of costly images ahead of everyone else's.
The upload's transaction adds its job here and the job's move to
``ready`` or ``failed`` removes it (``app/core/pending.py``), so the count
is an index scan of at most the limit's rows, whatever the size of
``jobs``. Backfills and replays, the operators' work, are not counted.

The jobs of uploads already waiting are counted from the start: a job made
in its attachment's own transaction (the same ``created_at``) that is not
finished.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pending_uploads",
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("owner", sa.Text(), nullable=False),
    )
    op.create_index("pending_uploads_owner_idx", "pending_uploads", ["owner"])
    op.execute("""
        INSERT INTO pending_uploads (job_id, owner)
        SELECT jobs.id, jobs.owner FROM jobs JOIN attachments ON attachments.id = jobs.attachment_id
        WHERE jobs.state IN ('queued', 'processing') AND jobs.created_at = attachments.created_at
    """)


def downgrade() -> None:
    op.drop_index("pending_uploads_owner_idx", table_name="pending_uploads")
    op.drop_table("pending_uploads")
