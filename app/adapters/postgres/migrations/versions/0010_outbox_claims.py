"""outbox.claimed_until: the relay claims rows, commits, then publishes

The scheduler's outbox relay used to hold its batch's row locks (``FOR
UPDATE SKIP LOCKED``) while it waited on RabbitMQ for each confirm. It now
claims the batch in a short transaction (``claimed_until``, a lease another
relay skips until it lapses), commits, publishes, and marks each row after
its confirm. A nullable column without a default: adding it rewrites
nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("outbox", sa.Column("claimed_until", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("outbox", "claimed_until")
