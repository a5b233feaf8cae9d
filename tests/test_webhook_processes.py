"""Webhooks with the real processes: a worker SIGKILLed between publish and delivery loses no event.

The worker dies right after the publish COMMIT (fault point
``after_result_commit``): the event and its delivery were written in that
transaction, so the scheduler's ``webhooks`` service delivers it to a
receiver that fails its first calls, signed, with sequence 1, and the
replay cursor returns the same document.
"""

from __future__ import annotations

import pytest
import requests

from tests.conftest import OPERATOR_TOKEN
from tests.processes import Deployment, wait_for
from tests.webhook_receivers import Receiver

pytestmark = pytest.mark.processes


def test_a_worker_killed_after_publish_still_gets_its_event_delivered(env, tmp_path, data_file):
    receiver = Receiver(fail_first=2)
    deployment = Deployment({**env, "ATTACHE_WEBHOOK_ALLOW_PRIVATE": "1", "ATTACHE_WEBHOOK_INTERVAL_SECONDS": "0.2",
                             "ATTACHE_WEBHOOK_RETRY_INITIAL_SECONDS": "0.2", "ATTACHE_WEBHOOK_TIMEOUT_SECONDS": "2"},
                            tmp_path)
    try:
        deployment.start("web")
        ops = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        hook = requests.post(deployment.url + "/v1/ops/webhooks", headers=ops, timeout=10, json={
            "url": receiver.url, "events": ["attachment.ready", "attachment.failed"]})
        assert hook.status_code == 201, hook.text
        worker = deployment.start("worker", ATTACHE_FAULT="after_result_commit")
        response = deployment.upload(data_file("photos/chelsea.jpg"))
        assert response.status_code == 202
        attachment_id = response.json()["id"]
        assert worker.wait_dead(timeout=60) != 0, "the fault point killed the worker after the publish COMMIT"
        deployment.start("scheduler")  # delivers; the worker stays dead: delivery does not need it
        wait_for(lambda: len(receiver.calls) >= 3, timeout=20, message="the third call (two refused)")
        calls = receiver.verified(hook.json()["secret"])
        assert {headers["webhook-id"] for headers, _ in calls} == {calls[0][1]["id"]}
        assert {headers["webhook-sequence"] for headers, _ in calls} == {"1"}
        assert calls[-1][1]["delivery"] == {"subscription": hook.json()["id"], "sequence": 1}
        event = {k: v for k, v in calls[-1][1].items() if k != "delivery"}
        assert (event["type"], event["data"]["attachment_id"]) == ("attachment.ready", attachment_id)
        replay = requests.get(deployment.url + "/v1/events?after=0", headers=ops, timeout=10).json()["events"]
        assert replay == [event]
        listed = requests.get(deployment.url + f"/v1/ops/webhooks/{hook.json()['id']}/deliveries", headers=ops,
                              timeout=10).json()["deliveries"]
        wait_for(lambda: requests.get(deployment.url + f"/v1/ops/webhooks/{hook.json()['id']}/deliveries",
                                      headers=ops, timeout=10).json()["deliveries"][0]["state"] == "delivered",
                 timeout=10, message="the delivery recorded as delivered")
        assert len(listed) == 1
    finally:
        deployment.stop_all()
        receiver.close()
