"""An upload's publish waits for RabbitMQ only up to ATTACHE_PUBLISH_TIMEOUT_SECONDS, against real gunicorn.

Two brokers that never answer, without touching the shared RabbitMQ:

* a TCP listener that accepts and stays silent (the handshake never ends);
* a TCP proxy to the real RabbitMQ that freezes after the connection is up
  (the confirm never comes), like a broker stalled or cut off mid-connection.

Either way the upload answers 202 without waiting for the broker (the web
publishes behind the answer, in a thread of its own:
``app.core.background_publisher``), that thread gives up within a bound
and goes on to the next upload, and the outbox rows stay unpublished, for
the scheduler's relay.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

import pytest
from sqlalchemy import select

from app.adapters.postgres.models import outbox
from tests.processes import Deployment, wait_for
from tests.tcp import Listener

pytestmark = pytest.mark.processes

TIMEOUT = 1.0
#: connecting may take 2 x TIMEOUT (pika's stack_timeout), an answer TIMEOUT; the rest is slack
BOUND = 2 * TIMEOUT + TIMEOUT + 3


def outbox_rows(engine):
    with engine.connect() as conn:
        return conn.execute(select(outbox).order_by(outbox.c.id)).all()


def timed_upload(web, path):
    began = time.monotonic()
    response = web.upload(path)
    return response, time.monotonic() - began


def given_up(engine, index):
    """Wait until the web's publisher gave the ``index``-th row up (its error recorded, unpublished)."""
    def recorded():
        rows = outbox_rows(engine)
        return len(rows) > index and rows[index].last_error and rows[index]

    row = wait_for(recorded, timeout=BOUND, message=f"the publisher to give outbox row {index} up")
    assert row.published_at is None, "the row is left to the relay"


def test_a_silent_broker_does_not_hold_the_upload(env, engine, tmp_path, data_file):
    silent = Listener()
    vhost = urlparse(env["BROKER_URL"]).path
    web = Deployment({**env, "BROKER_URL": f"amqp://guest:guest@127.0.0.1:{silent.port}{vhost}",
                      "ATTACHE_PUBLISH_TIMEOUT_SECONDS": str(TIMEOUT)}, tmp_path)
    try:
        web.start("web")
        response, elapsed = timed_upload(web, data_file("photos/chelsea.jpg"))
        assert response.status_code == 202, response.text
        assert elapsed < TIMEOUT, f"the upload waited {elapsed:.1f}s for a silent broker"
        given_up(engine, 0)
        response, elapsed = timed_upload(web, data_file("photos/coffee.jpg"))
        assert response.status_code == 202 and elapsed < TIMEOUT, (response.status_code, elapsed)
        given_up(engine, 1)
    finally:
        web.stop_all()
        silent.close()


def test_a_broker_that_stops_answering_mid_connection_does_not_hold_the_upload(env, engine, tmp_path, data_file):
    broker = urlparse(env["BROKER_URL"])
    proxy = Listener(upstream=(broker.hostname, broker.port or 5672))
    web = Deployment({**env, "BROKER_URL": f"amqp://guest:guest@127.0.0.1:{proxy.port}{broker.path}",
                      "ATTACHE_PUBLISH_TIMEOUT_SECONDS": str(TIMEOUT),
                      "WEB_CONCURRENCY": "1"}, tmp_path)  # one process: one publisher, its connection kept
    try:
        web.start("web")
        first, _ = timed_upload(web, data_file("photos/chelsea.jpg"))
        assert first.status_code == 202, first.text
        wait_for(lambda: outbox_rows(engine)[0].published_at, timeout=BOUND,
                 message="RabbitMQ's confirm, through the proxy")
        proxy.frozen.set()
        second, elapsed = timed_upload(web, data_file("photos/coffee.jpg"))
        assert second.status_code == 202, second.text
        assert elapsed < TIMEOUT, f"the upload waited {elapsed:.1f}s for a confirm that never came"
        given_up(engine, 1)
        third, elapsed = timed_upload(web, data_file("photos/chelsea.jpg"))
        assert third.status_code == 202 and elapsed < TIMEOUT, (third.status_code, elapsed)
        given_up(engine, 2)  # the publisher was not left waiting on the frozen connection
    finally:
        web.stop_all()
        proxy.close()
