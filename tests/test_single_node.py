"""Single-node mode as a newcomer gets it: no DATABASE_URL, no BROKER_URL, nothing on the default ports.

``make up`` itself runs (``release``, then ``web``, ``worker`` and
``scheduler`` under honcho) in an environment where libpq's defaults lead
nowhere (``PGHOST``/``PGPORT``) and no RabbitMQ URL exists; an upload must
still end ``ready``, and no process may hold a connection to PostgreSQL's
or RabbitMQ's default port. This is the CI's single-node run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
import requests

from app.adapters.postgres import embedded
from app.core import pipeline
from tests.conftest import API_TOKENS
from tests.processes import REPO, VENV_BIN, free_port, wait_for

pytestmark = pytest.mark.processes

DEFAULT_PORTS = {5432, 5672}


def newcomer_env(root: Path, port: int) -> dict[str, str]:
    return {
        "ATTACHE_DATA_DIR": str(root / "var"),
        "STORAGE_URL": f"file://{root / 'storage'}",
        "ATTACHE_API_TOKENS": API_TOKENS,
        "PORT": str(port),
        "PGHOST": "/nonexistent", "PGPORT": "1",  # a stray libpq default must fail, not find the shared server
    }


def run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=REPO, env=environment(env), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def environment(env: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "BROKER_URL")}
    clean["PATH"] = f"{VENV_BIN}:{clean.get('PATH', '')}"
    return {**clean, **env}


def default_port_connections(pid: int) -> list:
    """Connections to PostgreSQL's or RabbitMQ's default port held by ``pid`` or any process under it."""
    found = []
    try:
        tree = [psutil.Process(pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for member in tree:
        try:
            found += [c for c in member.net_connections(kind="inet") if c.raddr and c.raddr.port in DEFAULT_PORTS]
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def newcomer_root():
    """Not under pytest's temporary root: pytest keeps that ``0700``, and run as root the embedded
    server runs as its own OS user, which must reach its data directory."""
    root = Path(tempfile.mkdtemp(prefix="attache-newcomer-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_make_up_with_nothing_running_takes_an_upload_to_ready(newcomer_root, data_file):
    port = free_port()
    env = newcomer_env(newcomer_root, port)
    log = open(newcomer_root / "make-up.log", "wb")
    make = subprocess.Popen(["make", "-s", "up"], cwd=REPO, env=environment(env), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    output = lambda: (newcomer_root / "make-up.log").read_text(errors="replace")  # noqa: E731
    session = requests.Session()
    session.headers["Authorization"] = "Bearer alice-uploader-token"
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: make.poll() is None and session.get(url + "/readyz", timeout=2).status_code == 200,
                 timeout=60, message=f"make up to serve /readyz: {output()[-3000:]}")
        assert "mode: single node" in output(), output()
        assert str(newcomer_root / "var" / "pgdata") in output(), "make up says where the data lives"
        with open(data_file("photos/chelsea.jpg"), "rb") as fh:
            response = session.post(url + "/v1/attachments", files={"file": ("chelsea.jpg", fh)}, timeout=30)
        assert response.status_code == 202, response.text
        status = wait_for(lambda: (lambda s: s if s["state"] in ("ready", "failed") else None)(
            session.get(f"{url}/v1/attachments/{response.json()['id']}", timeout=10).json()),
            timeout=30, interval=0.2, message="the upload to end")
        assert status["state"] == "ready", status
        assert sorted(status["variants"]) == sorted(pipeline.get(pipeline.NEWEST).variants)
        assert session.get(url + "/readyz", timeout=10).json()["checks"] == {
            "database": "ok", "broker": "ok", "storage": "ok", "spool": "ok"}
        assert default_port_connections(make.pid) == []
        assert (newcomer_root / "var" / "pgdata" / "PG_VERSION").exists(), "the data lives under ATTACHE_DATA_DIR"
        assert embedded.running(str(newcomer_root / "var"))

        # the server killed (kill -9, the OOM killer): the scheduler starts it again and every process reconnects;
        # before, they all stayed up without it until someone ran `attache db upgrade`
        postmaster = int((newcomer_root / "var" / "pgdata" / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        wait_for(lambda: not embedded.running(str(newcomer_root / "var")), timeout=10, message="the postmaster to die")
        wait_for(lambda: embedded.running(str(newcomer_root / "var")), timeout=30, interval=0.5,
                 message=f"the scheduler to start the server again: {output()[-3000:]}")
        with open(data_file("photos/chelsea.jpg"), "rb") as fh:
            again = wait_for(lambda: (lambda r: r if r.status_code == 202 else None)(session.post(
                url + "/v1/attachments", files={"file": ("chelsea.jpg", fh.seek(0) or fh)}, timeout=30)),
                timeout=30, interval=0.5, message="an upload accepted again")
        status = wait_for(lambda: (lambda s: s if s["state"] in ("ready", "failed") else None)(
            session.get(f"{url}/v1/attachments/{again.json()['id']}", timeout=10).json()),
            timeout=60, interval=0.2, message="the upload after the restart to end")
        assert status["state"] == "ready", status
    finally:
        # honcho starts each process in a session of its own: kill the whole tree, not only make's group
        with contextlib.suppress(psutil.NoSuchProcess):
            for member in psutil.Process(make.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(make.pid, signal.SIGKILL)
        make.wait(timeout=30)
        log.close()
        survived = embedded.running(str(newcomer_root / "var"))
        run(["attache", "db", "stop"], env)
    assert survived, "the embedded server runs in a session of its own: killing every attache process leaves it up"
    assert not embedded.running(str(newcomer_root / "var")), "attache db stop stops it"
