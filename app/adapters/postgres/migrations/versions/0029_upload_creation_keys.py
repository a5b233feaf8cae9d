"""uploads: the Idempotency-Key a creation was sent with, one upload per key and uploader

A creation whose answer was lost (the link dropped after the request went
out) was sent again by tus-js-client and made a second upload; the first
stayed open, empty, for a day and counted against the uploader's limits:
half the creation answers lost left 100 such uploads after about 100
files, and every creation was then ``429 too_many_open_uploads`` for up to
a day (an adversarial run). A creation sent with a key the uploader used
for an upload that is still there answers that upload.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("uploads", sa.Column("creation_key", sa.Text()))
    op.create_index("uploads_creation_key", "uploads", ["owner", "creation_key"], unique=True,
                    postgresql_where=sa.text("creation_key IS NOT NULL"), if_not_exists=True)


def downgrade() -> None:
    op.drop_index("uploads_creation_key", table_name="uploads", if_exists=True)
    op.drop_column("uploads", "creation_key")
