"""pending_uploads: each uploader's uploads not yet ready or failed

``ATTACHE_MAX_PENDING_PER_UPLOADER`` refuses an upload (``429``) while its
uploader has that many accepted uploads still to process: one uploader
could otherwise put any number of costly images ahead of everyone else's.
Counting reads at most the limit's rows of one uploader, whatever the size
of ``jobs`` (``app/core/pending.py``).

The rows follow ``jobs`` by trigger, not by attache's code: a job inserted
in its attachment's own transaction (the same ``created_at``: an upload's,
never a backfill's) is added, and its move to ``ready`` or ``failed``
removes it. The release runs this migration while the previous release's
processes still serve: its workers knew nothing of this table, and a row
they left behind for a finished job refused its uploader for good (an
adversarial run of a rolling deploy). Replays (``failed -> queued``, an
UPDATE) and backfills are the operators' work and never counted.

The uploads already waiting are counted from the start, replays excepted.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pending_uploads",
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("owner", sa.Text(), nullable=False),
    )
    op.create_index("pending_uploads_owner_idx", "pending_uploads", ["owner"])
    op.execute("""
        CREATE FUNCTION pending_uploads_follow() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                IF NEW.state IN ('queued', 'processing') AND EXISTS (
                        SELECT 1 FROM attachments WHERE id = NEW.attachment_id AND created_at = NEW.created_at) THEN
                    INSERT INTO pending_uploads (job_id, owner) VALUES (NEW.id, NEW.owner);
                END IF;
            ELSE
                DELETE FROM pending_uploads WHERE job_id = NEW.id;
            END IF;
            RETURN NULL;
        END $$""")
    op.execute("CREATE TRIGGER pending_uploads_made AFTER INSERT ON jobs "
               "FOR EACH ROW EXECUTE FUNCTION pending_uploads_follow()")
    op.execute("CREATE TRIGGER pending_uploads_settled AFTER UPDATE OF state ON jobs FOR EACH ROW "
               "WHEN (NEW.state IN ('ready', 'failed')) EXECUTE FUNCTION pending_uploads_follow()")
    op.execute("""
        INSERT INTO pending_uploads (job_id, owner)
        SELECT jobs.id, jobs.owner FROM jobs JOIN attachments ON attachments.id = jobs.attachment_id
        WHERE jobs.state IN ('queued', 'processing') AND jobs.created_at = attachments.created_at
          AND NOT EXISTS (SELECT 1 FROM job_history WHERE job_history.job_id = jobs.id
                          AND job_history.from_state = 'failed')
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS pending_uploads_settled ON jobs")
    op.execute("DROP TRIGGER IF EXISTS pending_uploads_made ON jobs")
    op.execute("DROP FUNCTION IF EXISTS pending_uploads_follow()")
    op.drop_index("pending_uploads_owner_idx", table_name="pending_uploads")
    op.drop_table("pending_uploads")
