"""staging_removals: the staging cleanup commits its decision to remove a staged object before it removes it

The cleanup took the staged object's lock (a transaction-level advisory
lock, ``app/core/staging.py``), found no attachment row and removed the
object while holding it. A lock is its session's: a PostgreSQL restart, or
a cleanup paused past ``idle_in_transaction_session_timeout``, ended the
session and freed the lock while the cleanup went on to its delete. A web
paused past the grace period then took the lock, found the object still
there, committed and answered ``202``, and the delete removed the bytes:
the job failed ``staging_missing`` (an adversarial run, both ways). The
cleanup now commits a row here under the lock, then deletes, then forgets
the row; the upload's transaction looks for the row under the same lock
and refuses (``503``, retry) if it is there. A decision that committed
holds whatever becomes of the session that made it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "staging_removals",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_table("staging_removals")
