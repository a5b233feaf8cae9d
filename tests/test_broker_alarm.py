"""RabbitMQ out of room: a resource alarm blocks every publisher, and no upload is lost or charged an attempt.

When RabbitMQ's disk (below ``disk_free_limit``) or memory (above
``vm_memory_high_watermark``) runs short, it raises an alarm and blocks
every connection that publishes (``connection.blocked``) until the alarm
clears: the TCP connection stays up and nothing is refused, the publishes
just wait. The test raises the memory alarm on a RabbitMQ node of its own
(``tests.rabbitnode``; a watermark of 0 blocks at once, as a full disk
does, and changes nothing for the machine's node that other tests use)
while jobs are between their steps, holds it for longer than two leases,
and clears it.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from app.adapters.postgres.models import jobs
from tests.processes import Deployment, wait_for
from tests.rabbitnode import PrivateRabbit
from tests.test_failure_windows import assert_invariants

pytestmark = pytest.mark.processes

#: longer than two of the tests' 6 s leases: a blocked publish must not cost a job its lease or an attempt
ALARM_SECONDS = 14
IN_FLIGHT = 9


@pytest.mark.long  # make soak: waits out an outage or measures for long
def test_a_broker_out_of_room_blocks_the_work_and_loses_nothing(env, tmp_path, engine, storage_dir, data_file):
    rabbit = PrivateRabbit()
    deployment = Deployment({**env, "BROKER_URL": rabbit.url}, tmp_path)
    try:
        rabbit.start()
        for name in ("web", "worker", "scheduler"):
            deployment.start(name)
        photos = [data_file(f"photos/{name}") for name in
                  ("chelsea_12mp_4247x2825.jpg", "astronaut_12mp_3464x3464.jpg", "chelsea.jpg")]
        accepted = [deployment.upload(photos[i % len(photos)]).json()["id"] for i in range(IN_FLIGHT)]
        rabbit.ctl("set_vm_memory_high_watermark", "0")
        alarm_at = time.monotonic()

        for photo in photos:  # the 202 does not wait for the broker: the web publishes behind its answer
            began = time.monotonic()
            response = deployment.upload(photo)
            assert response.status_code == 202, response.text
            assert time.monotonic() - began < 2, "an upload waited on the blocked broker"
            accepted.append(response.json()["id"])

        def states() -> dict[str, int]:
            with engine.connect() as conn:
                rows = conn.execute(select(jobs.c.state, jobs.c.attempt)).all()
            assert all(attempt <= 1 for _, attempt in rows), rows
            return {state: sum(1 for s, _ in rows if s == state) for state in ("queued", "processing", "ready",
                                                                                "failed")}

        stalled = states()
        assert stalled["queued"] >= len(photos) and stalled["failed"] == 0, stalled
        while time.monotonic() - alarm_at < ALARM_SECONDS:  # the work stays where it is; nothing fails
            assert states()["failed"] == 0
            time.sleep(1)
        held = states()
        assert held["queued"] >= len(photos), f"an upload's first message got through the alarm: {held}"

        rabbit.ctl("set_vm_memory_high_watermark", "0.4")
        cleared_at = time.monotonic()
        wait_for(lambda: states()["ready"] == len(accepted), timeout=60, message="every upload ready")
        print(f"alarm held {ALARM_SECONDS} s with {held}; all {len(accepted)} ready "
              f"{time.monotonic() - cleared_at:.1f} s after it cleared")
        with engine.connect() as conn:
            assert conn.execute(select(jobs.c.attempt)).scalars().all() == [1] * len(accepted), \
                "a blocked publish cost no attempt"
        assert_invariants(engine, storage_dir, accepted)
    finally:
        deployment.stop_all()
        rabbit.destroy()
