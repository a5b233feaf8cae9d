"""Backfill as real processes: killed mid-run and resumed; two runs at once."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest
from sqlalchemy import func, insert, select, text, update

from app.adapters.postgres.models import attachments, jobs, outbox
from app.core import pipeline, states
from app.observability.tracing import new_traceparent
from tests.processes import REPO, VENV_BIN, wait_for

pytestmark = pytest.mark.processes

COUNT = 300


def seed_ready_v1(engine, count):
    """Attachments whose v1 job is ready (as after a normal run)."""
    with engine.begin() as conn:
        for _ in range(count):
            attachment_id = uuid.uuid4()
            conn.execute(insert(attachments).values(
                id=attachment_id, owner="t", filename="a.jpg", content_type="image/jpeg", format="JPEG", size=1,
                sha256="0" * 64, width=1, height=1, staging_key=pipeline.staging_key(attachment_id)))
            job_id, _ = states.create_job(conn, attachment_id=attachment_id, pipeline_version=1, max_attempts=3,
                                          traceparent=new_traceparent(), tracestate=None, actor="test", room_bytes=0)
        conn.execute(update(jobs).values(state="ready", attempt=1, ready_at=func.now()))
        conn.execute(update(outbox).values(published_at=func.now()))


def backfill(env, *args):
    return subprocess.Popen([str(VENV_BIN / "attache"), "pipeline", "backfill", "--to", "2", "--json", *args],
                            cwd=REPO, env={**os.environ, **env, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def v2_counts(engine):
    with engine.connect() as conn:
        made = conn.execute(select(func.count()).select_from(jobs).where(jobs.c.pipeline_version == 2)).scalar()
        per_attachment = conn.execute(select(func.count()).where(jobs.c.pipeline_version == 2)
                                      .group_by(jobs.c.attachment_id).order_by(func.count().desc()).limit(1)).scalar()
        messages = conn.execute(select(func.count()).select_from(outbox).join(jobs, jobs.c.id == outbox.c.job_id)
                                .where(jobs.c.pipeline_version == 2)).scalar()
    return made, per_attachment, messages


def test_backfill_killed_mid_run_is_resumed_without_doubles(env, engine):
    seed_ready_v1(engine, COUNT)
    first = backfill(env, "--batch", "5")
    wait_for(lambda: v2_counts(engine)[0] >= 20, timeout=60, message="the backfill to be under way")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    made, _, _ = v2_counts(engine)
    assert 0 < made < COUNT, f"killed mid-run ({made} of {COUNT})"
    second = backfill(env, "--batch", "50", "--reason", "resumed after the kill")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert v2_counts(engine) == (COUNT, 1, COUNT), "every attachment once, one message each"
    with engine.connect() as conn:
        reasons = conn.execute(text("SELECT reason FROM audit_log ORDER BY id")).scalars().all()
    assert reasons[0] == "backfill to version 2" and reasons[-1] == "resumed after the kill", reasons


def test_two_backfills_at_once_create_each_job_once(env, engine):
    seed_ready_v1(engine, COUNT)
    runs = [backfill(env, "--batch", "7"), backfill(env, "--batch", "11")]
    created = 0
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        created += __import__("json").loads(out)["created"]
    assert created == COUNT
    assert v2_counts(engine) == (COUNT, 1, COUNT)
    again = backfill(env)
    out, _ = again.communicate(timeout=60)
    assert __import__("json").loads(out)["created"] == 0, "a third run finds nothing to do"
