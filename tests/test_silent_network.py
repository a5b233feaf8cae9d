"""A worker whose network goes silent mid-step: its job is finished elsewhere; it works again once the cable is back.

The worker runs on a second host (``tests/netns.py``) and reaches
PostgreSQL and RabbitMQ through proxies on this side; web and scheduler
run here. Cutting the cable is a silence, not a refusal: nothing answers
and nothing resets, as when a switch, a firewall's state table or a VM's
network dies. The worker is held inside its step's transaction (a table
lock) when the cable is cut, so it is cut off with the job's row locked
and a variant written but not recorded.

What a broken system gets wrong here: the job waits for the cut-off
worker for ever (its row lock, its lease, its unacked messages); the late
worker's step lands a second effect or moves the job back when the cable
returns; or the worker never takes another message after it (a consumer
that does not reconnect, a thread stuck in a socket).
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest

from tests.netns import SecondHost
from tests.processes import Deployment, wait_for, waiting_on_a_lock
from tests.tcp import Listener
from tests.test_failure_windows import assert_invariants

pytestmark = pytest.mark.processes

#: the cut-off worker's URL asks for this heartbeat: RabbitMQ and the worker find its silent AMQP connections
#: after two to three (the default, CONSUMER_HEARTBEAT_SECONDS, would make the test take half a minute more)
HEARTBEAT_SECONDS = 2
#: and these keepalives, so that it gives up on PostgreSQL in about 3 s (the defaults take about 11)
FAST_KEEPALIVES = {"keepalives_idle": "1", "keepalives_interval": "1", "keepalives_count": "2",
                   "tcp_user_timeout": "3000"}
#: the cut-off worker's job is finished by another worker within this many seconds of the cut: PostgreSQL ends
#: its session after a lease (6 s here), RabbitMQ gives its unacked messages back after its heartbeats; before
#: the URL's heartbeat was taken, 89 s (a 30 s heartbeat)
FINISHED_WITHIN = 30
#: what the cut-off worker logs when it has given up on PostgreSQL (its step waits for it: libpq's keepalives
#: ended the connection) and on RabbitMQ (pika's heartbeats)
GAVE_UP = ("PostgreSQL is unreachable or read-only: the step waits for it", "too many missed heartbeats")


@pytest.fixture
def deployment(env, tmp_path):
    deployment = Deployment(env, tmp_path)
    yield deployment
    deployment.stop_all()


def _through(url: str, host: str, port: int, **query: str) -> str:
    """``url`` with its server replaced by ``host:port`` (a proxy), and ``query`` added."""
    parts = urlsplit(url)
    netloc = (parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else "") + f"{host}:{port}"
    extra = "&".join(f"{k}={v}" for k, v in query.items())
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(filter(None, [parts.query, extra]))))


@pytest.mark.long  # make soak: waits out an outage or measures for long
def test_a_worker_cut_off_in_silence_loses_nothing_and_works_again(deployment, env, engine, storage_dir, data_file):
    database, broker = urlsplit(env["DATABASE_URL"]), urlsplit(env["BROKER_URL"])
    host = SecondHost()
    to_postgres = Listener((database.hostname, database.port or 5432), host=host.here)
    to_rabbitmq = Listener((broker.hostname, broker.port or 5672), host=host.here)
    islander = here = None
    holder = psycopg2.connect(env["DATABASE_URL"])
    try:
        deployment.start("web")
        deployment.start("scheduler")
        islander = deployment.start(
            "worker", netns=host.namespace, WORKER_THREADS="1",
            DATABASE_URL=_through(env["DATABASE_URL"], host.here, to_postgres.port, **FAST_KEEPALIVES),
            BROKER_URL=_through(env["BROKER_URL"], host.here, to_rabbitmq.port, heartbeat=str(HEARTBEAT_SECONDS)))
        del deployment.processes["worker"]  # the worker started below is this host's; this one is killed at the end
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE variants IN SHARE MODE")  # the first render's INSERT waits, its job row locked
        first = deployment.upload(data_file("photos/chelsea.jpg")).json()["id"]
        wait_for(lambda: waiting_on_a_lock(engine, "attache worker"), timeout=30,
                 message="the cut-off worker's render waiting inside its transaction")

        host.cut()
        cut_at = time.monotonic()
        holder.rollback()  # its INSERT goes through on the server; the answer and its COMMIT are lost on the cable
        deployment.start("worker")
        assert deployment.wait_state(first, timeout=FINISHED_WITHIN)["state"] == "ready", deployment.logs()
        finished_after = time.monotonic() - cut_at
        assert islander.alive, islander.output()[-3000:]

        # the silence outlasts what the cut-off worker waits for: it has given its connections up, as in a long outage
        wait_for(lambda: all(sign in islander.output() for sign in GAVE_UP), timeout=60, interval=0.5,
                 message=f"the cut-off worker to give up its connections ({GAVE_UP})")

        host.mend()
        here = deployment.processes.pop("worker")
        here.kill()  # from now on only the worker that was cut off can do the work
        mended_at = time.monotonic()
        second = deployment.upload(data_file("photos/coffee.jpg")).json()["id"]
        try:
            deployment.wait_state(second, states=("ready",), timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"the worker that was cut off does not work again: {islander.output()[-6000:]}") \
                from exc
        assert "PostgreSQL answers and takes writes again: the step runs again" in islander.output()
        print(f"first upload ready {finished_after:.1f} s after the cut; the second, on the worker that was "
              f"cut off, {time.monotonic() - mended_at:.1f} s after the cable came back")

        # the late worker's step, run again once the cable was back, was fenced: one effect per variant, ready once
        assert_invariants(engine, storage_dir, [first, second])
    finally:
        holder.close()
        for process in (islander, here):
            if process is not None:
                process.kill()
        to_postgres.close()
        to_rabbitmq.close()
        host.remove()
