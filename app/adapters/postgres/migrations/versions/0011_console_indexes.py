"""console: search and job-list indexes, chart indexes, step_runs.worker

The operator console finds an upload by id, sha256, uploader or a fragment
of its filename, lists jobs newest first with filters (keyset-paginated),
draws an hour or a day of activity, and shows each job's timeline. Without
these indexes each of those scanned a whole table: on a million
attachments a filename fragment took about 1 s (a parallel sequential
scan), a page of failed jobs 355 ms and an uploader's jobs 230 ms; with
them, 0.1–260 ms, 0.1 ms and 5 ms (``docs/operations.md``, "Finding an
upload", has the figures).

* ``pg_trgm`` (a contrib extension shipped with PostgreSQL, trusted since
  PostgreSQL 13: the database owner may create it) for a GIN trigram index
  on ``attachments.filename``, so ``ILIKE '%fragment%'`` is an index scan.
* ``step_runs.worker``: which worker ran a step (null for runs recorded
  before this migration).

Where the server does not ship ``pg_trgm`` (the embedded PostgreSQL of
single-node mode does not), the extension and its index are left out:
the search runs the same ``ILIKE``, as a scan.

Plain CREATE INDEX, inside the release's migration transaction: writes to
each table wait while its index builds (about 30 s for the trigram index
of a million attachments, 1–3 s for the others). An index that exists
already is left alone (``IF NOT EXISTS``), so a large deployment can build
them ``CONCURRENTLY`` by hand beforehand, under these names
(``docs/operations.md``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def trigram_available() -> bool:
    """Whether this server ships pg_trgm (a contrib extension; the embedded server does not)."""
    return bool(op.get_bind().execute(sa.text(
        "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")).scalar())


def upgrade() -> None:
    trigram = trigram_available()
    if trigram:
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    op.add_column("step_runs", sa.Column("worker", sa.Text))
    op.create_index("step_runs_job_idx", "step_runs", ["job_id", "id"], if_not_exists=True)
    op.create_index("attachments_created_idx", "attachments", ["created_at"], if_not_exists=True)
    op.create_index("attachments_owner_idx", "attachments", ["owner", "created_at"], if_not_exists=True)
    op.create_index("attachments_sha256_idx", "attachments", ["sha256"],
                    postgresql_ops={"sha256": "text_pattern_ops"}, if_not_exists=True)
    if trigram:
        op.create_index("attachments_filename_trgm_idx", "attachments", ["filename"], postgresql_using="gin",
                        postgresql_ops={"filename": "gin_trgm_ops"}, if_not_exists=True)
    op.create_index("jobs_created_idx", "jobs", ["created_at", "id"], if_not_exists=True)
    op.create_index("jobs_state_created_idx", "jobs", ["state", "created_at", "id"], if_not_exists=True)
    op.create_index("jobs_error_code_idx", "jobs", ["error_code", "created_at", "id"],
                    postgresql_where=sa.text("error_code IS NOT NULL"), if_not_exists=True)
    op.create_index("jobs_ready_idx", "jobs", ["ready_at"], postgresql_where=sa.text("ready_at IS NOT NULL"),
                    if_not_exists=True)
    op.create_index("job_history_errors_idx", "job_history", ["at"],
                    postgresql_where=sa.text("error_code IS NOT NULL"), if_not_exists=True)
    op.create_index("outbox_published_idx", "outbox", ["published_at", "created_at"], if_not_exists=True)
    op.create_index("dead_letters_recorded_idx", "dead_letters", ["recorded_at"], if_not_exists=True)


def downgrade() -> None:
    for name, table in (("dead_letters_recorded_idx", "dead_letters"), ("outbox_published_idx", "outbox"),
                        ("job_history_errors_idx", "job_history"), ("jobs_ready_idx", "jobs"),
                        ("jobs_error_code_idx", "jobs"), ("jobs_state_created_idx", "jobs"),
                        ("jobs_created_idx", "jobs"), ("attachments_filename_trgm_idx", "attachments"),
                        ("attachments_sha256_idx", "attachments"), ("attachments_owner_idx", "attachments"),
                        ("attachments_created_idx", "attachments"), ("step_runs_job_idx", "step_runs")):
        op.drop_index(name, table_name=table, if_exists=True)
    op.drop_column("step_runs", "worker")
