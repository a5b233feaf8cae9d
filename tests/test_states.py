"""The state machine, driven directly against a real PostgreSQL."""

import re
import uuid

import pytest
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.exc import DBAPIError

from app.adapters.postgres.models import (
    JobState,
    attachments,
    job_history,
    jobs,
    outbox,
    variants,
)
from app.core import states
from app.observability.tracing import new_traceparent

LEASE = states.Lease("worker:test", 30)
REQUIRED = ("original", "thumbnail")


def seed(conn, max_attempts=3):
    attachment_id = uuid.uuid4()
    conn.execute(insert(attachments).values(
        id=attachment_id, owner="t", filename="a.jpg", content_type="image/jpeg", format="JPEG", size=1,
        sha256="0" * 64, width=1, height=1, staging_key=f"staging/{attachment_id}"))
    job_id, outbox_id = states.create_job(conn, attachment_id=attachment_id, pipeline_version=1,
                                          max_attempts=max_attempts, traceparent=new_traceparent(),
                                          tracestate=None, actor="test", room_bytes=0)
    return attachment_id, job_id


def record(conn, attachment_id, job_id, name, attempt=1):
    conn.execute(insert(variants).values(
        job_id=job_id, attachment_id=attachment_id, pipeline_version=1, variant=name, storage_key=f"k/{name}",
        content_type="image/jpeg", size=1, sha256="1" * 64, width=1, height=1, attempt=attempt))


def history(conn, job_id):
    return [(r.from_state, r.to_state, r.attempt) for r in
            conn.execute(select(job_history).where(job_history.c.job_id == job_id).order_by(job_history.c.id))]


def test_the_database_allows_exactly_the_job_states_of_the_enum(engine):
    """The migrations' CHECK constraint and :class:`JobState` name the same states."""
    with engine.connect() as conn:
        definition = conn.execute(text(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'jobs_state_check'")).scalar_one()
    allowed = set(re.findall(r"'(\w+)'::text", definition))
    assert allowed == {state.value for state in JobState}


def test_create_job_writes_job_history_and_outbox_in_one_go(engine):
    with engine.begin() as conn:
        _, job_id = seed(conn)
        job = states.get(conn, job_id)
        assert (job.state, job.attempt) == ("queued", 0)
        assert history(conn, job_id) == [(None, "queued", 0)]
        rows = conn.execute(select(outbox).where(outbox.c.job_id == job_id)).all()
        assert len(rows) == 1 and rows[0].payload["step"] == "inspect" and rows[0].payload["attempt"] == 1


def test_claim_takes_exactly_the_next_attempt(engine):
    with engine.begin() as conn:
        _, job_id = seed(conn)
        assert states.claim(conn, job_id, 2, LEASE) is None       # a message from the future claims nothing
        row = states.claim(conn, job_id, 1, LEASE)
        assert (row.state, row.attempt, row.lease_owner) == ("processing", 1, "worker:test")
        assert states.claim(conn, job_id, 1, LEASE) is None       # a duplicate cannot claim twice
        assert history(conn, job_id)[-1] == ("queued", "processing", 1)


def test_fence_refuses_other_attempts_and_expired_leases(engine):
    other = states.Lease("worker:other", 30)
    with engine.begin() as conn:
        _, job_id = seed(conn)
        states.claim(conn, job_id, 1, LEASE)
        assert states.fence(conn, job_id, 1, LEASE) is not None
        assert states.fence(conn, job_id, 2, LEASE) is None
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(lease_expires_at=func.now() - text("interval '1 second'")))
        assert states.fence(conn, job_id, 1, other) is None
        assert states.fence(conn, job_id, 1, other, take=False) is None
        assert states.renew(conn, job_id, 1, other) is False


def test_a_lapsed_lease_is_its_own_step_s_until_lease_recovery_takes_the_job_back(engine):
    """An outage longer than the lease stops the heartbeat of a step that lives: nobody was given the job, so
    the attempt's one running step (inspect) that owns the lapsed lease renews it, passes its fences and
    publishes; once lease recovery has taken the job back, it is stale (states.held_by). Render steps run side
    by side: for them a lapsed lease is lost, as before."""
    lapse = update(jobs).values(lease_expires_at=func.now() - text("interval '1 second'"))
    inspect = states.Lease(LEASE.owner, LEASE.seconds, sole=True)  # its attempt's one running step
    sibling = LEASE  # a render step: one of several side by side
    with engine.begin() as conn:
        attachment_id, job_id = seed(conn)
        states.claim(conn, job_id, 1, inspect)
        conn.execute(lapse.where(jobs.c.id == job_id))
        assert states.fence(conn, job_id, 1, sibling, take=False) is None, "a lapsed lease is no sibling's"
        assert states.renew(conn, job_id, 1, sibling) is False
        assert states.fence(conn, job_id, 1, inspect, take=False) is not None
        assert states.renew(conn, job_id, 1, inspect) is True
        assert states.get(conn, job_id).lease_expires_at > conn.execute(select(func.now())).scalar()
        conn.execute(lapse.where(jobs.c.id == job_id))
        assert states.fence(conn, job_id, 1, inspect) is not None, "a step run again after the outage takes it"
        conn.execute(lapse.where(jobs.c.id == job_id))
        for variant in REQUIRED:
            record(conn, attachment_id, job_id, variant)
        assert states.publish_ready(conn, job_id, 1, REQUIRED, inspect.owner) is True

        taken_attachment, taken_back = seed(conn)
        states.claim(conn, taken_back, 1, inspect)
        conn.execute(lapse.where(jobs.c.id == taken_back))
        assert states.recover_expired(conn, batch=10, actor="scheduler:test") == {"requeued": 1, "failed": 0}
        assert states.fence(conn, taken_back, 1, inspect) is None
        assert states.renew(conn, taken_back, 1, inspect) is False
        for variant in REQUIRED:
            record(conn, taken_attachment, taken_back, variant)
        assert states.publish_ready(conn, taken_back, 1, REQUIRED, inspect.owner) is False


def test_publish_needs_every_variant_and_flips_atomically(engine):
    with engine.begin() as conn:
        attachment_id, job_id = seed(conn)
        states.claim(conn, job_id, 1, LEASE)
        record(conn, attachment_id, job_id, "original")
        assert states.publish_ready(conn, job_id, 1, REQUIRED, "w") is False
        assert conn.execute(select(func.count()).select_from(variants).where(variants.c.published_at.is_not(None))).scalar() == 0
        record(conn, attachment_id, job_id, "thumbnail")
        assert states.publish_ready(conn, job_id, 2, REQUIRED, "w") is False   # wrong attempt
        assert states.publish_ready(conn, job_id, 1, REQUIRED, "w") is True
        assert states.get(conn, job_id).state == "ready"
        assert conn.execute(select(func.count()).select_from(variants).where(variants.c.published_at.is_(None))).scalar() == 0
        assert states.publish_ready(conn, job_id, 1, REQUIRED, "w") is False   # idempotent


def test_effect_key_is_unique(engine):
    with pytest.raises(DBAPIError):
        with engine.begin() as conn:
            attachment_id, job_id = seed(conn)
            record(conn, attachment_id, job_id, "thumbnail")
            record(conn, attachment_id, job_id, "thumbnail", attempt=2)


def test_ready_never_regresses_even_for_raw_sql(engine):
    with engine.begin() as conn:
        attachment_id, job_id = seed(conn)
        states.claim(conn, job_id, 1, LEASE)
        for name in REQUIRED:
            record(conn, attachment_id, job_id, name)
        assert states.publish_ready(conn, job_id, 1, REQUIRED, "w")
        # the state machine offers no way out of ready ...
        assert states.claim(conn, job_id, 2, LEASE) is None
        assert states.fail(conn, job_id, 1, "x", "y", "w") is False
        assert states.retry_later(conn, job_id, 1, "x", "y", 0, "w") is None
    # ... and PostgreSQL refuses a hand-written regression
    with pytest.raises(DBAPIError, match="ready never regresses"):
        with engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="processing"))


def test_retry_later_backs_off_through_the_outbox_then_fails_when_spent(engine):
    with engine.begin() as conn:
        _, job_id = seed(conn, max_attempts=2)
        states.claim(conn, job_id, 1, LEASE)
        assert states.retry_later(conn, job_id, 1, "storage_unavailable", "down", 30, "w") == "queued"
        job = states.get(conn, job_id)
        assert job.state == "queued" and job.error_code == "storage_unavailable" and job.next_attempt_at is not None
        delayed = conn.execute(select(outbox).where(outbox.c.job_id == job_id).order_by(outbox.c.id.desc())).first()
        assert delayed.payload["attempt"] == 2 and delayed.available_at > delayed.created_at
        assert states.claim(conn, job_id, 2, LEASE) is None        # not due yet
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(next_attempt_at=func.now()))
        assert states.claim(conn, job_id, 2, LEASE) is not None
        assert states.retry_later(conn, job_id, 2, "storage_unavailable", "down", 30, "w") == "failed"
        job = states.get(conn, job_id)
        assert job.state == "failed" and job.error_code == "storage_unavailable"
        assert "attempts exhausted" in job.error_reason


@pytest.mark.parametrize("skew_hours", [1, -1])
def test_a_retry_is_due_after_its_delay_on_the_databases_clock_whatever_the_workers(engine, monkeypatch, skew_hours):
    """An adversarial run: the due time was the worker's clock plus the delay, and everything that reads it compares
    with the database's now(): a worker an hour ahead delayed a 2 s retry by an hour, one an hour behind spent every
    attempt in seconds; and a message due by the worker's clock was published at once, without its delay."""
    import datetime as real

    class Skewed(real.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.datetime.now(tz) + real.timedelta(hours=skew_hours)

    from app.core import outbox as outbox_module

    monkeypatch.setattr(states, "datetime", Skewed, raising=False)
    monkeypatch.setattr(outbox_module, "datetime", Skewed)
    with engine.begin() as conn:
        _, job_id = seed(conn, max_attempts=3)
        states.claim(conn, job_id, 1, LEASE)
        with outbox_module.collecting(conn) as written:
            assert states.retry_later(conn, job_id, 1, "storage_unavailable", "down", 30, "w") == "queued"
        waits = conn.execute(text("SELECT extract(epoch FROM next_attempt_at - now()), "
                                  "(SELECT extract(epoch FROM max(available_at) - now()) FROM outbox o "
                                  " WHERE o.job_id = j.id) FROM jobs j WHERE id = :id"), {"id": job_id}).one()
    assert all(29 <= wait <= 31 for wait in waits), waits
    assert [w.due for w in written] == [False], "a delayed message waits for the relay"


def test_expired_lease_is_recovered_then_fails_worker_lost(engine):
    with engine.begin() as conn:
        _, job_id = seed(conn, max_attempts=2)
        for attempt in (1, 2):
            states.claim(conn, job_id, attempt, LEASE)
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(lease_expires_at=func.now() - text("interval '1 second'")))
            counts = states.recover_expired(conn, batch=10, actor="scheduler:test")
            if attempt == 1:
                assert counts == {"requeued": 1, "failed": 0}
                assert states.get(conn, job_id).state == "queued"
            else:
                assert counts == {"requeued": 0, "failed": 1}
        job = states.get(conn, job_id)
        assert (job.state, job.error_code) == ("failed", "worker_lost")
        assert [h[1] for h in history(conn, job_id)] == ["queued", "processing", "queued", "processing", "failed"]


def test_a_failed_job_always_has_a_code(engine):
    with pytest.raises(DBAPIError):
        with engine.begin() as conn:
            _, job_id = seed(conn)
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="failed"))
