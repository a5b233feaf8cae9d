"""webhook_deliveries: an index of the delivered ones by when, for their retention

``scheduler/delivery_retention.py`` deletes deliveries delivered longer
ago than ``ATTACHE_WEBHOOK_DELIVERY_RETENTION_SECONDS``, oldest first: the
table had grown by a row per event and subscription for ever (0.8 MB an
event at 2,000 subscriptions, an adversarial run).

Plain CREATE INDEX, as 0027's: writes to ``webhook_deliveries`` wait while
it builds; an index that exists already is left alone, so a large
deployment can build it ``CONCURRENTLY`` by hand beforehand, under this name.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("webhook_deliveries_delivered_idx", "webhook_deliveries", ["delivered_at"],
                    postgresql_where=sa.text("state = 'delivered'"), if_not_exists=True)


def downgrade() -> None:
    op.drop_index("webhook_deliveries_delivered_idx", table_name="webhook_deliveries", if_exists=True)
