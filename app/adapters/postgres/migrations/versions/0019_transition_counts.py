"""transition_counts: the job_history counters of /metrics, kept as it grows

``/metrics`` counted every transition (``attache_job_transitions_total``,
``attache_retries_total``, ``attache_lease_expiries_total``,
``attache_reconciler_reannounced_total``) with a ``GROUP BY`` over the whole
of ``job_history``, which grows with every transition for ever: 0.3 s of
a 0.6 s scrape at a million uploads (three million rows), ten times that
at ten million, toward Prometheus's 10 s scrape timeout.

A statement trigger on ``job_history`` now appends what each insert added
to ``transition_deltas`` (one row per transition kind and statement: no
row is updated, so concurrent transitions never wait for each other); the
scheduler's ``counter_fold`` moves the deltas into ``transition_counts``
in one transaction (``app/adapters/postgres/transition_counts.py``), and a scrape reads both
tables in one statement: exact, whatever a fold does meanwhile.

The existing rows are counted here, in the migration's transaction, after
the trigger is created: ``CREATE TRIGGER`` locks ``job_history`` against
inserts until the migration commits, so no transition is counted twice or
missed (transitions of the previous release's processes wait: some 0.3 s
a million uploads).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # CREATE TRIGGER waits for every transaction that touched job_history, and each new insert waits behind it:
    # a long transaction would hold the pipeline still; the release fails instead, to be run again
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.create_table(
        "transition_counts",
        sa.Column("from_state", sa.Text(), primary_key=True),
        sa.Column("to_state", sa.Text(), primary_key=True),
        sa.Column("worker_lost", sa.Boolean(), primary_key=True),
        sa.Column("total", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "transition_deltas",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("from_state", sa.Text(), nullable=False),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("worker_lost", sa.Boolean(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
    )
    op.execute("""
        CREATE FUNCTION job_history_counted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO transition_deltas (from_state, to_state, worker_lost, rows)
            SELECT coalesce(from_state, 'none'), to_state, coalesce(error_code = 'worker_lost', false), count(*)
            FROM added GROUP BY 1, 2, 3;
            RETURN NULL;
        END $$""")
    op.execute("CREATE TRIGGER job_history_counted AFTER INSERT ON job_history REFERENCING NEW TABLE AS added "
               "FOR EACH STATEMENT EXECUTE FUNCTION job_history_counted()")
    op.execute("INSERT INTO transition_counts (from_state, to_state, worker_lost, total) "
               "SELECT coalesce(from_state, 'none'), to_state, coalesce(error_code = 'worker_lost', false), count(*) "
               "FROM job_history GROUP BY 1, 2, 3")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_history_counted ON job_history")
    op.execute("DROP FUNCTION IF EXISTS job_history_counted()")
    op.drop_table("transition_deltas")
    op.drop_table("transition_counts")
