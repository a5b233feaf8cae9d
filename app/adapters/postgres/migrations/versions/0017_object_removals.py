"""object_removals: the object GC commits its decision to remove an object before it removes it

The GC checked that no variant row referenced an object and no job of its
attachment was unfinished, then deleted it. An operator's replay between
the two (the delete slow on its storage: 15 s in an adversarial run) let a
worker claim the job, render the same content-addressed key, record it and
publish ``ready``; the delete then removed the fresh object, and the ready
attachment's variant answered ``500 effect_missing`` for good. The GC now
commits a row here under the attachment's lock before it deletes, and a
job's claim, under the same lock, waits while its attachment has one
(``app/core/objects.py``).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "object_removals",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        if_not_exists=True,
    )
    op.create_index("object_removals_owner_idx", "object_removals", ["owner"], if_not_exists=True)


def downgrade() -> None:
    op.drop_table("object_removals")
