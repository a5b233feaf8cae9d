"""webhook_subscriptions.disabled_after_event: where a disabled subscription's gap begins

A disable (an operator's, or the deliverer's on ``410 Gone``) was final:
the subscription's later events got no delivery, and the only way back
was registering the URL again, with a new secret, losing the gap's
events. ``enable`` now resumes a subscription and makes the deliveries
its events after this number would have had (``app/core/webhooks.py``).
The number is the event counter as the disable's statement read it: every
event numbered at or below it had its deliveries made already; a later
one may have (its transaction took the subscription's row before the
disable), and enable leaves an event that has its delivery. ``NULL`` on subscriptions disabled before this migration: their
enable recovers nothing (their gap is unknown) and says so.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_subscriptions", sa.Column("disabled_after_event", sa.BigInteger()))


def downgrade() -> None:
    op.drop_column("webhook_subscriptions", "disabled_after_event")
