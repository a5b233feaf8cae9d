"""Pipeline versions side by side: registry, serving, interleavings, backfill, retirement.

The interleavings are driven step by step in-process (real PostgreSQL and
storage), so each order is exact; tests/test_backfill_processes.py kills
and doubles real backfill processes.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
from PIL import Image
from sqlalchemy import func, select, text

from app.adapters.imaging import VariantSpec
from app.adapters.postgres.models import audit_log, job_history, jobs, outbox, variants
from app.config import Settings
from app.core import backfill, operations, pipeline, states
from app.core.workflow import Workflow
from app.errors import ConfigError, JobConflict, VersionUnknownHere
from app.services import Services
from app.web import create_app
from scheduler.retirement import Retirement, RetirementConfig
from tests.conftest import OPERATOR_TOKEN, authed
from tests.driver import job, run, take_messages, upload
from tests.test_imaging import assert_upright_srgb_card

#: Pinned on purpose: editing a registered version in place must fail here.
#: To change the pipeline, register a new version and pin its fingerprint.
FROZEN = {
    1: "ddd8cfe6584d7aa626f25bee91732a2a66d645f21726795c1cd5f74385729abe",
    2: "8953ac93fcc1fbbf6623a6ebec77cf541ec67ef7e4a3d0aa6f2e3463d38c0148",
}


def test_registered_versions_are_immutable():
    assert {v: d.fingerprint for v, d in pipeline.REGISTRY.items()} == FROZEN


def test_a_version_edited_in_place_is_refused_once_jobs_exist(quiet_services, engine, data_file, monkeypatch):
    upload(quiet_services, data_file("photos/chelsea.jpg"))  # records v1's fingerprint
    edited = dataclasses.replace(pipeline.REGISTRY[1], specs={
        **pipeline.REGISTRY[1].specs, "thumbnail": VariantSpec("thumbnail", "fit", 300, 300)})
    monkeypatch.setitem(pipeline.REGISTRY, 1, edited)
    with pytest.raises(pipeline.PipelineChanged):
        upload(quiet_services, data_file("photos/coffee.jpg"))


def test_new_uploads_default_to_the_newest_version():
    assert Settings.from_env({}).pipeline_version == pipeline.NEWEST == 2
    assert Settings.from_env({"ATTACHE_PIPELINE_VERSION": "1"}).pipeline_version == 1
    with pytest.raises(ConfigError, match="ATTACHE_PIPELINE_VERSION"):
        Settings.from_env({"ATTACHE_PIPELINE_VERSION": "9"})


@pytest.fixture
def v2_services(env):
    services = Services(Settings.from_env({**env, "ATTACHE_PIPELINE_VERSION": "2",
                                           "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                           "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5",
                                           "ATTACHE_RETRY_INITIAL_SECONDS": "0"}))
    yield services
    services.engine.dispose()


@pytest.fixture
def broken(env):
    """A worker whose storage is down, with one attempt per job (and no wait for storage within it)."""
    services = Services(Settings.from_env({**env, "STORAGE_URL": "s3://attache?endpoint=http://127.0.0.1:1",
                                           "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                           "ATTACHE_MAX_ATTEMPTS": "1", "ATTACHE_RETRY_INITIAL_SECONDS": "0",
                                           "ATTACHE_STORAGE_WAIT_SECONDS": "0"}))
    yield services
    services.engine.dispose()


@pytest.fixture
def app(settings):
    app = create_app(settings)
    yield app
    app.extensions["attache"].close()


def new_job(services, attachment_id, version):
    with services.engine.begin() as conn:
        job_id, _ = states.create_job(conn, attachment_id=attachment_id, pipeline_version=version, max_attempts=1,
                                      traceparent="00-" + "3" * 32 + "-" + "4" * 16 + "-01", tracestate=None,
                                      actor="test", room_bytes=0)
    return job_id


def retirement(services, grace_seconds: float) -> Retirement:
    return Retirement(services.engine, services.storage, RetirementConfig(grace_seconds=grace_seconds))


def served(app, attachment_id, version=None):
    path = f"/v1/attachments/{attachment_id}" + (f"?version={version}" if version else "")
    return authed(app, OPERATOR_TOKEN).get(path).json


def test_v2_makes_its_own_variants(v2_services, engine, data_file):
    accepted = upload(v2_services, data_file("photos/chelsea.jpg"))
    run(Workflow(v2_services), engine, accepted.job_id)
    with engine.connect() as conn:
        rows = {r.variant: r for r in conn.execute(select(variants).where(variants.c.job_id == accepted.job_id))}
    assert set(rows) == {"original", "thumbnail", "crop", "optimized", "webp"}
    assert max(rows["thumbnail"].width, rows["thumbnail"].height) == 451  # fits 512, never upscaled
    assert rows["webp"].content_type == "image/webp"


def test_avif_is_an_output_a_new_version_can_choose(env, engine, data_file, storage_dir, monkeypatch):
    """No registered version renders AVIF (FROZEN above holds); a version that does carries its settings."""
    specs = pipeline.REGISTRY[2].specs
    avif = pipeline.PipelineVersion(3, {**specs, "avif": VariantSpec("avif", "bounded", 2048, 2048, output="avif")})
    webp = pipeline.PipelineVersion(3, {**specs, "avif": VariantSpec("avif", "bounded", 2048, 2048, output="webp")})
    assert avif.fingerprint != webp.fingerprint
    before = (avif.fingerprint, webp.fingerprint)
    with monkeypatch.context() as patched:  # the encoder settings are part of an AVIF version's definition only
        patched.setattr(pipeline, "AVIF_QUALITY", pipeline.AVIF_QUALITY - 1)
        assert {v: d.fingerprint for v, d in pipeline.REGISTRY.items()} == FROZEN
        assert avif.fingerprint != before[0] and webp.fingerprint == before[1]
    monkeypatch.setitem(pipeline.REGISTRY, 3, avif)
    services = Services(Settings.from_env({**env, "ATTACHE_PIPELINE_VERSION": "3",
                                           "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                           "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
    try:
        accepted = upload(services, data_file("phones/card_p3_orientation6.heic"))
        run(Workflow(services), engine, accepted.job_id)
        assert job(engine, accepted.job_id).state == "ready"
    finally:
        services.engine.dispose()
    with engine.connect() as conn:
        rows = {r.variant: r for r in conn.execute(select(variants).where(variants.c.job_id == accepted.job_id))}
    assert set(rows) == {"original", "thumbnail", "crop", "optimized", "webp", "avif"}
    assert (rows["avif"].content_type, rows["avif"].width, rows["avif"].height) == ("image/avif", 600, 400)
    assert rows["avif"].storage_key.endswith(".avif")
    with Image.open(storage_dir / rows["avif"].storage_key) as image:
        assert image.format == "AVIF"
        assert_upright_srgb_card(image)


def all_but_publish(workflow, engine, job_id):
    """Run every step of a job but publish; its publish message."""
    held = None
    for _ in range(5):
        for payload in take_messages(engine, job_id):
            if payload["step"] == "publish":
                held = payload
            else:
                workflow.handle(payload, step=payload["step"])
    return held


def test_v1_publishing_after_v2_changes_nothing_served(quiet_services, app, engine, data_file):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    workflow = Workflow(quiet_services)
    v1_publish = all_but_publish(workflow, engine, accepted.job_id)
    assert v1_publish is not None and job(engine, accepted.job_id).state == "processing"
    v2_job = new_job(quiet_services, accepted.attachment_id, 2)
    run(workflow, engine, v2_job)
    assert served(app, accepted.attachment_id)["pipeline_version"] == 2
    assert workflow.handle(v1_publish, step="publish").status == "ready"  # v1 finishes late
    document = served(app, accepted.attachment_id)
    assert document["pipeline_version"] == 2 and "webp" in document["variants"]
    assert served(app, accepted.attachment_id, 1)["state"] == "ready"
    with engine.connect() as conn:
        per_key = conn.execute(select(variants.c.pipeline_version, variants.c.variant, func.count())
                               .group_by(variants.c.pipeline_version, variants.c.variant)).all()
    assert all(count == 1 for *_, count in per_key) and len(per_key) == 4 + 5


def test_while_v2_is_made_v1_is_served_and_a_failed_v2_leaves_v1(quiet_services, broken, app, engine, data_file):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    v2_job = new_job(quiet_services, accepted.attachment_id, 2)
    document = served(app, accepted.attachment_id)
    assert (document["pipeline_version"], document["state"]) == (1, "ready"), "v2 queued: v1 served"
    assert {"pipeline_version": 2, "state": "queued"} in document["versions"]
    run(Workflow(broken), engine, v2_job)  # storage down, one attempt: v2 fails
    assert job(engine, v2_job).state == "failed"
    document = served(app, accepted.attachment_id)
    assert (document["pipeline_version"], document["state"]) == (1, "ready")
    assert set(document["variants"]) == {"original", "thumbnail", "crop", "optimized"}
    failed = operations.list_jobs(quiet_services, state="failed", pipeline_version=2)
    assert [j["job_id"] for j in failed] == [str(v2_job)], "operators see the failed v2"


def test_a_v1_replay_after_v2_leaves_v2_served(quiet_services, broken, app, engine, data_file):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    run(Workflow(broken), engine, accepted.job_id)  # v1 fails
    assert job(engine, accepted.job_id).state == "failed"
    v2_job = new_job(quiet_services, accepted.attachment_id, 2)
    run(Workflow(quiet_services), engine, v2_job)
    assert served(app, accepted.attachment_id)["pipeline_version"] == 2
    operations.replay(quiet_services, accepted.job_id, operator="olga", reason="storage is back")
    run(Workflow(quiet_services), engine, accepted.job_id)
    assert job(engine, accepted.job_id).state == "ready"
    assert served(app, accepted.attachment_id)["pipeline_version"] == 2
    assert served(app, accepted.attachment_id, 1)["state"] == "ready"


def test_backfill_dry_run_then_twice(quiet_services, engine, data_file):
    ids = []
    for name in ("photos/chelsea.jpg", "photos/coffee.jpg", "pillow/hopper.jpg"):
        accepted = upload(quiet_services, data_file(name))
        run(Workflow(quiet_services), engine, accepted.job_id)
        ids.append(accepted.job_id)
    upload(quiet_services, data_file("photos/rocket.jpg"))  # queued, not ready: not a candidate
    estimate = backfill.estimate(quiet_services, 2)
    assert (estimate.candidates, estimate.renders) == (3, 3 * 5)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs).where(jobs.c.pipeline_version == 2)).scalar() == 0
    progress = []
    assert backfill.run(quiet_services, 2, batch=2, progress=progress.append)["created"] == 3
    assert progress == [2, 1]
    assert backfill.run(quiet_services, 2, batch=2)["created"] == 0, "idempotent"
    with engine.connect() as conn:
        v2_jobs = conn.execute(select(jobs.c.id).where(jobs.c.pipeline_version == 2)).scalars().all()
    for job_id in v2_jobs:  # the backfilled jobs run from the kept original (staging is long gone)
        run(Workflow(quiet_services), engine, job_id)
        assert job(engine, job_id).state == "ready"


def test_a_backfill_makes_no_batch_the_storage_has_no_room_for(env, engine, data_file):
    """A backfill's renders took the room counted for the uploads accepted beside it, and those uploads failed
    ``storage_unavailable`` (a re-attack). A batch is made only where the storage has room for it beside the work
    not yet done; else the backfill stops, saying what it made."""
    import os

    from app.core import room
    from app.errors import StorageUnavailable
    from tests.filesystems import small_filesystem

    floor = 4 << 20
    with small_filesystem(64 << 20) as disk:
        services = Services(Settings.from_env({**env, "STORAGE_URL": f"file://{disk}",
                                               "ATTACHE_SPOOL_MIN_FREE_BYTES": str(floor),
                                               "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                               "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
        try:
            for name in ("photos/coffee.jpg", "photos/chelsea.jpg"):  # 600x400 first, then 451x300
                run(Workflow(services), engine, upload(services, data_file(name)).job_id)
            first = room.need(pipeline.get(2), size=0, pixels=600 * 400)
            free = os.statvfs(disk)
            room_left = first + os.path.getsize(data_file("photos/coffee.jpg")) + (64 << 10)
            with open(disk / "filler", "wb") as filler:  # the disk keeps room for the first job only
                os.posix_fallocate(filler.fileno(), 0, free.f_bavail * free.f_frsize - floor - room_left)
            with pytest.raises(StorageUnavailable, match="1 job\\(s\\) of version 2 made so far"):
                backfill.run(services, 2, batch=1)
            (disk / "filler").unlink()
            assert backfill.run(services, 2, batch=1)["created"] == 1, "the rest, once there is room"
        finally:
            services.close()


def test_backfill_over_http_is_audited_and_estimates_the_steps_time(quiet_services, app, engine, data_file, caplog):
    """An adversarial review: the endpoint answered 500 after its first batch wherever INFO was logged (the web
    logs it; the batch's log line named a field ``created``, which a LogRecord keeps for itself); a backfill wrote
    no audit row, where every other operator action does; and the dry run's estimate was the upload-to-ready
    time, so after a backlog it counted the wait in the queue as worker time."""
    for name in ("photos/chelsea.jpg", "photos/coffee.jpg"):
        run(Workflow(quiet_services), engine, upload(quiet_services, data_file(name)).job_id)
    with engine.begin() as conn:  # both waited an hour behind a backlog before their steps ran
        conn.execute(text("ALTER TABLE jobs DISABLE TRIGGER USER"))
        conn.execute(text("UPDATE jobs SET created_at = created_at - interval '1 hour'"))
        conn.execute(text("ALTER TABLE jobs ENABLE TRIGGER USER"))
    ops = authed(app, OPERATOR_TOKEN)
    # a dry run asked for in a body that is not a JSON object was taken for no body, and ran (an adversarial run)
    for unread in (dict(data={"dry_run": "true"}), dict(data='{"dry_run": true,}', content_type="application/json"),
                   dict(data='{"dry_run": true}', content_type="text/plain"), dict(json=[{"dry_run": True}]),
                   # a re-attack: a dry run asked for in the query, given twice, or as something not a boolean
                   dict(query_string={"dry_run": "true"}), dict(json={"dry_run": None}), dict(json={"dry_run": {}}),
                   dict(data='{"dry_run": true, "dry_run": false}', content_type="application/json")):
        refused = ops.post("/v1/ops/pipelines/2/backfill", **unread)
        assert refused.status_code == 400 and refused.json["error"] == "bad_request", (unread, refused.json)
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.id).where(jobs.c.pipeline_version == 2)).first() is None, "nothing ran"
    estimate = ops.post("/v1/ops/pipelines/2/backfill", json={"dry_run": True}).json
    assert estimate["candidates"] == 2 and 0 < estimate["seconds_per_job"] < 60, estimate
    assert ops.post("/v1/ops/pipelines/2/backfill", json={"reason": 7}).status_code == 400
    mistyped = ops.post("/v1/ops/pipelines/2/backfill", json={"dryRun": True})  # ran the backfill (an adversarial run)
    assert mistyped.status_code == 400 and "dryRun" in mistyped.json["message"], mistyped.json
    with caplog.at_level(logging.INFO, logger="attache.backfill"):  # the operator's reason (an adversarial run:
        done = ops.post("/v1/ops/pipelines/2/backfill",  # it was dropped for "backfill to version 2")
                        json={"batch": 1, "reason": "webp for the gallery, ticket 42"})
    assert done.status_code == 200 and done.json["created"] == 2, done.json
    with engine.connect() as conn:
        made = set(map(str, conn.execute(select(jobs.c.id).where(jobs.c.pipeline_version == 2)).scalars()))
        rows = conn.execute(select(audit_log.c.actor, audit_log.c.action, audit_log.c.target, audit_log.c.reason,
                                   audit_log.c.details).order_by(audit_log.c.id)).all()
        histories = set(conn.execute(select(job_history.c.reason).where(job_history.c.job_id.in_(made))).scalars())
    assert [(r.action, r.target, r.actor.startswith("backfill:operator:"), r.reason) for r in rows] == \
        [("pipeline.backfill", "pipeline:2", True, "webp for the gallery, ticket 42")] * 2, "one row per batch"
    assert {job for r in rows for job in r.details["jobs"]} == made and len(made) == 2
    assert histories == {"webp for the gallery, ticket 42"}
    # run again, it finds nothing to make: the trail says it ran (it wrote no row)
    again = ops.post("/v1/ops/pipelines/2/backfill", json={"reason": "again"})
    assert again.status_code == 200 and again.json["created"] == 0, again.json
    with engine.connect() as conn:
        last = conn.execute(select(audit_log.c.action, audit_log.c.reason, audit_log.c.details)
                            .order_by(audit_log.c.id.desc()).limit(1)).one()
    assert tuple(last) == ("pipeline.backfill", "again", {"jobs": []})


def test_retirement_collects_superseded_objects_after_the_grace_period(quiet_services, app, engine, data_file,
                                                                       storage_dir):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    with engine.connect() as conn:
        v1_keys = dict(conn.execute(select(variants.c.variant, variants.c.storage_key)).all())
    assert retirement(quiet_services, 0).run_once()["retired"] == 0, \
        "nothing newer is ready: v1 is still served"
    v2_job = new_job(quiet_services, accepted.attachment_id, 2)
    run(Workflow(quiet_services), engine, v2_job)
    waiting = retirement(quiet_services, 3600).run_once()
    assert waiting["retired"] == 0, "within the grace period nothing is retired"
    assert retirement(quiet_services, 0).run_once(dry_run=True)["retired"] == 4
    counts = retirement(quiet_services, 0).run_once()
    assert counts["retired"] == 4 and counts["objects_removed"] == 3 and counts["objects_kept"] == 1
    assert (storage_dir / v1_keys["original"]).exists(), "the original is shared with v2"
    for name in ("thumbnail", "crop", "optimized"):
        assert not (storage_dir / v1_keys[name]).exists()
    assert served(app, accepted.attachment_id)["pipeline_version"] == 2
    assert served(app, accepted.attachment_id, 1)["variants"] == {}
    assert retirement(quiet_services, 0).run_once()["retired"] == 0


def test_a_retired_object_written_again_by_a_late_attempt_is_collected(quiet_services, app, engine, data_file,
                                                                        storage_dir):
    """An adversarial run: a v1 worker paused in its render (its lease lost, v1 made ready by attempt 2, v2 ready,
    v1 retired and its objects removed) wrote its variant when it woke, under the retired row's key; the object GC
    counted a retired row as a reference, and retirement never looks at a retired row again: the object stayed
    for good."""
    from scheduler.object_gc import ObjectGc, ObjectGcConfig

    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    with engine.connect() as conn:
        v1_keys = dict(conn.execute(select(variants.c.variant, variants.c.storage_key)).all())
    thumbnail = (storage_dir / v1_keys["thumbnail"]).read_bytes()
    run(Workflow(quiet_services), engine, new_job(quiet_services, accepted.attachment_id, 2))
    assert retirement(quiet_services, 0).run_once()["objects_removed"] == 3
    quiet_services.storage.put_bytes(v1_keys["thumbnail"], thumbnail)  # the late attempt's write
    counts = ObjectGc(quiet_services.engine, quiet_services.storage, ObjectGcConfig(grace_seconds=0)).run_once()
    assert not (storage_dir / v1_keys["thumbnail"]).exists(), counts
    assert (storage_dir / v1_keys["original"]).exists(), "the original, shared with v2's live row, stays"
    assert served(app, accepted.attachment_id)["pipeline_version"] == 2


def test_a_redelivery_to_a_ready_job_of_a_retired_version_is_a_no_op(quiet_services, engine, data_file, storage_dir):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    workflow = Workflow(quiet_services)
    run(workflow, engine, accepted.job_id)
    with engine.connect() as conn:
        v1_messages = [r.payload for r in conn.execute(select(outbox).where(outbox.c.job_id == accepted.job_id)
                                                       .order_by(outbox.c.id))]
    run(workflow, engine, new_job(quiet_services, accepted.attachment_id, 2))
    assert retirement(quiet_services, 0).run_once()["objects_removed"] == 3
    for payload in v1_messages:  # every v1 message again, late: each verifies and is acked
        assert workflow.handle(payload, step=payload["step"]).status == "already_ready", payload["step"]
    assert job(engine, accepted.job_id).state == "ready"


def test_a_recorded_fingerprint_is_checked_once_per_process_not_on_every_upload(quiet_services, engine, data_file):
    from tests.sql_log import sql_log

    upload(quiet_services, data_file("photos/chelsea.jpg"))  # records the fingerprint (this may yet roll back)
    upload(quiet_services, data_file("photos/chelsea.jpg"))  # finds it committed
    with sql_log(quiet_services.engine) as log:
        upload(quiet_services, data_file("photos/chelsea.jpg"))
    assert log.statements and not [sql for sql in log.statements if "pipeline_versions" in sql]


@pytest.mark.parametrize("redelivered", [False, True], ids=["v1_publishes", "v1_publishes_then_is_redelivered"])
def test_v1_publishing_while_v2_reads_the_staged_original_keeps_it_for_v2(quiet_services, engine, data_file,
                                                                          storage_dir, redelivered):
    """v2's steps read the staged original until a version publishes the kept one; a publish (or a redelivered
    message verifying it) while v2 is under way must not remove the staging v2's next step reads."""
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    workflow = Workflow(quiet_services)
    v1_publish = all_but_publish(workflow, engine, accepted.job_id)
    v2_job = new_job(quiet_services, accepted.attachment_id, 2)
    [v2_inspect] = take_messages(engine, v2_job)
    assert workflow.handle(v2_inspect, step="inspect").status == "inspected"  # read staging: nothing kept yet
    v2_renders = take_messages(engine, v2_job)
    assert workflow.handle(v1_publish, step="publish").status == "ready"
    if redelivered:
        assert workflow.handle(v1_publish, step="publish").status == "already_ready"
    assert (storage_dir / pipeline.staging_key(accepted.attachment_id)).exists(), "v2 is still under way"
    statuses = [workflow.handle(p, step=p["step"]).status for p in v2_renders]
    assert set(statuses) == {"rendered"}
    run(workflow, engine, v2_job)
    assert job(engine, v2_job).state == "ready"
    assert not (storage_dir / pipeline.staging_key(accepted.attachment_id)).exists(), "the last one out removes it"


def test_a_worker_of_an_older_release_hands_a_newer_versions_message_back(env, engine, data_file, monkeypatch):
    """A release adds version 3, its web (or a backfill) makes jobs at it, and a worker of the previous release
    takes their messages: each claimed the job and failed its attempt on the version it did not know, so every job
    spent its attempts within 30 s and ended ``failed internal_error``, the new upload's included; a backfill run
    again found nothing to make, and a replay by a web of the previous release answered 500 (an adversarial run).
    The message goes back to the broker instead, and the job waits, unclaimed, for a worker that knows it."""
    newer = pipeline.PipelineVersion(3, dict(pipeline.REGISTRY[2].specs))
    monkeypatch.setitem(pipeline.REGISTRY, 3, newer)
    services = Services(Settings.from_env({**env, "ATTACHE_PIPELINE_VERSION": "3",
                                           "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                           "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5",
                                           "ATTACHE_RETRY_INITIAL_SECONDS": "0"}))
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        failed = upload(services, data_file("photos/coffee.jpg"))
        with engine.begin() as conn:  # a job of version 3 that failed, for a replay
            conn.execute(jobs.update().where(jobs.c.id == failed.job_id)
                         .values(state="failed", error_code="storage_unavailable"))
        (message,) = take_messages(engine, accepted.job_id)
        monkeypatch.delitem(pipeline.REGISTRY, 3)  # the previous release's worker and web
        older = Workflow(services)
        for _ in range(services.settings.max_attempts + 1):
            with pytest.raises(VersionUnknownHere, match="pipeline version 3 is not registered"):
                older.handle(message, step=message["step"])
        waiting = job(engine, accepted.job_id)
        assert (waiting.state, waiting.attempt, waiting.lease_owner) == ("queued", 0, None)
        with engine.connect() as conn:
            moves = conn.execute(select(job_history.c.to_state).where(job_history.c.job_id == accepted.job_id)).all()
        assert [m.to_state for m in moves] == ["queued"], "never claimed"
        with pytest.raises(JobConflict, match="version 3 is not registered in this release"):
            operations.replay(services, failed.job_id, operator="olga", reason="after the rollback")

        monkeypatch.setitem(pipeline.REGISTRY, 3, newer)  # a worker of the release that made it
        current = Workflow(services)
        assert current.handle(message, step=message["step"]).status in ("inspected", "ready")
        run(current, engine, accepted.job_id)
        assert job(engine, accepted.job_id).state == "ready"
    finally:
        services.close()
