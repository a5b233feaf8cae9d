"""A PostgreSQL server of a test's own, that the test may stop and start.

Outage tests must stop PostgreSQL for longer than attache's retry budgets.
Stopping the machine's server would also stop every other test database
(and a developer's ``make up``); a private cluster made with the same
server binaries (``initdb``, ``pg_ctl``) is just as real and stops alone.
The server runs as the ``postgres`` OS user (PostgreSQL refuses root),
on a free port, with its data in a temporary directory removed at the end.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.processes import free_port


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found")


class PrivateCluster:
    """``listen``: more addresses to listen on (a second host's side of its cable, ``tests/netns.py``), trusted
    from anywhere."""

    def __init__(self, listen: tuple[str, ...] = (), data_on: Path | None = None):
        """``data_on``: a filesystem for the data files (a small one, to fill); the WAL then stays on the
        machine's disk, as on a server with its own WAL volume, so a full data disk refuses writes
        (``could not extend file``) rather than stopping the server."""
        self.listen = ("127.0.0.1", *listen)
        self.bindir = _bindir()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="attache-pg-"))
        self.data_root = Path(tempfile.mkdtemp(prefix="attache-pgdata-", dir=data_on)) if data_on else self.root
        self.data = self.data_root / "data"
        self.log = self.root / "server.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            entry = pwd.getpwnam("postgres")
            for path in {self.root, self.data_root}:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        wal = ["-X", str(self.root / "wal")] if data_on else []
        self._run("initdb", "-D", str(self.data), *wal, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        if listen:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write("host all all 0.0.0.0/0 trust\n")

    def _run(self, tool: str, *args: str, check: bool = True, timeout: float = 120):
        command = [str(self.bindir / tool), *args]
        if self._as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, timeout=timeout)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses={','.join(self.listen)} -k {self.root} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop", check=False)

    @property
    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def destroy(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.data_root, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)
