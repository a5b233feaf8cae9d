"""jobs.owner: an uploader's jobs found through an index of their own

The job lists filtered by uploader (``/v1/ops/jobs?uploader=``, the
console, ``attache jobs list --uploader``) joined ``attachments`` on its
owner and walked ``jobs_created_idx`` newest first until a page was full.
For an uploader with few jobs, or none, that walk read the whole table:
an adversarial run on 300,000 jobs took 0.8-3 s per request, and 44 such
requests at once held every connection of the web's pools for 35 s,
answered two of them 500 and kept an upload waiting 15 s. Starting from
the uploader's attachments instead is as slow for an uploader with many
(0.74 s for 184,500). The owner is now copied onto the job when it is
created (it never changes), and ``jobs_owner_created_idx`` serves the
list the way ``jobs_state_created_idx`` serves a state's: a page costs
what its rows cost, whoever the uploader.

A job inserted without an owner gets its attachment's from a trigger
(``jobs_owner_default``): the release runs this migration while the
previous release's processes still serve, and they create jobs without
one (an adversarial run of the previous web against this schema answered
every upload 503 before the trigger). attache's own code names the owner.

The copy of existing rows is one ``UPDATE`` inside the release's
migration transaction, and ``ADD COLUMN`` locks ``jobs`` against reads as
well as writes until the migration commits (16.7 s for 450,000 jobs on a
loaded 2-core machine: some 37 s a million). The index is created ``IF
NOT EXISTS``, so a large deployment can build it ``CONCURRENTLY`` by hand
beforehand.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("owner", sa.Text()))
    op.execute("UPDATE jobs SET owner = attachments.owner FROM attachments WHERE attachments.id = jobs.attachment_id")
    op.alter_column("jobs", "owner", nullable=False)
    op.execute("CREATE INDEX IF NOT EXISTS jobs_owner_created_idx ON jobs (owner, created_at, id)")
    op.execute("""
        CREATE FUNCTION jobs_owner_default() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.owner IS NULL THEN
                SELECT owner INTO NEW.owner FROM attachments WHERE id = NEW.attachment_id;
            END IF;
            RETURN NEW;
        END $$""")
    op.execute("CREATE TRIGGER jobs_owner_default BEFORE INSERT ON jobs "
               "FOR EACH ROW EXECUTE FUNCTION jobs_owner_default()")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_owner_default ON jobs")
    op.execute("DROP FUNCTION IF EXISTS jobs_owner_default()")
    op.execute("DROP INDEX IF EXISTS jobs_owner_created_idx")
    op.drop_column("jobs", "owner")
