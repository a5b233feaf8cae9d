"""object_taints: keys a late delete may still reach, never written again

The object GC commits its decision to remove an object, then deletes it.
A GC that froze between the two (a paused VM: its session ends and frees
its lock) left the decision to the next round, which finishes it once
``ATTACHE_OBJECT_DECISION_GRACE_SECONDS`` has passed, so the
attachment's claims go on; a replayed attempt then rendered the same
content-addressed key, recorded it and was published ``ready``, and the
frozen GC, thawing, deleted it: a ready variant gone for good (an
adversarial run). No lock can reach a process that is frozen. So a key
whose removal another GC had to finish is tainted: the steps write such a
variant under another key (``app/core/objects.py``), which the late
delete does not name.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "object_taints",
        sa.Column("key", sa.Text(), primary_key=True),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("tainted_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("object_taints_owner_idx", "object_taints", ["owner"])


def downgrade() -> None:
    op.drop_index("object_taints_owner_idx", table_name="object_taints")
    op.drop_table("object_taints")
