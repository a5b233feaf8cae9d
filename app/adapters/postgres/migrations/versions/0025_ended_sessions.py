"""ended_sessions: browser sessions signed out before their cookie's age ran out

The upload page's and the console's session is a signed cookie, never
stored: signing out cleared the browser's copy, and any other copy of it
(taken from a shared machine, a proxy's log, a stolen backup) kept its
principal's powers for the rest of its 12 hours (an adversarial run). A
session now carries an id of its own, a sign-out writes it here, and a
request riding on a session whose id is here is refused. A row is needed
only until the cookie would have expired anyway; each sign-out removes
the rows past that.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ended_sessions",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ended_sessions")
