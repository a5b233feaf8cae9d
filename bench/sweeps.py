"""Sweep benchmark: object GC and retirement over 1,000,000 variant rows, with and without the sweep indexes.

A scratch database (migrated, then dropped) gets 250,000 ready v1 jobs with
4 variants each (1,000,000 rows, made by one ``INSERT ... SELECT
generate_series`` per table) plus 2,000 attachments whose v2 is ready, so
8,000 v1 rows are superseded. A scratch directory holds 1,000 objects two
hours old under ``attachments/``: 500 referenced, 500 not.

With the indexes the real ``ObjectGc.run_once`` and ``Retirement.run_once``
run and each batch (500 objects, 500 rows) is timed. Without them (the
reference, same data, same run) a full round would take minutes, so the
lookups a batch makes are timed on a sample and extrapolated to a batch;
the figures say so.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid

from sqlalchemy import create_engine, text

from app.adapters.postgres import db
from app.config import Settings
from app.services import Services
from scheduler.object_gc import ObjectGc, ObjectGcConfig, referenced_query
from scheduler.retirement import (
    Retirement,
    RetirementConfig,
    candidates_query,
    oldest_live_version_query,
    still_used_query,
)
from scheduler.staging_cleanup import owner_query

ADMIN_URL = os.environ.get("ATTACHE_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
ATTACHMENTS = 250_000
SUPERSEDED = 2_000
OBJECTS = 1_000
BATCH = 500
SAMPLE = 5
INDEXES = {
    "variants_storage_key_idx": "CREATE INDEX variants_storage_key_idx ON variants (storage_key)",
    "variants_job_idx": "CREATE INDEX variants_job_idx ON variants (job_id)",
    "attachments_staging_key_idx": "CREATE INDEX attachments_staging_key_idx ON attachments (staging_key)",
    "variants_live_version_idx": "CREATE INDEX variants_live_version_idx ON variants (pipeline_version) "
                                 "WHERE published_at IS NOT NULL AND retired_at IS NULL",
}

# ids in insertion order (like time-ordered ids), so the bulk load appends to its indexes instead of thrashing
# a small buffer cache; the attachments whose v2 is ready are spread evenly (every 125th)
_ATT = "('00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0'))::uuid"
_JOB = "('00000000-0000-4000-900' || v || '-' || lpad(to_hex(i), 12, '0'))::uuid"
_EVERY = ATTACHMENTS // SUPERSEDED
GENERATE = [
    f"""INSERT INTO attachments (id, owner, filename, content_type, format, size, sha256, width, height, staging_key)
        SELECT {_ATT}, 'bench', 'photo.jpg', 'image/jpeg', 'JPEG', 1000, md5('s' || i) || md5('t' || i),
               100, 100, 'staging/' || {_ATT}
        FROM generate_series(1, {ATTACHMENTS}) AS i""",
    f"""INSERT INTO jobs (id, attachment_id, owner, pipeline_version, state, attempt, max_attempts, traceparent,
                          ready_at)
        SELECT {_JOB}, {_ATT}, 'bench', v, 'ready', 1, 3, '00-' || md5('t' || i) || '-0000000000000001-01',
               now() - make_interval(days => 3 - v)
        FROM generate_series(1, 2) AS v, generate_series(1, {ATTACHMENTS}) AS i
        WHERE v = 1 OR mod(i, {_EVERY}) = 0""",
    """INSERT INTO variants (job_id, attachment_id, pipeline_version, variant, storage_key, content_type, size, sha256,
                             width, height, attempt, published_at)
        SELECT j.id, j.attachment_id, j.pipeline_version, name,
               CASE WHEN name = 'original' THEN 'attachments/' || j.attachment_id || '/original/' || a.sha256
                    ELSE 'attachments/' || j.attachment_id || '/v' || j.pipeline_version || '/' || name || '-'
                         || md5(name || j.id) || '.jpg' END,
               'image/jpeg', 1000, a.sha256, 100, 100, 1, j.ready_at
        FROM jobs j JOIN attachments a ON a.id = j.attachment_id,
             unnest(CASE WHEN j.pipeline_version = 1 THEN ARRAY['original', 'thumbnail', 'crop', 'optimized']
                         ELSE ARRAY['original', 'thumbnail', 'crop', 'optimized', 'webp'] END) AS name
        ORDER BY j.attachment_id, j.pipeline_version, name""",
]


# the candidate search before 0007: every live row probes for a newer ready job of its attachment
OLD_CANDIDATES = """SELECT v.id FROM variants v WHERE v.published_at IS NOT NULL AND v.retired_at IS NULL
    AND EXISTS (SELECT 1 FROM jobs n WHERE n.attachment_id = v.attachment_id AND n.pipeline_version > v.pipeline_version
                AND n.state = 'ready' AND n.ready_at <= now() - interval '1 hour')
    LIMIT 500 FOR UPDATE SKIP LOCKED"""


def _url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def _explain(conn, statement) -> str:
    sql = str(statement.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    return "\n".join("    " + line for line in conn.exec_driver_sql("EXPLAIN ANALYZE " + sql).scalars()
                     if "JIT" not in line and "Functions:" not in line and "Options:" not in line
                     and "Timing:" not in line)


def _timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


class _Timed:
    """Wraps a sweep's per-batch method to time each batch."""

    def __init__(self, target, name: str):
        self.times: list[float] = []
        original = getattr(target, name)

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.times.append(time.perf_counter() - began)

        setattr(target, name, timed)


def _objects(storage, engine) -> tuple[list[str], list[str]]:
    """500 referenced and 500 unreferenced objects under attachments/, two hours old."""
    with engine.connect() as conn:
        referenced = conn.execute(text("SELECT storage_key FROM variants WHERE variant = 'thumbnail' "
                                       "AND pipeline_version = 1 ORDER BY id DESC LIMIT :n"),
                                  {"n": OBJECTS // 2}).scalars().all()
    unreferenced = [f"attachments/{uuid.uuid4()}/v1/thumbnail-{uuid.uuid4().hex}.jpg" for _ in range(OBJECTS // 2)]
    past = time.time() - 7200
    for key in referenced + unreferenced:
        storage.put_bytes(key, b"x")
        os.utime(storage.root / key, (past, past))
    return referenced, unreferenced


def _reference(engine, referenced: list[str], unreferenced: list[str]) -> dict[str, float]:
    """Without the indexes: the lookups of one batch, timed on a sample and extrapolated."""
    with engine.connect() as conn:
        batch_keys = (referenced[: BATCH // 2] + unreferenced[: BATCH // 2])
        in_query = _timed(lambda: conn.execute(referenced_query(batch_keys)).all())
        one_key = statistics.median(_timed(lambda k=k: conn.execute(referenced_query([k])).all())
                                    for k in unreferenced[:SAMPLE])
        still_used = statistics.median(_timed(lambda k=k: conn.execute(still_used_query(k)).scalar())
                                       for k in referenced[:SAMPLE])
        owner = statistics.median(_timed(lambda i=i: conn.execute(owner_query(f"staging/{uuid.uuid4()}")).all())
                                  for i in range(SAMPLE))
        candidates = _timed(lambda: conn.execute(candidates_query(
            3600, BATCH, conn.execute(oldest_live_version_query()).scalar())).all())
        conn.rollback()
        old_shape = _timed(lambda: conn.exec_driver_sql(OLD_CANDIDATES).all())
        conn.rollback()
    return {
        # a GC batch: one IN query, then a re-check per unreferenced old key (half the batch here)
        "gc_batch": in_query + (BATCH // 2) * one_key,
        # a retirement batch: the candidate search + one still-used check per retired key
        "retire_batch": candidates + BATCH * still_used,
        "candidates": candidates,
        "old_shape": old_shape,
        "one_key": one_key,
        "still_used": still_used,
        "owner": owner,
    }


def main() -> int:
    name = f"attache_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(ADMIN_URL.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    services = None
    try:
        db.upgrade(_url(name))
        with tempfile.TemporaryDirectory(prefix="attache-bench-") as root:
            services = Services(Settings.from_env({"DATABASE_URL": _url(name), "STORAGE_URL": f"file://{root}"}))
            engine = services.engine
            began = time.perf_counter()
            with engine.begin() as conn:
                for name_ in INDEXES:
                    conn.exec_driver_sql(f"DROP INDEX {name_}")
                # the rows are consistent by construction: skip the per-row foreign key checks
                conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
                for statement in GENERATE:
                    conn.exec_driver_sql(statement)
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")
                rows = conn.exec_driver_sql("SELECT count(*) FROM variants").scalar()
            generated = time.perf_counter() - began
            referenced, unreferenced = _objects(services.storage, engine)
            print(f"\nsweeps over {rows:,} variant rows ({ATTACHMENTS:,} attachments, "
                  f"{SUPERSEDED * 4:,} rows superseded), {OBJECTS:,} objects; generated in {generated:.1f} s")

            without = _reference(engine, referenced, unreferenced)
            build = {}
            with engine.begin() as conn:  # what migration 0007 does
                for name_, ddl in INDEXES.items():
                    build[name_] = _timed(lambda ddl=ddl: conn.exec_driver_sql(ddl))
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("ANALYZE")
            with_idx = _reference(engine, referenced, unreferenced)

            gc = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=3600, batch=BATCH))
            gc_batches = _Timed(gc, "_process")
            storage = services.storage
            gc_storage = [_Timed(storage, "stat"), _Timed(storage, "delete")]  # instance attributes, this run only
            gc_counts = gc.run_once()
            gc_storage_s = sum(sum(t.times) for t in gc_storage)
            gc_db_s = (sum(gc_batches.times) - gc_storage_s) / len(gc_batches.times)
            retirement = Retirement(services.engine, services.storage,
                                    RetirementConfig(grace_seconds=3600, batch=BATCH))
            began = time.perf_counter()
            retire_counts = retirement.run_once()
            retire_total = time.perf_counter() - began
            batches = -(-retire_counts["retired"] // BATCH)
            empty_round = _timed(retirement.run_once)  # nothing left: one candidate search that finds nothing
            assert gc_counts["removed"] == len(unreferenced) and gc_counts["referenced"] == len(referenced), gc_counts
            assert retire_counts["retired"] == SUPERSEDED * 4, retire_counts

            print(f"{'per batch of ' + str(BATCH):<50} {'no indexes*':>12} {'indexes':>10}")
            print(f"{'object GC batch (list, look up, re-check, delete)':<50} {without['gc_batch']:>11.2f}s "
                  f"{max(gc_batches.times):>9.3f}s  (max of {len(gc_batches.times)} batches)")
            print(f"{'  of which PostgreSQL (the rest: stat, unlink, fsync)':<50} {'':>12} {gc_db_s:>9.3f}s  "
                  f"(mean; storage {gc_storage_s / len(gc_batches.times):.3f}s)")
            print(f"{'retirement batch (retire 500 rows, collect)':<50} {without['retire_batch']:>11.2f}s "
                  f"{retire_total / batches:>9.3f}s  (mean of {batches} batches, the final empty search included)")
            print(f"{'retirement round with nothing to retire':<50} {'':>12} {empty_round:>9.3f}s")
            print(f"{'  candidate search (500 rows)':<50} {without['candidates'] * 1000:>10.1f}ms "
                  f"{with_idx['candidates'] * 1000:>8.2f}ms")
            print(f"{'  candidate search, shape before 0007':<50} {without['old_shape'] * 1000:>10.1f}ms "
                  f"{with_idx['old_shape'] * 1000:>8.2f}ms")
            with engine.connect() as conn:
                print(f"{'  same, with nothing to retire':<50} {'':>12} "
                      f"{_timed(lambda: conn.exec_driver_sql(OLD_CANDIDATES).all()) * 1000:>8.2f}ms")
            print(f"{'  one key: GC re-check':<50} {without['one_key'] * 1000:>10.1f}ms "
                  f"{with_idx['one_key'] * 1000:>8.2f}ms")
            print(f"{'  one key: retirement still-used check':<50} {without['still_used'] * 1000:>10.1f}ms "
                  f"{with_idx['still_used'] * 1000:>8.2f}ms")
            print(f"{'  one key: staging cleanup owner lookup':<50} {without['owner'] * 1000:>10.1f}ms "
                  f"{with_idx['owner'] * 1000:>8.2f}ms")
            print("* without indexes a round takes minutes: the batch is extrapolated from the lookups it makes, "
                  f"timed on a sample of {SAMPLE}")
            print("index builds (migration 0007, writes to the table wait meanwhile): "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in build.items()))
            with engine.connect() as conn:
                print("EXPLAIN ANALYZE, GC re-check of one key:")
                print(_explain(conn, referenced_query([unreferenced[0]])))
                print("EXPLAIN ANALYZE, retirement still-used check:")
                print(_explain(conn, still_used_query(referenced[0])))
                print("EXPLAIN ANALYZE, staging cleanup owner lookup:")
                print(_explain(conn, owner_query(f"staging/{uuid.uuid4()}")))
                print("EXPLAIN ANALYZE, retirement candidate search (nothing left to retire):")
                print(_explain(conn, oldest_live_version_query()))
                print(_explain(conn, candidates_query(3600, BATCH, conn.execute(oldest_live_version_query()).scalar())))
                conn.rollback()
    finally:
        if services is not None and "engine" in services.__dict__:
            services.engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
