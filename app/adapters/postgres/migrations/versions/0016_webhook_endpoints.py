"""webhook_endpoints: the deliverer's own record of each subscription's endpoint

``last_claimed_at``: when the deliverer last took one of the subscription's
deliveries. Free threads go to the endpoint taken longest ago; the order was
read from the pending deliveries' own ``updated_at``, so a hanging endpoint
whose tried delivery ended ``failed`` (or was redelivered) counted as never
tried and went before a healthy one again. ``resume_at``: the endpoint asked
to be left alone until then (``429``, ``502``, ``503`` or ``504``, or any
answer with ``Retry-After``: Standard Webhooks' "throttle"); no delivery of
the subscription is sent before it. A row of its own, written by the
deliverer only, so that claiming never waits on the subscription's row,
which every event's transaction updates (its delivery counter).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("subscription_id", UUID(as_uuid=True), sa.ForeignKey("webhook_subscriptions.id"),
                  primary_key=True),
        sa.Column("last_claimed_at", sa.DateTime(timezone=True)),
        sa.Column("resume_at", sa.DateTime(timezone=True)),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_table("webhook_endpoints")
