"""A backlog longer than the lease costs no attempt.

``make soak`` found this: 1,000 uploads arriving faster than one worker
renders them left each job's render messages waiting in the queue longer
than its lease. The lease expired between steps, lease recovery took the
attempt back, the new attempt's messages joined the back of the queue, and
916 of 1,000 jobs ended ``failed`` with ``worker_lost`` while no worker
had died. A step now hands off when it is done (``states.hand_off``): the
job waits for its next message with no owner and a long lease.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.adapters.postgres.models import jobs
from tests.processes import Deployment

pytestmark = pytest.mark.processes


def test_jobs_waiting_behind_a_backlog_longer_than_their_lease_keep_their_attempt(env, tmp_path, engine, data_file):
    deployment = Deployment({**env, "ATTACHE_LEASE_SECONDS": "1", "ATTACHE_MAX_ATTEMPTS": "2",
                             "WORKER_THREADS": "1"}, tmp_path)
    try:
        deployment.start("web")
        deployment.start("scheduler")
        accepted = [deployment.upload(data_file(name)).json()["id"]
                    for name in ["photos/chelsea.jpg", "photos/coffee.jpg", "photos/astronaut.jpg",
                                 "photos/rocket.jpg", "photos/camera.jpg", "photos/brick.jpg"] * 2]
        deployment.start("worker")  # one thread: the last jobs' renders wait several leases long
        for attachment_id in accepted:
            status = deployment.wait_state(attachment_id, timeout=180)
            assert (status["state"], status["attempt"]) == ("ready", 1), status
        with engine.connect() as conn:
            assert conn.execute(select(func.max(jobs.c.attempt))).scalar() == 1
    finally:
        deployment.stop_all()
