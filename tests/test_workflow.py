"""The pipeline steps run in-process against real PostgreSQL and storage.

Messages are taken from the outbox and handed to :class:`Workflow` directly
(what a worker does, without RabbitMQ in between), so each behaviour can be
driven step by step.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from sqlalchemy import func, select, text, update

from app.adapters.postgres.models import jobs, outbox, variants
from app.config import Settings
from app.core import pipeline, states
from app.core.steps import Step
from app.core.workflow import Workflow
from app.errors import VersionUnknownHere
from app.services import Services
from tests.driver import job, run, take_messages, upload
from tests.filesystems import read_only_view
from tests.sql_log import sql_log


class _NoJitter:
    def uniform(self, low: float, high: float) -> float:
        return 0.0


def test_each_step_backs_off_as_docs_retries_md_says():
    def waits(step, attempts):
        policy = step.retry_policy(2.0, 300.0)  # the default ATTACHE_RETRY_INITIAL_SECONDS and _MAX_SECONDS
        return [policy.delay(n, rng=_NoJitter()) for n in attempts]

    assert waits(Step.RENDER, range(1, 6)) == [4, 12, 36, 108, 300]
    assert waits(Step.INSPECT, range(1, 4)) == waits(Step.PUBLISH, range(1, 4)) == [2, 4, 8]
    assert (Step.INSPECT.retry_policy(2.0, 300.0).jitter, Step.RENDER.retry_policy(2.0, 300.0).jitter) == (0.2, 0.3)


def test_a_job_runs_to_ready_through_every_step(quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    outcomes = run(Workflow(quiet_services), engine, accepted.job_id)
    assert outcomes[0] == "inspected" and outcomes[-1] == "ready"
    assert sorted(o for o in outcomes if o == "rendered") == ["rendered"] * 4
    assert job(engine, accepted.job_id).state == "ready"


def test_inspect_announces_the_longest_renders_first(env, engine, data_file):
    """The worker's threads start renders in message order: the WebP first, the original's copy last."""
    services = Services(Settings.from_env({**env, "ATTACHE_PIPELINE_VERSION": "2",
                                           "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        [inspect] = take_messages(engine, accepted.job_id)
        assert Workflow(services).handle(inspect, step=inspect["step"]).status == "inspected"
        announced = [payload["variant"] for payload in take_messages(engine, accepted.job_id)]
        assert announced == ["webp", "optimized", "thumbnail", "crop", "original"]
    finally:
        services.engine.dispose()


def test_corrupt_pixels_end_failed_with_a_specific_code(quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    row = job(engine, accepted.job_id)
    assert (row.state, row.error_code) == ("failed", "corrupt_image")
    with engine.connect() as conn:
        published = conn.execute(select(func.count()).select_from(variants).where(variants.c.published_at.is_not(None))).scalar()
    assert published == 0, "a failed job publishes nothing"


def test_transient_storage_error_requeues_with_backoff_then_heals(quiet_services, env, engine, data_file):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    broken = Services(Settings.from_env({**env, "STORAGE_URL": "s3://attache?endpoint=http://127.0.0.1:1",
                                         "S3_ACCESS_KEY": "k", "S3_SECRET_KEY": "super-secret-value",
                                         "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                         "ATTACHE_RETRY_INITIAL_SECONDS": "0", "ATTACHE_STORAGE_WAIT_SECONDS": "0"}))
    payload = take_messages(engine, accepted.job_id)[0]
    assert Workflow(broken).handle(payload, step="inspect").status == "queued"
    row = job(engine, accepted.job_id)
    assert (row.state, row.attempt, row.error_code) == ("queued", 1, "storage_unavailable")
    assert row.next_attempt_at is not None
    assert "super-secret-value" not in row.error_reason and "http://" not in row.error_reason
    broken.engine.dispose()
    # storage is back: the next attempt (from the outbox) finishes the job
    outcomes = run(Workflow(quiet_services), engine, accepted.job_id)
    assert outcomes[-1] == "ready" and job(engine, accepted.job_id).attempt == 2


def test_attempts_are_bounded(env, engine, data_file):
    services = Services(Settings.from_env({**env, "ATTACHE_MAX_ATTEMPTS": "2", "ATTACHE_RETRY_INITIAL_SECONDS": "0",
                                           "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
    broken = Services(Settings.from_env({**env, "STORAGE_URL": "s3://attache?endpoint=http://127.0.0.1:1",
                                         "ATTACHE_RETRY_INITIAL_SECONDS": "0", "ATTACHE_STORAGE_WAIT_SECONDS": "0",
                                         "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
    accepted = upload(services, data_file("photos/chelsea.jpg"))
    run(Workflow(broken), engine, accepted.job_id)
    row = job(engine, accepted.job_id)
    assert (row.state, row.attempt, row.error_code) == ("failed", 2, "storage_unavailable")
    assert row.error_reason.startswith("attempts exhausted")
    services.engine.dispose()
    broken.engine.dispose()


def test_recovered_job_resumes_at_the_first_unfinished_step(quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    workflow = Workflow(quiet_services)
    [inspect] = take_messages(engine, accepted.job_id)
    workflow.handle(inspect, step="inspect")
    renders = take_messages(engine, accepted.job_id)
    done = [p for p in renders if p["variant"] in ("original", "thumbnail")]
    for payload in done:
        workflow.handle(payload, step="render")
    # the next render starts and its worker dies; its lease expires; the scheduler requeues
    with engine.begin() as conn:
        assert states.fence(conn, accepted.job_id, 1, states.Lease("worker:dies", 30))
        conn.execute(update(jobs).where(jobs.c.id == accepted.job_id).values(lease_expires_at=func.now() - text("interval '1 second'")))
        states.recover_expired(conn, batch=10, actor="scheduler:test")
    [retry] = take_messages(engine, accepted.job_id)
    assert retry["step"] == "inspect" and retry["attempt"] == 2
    workflow.handle(retry, step="inspect")
    announced = take_messages(engine, accepted.job_id)
    assert sorted(p["variant"] for p in announced) == ["crop", "optimized"], "finished renders are not redone"
    for payload in announced:
        workflow.handle(payload, step="render")
    [publish] = take_messages(engine, accepted.job_id)
    assert workflow.handle(publish, step="publish").status == "ready"
    with engine.connect() as conn:
        attempts = dict(conn.execute(select(variants.c.variant, variants.c.attempt)).all())
    assert attempts == {"original": 1, "thumbnail": 1, "crop": 2, "optimized": 2}


def test_a_worker_that_lost_its_lease_makes_nothing_visible(quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    workflow = Workflow(quiet_services)
    [inspect] = take_messages(engine, accepted.job_id)
    workflow.handle(inspect, step="inspect")
    renders = take_messages(engine, accepted.job_id)
    with engine.begin() as conn:  # a render took the lease and hung past it
        assert states.fence(conn, accepted.job_id, 1, states.Lease("worker:hung", 30))
        conn.execute(update(jobs).where(jobs.c.id == accepted.job_id).values(lease_expires_at=func.now() - text("interval '1 second'")))
    assert {workflow.handle(p, step="render").status for p in renders} == {"stale"}
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(variants)).scalar() == 0


def test_heartbeat_keeps_a_long_step_leased(env, engine, data_file):
    services = Services(Settings.from_env({**env, "ATTACHE_LEASE_SECONDS": "1",
                                           "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
    accepted = upload(services, data_file("photos/chelsea.jpg"))
    lease = states.Lease("worker:test", 1.0)
    with engine.begin() as conn:
        assert states.claim(conn, accepted.job_id, 1, lease)
    workflow = Workflow(services)
    lapsed = select(states.expired()).where(jobs.c.id == accepted.job_id)
    with workflow._lease_kept(accepted.job_id, 1, lease):
        time.sleep(2.5)  # a step that runs past its lease length
    with engine.begin() as conn:
        assert conn.execute(lapsed).scalar() is False, "the heartbeat kept the lease alive"
    time.sleep(1.2)
    with engine.begin() as conn:
        assert conn.execute(lapsed).scalar() is True, "without it, the lease expires"
        assert states.fence(conn, accepted.job_id, 1, states.Lease("worker:other", 1.0)) is None
    services.engine.dispose()


def test_inspect_keeps_its_lease_while_a_slow_store_hands_over_the_original(env, engine, data_file):
    """Fetching a large original from a slow S3 can outlast the lease: the heartbeat covers inspect too."""
    import contextlib
    from functools import cached_property

    from app.adapters.storage import storage_from_url
    from app.adapters.storage.filesystem import FilesystemStorage

    class SlowStore(FilesystemStorage):  # the real filesystem store, taking its time to hand over a file
        @contextlib.contextmanager
        def fetch_to_path(self, key):
            time.sleep(2.5)
            with super().fetch_to_path(key) as path:
                yield path

    class SlowServices(Services):
        @cached_property
        def storage(self):
            return SlowStore(storage_from_url(self.settings.storage_url).root)

    settings = Settings.from_env({**env, "ATTACHE_LEASE_SECONDS": "1",
                                  "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"})
    uploader = Services(settings)
    accepted = upload(uploader, data_file("photos/chelsea.jpg"))
    uploader.engine.dispose()
    services = SlowServices(settings)
    [inspect] = take_messages(engine, accepted.job_id)
    assert Workflow(services).handle(inspect, step="inspect").status == "inspected"
    services.engine.dispose()


def test_a_message_its_attempt_does_not_hold_is_told_apart_in_the_steps_opening(quiet_services, engine, data_file):
    """No job: poison. Another job's message: poison, and the fence it took is rolled back. Failed: ignored."""
    import uuid

    import pytest

    from app.errors import InvalidMessage, UnknownJob

    workflow = Workflow(quiet_services)
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    [inspect] = take_messages(engine, accepted.job_id)
    with pytest.raises(UnknownJob):
        workflow.handle({**inspect, "job_id": str(uuid.uuid4())}, step="inspect")
    with pytest.raises(InvalidMessage, match="does not match the job"):  # claimable, but names another attachment
        workflow.handle({**inspect, "attachment_id": str(uuid.uuid4())}, step="inspect")
    row = job(engine, accepted.job_id)
    assert (row.state, row.attempt, row.lease_owner) == ("queued", 0, None), "the claim was rolled back"
    assert workflow.handle(inspect, step="inspect").status == "inspected"
    render = take_messages(engine, accepted.job_id)[0]
    assert render["pipeline_version"] == 1 and render["variant"] in pipeline.get(2).variants
    with pytest.raises(InvalidMessage, match="does not match the job"):  # held, but names another version
        workflow.handle({**render, "pipeline_version": 2}, step="render")
    assert job(engine, accepted.job_id).lease_owner is None, "the fence it took was rolled back"
    with engine.begin() as conn:
        assert states.fail(conn, accepted.job_id, 1, "test", "failed by the test", "test")
    assert workflow.handle(render, step="render").status == "ignored"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(variants)
                            .where(variants.c.job_id == accepted.job_id)).scalar() == 0


def test_a_render_commits_twice_its_opening_and_its_outcome_with_its_timing(quiet_services, engine, data_file):
    """The fence and what the render needs in one transaction; the variant, hand-off and step_runs row in one more."""
    from app.adapters.postgres.models import step_runs

    workflow = Workflow(quiet_services)
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    [inspect] = take_messages(engine, accepted.job_id)
    assert workflow.handle(inspect, step="inspect").status == "inspected"
    render = next(p for p in take_messages(engine, accepted.job_id) if p["variant"] == "thumbnail")
    with sql_log(quiet_services.engine) as log:
        assert workflow.handle(render, step="render").status == "rendered"
    assert len(log.commits) == 2, f"{len(log.commits)} commits"
    with engine.connect() as conn:
        run_row = conn.execute(select(step_runs).where(step_runs.c.job_id == accepted.job_id,
                                                       step_runs.c.variant == "thumbnail")).one()
    assert (run_row.outcome, run_row.attempt) == ("rendered", 1) and run_row.seconds > 0


def test_a_message_naming_an_unregistered_version_is_poison_and_leaves_the_job_alone(quiet_services, engine,
                                                                                       data_file):
    """Checked against the job before the version is looked up: not a failure of the job it names."""
    import pytest

    from app.errors import InvalidMessage

    workflow = Workflow(quiet_services)
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    [inspect] = take_messages(engine, accepted.job_id)
    assert workflow.handle(inspect, step="inspect").status == "inspected"
    render = take_messages(engine, accepted.job_id)[0]
    for step, payload in (("render", render), ("publish", {**render, "step": "publish"})):
        payload = {key: value for key, value in payload.items() if step == "render" or key != "variant"}
        with pytest.raises(InvalidMessage, match="does not match the job"):
            workflow.handle({**payload, "pipeline_version": 99}, step=step)
    row = job(engine, accepted.job_id)
    assert (row.state, row.attempt, row.error_code, row.lease_owner) == ("processing", 1, None, None)


# --- a small image: inspect makes its variants ----------------------------------------------------------------


def offline_services(env, **extra):
    """Services whose broker is unreachable: the steps' messages stay in the outbox for ``run`` to deliver."""
    return Services(Settings.from_env({**env, "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                       "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5", **extra}))


def small_image_services(env, **extra):
    return offline_services(env, **{"ATTACHE_ONE_STEP_MAX_PIXELS": str(1024 * 1024), **extra})


def recorded_variants(engine, job_id):
    with engine.connect() as conn:
        return dict(conn.execute(select(variants.c.variant, variants.c.storage_key)
                                 .where(variants.c.job_id == job_id)).all())


def test_a_small_image_is_made_and_published_by_inspect(env, engine, data_file, storage_dir):
    """One step, not one per variant and a publish: the objects and rows are the ones the render steps make."""
    services = small_image_services(env, ATTACHE_PIPELINE_VERSION="2")
    per_variant = Services(Settings.from_env({**env, "ATTACHE_PIPELINE_VERSION": "2",
                                              "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
    try:
        small = upload(services, data_file("photos/chelsea.jpg"))  # 451x300
        assert run(Workflow(services), engine, small.job_id) == ["ready"]
        apart = upload(per_variant, data_file("photos/chelsea.jpg"))
        assert run(Workflow(per_variant), engine, apart.job_id).count("rendered") == 5
        inline, rendered = recorded_variants(engine, small.job_id), recorded_variants(engine, apart.job_id)
        assert set(inline) == set(rendered) == set(pipeline.get(2).variants)
        for name in inline:  # the same bytes (the keys name their SHA-256), the original aside (its own attachment)
            if name != "original":
                assert inline[name].rsplit("/", 1)[1] == rendered[name].rsplit("/", 1)[1], name
            assert (storage_dir / inline[name]).exists()
        big = Services(Settings.from_env({**env, "ATTACHE_ONE_STEP_MAX_PIXELS": str(451 * 300 - 1),
                                          "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
        try:  # one pixel over: a render message per variant
            over = upload(big, data_file("photos/chelsea.jpg"))
            assert run(Workflow(big), engine, over.job_id).count("rendered") == 4
        finally:
            big.engine.dispose()
    finally:
        services.engine.dispose()
        per_variant.engine.dispose()



def test_a_small_images_outcome_records_its_variants_in_one_statement_and_reads_no_owner(env, engine, data_file):
    """Each statement of the step is a round trip on its critical path: five ``INSERT``s of variant rows, and the
    event's lookup of an owner its job row already carries, cost the small photo some 2-3 ms before."""
    from app.adapters.postgres.models import events

    services = small_image_services(env, ATTACHE_PIPELINE_VERSION="2")
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        [inspect] = take_messages(engine, accepted.job_id)
        with sql_log(services.engine) as log:
            assert Workflow(services).handle(inspect, step="inspect").status == "ready"
        inserts = [s for s in log.statements if s.startswith("INSERT INTO variants")]
        assert len(inserts) == 1, inserts
        assert not [s for s in log.statements if s.startswith("SELECT attachments.owner")]
        assert set(recorded_variants(engine, accepted.job_id)) == set(pipeline.get(2).variants)
        with engine.connect() as conn:
            event = conn.execute(select(events).where(events.c.job_id == accepted.job_id)).one()
        assert (event.owner, event.document["data"]["uploader"], event.type) == ("t", "t", "attachment.ready")
    finally:
        services.engine.dispose()


def test_by_default_a_12_mp_photo_is_made_in_one_step_too(env, engine, data_file):
    """The default takes every image the default limits accept: v2's ``optimized`` and ``webp`` of a large photo
    come from one decode in one process, which separate render messages do not ensure."""
    defaults = {key: value for key, value in env.items() if key != "ATTACHE_ONE_STEP_MAX_PIXELS"}
    services = offline_services(defaults, ATTACHE_PIPELINE_VERSION="2")
    try:
        assert services.settings.one_step_max_pixels >= services.settings.max_pixels
        accepted = upload(services, data_file("photos/rocket_12mp_4241x2830.jpg"))
        assert run(Workflow(services), engine, accepted.job_id) == ["ready"]
        assert set(recorded_variants(engine, accepted.job_id)) == set(pipeline.get(2).variants)
    finally:
        services.engine.dispose()


def test_an_inspect_that_lost_its_lease_while_making_variants_records_none(env, engine, data_file, monkeypatch):
    """Its objects stay unreferenced (the object GC's); the attempt holding the job makes and records them."""
    services = small_image_services(env)
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        workflow = Workflow(services)
        [inspect] = take_messages(engine, accepted.job_id)
        make = Workflow._make_object

        def lose_the_lease_then_make(self, *args):
            with engine.begin() as conn:  # the lease expired meanwhile and the scheduler gave the job attempt 2
                conn.execute(update(jobs).where(jobs.c.id == accepted.job_id)
                             .values(lease_expires_at=func.now() - text("interval '1 second'")))
                states.recover_expired(conn, batch=10, actor="scheduler:test")
            return make(self, *args)

        monkeypatch.setattr(Workflow, "_make_object", lose_the_lease_then_make)
        outcome = workflow.handle(inspect, step="inspect")
        assert outcome.status == "stale" and "unreferenced" in outcome.detail
        assert recorded_variants(engine, accepted.job_id) == {}
        monkeypatch.setattr(Workflow, "_make_object", make)
        assert run(workflow, engine, accepted.job_id) == ["ready"]
        row = job(engine, accepted.job_id)
        assert (row.state, row.attempt) == ("ready", 2)
    finally:
        services.engine.dispose()


def test_a_redelivered_inspect_makes_only_what_is_not_recorded_and_late_renders_change_nothing(env, engine,
                                                                                               data_file):
    services = small_image_services(env)
    per_variant = Services(Settings.from_env({**env, "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        [inspect] = take_messages(engine, accepted.job_id)
        # an earlier deployment's worker (per variant) announced the renders and made two of them
        assert Workflow(per_variant).handle(inspect, step="inspect").status == "inspected"
        renders = take_messages(engine, accepted.job_id)
        for payload in renders:
            if payload["variant"] in ("original", "thumbnail"):
                Workflow(per_variant).handle(payload, step="render")
        before = recorded_variants(engine, accepted.job_id)
        outcome = Workflow(services).handle(inspect, step="inspect")  # redelivered to this deployment
        assert outcome.status == "ready" and outcome.detail.startswith("2 variant(s) made")
        after = recorded_variants(engine, accepted.job_id)
        assert set(after) == set(pipeline.get(1).variants) and all(after[k] == v for k, v in before.items())
        late = [Workflow(services).handle(p, step="render").status for p in renders
                if p["variant"] not in ("original", "thumbnail")]
        assert late == ["already_ready", "already_ready"]
        assert run(Workflow(services), engine, accepted.job_id) == [], "inspect published; the late renders nothing"
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(variants)
                                .where(variants.c.job_id == accepted.job_id)).scalar() == 4, "one row per variant"
    finally:
        services.engine.dispose()
        per_variant.engine.dispose()


def test_a_small_corrupt_image_fails_in_inspect_with_its_code(env, engine, data_file):
    services = small_image_services(env)
    try:
        accepted = upload(services, data_file("pillow/truncated_jpeg.jpg"))
        run(Workflow(services), engine, accepted.job_id)
        row = job(engine, accepted.job_id)
        assert (row.state, row.error_code) == ("failed", "corrupt_image")
        # as with a render step per variant: the original's copy (no decoding) is recorded, nothing is published
        assert set(recorded_variants(engine, accepted.job_id)) == {"original"}
        with engine.connect() as conn:
            assert not conn.execute(select(variants.c.id).where(variants.c.job_id == accepted.job_id,
                                                                variants.c.published_at.is_not(None))).all()
    finally:
        services.engine.dispose()


def _due_in(engine, job_id) -> float:
    """Seconds from the failure's record to the next attempt (both are the database's clock)."""
    with engine.connect() as conn:
        return conn.execute(select(func.extract("epoch", jobs.c.next_attempt_at - jobs.c.updated_at))
                            .where(jobs.c.id == job_id)).scalar_one()


def _heal(engine, job_id):
    with engine.begin() as conn:  # the retry is due now
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(next_attempt_at=func.now()))
        conn.execute(update(outbox).where(outbox.c.job_id == job_id, outbox.c.published_at.is_(None))
                     .values(available_at=func.now()))


def test_an_inline_render_that_cannot_write_backs_off_as_a_render_does(env, engine, data_file, storage_dir):
    """docs/retries.md: a step that decodes and writes objects backs off harder (storage trouble tends to last);
    inspect making a small image's variants is that step, so its render errors wait the render's 4 s, not 2 s."""
    services = small_image_services(env)
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        blocker = storage_dir / "attachments" / str(accepted.attachment_id)
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_bytes(b"")  # a file where the attachment's objects go: every write fails (ENOTDIR)
        [inspect] = take_messages(engine, accepted.job_id)
        assert Workflow(services).handle(inspect, step="inspect").status == "queued"
        row = job(engine, accepted.job_id)
        assert (row.state, row.error_code) == ("queued", "storage_error")
        render_policy = Step.RENDER.retry_policy(services.settings.retry_initial_seconds,
                                                 services.settings.retry_max_seconds)
        assert _due_in(engine, accepted.job_id) >= render_policy.initial_interval * (1 - render_policy.jitter) - 0.05
        blocker.unlink()
        _heal(engine, accepted.job_id)
        assert run(Workflow(services), engine, accepted.job_id) == ["ready"]
    finally:
        services.engine.dispose()


def test_an_inline_render_failing_keeps_what_the_other_variants_made(env, engine, data_file, storage_dir):
    """As with a render message per variant: a variant made is recorded, and the next attempt makes only the rest."""
    services = small_image_services(env)
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        blocker = storage_dir / "attachments" / str(accepted.attachment_id) / "v1"
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_bytes(b"")  # the renders cannot write; the original's copy can
        [inspect] = take_messages(engine, accepted.job_id)
        assert Workflow(services).handle(inspect, step="inspect").status == "queued"
        assert set(recorded_variants(engine, accepted.job_id)) == {"original"}
        assert job(engine, accepted.job_id).error_code == "storage_error"
        blocker.unlink()
        _heal(engine, accepted.job_id)
        [retry] = take_messages(engine, accepted.job_id)
        outcome = Workflow(services).handle(retry, step="inspect")
        assert outcome.status == "ready" and outcome.detail.startswith("3 variant(s) made"), outcome
        assert run(Workflow(services), engine, accepted.job_id) == []
    finally:
        services.engine.dispose()


def test_a_step_run_starts_when_the_step_started_however_long_its_outcome_transaction(env, engine, data_file,
                                                                                      monkeypatch):
    """finished_at minus seconds is the start a job's timeline shows: finished_at was the outcome transaction's
    now(), its start, so every statement before the run's row moved the step's start earlier by its time."""
    services = small_image_services(env)
    record_variants = Workflow._record_variants

    def slow(self, *args):
        time.sleep(0.5)  # a slow statement inside the outcome transaction
        return record_variants(self, *args)

    monkeypatch.setattr(Workflow, "_record_variants", slow)
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        [inspect] = take_messages(engine, accepted.job_id)
        before = time.time()
        assert Workflow(services).handle(inspect, step="inspect").status == "ready"
        with engine.connect() as conn:
            started = conn.execute(text(
                "SELECT extract(epoch FROM finished_at) - seconds FROM step_runs WHERE job_id = :job"),
                {"job": accepted.job_id}).scalar()
        assert float(started) >= before - 0.05, f"started {before - float(started):.3f} s before it was called"
    finally:
        services.engine.dispose()


def test_a_permanent_inline_error_fails_the_job_even_when_a_costlier_variant_failed_transiently(
        env, engine, data_file, monkeypatch):
    """Retrying cannot help a corrupt image: the job ends failed with its code at once, not after every attempt."""
    from app.errors import StorageUnavailable

    services = small_image_services(env, ATTACHE_RETRY_INITIAL_SECONDS="0")
    make = Workflow._make_object

    def optimized_write_fails(self, attachment, version, variant, path):
        if variant == "optimized":  # the costliest, first in order: its PUT met a storage blip
            raise StorageUnavailable("storage blip")
        return make(self, attachment, version, variant, path)

    monkeypatch.setattr(Workflow, "_make_object", optimized_write_fails)
    try:
        accepted = upload(services, data_file("pillow/truncated_jpeg.jpg"))
        [inspect] = take_messages(engine, accepted.job_id)
        Workflow(services).handle(inspect, step="inspect")
        row = job(engine, accepted.job_id)
        assert (row.state, row.error_code, row.attempt) == ("failed", "corrupt_image", 1)
    finally:
        services.engine.dispose()


def test_a_small_image_on_s3_is_made_by_inspect_from_one_download(env, engine, data_file):
    """On S3 the original is a temporary download: both threads read it before it is removed, and the original's
    copy is made in the bucket."""
    from tests.s3server import moto_server

    with moto_server() as endpoint:
        services = small_image_services(env, ATTACHE_PIPELINE_VERSION="2", S3_ACCESS_KEY="test",
                                        STORAGE_URL=f"s3://inline?endpoint={endpoint}", S3_SECRET_KEY="test-secret")
        try:
            services.storage.ensure_bucket()
            accepted = upload(services, data_file("photos/chelsea.jpg"))
            assert run(Workflow(services), engine, accepted.job_id) == ["ready"]
            made = recorded_variants(engine, accepted.job_id)
            assert set(made) == set(pipeline.get(2).variants)
            assert all(services.storage.stat(key) is not None for key in made.values())
            assert services.storage.stat(pipeline.staging_key(accepted.attachment_id)) is None
        finally:
            services.engine.dispose()


def test_v1_publishing_while_v2s_inspect_makes_its_variants_from_staging_keeps_staging(env, engine, data_file,
                                                                                       storage_dir, monkeypatch):
    """Both versions of a small image: v2's inspect read where the original is (staging) before v1 published the
    kept one; v1's inspect publishing in the middle of v2's renders must leave staging for them, and v2's inspect,
    the last one out, removes it."""
    import threading

    services = small_image_services(env)
    v2_services = small_image_services(env, ATTACHE_PIPELINE_VERSION="2")
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        workflow = Workflow(services)
        [v1_inspect] = take_messages(engine, accepted.job_id)
        with engine.begin() as conn:
            v2_job, _ = states.create_job(conn, attachment_id=accepted.attachment_id, pipeline_version=2,
                                          max_attempts=3, traceparent=v1_inspect["traceparent"], tracestate=None,
                                          actor="test", room_bytes=0)
        # (a backfill creates the same job once v1 is ready; made directly here, while v1 is not yet)
        [v2_inspect] = take_messages(engine, v2_job)
        make, published, once = Workflow._make_object, [], threading.Lock()

        def v1_publishes_meanwhile(self, attachment, version, variant, path):
            if version.version == 2:
                with once:  # the first of v2's renders, on either thread
                    if not published:
                        published.append(workflow.handle(v1_inspect, step="inspect").status)
                        published.append((storage_dir / pipeline.staging_key(accepted.attachment_id)).exists())
            return make(self, attachment, version, variant, path)

        monkeypatch.setattr(Workflow, "_make_object", v1_publishes_meanwhile)
        assert Workflow(v2_services).handle(v2_inspect, step="inspect").status == "ready"
        assert published == ["ready", True], "v1 published, and left staging: v2 was reading it"
        assert job(engine, accepted.job_id).state == job(engine, v2_job).state == "ready"
        assert set(recorded_variants(engine, v2_job)) == set(pipeline.get(2).variants)
        assert not (storage_dir / pipeline.staging_key(accepted.attachment_id)).exists(), "the last one out"
    finally:
        services.engine.dispose()
        v2_services.engine.dispose()


def test_a_step_whose_worker_does_not_know_the_jobs_version_gives_its_message_back(env, engine, data_file,
                                                                                    monkeypatch):
    """Not a silent 'stale' either, which acks the message: it raises for Dramatiq's retry (then the dead letters
    and the reconciler), its claim or fence rolled back. It was a failed attempt, and in a rolling deploy every
    job of the new version ended ``failed`` within 30 s (an adversarial run; tests/test_pipeline_versions.py)."""
    services = small_image_services(env, ATTACHE_PIPELINE_VERSION="2", ATTACHE_MAX_ATTEMPTS="1")
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        [inspect] = take_messages(engine, accepted.job_id)
        with monkeypatch.context() as older:  # a worker of an older release, in a rolling deploy
            older.delitem(pipeline.REGISTRY, 2)
            with pytest.raises(VersionUnknownHere):
                Workflow(services).handle(inspect, step="inspect")
        row = job(engine, accepted.job_id)
        assert (row.state, row.attempt, row.lease_owner, row.error_code) == ("queued", 0, None, None)
        assert Workflow(services).handle(inspect, step="inspect").status == "ready", "a worker that knows it"
    finally:
        services.engine.dispose()


def test_a_redelivery_to_a_ready_job_is_acked_while_storage_refuses_writes(quiet_services, env, engine,
                                                                            storage_dir, data_file):
    """Verifying a ready job removes its staging at best: an error there is left to the staging cleanup.

    The soak dead-lettered the four render messages of a job recovered from a
    SIGSTOPped worker: they came back while storage was read-only, and the
    staging delete of their verification raised (EROFS even for a missing
    file) until Dramatiq's retries were spent.
    """
    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    assert job(engine, accepted.job_id).state == "ready"
    with engine.connect() as conn:
        sent = [row.payload for row in conn.execute(select(outbox).where(outbox.c.job_id == accepted.job_id))]
    with read_only_view(storage_dir) as view:
        read_only = Services(Settings.from_env({**env, "STORAGE_URL": f"file://{view}",
                                                "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
        try:
            for payload in sent:  # every message of the job, delivered again
                assert Workflow(read_only).handle(payload, step=payload["step"]).status == "already_ready"
        finally:
            read_only.engine.dispose()
    assert job(engine, accepted.job_id).state == "ready"


@pytest.mark.parametrize("damage", ["zeroed_tail", "zeroed_middle"])
def test_an_original_damaged_in_storage_fails_its_job_and_publishes_nothing(quiet_services, engine, storage_dir,
                                                                          data_file, damage):
    """The staged bytes are checked against the SHA-256 taken at upload before anything is made of them.

    A thin-provisioned disk whose backing filled zeroed staged originals
    whose fsync had succeeded; their jobs ended ``ready`` with an
    ``original`` that was not the upload and did not decode (an adversarial
    review). The damage here keeps the length, as that disk did.
    """
    from app.adapters.postgres.models import variants

    accepted = upload(quiet_services, data_file("photos/chelsea.jpg"))
    staged = storage_dir / pipeline.staging_key(accepted.attachment_id)
    data = bytearray(staged.read_bytes())
    start = len(data) - 4096 if damage == "zeroed_tail" else len(data) // 2
    data[start:start + 4096] = bytes(4096)
    staged.write_bytes(bytes(data))
    run(Workflow(quiet_services), engine, accepted.job_id)
    row = job(engine, accepted.job_id)
    assert (row.state, row.error_code) == ("failed", "original_corrupted")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(variants)).scalar_one() == 0


@contextlib.contextmanager
def _inspect_on_broken_storage(env, engine, data_file, failure: str, **settings):
    """The inspect message of a small photo, for services whose storage writes all raise ``StorageUnavailable``
    (``failure``); yields (services, message, how many writes were tried)."""
    from app.errors import StorageUnavailable

    services = small_image_services(env, **settings)
    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise StorageUnavailable(f"put failed: {failure}", where="s3://broken")

    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        [inspect] = take_messages(engine, accepted.job_id)
        services.storage.put_bytes = services.storage.copy = broken
        yield services, inspect, calls
    finally:
        services.engine.dispose()


def test_a_worker_shutting_down_in_a_storage_wait_gives_the_message_back_and_charges_no_attempt(env, engine,
                                                                                                data_file):
    """A step waiting for storage when the worker began to stop (SIGTERM: a deploy, a rescheduled pod) recorded a
    managed retry: an attempt per stop, and five stops in a disk-full spell of 54 s failed the upload (an
    adversarial run; a kill -9 cost nothing). Now the message goes back to the broker, as after a PostgreSQL
    outage, and the job keeps its attempt and its lease for the next worker."""
    import threading

    from app.errors import StorageWaitInterrupted

    stopping = threading.Event()
    with _inspect_on_broken_storage(env, engine, data_file, "No space left on device",
                                    ATTACHE_STORAGE_WAIT_SECONDS="60") as (services, inspect, _):
        threading.Timer(1.5, stopping.set).start()  # the worker is told to stop while the step waits
        began = time.monotonic()
        with pytest.raises(StorageWaitInterrupted):
            Workflow(services, stopping=stopping).handle(inspect, step="inspect")
        assert time.monotonic() - began < 10, "the wait ends when the worker stops"
        row = job(engine, inspect["job_id"])
        assert (row.state, row.attempt, row.error_code) == ("processing", 1, None)


def test_a_step_makes_no_more_storage_calls_once_its_wait_is_spent(env, engine, data_file):
    """One call to a hung S3 endpoint can take 90 s (the client's timeouts and retries): each variant's call made
    after the deadline took that long again, toward the step's 600 s time limit (an adversarial run). Once a call
    has failed past the deadline, the step's other calls fail at once."""
    with _inspect_on_broken_storage(env, engine, data_file, "read timed out", ATTACHE_STORAGE_WAIT_SECONDS="0",
                                    ATTACHE_RETRY_INITIAL_SECONDS="0") as (services, inspect, calls):
        assert Workflow(services).handle(inspect, step="inspect").status == "queued"
        assert len(calls) <= 2, f"{len(calls)} calls after the wait was spent (one per inline thread at most)"


def test_a_timeout_recorded_as_its_step_returns_is_never_taken_back_after_the_steps_outcome(env, engine, data_file,
                                                                                             monkeypatch):
    """A render returned just past its time limit while its heartbeat was recording the timeout, slowly (a slow
    PostgreSQL): the step waited 5 s for the heartbeat, committed its variant and handed off, and the timeout then
    took the attempt back (an adversarial run). The step now waits for the record, and its fence finds the attempt
    taken back: one outcome, the timeout's."""
    from app.errors import StepTimedOut

    services = offline_services(env, ATTACHE_STEP_TIME_LIMIT_SECONDS="1", ATTACHE_DATABASE_WAIT_SECONDS="0.5",
                                ATTACHE_STORAGE_WAIT_SECONDS="0.5", ATTACHE_LEASE_SECONDS="30")
    try:
        accepted = upload(services, data_file("photos/chelsea.jpg"))
        workflow = Workflow(services)
        [inspect] = take_messages(engine, accepted.job_id)
        assert workflow.handle(inspect, step="inspect").status == "inspected"
        render = next(p for p in take_messages(engine, accepted.job_id) if p["variant"] == "thumbnail")
        make, record = Workflow._make_object, Workflow.record_failure

        def past_the_limit(self, *args):
            time.sleep(1.1)
            return make(self, *args)

        def slowly(self, job_id, attempt, step, error, *args, **kwargs):
            if isinstance(error, StepTimedOut):
                time.sleep(6)
            return record(self, job_id, attempt, step, error, *args, **kwargs)

        monkeypatch.setattr(Workflow, "_make_object", past_the_limit)
        monkeypatch.setattr(Workflow, "record_failure", slowly)
        outcome = workflow.handle(render, step="render")
        assert outcome.status == "stale", outcome
        row = job(engine, accepted.job_id)
        assert (row.state, row.error_code) == ("queued", "step_timeout")
        assert "thumbnail" not in recorded_variants(engine, accepted.job_id)
    finally:
        services.engine.dispose()
