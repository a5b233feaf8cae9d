"""room_held: what the unfinished jobs still write to storage, counted as they change

The web's room check (``app/core/room.py``) summed, about once a second
per web process and on every upload near its bound, what every ``queued``
or ``processing`` job still writes: a join of those jobs to their
attachments. With a backlog of 100,000 jobs among a million attachments
(what a long outage leaves) one such sum took PostgreSQL 0.5-0.6 s, with
two parallel workers, on a 2-core machine.

Each job now carries what it was counted to need when it was made
(``jobs.room_bytes``, :func:`app.core.room.need`), and triggers on
``jobs`` append what each change of a job does to the unfinished jobs' sum
to ``room_deltas`` (a job made, one ending ``ready`` or ``failed``, a
replay putting one back; a claim or a lease renewal changes nothing, and
fires nothing). The scheduler's ``counter_fold`` moves the deltas into
``room_total``'s one row, and the check reads both, as ``/metrics`` reads
``transition_counts`` (migration 0019).

Jobs made before this migration (or by the previous release's processes
while it rolls out) have no ``room_bytes``; the check still sums those
that are unfinished from their attachments, through an index of them
alone, which is empty once they are done (a few read by their keys, a
thousand or more summed as before). Nothing is written to existing
rows here: an ``UPDATE`` of a backlog in the release's transaction would
hold those jobs against their workers until it committed.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

UNFINISHED = "('queued', 'processing')"


def upgrade() -> None:
    # ADD COLUMN (no default: no rewrite) and CREATE TRIGGER wait for every transaction that touched jobs, and each
    # new statement on jobs waits behind them: a long transaction would hold the pipeline still; the release fails
    # instead, to be run again
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("jobs", sa.Column("room_bytes", sa.BigInteger()))
    op.create_table(
        "room_total",
        sa.Column("id", sa.SmallInteger(), primary_key=True, server_default=sa.text("1")),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name="room_total_one_row"),
    )
    op.execute("INSERT INTO room_total (id, bytes) VALUES (1, 0)")
    op.create_table(
        "room_deltas",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
    )
    # the jobs the triggers do not count: made without room_bytes and not done (none, once the backlog of the
    # release before is done); IF NOT EXISTS: a large deployment can build it CONCURRENTLY by hand beforehand
    op.execute(f"CREATE INDEX IF NOT EXISTS jobs_room_uncounted_idx ON jobs (id) "
               f"WHERE room_bytes IS NULL AND state IN {UNFINISHED}")
    # row triggers whose WHEN leaves out what changes nothing (a claim, a lease renewal): a statement trigger cannot
    # name its columns when it reads transition tables, and ran for each of them (some 60-100 µs of PostgreSQL an
    # UPDATE of one job, measured on a 2-core machine); a NULL room_bytes adds nothing (counted by the check itself)
    op.execute(f"""
        CREATE FUNCTION jobs_room_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            moved bigint := 0;
        BEGIN
            IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.state IN {UNFINISHED} THEN
                moved := moved + coalesce(NEW.room_bytes, 0);
            END IF;
            IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state IN {UNFINISHED} THEN
                moved := moved - coalesce(OLD.room_bytes, 0);
            END IF;
            IF moved <> 0 THEN
                INSERT INTO room_deltas (bytes) VALUES (moved);
            END IF;
            RETURN NULL;
        END $$""")
    op.execute(f"CREATE TRIGGER jobs_room_inserted AFTER INSERT ON jobs FOR EACH ROW "
               f"WHEN (NEW.state IN {UNFINISHED} AND NEW.room_bytes IS NOT NULL) EXECUTE FUNCTION jobs_room_changed()")
    op.execute(f"CREATE TRIGGER jobs_room_updated AFTER UPDATE OF state, room_bytes ON jobs FOR EACH ROW "
               f"WHEN ((OLD.state IN {UNFINISHED}) IS DISTINCT FROM (NEW.state IN {UNFINISHED}) "
               f"OR OLD.room_bytes IS DISTINCT FROM NEW.room_bytes) EXECUTE FUNCTION jobs_room_changed()")
    op.execute(f"CREATE TRIGGER jobs_room_deleted AFTER DELETE ON jobs FOR EACH ROW "
               f"WHEN (OLD.state IN {UNFINISHED} AND OLD.room_bytes IS NOT NULL) EXECUTE FUNCTION jobs_room_changed()")


def downgrade() -> None:
    for name in ("jobs_room_inserted", "jobs_room_updated", "jobs_room_deleted"):
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON jobs")
    op.execute("DROP FUNCTION IF EXISTS jobs_room_changed()")
    op.execute("DROP INDEX IF EXISTS jobs_room_uncounted_idx")
    op.drop_table("room_deltas")
    op.drop_table("room_total")
    op.drop_column("jobs", "room_bytes")
