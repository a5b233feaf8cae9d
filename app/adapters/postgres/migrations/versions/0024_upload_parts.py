"""upload_parts: the part each committed PATCH of a resumable upload stored, under a key of its own

Parts were keyed by their offset alone, and the row's lock was all that
kept two PATCHes from writing the same key. A PATCH whose session ended
while it stored its part (a frozen machine, a failover) lost the lock,
another PATCH took the offset and was answered ``204``, and the first,
thawed, replaced that part with its own bytes: the upload was accepted
spliced, or lost (an adversarial run). Each part now has its PATCH's own
token in its key, and a row here names the part a committed PATCH
stored at each offset (one row per offset: its primary key); only those
are joined. A row a PATCH, not an array in the upload's row: an array
is rewritten whole at each PATCH, quadratic in a client's many small
ones.

Uploads created before this revision have bytes and no rows here: their
parts stay keyed by offset alone, and a part an earlier release's web
stores meanwhile is joined too (``docs/deploy.md``: upgrade every web and
scheduler soon after this revision).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "upload_parts",
        sa.Column("upload_id", postgresql.UUID(as_uuid=True), sa.ForeignKey("uploads.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("offset", sa.BigInteger(), primary_key=True),
        sa.Column("token", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("upload_parts")
