"""Sixteen uploads trickled byte by byte do not stall another uploader's normal upload.

They are one uploader's: ATTACHE_MAX_BODIES_PER_UPLOADER (8) of them hold a thread, the rest are refused before their
bodies are read (``tests/test_hostile_clients.py``)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from tests.conftest import OTHER_UPLOADER_TOKEN
from tests.processes import Deployment

pytestmark = pytest.mark.processes

TRICKLERS = 16


def trickle(port: int, stop: threading.Event, started: threading.Barrier, token: str) -> None:
    """An upload that announces 5 MB and sends one byte every 200 ms until told to stop."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall((f"POST /v1/attachments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                      "Content-Type: image/jpeg\r\nContent-Length: 5000000\r\n\r\n").encode() + b"\xff\xd8")
        started.wait(timeout=30)
        deadline = time.monotonic() + 60  # bounded: the test ends long before
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                sock.sendall(b"\x00")
                stop.wait(0.2)
        except OSError:  # refused (429) and closed: past the uploader's bodies at once
            pass


def test_slow_uploaders_do_not_stall_a_normal_upload(env, tmp_path, data_file):
    (tmp_path / "spool").mkdir()  # the tricklers' spools, left by the web stopped under them, go with the test
    deployment = Deployment({**env, "TMPDIR": str(tmp_path / "spool")}, tmp_path)
    deployment.start("web")  # the Procfile's gthread settings, one gunicorn worker
    stop = threading.Event()
    started = threading.Barrier(TRICKLERS + 1)
    threads = [threading.Thread(target=trickle, args=(deployment.port, stop, started, deployment.token), daemon=True)
               for _ in range(TRICKLERS)]
    try:
        for thread in threads:
            thread.start()
        started.wait(timeout=30)
        time.sleep(1.0)  # let the trickling bodies reach the server's threads (this is the load, not a sync)
        began = time.monotonic()
        with open(data_file("photos/chelsea.jpg"), "rb") as fh:
            response = requests.post(deployment.url + "/v1/attachments", files={"file": ("chelsea.jpg", fh)},
                                     headers={"Authorization": f"Bearer {OTHER_UPLOADER_TOKEN}"}, timeout=30)
        elapsed = time.monotonic() - began
        assert response.status_code == 202
        assert elapsed < 5, f"a normal upload took {elapsed:.1f}s behind {TRICKLERS} slow uploaders"
        health = deployment.session.get(deployment.url + "/healthz", timeout=5)
        assert health.status_code == 200
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        deployment.stop_all()
