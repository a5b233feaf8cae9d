"""``/readyz`` is cheap: no new AMQP connection per probe, no fsync, one answer per second per process."""

from __future__ import annotations

import os
import time
from urllib.parse import urlparse

import pytest
import requests

from app.web import create_app
from app.web.health import READY_CACHE_SECONDS
from tests.processes import Deployment, wait_for
from tests.tcp import Listener

TIMEOUT = 1.0


@pytest.mark.processes
def test_probes_reuse_the_broker_connection_and_still_see_it_go(env, tmp_path):
    broker = urlparse(env["BROKER_URL"])
    proxy = Listener(upstream=(broker.hostname, broker.port or 5672))  # counts the connections the web opens
    web = Deployment({**env, "BROKER_URL": f"amqp://guest:guest@127.0.0.1:{proxy.port}{broker.path}",
                      "ATTACHE_PUBLISH_TIMEOUT_SECONDS": str(TIMEOUT), "WEB_THREADS": "2"}, tmp_path)
    try:
        web.start("web")
        probes = 0
        deadline = time.monotonic() + 3 * READY_CACHE_SECONDS  # several cache windows: several real checks
        while time.monotonic() < deadline:
            response = requests.get(web.url + "/readyz", timeout=10)
            assert response.status_code == 200, response.text
            probes += 1
        assert probes >= 20
        assert 1 <= proxy.accepted <= 2, f"{proxy.accepted} AMQP connections for {probes} probes (2 threads)"
        proxy.frozen.set()  # RabbitMQ stops answering: readiness must say so, within the timeouts
        unready = wait_for(lambda: (lambda r: r.json() if r.status_code == 503 else None)(
            requests.get(web.url + "/readyz", timeout=15)), timeout=20, message="/readyz 503")
        assert unready["checks"]["broker"].startswith("unavailable") and unready["checks"]["database"] == "ok"
    finally:
        web.stop_all()
        proxy.close()


def test_the_storage_check_does_not_fsync(settings, monkeypatch):
    app = create_app(settings)
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
    try:
        response = app.test_client().get("/readyz")
        assert response.status_code == 200, response.json
        assert response.json["checks"]["storage"] == "ok"
        assert calls == [], "a readiness probe writes nothing durable"
    finally:
        services = app.extensions["attache"]
        services.engine.dispose()
        services.broker.close()


def test_a_check_that_hangs_leaves_the_others_their_own_answers(settings, monkeypatch):
    """The checks ran one after another in one thread: RabbitMQ black-holed, its check hung, and the probe named
    storage and the temporary directory as down too, never having checked them (an adversarial run)."""
    import threading

    from app.web.health import NO_ANSWER, READY_DEADLINE_SECONDS

    app = create_app(settings)
    services, silent = app.extensions["attache"], threading.Event()
    monkeypatch.setattr(services.broker, "ping", lambda: silent.wait(30))
    try:
        began = time.monotonic()
        response = app.test_client().get("/readyz")
        assert time.monotonic() - began < READY_DEADLINE_SECONDS + 1
        assert response.status_code == 503
        assert response.json["checks"] == {"database": "ok", "broker": NO_ANSWER, "storage": "ok", "spool": "ok"}
    finally:
        silent.set()
        services.engine.dispose()
        services.broker.close()


@pytest.mark.processes
@pytest.mark.long  # make soak: waits out an outage or measures for long
def test_readyz_answers_503_in_time_when_postgresql_stops_answering(env, tmp_path):
    """A database frozen mid-connection once hung every probe, then the whole web process (adversarial review)."""
    from app.web.health import READY_DEADLINE_SECONDS

    database = urlparse(env["DATABASE_URL"])
    proxy = Listener(upstream=(database.hostname, database.port or 5432))
    url = env["DATABASE_URL"].replace(f"{database.hostname}:{database.port}", f"127.0.0.1:{proxy.port}")
    web = Deployment({**env, "DATABASE_URL": url, "WEB_THREADS": "2"}, tmp_path)
    try:
        web.start("web")
        assert requests.get(web.url + "/readyz", timeout=10).status_code == 200
        proxy.frozen.set()
        wait_for(lambda: requests.get(web.url + "/readyz", timeout=10).status_code == 503, timeout=15,
                 message="/readyz 503 with PostgreSQL frozen")
        for _ in range(3):  # more probes than the web has threads: each is answered within the deadline
            began = time.monotonic()
            response = requests.get(web.url + "/readyz", timeout=10)
            assert response.status_code == 503
            assert time.monotonic() - began < READY_DEADLINE_SECONDS + 2
        assert response.json()["checks"]["database"].startswith("unavailable")
        assert requests.get(web.url + "/healthz", timeout=5).status_code == 200
    finally:
        web.stop_all()
        proxy.close()


@pytest.mark.processes
def test_a_temporary_directory_that_cannot_hold_a_spool_is_not_ready(env, tmp_path, data_file):
    """A TMPDIR replaced by a file (or a symlink to nothing) refused every upload with 503 while /readyz said ready
    (an adversarial run); one removed is made again, and is ready."""
    temp = tmp_path / "web-tmp"
    temp.mkdir()
    web = Deployment({**env, "TMPDIR": str(temp)}, tmp_path)
    try:
        web.start("web")
        assert requests.get(web.url + "/readyz", timeout=10).json()["checks"]["spool"] == "ok"
        temp.rmdir()
        temp.write_bytes(b"not a directory")
        unready = wait_for(lambda: (lambda r: r.json() if r.status_code == 503 else None)(
            requests.get(web.url + "/readyz", timeout=10)), timeout=10, message="/readyz 503")
        assert unready["checks"]["spool"] == "unavailable: spool_unavailable", unready
        assert web.upload(data_file("photos/chelsea.jpg")).status_code == 503
        temp.unlink()  # gone: made again
        wait_for(lambda: requests.get(web.url + "/readyz", timeout=10).status_code == 200, timeout=10,
                 message="/readyz ready again")
        assert temp.is_dir()
        assert web.upload(data_file("photos/chelsea.jpg")).status_code == 202
    finally:
        web.stop_all()
