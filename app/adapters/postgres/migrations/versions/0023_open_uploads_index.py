"""uploads_open_owner_idx: each uploader's unfinished resumable uploads, counted at a creation

A creation is refused once its uploader has ``ATTACHE_MAX_OPEN_UPLOADS_PER_UPLOADER``
unfinished uploads or ``ATTACHE_MAX_OPEN_UPLOAD_BYTES_PER_UPLOADER`` declared
in them (nothing bounded them: one token made 3,200 in 10.6 s, each kept a
day, and filled a disk with their parts; an adversarial run). The count reads
this index's entries of one uploader, not the whole table.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX uploads_open_owner_idx ON uploads (owner) WHERE attachment_id IS NULL")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS uploads_open_owner_idx")
