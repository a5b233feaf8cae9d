"""duration_counts: the duration histograms of /metrics, counted as rows are written

``/metrics`` computed its three duration histograms
(``attache_job_duration_seconds``, ``attache_attempt_duration_seconds``,
``attache_step_duration_seconds``) over the newest 10,000 rows of their
tables at each scrape: a moving window whose ``_count``, ``_sum`` and
buckets went down as rows left it, which Prometheus's ``rate()`` takes for
counter resets (an adversarial run: renders pushed ``inspect`` out of the
step histogram's window).

They are now counted as ``transition_counts`` counts the transitions
(migration 0019): statement triggers append each insert's observations,
per histogram, label and bucket, to ``duration_deltas``; the scheduler's
``counter_fold`` moves them into ``duration_counts``, and a scrape adds up
both tables in one statement (``app/adapters/postgres/duration_counts.py``).

* job: a ``job_history`` row to ``ready``, the job's upload to it;
* attempt: a ``job_history`` row after one to ``processing`` of its job,
  the claim to what followed it (as the window measured it);
* step: a ``step_runs`` row, labelled with its step.

A bucket is named by its upper bound (``duration_bucket``, the one place
the bounds are written; ``/metrics`` reads them from it). The histograms
count from this migration on, as a process's own would from its start:
the rows already there are not counted (Prometheus takes the drop from the
window's counts for a reset, once). Counting them here, in the migration's
transaction, held ``job_history`` and ``step_runs`` locked against inserts
for the whole scan, and every upload was refused ``503`` for 70-78 s at
1.5 million uploads (an adversarial run): the triggers lock them only
until the migration commits, a few milliseconds.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

#: the buckets' upper bounds, seconds; the last is 'Infinity'
BOUNDS = ("0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "300", "1800")

#: the observations of the rows one statement inserted into job_history (``added``): histogram, label, seconds
JOB_HISTORY_OBSERVED = """
    SELECT 'job', '', extract(epoch FROM a.at - j.created_at)::float8
    FROM added a JOIN jobs j ON j.id = a.job_id WHERE a.to_state = 'ready'
    UNION ALL
    SELECT 'attempt', '', extract(epoch FROM a.at - claim.at)::float8
    FROM added a JOIN LATERAL (
        SELECT h.at, h.to_state FROM job_history h WHERE h.job_id = a.job_id AND h.id < a.id ORDER BY h.id DESC LIMIT 1
    ) claim ON claim.to_state = 'processing'
"""


#: an observation's part of a histogram's sum: whole microseconds, so a sum added up in any order is the same, and
#: never goes down (floats added up in another order by a fold moved it by their last place, either way, and
#: Prometheus takes a drop for a reset: a re-attack); 0 for what is no duration (negative, NaN, infinite, past 31
#: years), which would otherwise fail the insert it counts
MICROSECONDS = "CASE WHEN seconds >= 0 AND seconds < 1e9 THEN round(seconds * 1e6)::bigint ELSE 0 END"


def upgrade() -> None:
    # as 0019: the triggers' locks wait for every transaction writing the two tables; a long one fails the release
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.create_table(
        "duration_counts",
        sa.Column("histogram", sa.Text(), primary_key=True),
        sa.Column("label", sa.Text(), primary_key=True),
        sa.Column("le", sa.Float(), primary_key=True),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("microseconds", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "duration_deltas",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("histogram", sa.Text(), nullable=False),
        sa.Column("label", sa.Text(), nullable=False),
        sa.Column("le", sa.Float(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("microseconds", sa.BigInteger(), nullable=False),
    )
    op.execute(f"""
        CREATE FUNCTION duration_bounds() RETURNS float8[] LANGUAGE sql IMMUTABLE
        AS $$ SELECT ARRAY[{", ".join(BOUNDS)}, 'Infinity']::float8[] $$""")
    # one CASE, which the planner inlines: a function that looked the bound up in duration_bounds() was planned
    # at each statement that called it, and tripled the cost of an insert into step_runs
    op.execute(f"""
        CREATE FUNCTION duration_bucket(seconds float8) RETURNS float8 LANGUAGE sql IMMUTABLE
        AS $$ SELECT CASE {" ".join(f"WHEN seconds <= {bound} THEN {bound}::float8" for bound in BOUNDS)}
                          ELSE 'Infinity'::float8 END $$""")
    op.execute(f"""
        CREATE OR REPLACE FUNCTION job_history_counted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO transition_deltas (from_state, to_state, worker_lost, rows)
            SELECT coalesce(from_state, 'none'), to_state, coalesce(error_code = 'worker_lost', false), count(*)
            FROM added GROUP BY 1, 2, 3;
            INSERT INTO duration_deltas (histogram, label, le, rows, microseconds)
            SELECT histogram, label, duration_bucket(seconds), count(*), sum({MICROSECONDS})
            FROM ({JOB_HISTORY_OBSERVED}) observed (histogram, label, seconds)
            GROUP BY 1, 2, 3;
            RETURN NULL;
        END $$""")
    op.execute(f"""
        CREATE FUNCTION step_runs_counted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO duration_deltas (histogram, label, le, rows, microseconds)
            SELECT 'step', step, duration_bucket(seconds), count(*), sum({MICROSECONDS}) FROM added GROUP BY 2, 3;
            RETURN NULL;
        END $$""")
    op.execute("CREATE TRIGGER step_runs_counted AFTER INSERT ON step_runs REFERENCING NEW TABLE AS added "
               "FOR EACH STATEMENT EXECUTE FUNCTION step_runs_counted()")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS step_runs_counted ON step_runs")
    op.execute("DROP FUNCTION IF EXISTS step_runs_counted()")
    op.execute("""
        CREATE OR REPLACE FUNCTION job_history_counted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO transition_deltas (from_state, to_state, worker_lost, rows)
            SELECT coalesce(from_state, 'none'), to_state, coalesce(error_code = 'worker_lost', false), count(*)
            FROM added GROUP BY 1, 2, 3;
            RETURN NULL;
        END $$""")
    op.execute("DROP FUNCTION IF EXISTS duration_bucket(float8)")
    op.execute("DROP FUNCTION IF EXISTS duration_bounds()")
    op.drop_table("duration_deltas")
    op.drop_table("duration_counts")
