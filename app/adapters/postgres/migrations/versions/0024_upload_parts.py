"""uploads.parts: the parts a resumable upload's committed PATCHes stored, each under a key of its own

Parts were keyed by their offset alone, and the row's lock was all that
kept two PATCHes from writing the same key. A PATCH whose session ended
while it stored its part (a frozen machine, a failover) lost the lock,
another PATCH took the offset and was answered ``204``, and the first,
thawed, replaced that part with its own bytes: the upload was accepted
spliced, or lost (an adversarial run). Each part now has its PATCH's own
token in its key, and the row names the parts its committed PATCHes
stored; only those are joined.

Uploads created before this revision keep ``parts`` NULL and their parts
keyed by offset (the column's default applies to new rows only).

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
    op.add_column("uploads", sa.Column("parts", postgresql.ARRAY(sa.Text()), nullable=True))
    op.alter_column("uploads", "parts", server_default=sa.text("'{}'"))


def downgrade() -> None:
    op.drop_column("uploads", "parts")
