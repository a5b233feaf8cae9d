"""Real attache processes for tests: started from the Procfile's own command lines.

Each process runs in its own session (process group), so a fault point's
``killpg`` or a test's SIGKILL takes down exactly that process and its
children, like ``kill -9`` on a real host.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

import requests
from sqlalchemy import text

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(os.sys.executable).parent


def procfile() -> dict[str, str]:
    entries = {}
    for line in (REPO / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            entries[name.strip()] = command.strip()
    return entries


#: where free_port() looks, below the kernel's ephemeral ports (net.ipv4.ip_local_port_range, 32768-60999 here)
LISTEN_PORTS = range(20000, 32768)
#: ``make test`` runs tests in parallel (pytest-xdist: gw0, gw1, ...); each runner looks in its own share of the
#: ports, so two runners never choose one port between a choice and a bind, or while a killed server restarts
RUNNER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
RUNNERS = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
_GIVEN: set[int] = set()


def free_port() -> int:
    """A port a server of the test may listen on, again after a restart.

    Not one the kernel hands out itself (binding port 0 does, from the
    ephemeral range): an outgoing connection to PostgreSQL or RabbitMQ could
    take it between the choice and the bind, or while a killed web is
    restarted on it ("Address already in use", seen once in a full run).
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = [port for port in LISTEN_PORTS if port < low and port % RUNNERS == RUNNER % RUNNERS]
    for port in random.sample(candidates, len(candidates)):
        if port in _GIVEN:  # two servers of one test ask before either listens
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS} below the ephemeral range")


def wait_for(predicate: Callable[[], object], *, timeout: float, interval: float = 0.1, message: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the thing polled may not be up yet
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}" + (f" (last error: {last_error!r})" if last_error else ""))


def waiting_on_a_lock(engine, application_name: str, statement: str = "") -> bool:
    """Whether a backend of ``application_name`` (``attache worker``, ``attache scheduler``...) waits on a lock,
    in a statement starting with ``statement`` (any, by default): a process held inside its transaction."""
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                 "AND application_name = :app AND wait_event_type = 'Lock' "
                                 "AND upper(query) LIKE upper(:statement)"),
                            {"app": application_name, "statement": statement + "%"}).scalar() > 0


class Process:
    def __init__(self, name: str, env: dict[str, str], log_dir: Path, netns: str | None = None):
        self.name = name
        self.env = env
        self.netns = netns
        self.log_path = log_dir / f"{name}-{int(time.time() * 1000)}.log"
        self.popen: subprocess.Popen | None = None

    def start(self) -> "Process":
        command = procfile()[self.name]
        env = {**os.environ, **self.env, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
        self._log = open(self.log_path, "wb")
        # in a network namespace (tests/netns.py): ``ip netns exec`` execs the shell, so the pid and group are the same
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.popen = subprocess.Popen([*prefix, "/bin/sh", "-c", f"exec {command}"], cwd=REPO, env=env,
                                      stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_dead(self, timeout: float = 30) -> int:
        assert self.popen is not None
        return self.popen.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(timeout=30)

    def stop(self, timeout: float = 20) -> None:
        if not self.alive:
            return
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def children(self) -> list[int]:
        """The pids of the other processes of its process group (gunicorn's workers), sorted."""
        found = subprocess.run(["pgrep", "-g", str(self.popen.pid)], capture_output=True, text=True).stdout.split()
        return sorted(int(pid) for pid in found if int(pid) != self.popen.pid)


class Deployment:
    """web + worker + scheduler of one test, sharing one database, vhost and storage.

    Client helpers send the uploader token of ``tests.conftest`` (principal ``alice``).
    """

    token = "alice-uploader-token"

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env = dict(env)
        self.log_dir = log_dir
        self.port = free_port()
        self.processes: dict[str, Process] = {}
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {self.token}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, name: str, *, wait: bool = True, netns: str | None = None, **extra_env: str) -> Process:
        """Start ``name`` from the Procfile, with ``extra_env`` over the deployment's; ``netns``: on that network
        namespace's host (``tests.netns.SecondHost``), which reaches PostgreSQL and RabbitMQ only as its env says."""
        old = self.processes.get(name)
        if old is not None and old.alive:
            raise RuntimeError(f"{name} is already running")
        env = {**self.env, **extra_env}
        if name == "web":
            env.setdefault("PORT", str(self.port))
            env.setdefault("BIND", "127.0.0.1")
            env.setdefault("WEB_CONCURRENCY", "1")
        process = Process(name, env, self.log_dir, netns).start()
        self.processes[name] = process
        if wait and name == "web":
            wait_for(lambda: self._healthy(process), timeout=30, message="web /healthz")
        if wait and name == "worker":
            wait_for(lambda: "Worker process is ready" in process.output() or not process.alive, timeout=30,
                     message="worker ready")
            assert process.alive, process.output()[-3000:]
        return process

    def _healthy(self, process: Process) -> bool:
        if not process.alive:
            raise AssertionError(f"web exited: {process.output()[-3000:]}")
        return requests.get(self.url + "/healthz", timeout=2).status_code == 200

    def stop_all(self) -> None:
        """End every process with SIGKILL, all at once.

        A test's teardown needs no graceful stop (the system must recover from
        ``kill -9`` anyway, and tests of SIGTERM call ``Process.stop``), and the
        worker's graceful stop alone took a second of every test.
        """
        for process in self.processes.values():
            process.signal(signal.SIGKILL)
        for process in self.processes.values():
            if process.popen is not None:
                process.popen.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join(f"===== {name} =====\n{p.output()[-4000:]}" for name, p in self.processes.items())

    # --- client helpers ---------------------------------------------------

    def upload(self, path: Path, **kwargs) -> requests.Response:
        with open(path, "rb") as fh:
            return self.session.post(self.url + "/v1/attachments", files={"file": (path.name, fh)}, timeout=30,
                                     **kwargs)

    def status(self, attachment_id: str) -> dict:
        response = self.session.get(f"{self.url}/v1/attachments/{attachment_id}", timeout=10)
        response.raise_for_status()
        return response.json()

    def wait_state(self, attachment_id: str, states=("ready", "failed"), timeout: float = 60) -> dict:
        return wait_for(lambda: (lambda s: s if s["state"] in states else None)(self.status(attachment_id)),
                        timeout=timeout, interval=0.2, message=f"{attachment_id} in {states}")


@contextlib.contextmanager
def read_only(database_url):
    """What a demotion does to the test's database: its sessions end, and the new ones cannot write until the
    block ends (the sessions opened meanwhile stay read-only: the processes must replace them)."""
    from sqlalchemy import create_engine

    admin = create_engine(database_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    name = database_url.rsplit("/", 1)[1]
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :name AND pid <> pg_backend_pid()"), {"name": name})
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" RESET default_transaction_read_only'))
        admin.dispose()
