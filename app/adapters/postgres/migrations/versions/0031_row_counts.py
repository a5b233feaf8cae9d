"""row_counts: the uploads and the jobs per state of /metrics, counted as their rows change

``/metrics`` still counted ``attachments`` whole (``attache_uploads_total``)
and grouped ``jobs`` whole by state and pipeline version
(``attache_jobs``) at every scrape: both grow with every upload for ever,
some 0.3 s at a million rows.

They are now counted as ``transition_counts`` counts the transitions
(migration 0019): a statement trigger on ``attachments`` appends each
insert's rows to ``upload_deltas``; statement triggers on ``jobs`` append
each insert's (+) and each delete's (-) rows per ``(state,
pipeline_version)`` to ``job_deltas``, and a row trigger each job's move
between them (- where it was, + where it is). The scheduler's
``counter_fold`` moves the deltas into ``upload_total`` and
``job_counts``, and a scrape adds up each total and its deltas in one
statement (``app/adapters/postgres/row_counts.py``). The update's trigger
is a row trigger whose ``WHEN`` leaves out what moves no job (a fence, a
heartbeat, a hand-off, ``room_bytes``), as migration 0030's: a statement
trigger cannot name its columns when it reads transition tables, and ran
for every one of those (some 60-100 µs of PostgreSQL an ``UPDATE`` of one
job, measured for 0030). Nothing counts an attachment's deletion:
``attache_uploads_total`` counts accepted uploads and never goes down
(attache deletes no attachment anyway).

The existing rows are counted here, so an upgraded database reports what
it reported before. ``attachments`` and then ``jobs`` are locked first
(``SHARE ROW EXCLUSIVE``: reads go on, every insert, update and delete
waits until the migration commits, and then fires the triggers), in the
order an upload writes them (no deadlock with one); the count, in the
same transaction, sees every row committed before the lock and none
after: none is missed or counted twice. Uploads and the pipeline wait for
the two scans (some 0.3 s each at a million rows: a ``count(*)``, not
0026's join, whose scan held uploads back for 70-78 s).

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-08
"""
import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

#: a job moved between ``(state, pipeline_version)`` pairs (a row trigger's ``WHEN``): what a change of its
#: state or version does, and a fence, a heartbeat or a hand-off does not
MOVED = "(OLD.state IS DISTINCT FROM NEW.state OR OLD.pipeline_version IS DISTINCT FROM NEW.pipeline_version)"
#: the statement triggers on ``jobs``: (name, transition table, sign of its count, event, NEW or OLD)
JOBS_COUNTED = (("jobs_counted_inserted", "added", "", "INSERT", "NEW"),
                ("jobs_counted_deleted", "removed", "-", "DELETE", "OLD"))


def upgrade() -> None:
    # as 0019 and 0030: the locks wait for every transaction writing the two tables; a long one fails the release,
    # to be run again, rather than holding the pipeline still behind it
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute("LOCK TABLE attachments, jobs IN SHARE ROW EXCLUSIVE MODE")
    op.create_table(
        "upload_total",
        sa.Column("id", sa.SmallInteger(), primary_key=True, server_default=sa.text("1")),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name="upload_total_one_row"),
    )
    op.create_table(
        "upload_deltas",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("rows", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "job_counts",
        sa.Column("state", sa.Text(), primary_key=True),
        sa.Column("pipeline_version", sa.Integer(), primary_key=True),
        sa.Column("total", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "job_deltas",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("pipeline_version", sa.Integer(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
    )
    op.execute("""
        CREATE FUNCTION attachments_counted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO upload_deltas (rows) SELECT count(*) FROM added HAVING count(*) > 0;
            RETURN NULL;
        END $$""")
    op.execute("CREATE TRIGGER attachments_counted AFTER INSERT ON attachments REFERENCING NEW TABLE AS added "
               "FOR EACH STATEMENT EXECUTE FUNCTION attachments_counted()")
    for name, rows, sign, event, table in JOBS_COUNTED:  # each insert's jobs (+), each delete's (-)
        op.execute(f"""
            CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO job_deltas (state, pipeline_version, rows)
                SELECT state, pipeline_version, {sign}count(*) FROM {rows} GROUP BY 1, 2;
                RETURN NULL;
            END $$""")
        op.execute(f"CREATE TRIGGER {name} AFTER {event} ON jobs REFERENCING {table} TABLE AS {rows} "
                   f"FOR EACH STATEMENT EXECUTE FUNCTION {name}()")
    op.execute("""
        CREATE FUNCTION jobs_counted_moved() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO job_deltas (state, pipeline_version, rows)
            VALUES (OLD.state, OLD.pipeline_version, -1), (NEW.state, NEW.pipeline_version, 1);
            RETURN NULL;
        END $$""")
    op.execute(f"CREATE TRIGGER jobs_counted_moved AFTER UPDATE OF state, pipeline_version ON jobs FOR EACH ROW "
               f"WHEN {MOVED} EXECUTE FUNCTION jobs_counted_moved()")
    op.execute("INSERT INTO upload_total (id, total) SELECT 1, count(*) FROM attachments")
    op.execute("INSERT INTO job_counts (state, pipeline_version, total) "
               "SELECT state, pipeline_version, count(*) FROM jobs GROUP BY 1, 2")


def downgrade() -> None:
    on_jobs = (*(name for name, *_ in JOBS_COUNTED), "jobs_counted_moved")
    op.execute("DROP TRIGGER IF EXISTS attachments_counted ON attachments")
    for name in on_jobs:
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON jobs")
    for name in ("attachments_counted", *on_jobs):
        op.execute(f"DROP FUNCTION IF EXISTS {name}()")
    op.drop_table("job_deltas")
    op.drop_table("job_counts")
    op.drop_table("upload_deltas")
    op.drop_table("upload_total")
