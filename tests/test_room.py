"""What the room check counts the unfinished jobs to need (``app/core/room.py``, migration 0030)."""

from __future__ import annotations

import json
import os

from sqlalchemy import select, text, update

from app.adapters.imaging import probe
from app.adapters.postgres.models import jobs
from app.core import backfill, operations, pipeline, room, states
from app.core.workflow import Workflow
from scheduler.counter_fold import CounterFold
from tests.driver import run, take_messages, upload


def held(engine, version: int = 1) -> int:
    with engine.connect() as conn:
        return room._read_held(conn, pipeline.get(version))


def need(services, path, version: int, *, kept: bool = False) -> int:
    info = probe(path, services.limits)
    return room.need(pipeline.get(version), size=0 if kept else path.stat().st_size, pixels=info.width * info.height)


def test_the_room_held_is_each_unfinished_jobs_own_need_through_every_transition(quiet_services, engine, data_file):
    """Counted by triggers as jobs change, read from two small tables. Each job counts the need it was made with:
    the sum counted every unfinished job with the version being uploaded to, and a backfill's original, which it
    reads from the kept copy, at its size."""
    chelsea, coffee = data_file("photos/chelsea.jpg"), data_file("photos/coffee.jpg")
    assert held(engine) == 0
    first, second = upload(quiet_services, chelsea), upload(quiet_services, coffee)
    assert held(engine) == need(quiet_services, chelsea, 1) + need(quiet_services, coffee, 1)

    assert run(Workflow(quiet_services), engine, first.job_id)[-1] == "ready"
    assert held(engine) == need(quiet_services, coffee, 1), "a ready job needs nothing more"

    with engine.begin() as conn:  # the second fails
        [message] = take_messages(engine, second.job_id)
        assert states.claim(conn, second.job_id, message["attempt"], states.Lease("test", 60)) is not None
        assert states.fail(conn, second.job_id, message["attempt"], "image_corrupt", "test", "test")
    assert held(engine) == 0

    operations.replay(quiet_services, second.job_id, operator="test", reason="counted again")
    assert held(engine) == need(quiet_services, coffee, 1)

    assert backfill.run(quiet_services, 2)["created"] == 1  # chelsea's v2 job, from its kept original
    assert held(engine) == need(quiet_services, coffee, 1) + need(quiet_services, chelsea, 2, kept=True)
    assert held(engine, version=2) == held(engine), "the counted jobs' need does not depend on the version asked"

    with engine.connect() as conn:
        deltas = conn.execute(text("SELECT count(*) FROM room_deltas")).scalar()
    assert deltas > 0
    before = held(engine)
    assert CounterFold(engine).run_once()["room_folded"] == deltas
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM room_deltas")).scalar() == 0
    assert held(engine) == before

    with engine.begin() as conn:  # a job made before migration 0030 (or by the release before it) has no need
        conn.execute(update(jobs).where(jobs.c.id == second.job_id).values(room_bytes=None))
    assert held(engine) == before, "summed from its attachment, as before the migration"


def test_a_replayed_job_made_before_the_room_was_counted_is_counted_from_then_on(quiet_services, engine, data_file):
    """A failed job made before migration 0030 has no ``room_bytes``: replayed, it was read from its attachment on
    each check for as long as it ran (a re-attack); it now carries its need."""
    coffee = data_file("photos/coffee.jpg")
    accepted = upload(quiet_services, coffee)
    with engine.begin() as conn:
        [message] = take_messages(engine, accepted.job_id)
        assert states.claim(conn, accepted.job_id, message["attempt"], states.Lease("test", 60)) is not None
        assert states.fail(conn, accepted.job_id, message["attempt"], "image_corrupt", "test", "test")
        conn.execute(update(jobs).where(jobs.c.id == accepted.job_id).values(room_bytes=None))
    operations.replay(quiet_services, accepted.job_id, operator="test", reason="counted from now on")
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.room_bytes).where(jobs.c.id == accepted.job_id)).scalar_one() == need(
            quiet_services, coffee, 1)
        few, _ = room._statements_of(pipeline.get(1))
        assert conn.execute(few).one()[2] == 0, "no uncounted job is left"
    assert held(engine) == need(quiet_services, coffee, 1)


def test_the_room_check_reads_none_of_a_backlogs_rows_nor_of_the_jobs_done_before_it_was_counted(
        quiet_services, engine, data_file):
    """0.5-0.6 s of PostgreSQL for 100,000 unfinished jobs among a million attachments, each second per web process
    and on each upload near the bound (what a long outage leaves): it joined every unfinished job to its
    attachment. Then one job made without ``room_bytes`` (by the release before, while it rolled out) joined every
    attachment (65-112 ms with 400,000: a re-attack). Here 3,000 unfinished jobs, 3,000 done ones made before the
    migration and one uncounted job not done: the check's buffers do not grow with them."""
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    with engine.begin() as conn:
        conn.execute(text("""
            WITH made AS (
                INSERT INTO attachments (id, owner, filename, content_type, format, size, sha256, width, height,
                                         staging_key)
                SELECT gen_random_uuid(), 'backlog', 'b.jpg', 'image/jpeg', 'JPEG', 5000000, md5(g::text), 4000, 3000,
                       'staging/backlog-' || g FROM generate_series(1, 6001) g RETURNING id)
            INSERT INTO jobs (id, attachment_id, pipeline_version, state, owner, max_attempts, traceparent, room_bytes,
                              error_code)
            SELECT gen_random_uuid(), id, 1, CASE WHEN n <= 3000 OR n = 6001 THEN 'queued' ELSE 'failed' END,
                   'backlog', 5, 'x', CASE WHEN n <= 3000 THEN 1000 END, CASE WHEN n BETWEEN 3001 AND 6000 THEN 'x' END
            FROM (SELECT id, row_number() OVER () AS n FROM made) numbered"""))
        conn.execute(text("ANALYZE jobs; ANALYZE attachments"))
    CounterFold(engine).run_once()  # a delta a job made: the scheduler folds them every minute
    few, _ = room._statements_of(pipeline.get(1))
    with engine.connect() as conn:
        [[plan]] = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {few.text}")).one()
        held_now = held(engine)
        own = conn.execute(select(jobs.c.room_bytes).where(jobs.c.id == accepted.job_id)).scalar_one()
    plan = plan if isinstance(plan, dict) else json.loads(plan)[0]
    buffers = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert buffers < 40, f"{buffers} buffers read for the sum"
    assert held_now == own + 3000 * 1000 + room.need(pipeline.get(1), size=5_000_000, pixels=4000 * 3000)


def test_a_disk_short_of_inodes_takes_no_more_uploads_than_it_has_files_for(env, engine, data_file):
    """Out of inodes with bytes to spare, uploads were accepted whose variants could not be written: 20 of 27
    ended ``failed storage_unavailable`` with 190 MB free (an adversarial run: a tmpfs of 100 inodes); with a
    fixed floor of files alone, 40 of 90 stood still, their partial files holding the last inodes (a re-attack).
    The files every unfinished job may still make are counted, above the floor's, as their bytes are; every upload
    taken is made ``ready``."""
    import pytest

    from app.config import Settings
    from app.errors import StorageUnavailable
    from app.services import Services
    from tests.filesystems import small_filesystem

    floor = 1 << 20  # 64 inodes
    with small_filesystem(64 << 20, inodes=200) as root:
        services = Services(Settings.from_env({
            **env, "STORAGE_URL": f"file://{root}", "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
            "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5", "ATTACHE_SPOOL_MIN_FREE_BYTES": str(floor)}))
        try:
            version = pipeline.get(services.settings.pipeline_version)
            free = services.storage.free_inodes()
            accepted = []
            with pytest.raises(StorageUnavailable):
                for _ in range(200):
                    accepted.append(upload(services, data_file("photos/chelsea.jpg")))
            assert 0 < len(accepted) <= (free - floor // room.FLOOR_BYTES_PER_INODE) // room.files_per_job(version)
            assert services.storage.free_bytes() > 32 << 20, "refused for its files, not its bytes"
            for each in accepted:
                assert run(Workflow(services), engine, each.job_id)[-1] == "ready"
            assert services.storage.free_inodes() >= floor // room.FLOOR_BYTES_PER_INODE
        finally:
            services.engine.dispose()


def test_a_spool_on_the_storages_disk_leaves_free_the_room_the_accepted_jobs_hold(env, engine, data_file, tmp_path,
                                                                                    monkeypatch):
    """The spool kept its floor alone free, and the room of the jobs accepted was checked at the upload's commit,
    after its body: one uploader's two raw POSTs sized to the free space less the floor, trickled a byte every 4 s,
    held the disk while five jobs accepted before them waited, and 3 of the 5 ended ``failed storage_unavailable``
    (an adversarial run, twice: a 60 MB tmpfs held the storage and TMPDIR). A body that would eat into that room is
    now refused, 503 ``spool_unavailable`` with ``Retry-After``: before it is read when its declared length would,
    at the write that would otherwise; the sum read once as the spool is made when this process had not read it.
    With the storage on another filesystem the spool keeps its floor alone, as before."""
    import tempfile

    import pytest
    from flask import request

    from app.config import Settings
    from app.errors import SpoolUnavailable
    from app.web import create_app
    from app.web.spool import CHUNK
    from tests.conftest import authed
    from tests.filesystems import small_filesystem

    floor = 1 << 20
    photo = data_file("photos/astronaut_12mp_3464x3464.jpg").read_bytes()

    def app_on(storage):
        return create_app(Settings.from_env({**env, "STORAGE_URL": f"file://{storage}",
                                             "ATTACHE_SPOOL_MIN_FREE_BYTES": str(floor)}))

    with small_filesystem(48 << 20) as disk:
        (disk / "tmp").mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(disk / "tmp"))  # TMPDIR on the storage's disk

        def free() -> int:
            found = os.statvfs(disk)
            return found.f_bavail * found.f_frsize

        app = app_on(disk / "storage")
        try:
            client = authed(app)
            for _ in range(3):  # accepted, and not processed: no worker
                answer = client.post("/v1/attachments", data=photo, content_type="image/jpeg")
                assert answer.status_code == 202, answer.get_data(as_text=True)
            holding = held(engine)
            database = app.extensions["attache"].engine.url
            room._seen.pop(database, None)  # this process has not read it yet: the spool reads it
            into = free() - floor - holding // 2  # above the floor, half into the room held
            answer = client.post("/v1/attachments", data=photo + bytes(into - len(photo)), content_type="image/jpeg")
            assert answer.status_code == 503 and answer.json["error"] == "spool_unavailable", answer.json
            assert answer.headers["Retry-After"]
            assert room.held_lately(database) == holding, "read as the spool was made"
            assert list((disk / "tmp").iterdir()) == []

            with app.test_request_context("/v1/attachments", method="POST"):  # no length declared: at a write
                spool = request.spool()
                with pytest.raises(SpoolUnavailable):
                    for _ in range(into // CHUNK + 1):
                        spool.write(bytes(CHUNK))
                assert spool.size <= into - holding // 2 + CHUNK
            assert free() >= floor + holding

            answer = client.post("/v1/attachments", data=photo, content_type="image/jpeg")  # it fits: taken
            assert answer.status_code == 202, answer.get_data(as_text=True)
        finally:
            app.extensions["attache"].close()

        elsewhere = app_on(tmp_path / "elsewhere")  # the storage on another filesystem: the floor alone
        try:
            into = free() - floor - held(engine) // 2
            with elsewhere.test_request_context("/v1/attachments", method="POST",
                                                headers={"Content-Length": str(into)}):
                spool = request.spool()
                for _ in range(into // CHUNK):
                    spool.write(bytes(CHUNK))
                assert spool.size == into // CHUNK * CHUNK
        finally:
            elsewhere.extensions["attache"].close()
