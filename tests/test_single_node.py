"""Single-node mode as a newcomer gets it: no DATABASE_URL, no BROKER_URL, nothing on the default ports.

The Procfile's own processes (``release``, then ``web``, ``worker`` and
``scheduler``, as ``make up`` runs them with honcho) start with an
environment where libpq's defaults lead nowhere (``PGHOST``/``PGPORT``)
and no RabbitMQ URL exists; an upload must still end ``ready``, and no
process may hold a connection to PostgreSQL's or RabbitMQ's default port.
"""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from app.adapters.postgres import embedded
from app.core import pipeline
from tests.conftest import API_TOKENS
from tests.processes import REPO, VENV_BIN, Deployment

pytestmark = pytest.mark.processes

DEFAULT_PORTS = {5432, 5672}


def newcomer_env(tmp_path) -> dict[str, str]:
    return {
        "ATTACHE_DATA_DIR": str(tmp_path / "var"),
        "STORAGE_URL": f"file://{tmp_path / 'storage'}",
        "ATTACHE_API_TOKENS": API_TOKENS,
        "ATTACHE_DEV": "1",
        "PGHOST": "/nonexistent", "PGPORT": "1",  # a stray libpq default must fail, not find the shared server
    }


def run(args: list[str], env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "BROKER_URL")}
    clean["PATH"] = f"{VENV_BIN}:{clean.get('PATH', '')}"
    done = subprocess.run(args, cwd=REPO, env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def default_port_connections(processes) -> list:
    found = []
    for process in processes:
        try:
            tree = [psutil.Process(process.popen.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for member in tree:
            try:
                found += [c for c in member.net_connections(kind="inet") if c.raddr and c.raddr.port in DEFAULT_PORTS]
            except psutil.NoSuchProcess:
                pass
    return found


@pytest.fixture
def newcomer(tmp_path, monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("BROKER_URL", raising=False)
    env = newcomer_env(tmp_path)
    deployment = Deployment(env, tmp_path)
    yield deployment
    deployment.stop_all()
    run(["attache", "db", "stop"], env)  # a no-op when the last process already stopped it


def test_make_up_with_nothing_running_takes_an_upload_to_ready(newcomer, tmp_path, data_file):
    assert "mode: single node" in run(["attache", "db", "where"], newcomer.env)
    run(["attache", "db", "upgrade"], newcomer.env)  # the Procfile's release
    for name in ("web", "worker", "scheduler"):
        newcomer.start(name)
    response = newcomer.upload(data_file("photos/chelsea.jpg"))
    assert response.status_code == 202, response.text
    status = newcomer.wait_state(response.json()["id"], timeout=30)
    assert status["state"] == "ready", status
    assert sorted(status["variants"]) == sorted(pipeline.get(pipeline.NEWEST).variants)
    ready = newcomer.session.get(newcomer.url + "/readyz", timeout=10).json()
    assert ready["checks"] == {"database": "ok", "broker": "ok", "storage": "ok"}
    assert default_port_connections(newcomer.processes.values()) == []
    assert (tmp_path / "var" / "pgdata" / "PG_VERSION").exists(), "the data lives under ATTACHE_DATA_DIR"
    assert embedded.running(str(tmp_path / "var"))
