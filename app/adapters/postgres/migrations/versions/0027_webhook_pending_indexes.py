"""webhook_deliveries: indexes of the pending deliveries, for the deliverer's claim

The claim looked at every due delivery and, for each, at its
subscription's every pending one (whether one was in flight): four
endpoints that never answered, 5,000 deliveries due each, made a claim
take up to 5.5 s, one at a time, and a healthy endpoint got 28 of 3,000
deliveries in 150 s (an adversarial run). It now takes each subscription
once: whether one of its deliveries is in flight (``..._claimed_idx``, the
few with a claim), and its earliest due delivery (``..._pending_idx``).

Plain CREATE INDEX, as 0011's: writes to ``webhook_deliveries`` (an
event's fan-out) wait while they build, a scan of the table; an index that
exists already is left alone, so a large deployment can build them
``CONCURRENTLY`` by hand beforehand, under these names.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("webhook_deliveries_pending_idx", "webhook_deliveries",
                    ["subscription_id", "next_attempt_at", "sequence"],
                    postgresql_where=sa.text("state = 'pending'"), if_not_exists=True)
    op.create_index("webhook_deliveries_claimed_idx", "webhook_deliveries", ["subscription_id", "claimed_until"],
                    postgresql_where=sa.text("state = 'pending' AND claimed_until IS NOT NULL"), if_not_exists=True)


def downgrade() -> None:
    op.drop_index("webhook_deliveries_claimed_idx", table_name="webhook_deliveries", if_exists=True)
    op.drop_index("webhook_deliveries_pending_idx", table_name="webhook_deliveries", if_exists=True)
