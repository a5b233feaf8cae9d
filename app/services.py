"""Wiring: what every process needs, built once from :class:`Settings`.

Each process (web, worker, scheduler, the ``attache`` command) reads its
settings with :func:`settings_or_exit` and makes one :class:`Services`;
everything it uses is built here, on first use: the engine, the storage,
the broker (with the worker's Dramatiq middleware when the process
consumes), the outbox publisher and the unit of work that commits, then
publishes (:mod:`app.core.unit_of_work`), the dead-letter tools, the
imaging limits. The scheduler's maintenance services live above this
layer and are built from these in ``scheduler/sweepers.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from functools import cached_property
from typing import Mapping

from app.config import Settings
from app.core.steps import step_interrupt_grace
from app.errors import ConfigError

#: how a process stops on a bad setting: 2, but a web worker stops with gunicorn's "failed to boot" status, on which
#: its master stops too (with 2 it booted a worker again 1.5 times a second, its port bound: an adversarial run)
CONFIG_ERROR_STATUS = {"web": 3}


@contextlib.contextmanager
def exit_on_config_error(process: str) -> Iterator[None]:
    """A bad setting met inside prints one line naming its variable and exits (:data:`CONFIG_ERROR_STATUS`)."""
    try:
        yield
    except ConfigError as exc:
        print(f"attache {process}: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_STATUS.get(process, 2)) from None


#: a worker process that exits for a step stuck in C says so with this status (``EX_TEMPFAIL``): its process
#: manager starts it again (Dramatiq's main process stops the others and exits with it)
STUCK_EXIT_STATUS = 75


def exit_stuck_worker(drain_seconds: float) -> None:
    """A step has run far past its time limit inside a call no exception reaches (a render in C): its thread is
    lost for good, and a file that hangs every attempt would take one per attempt until the worker did nothing.
    The attempt is recorded already (``step_timeout``). The process stops taking messages as on SIGTERM (Dramatiq's
    shutdown; steps waiting for PostgreSQL or storage give their messages back), lets its other steps finish for
    ``drain_seconds``, then exits, for its process manager to start a fresh one: Dramatiq's own shutdown would wait
    for the stuck thread. A step still running then loses its lease, recovered as ``worker_lost``."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(drain_seconds)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(STUCK_EXIT_STATUS)


def settings_or_exit(process: str, environ: Mapping[str, str] | None = None) -> Settings:
    """The process's settings (:func:`exit_on_config_error`)."""
    with exit_on_config_error(process):
        return Settings.from_env(environ)


def database_url(settings: Settings) -> str:
    """The database of ``settings``: ``DATABASE_URL``, or the embedded server's (started if need be)."""
    if settings.database_url:
        return settings.database_url
    from app.adapters.postgres import embedded

    return embedded.start(settings.data_dir)


def mode(settings: Settings) -> str:
    """One line saying where the data and the messages live (``make up`` prints it)."""
    from app.adapters.postgres import embedded

    if settings.embedded_database:
        database = f"embedded PostgreSQL, data in {embedded.pgdata(settings.data_dir)}"
    else:
        database = "PostgreSQL at DATABASE_URL"
    if settings.broker_kind == "rabbitmq":
        broker = "RabbitMQ at BROKER_URL"
    elif settings.broker_url:
        broker = "PostgreSQL broker at BROKER_URL"
    else:
        broker = "PostgreSQL broker in the same database"
    name = "single node" if settings.embedded_database and not settings.broker_url else "services"
    return f"mode: {name} ({database}; {broker}; storage {settings.storage_url})"


#: the shortest a worker's transaction may wait for it before PostgreSQL ends the session (with a lease shorter
#: than this, a busy worker's thread could wait that long for the GIL between two statements)
MIN_IDLE_IN_TRANSACTION_SECONDS = 5.0
#: the longest a web request's statement waits for a lock another session holds, then ``503`` + Retry-After: a
#: paused web process inside an upload's transaction held the Idempotency-Key's row, and every retry with that
#: key (each holding a connection and a thread) waited for as long as it stayed paused
WEB_LOCK_TIMEOUT_SECONDS = 10.0
#: the longest a web request's transaction may sit idle, waiting for its process, before PostgreSQL ends it: a
#: request whose connection the web cut (ATTACHE_DATABASE_ANSWER_SECONDS) behind a proxy that kept the server's side
#: open left its transaction open there, holding an Idempotency-Key's row for good (every retry of that key waited
#: and answered 503; an adversarial run). A tus PATCH's storage calls under its row's lock (its part stored; the
#: last one's parts joined and staged) may take longer: its transaction is kept alive meanwhile (``db.kept_alive``)
WEB_IDLE_IN_TRANSACTION_SECONDS = 120.0


class Services:
    """One process's adapters. ``consumer``: the process runs Dramatiq actors (the worker). ``process``: what
    the process is (``web``, ``worker``, ``scheduler``, ``cli``), named in its database connections."""

    def __init__(self, settings: Settings, *, pool_size: int = 5, consumer: bool = False,
                 process: str | None = None):
        self.settings = settings
        self._pool_size = pool_size
        self._consumer = consumer
        self._process = process

    @cached_property
    def database_url(self) -> str:
        """``DATABASE_URL``, or (unset) the embedded PostgreSQL's, started if it is not running."""
        return database_url(self.settings)

    @cached_property
    def broker_url(self) -> str:
        """``BROKER_URL``, or (unset) the database's: the PostgreSQL broker lives in it."""
        return self.settings.broker_url or self.database_url

    @cached_property
    def engine(self):
        from app.adapters.postgres.db import make_engine
        from app.adapters.postgres.liveness import AnswerWatch

        # a worker's and a scheduler's transactions hold job and outbox rows (FOR UPDATE) for a few statements;
        # one idle for a whole lease belongs to a process that stopped mid-transaction (SIGSTOP, a frozen VM),
        # whose locks lease recovery, the relay and the reconciler (SKIP LOCKED, in any scheduler) and the
        # workers (who wait on them) would otherwise pass over or wait for as long as it stays stopped (a paused
        # scheduler held two expired jobs for its whole 2-minute pause; an adversarial review). A scheduler's
        # cleanups call storage inside a transaction, each call bounded by the storage client's timeouts; one
        # cut short fails its round, and the next round checks again. The web may wait on storage under a row
        # lock for longer (a tus upload's last PATCH joins its parts): WEB_IDLE_IN_TRANSACTION_SECONDS.
        bounded = self._consumer or self._process == "scheduler"
        web = self._process == "web"
        idle = max(self.settings.lease_seconds, MIN_IDLE_IN_TRANSACTION_SECONDS) if bounded else None
        engine = make_engine(self.database_url, pool_size=self._pool_size, process=self._process,
                             idle_in_transaction_seconds=WEB_IDLE_IN_TRANSACTION_SECONDS if web else idle,
                             lock_timeout_seconds=WEB_LOCK_TIMEOUT_SECONDS if web else None)
        if self._answer_deadline is not None:
            AnswerWatch(engine, *self._answer_deadline)
        return engine

    @property
    def _answer_deadline(self) -> tuple[float, str] | None:
        """How long this process's connections to PostgreSQL (the engine's, a PostgreSQL broker's) wait for an
        answer at most, and the setting that says so. The web's requests: then 503. The worker's and the
        scheduler's, longer: a step or a round cut is run again, and nobody waits on it; but a wait with no end
        held a worker's thread and every sweeper (lease recovery among them) for good (an adversarial run). The
        CLI's too: ``webhooks list`` and ``gc run`` waited for good on a database frozen mid-statement (a re-attack).
        The migrations' own connections have none (a migration may take long: ``migrations/env.py``)."""
        if self._process == "web":
            return self.settings.database_answer_seconds, "ATTACHE_DATABASE_ANSWER_SECONDS"
        if self._consumer or self._process in ("scheduler", "cli"):
            return self.settings.background_answer_seconds, "ATTACHE_BACKGROUND_ANSWER_SECONDS"
        return None

    @cached_property
    def storage(self):
        from app.adapters.storage import storage_from_url

        return storage_from_url(self.settings.storage_url, access_key=self.settings.s3_access_key,
                                secret_key=self.settings.s3_secret_key)

    @cached_property
    def broker(self):
        """The one broker of the process: the worker consumes through it and publishes follow-ups on it."""
        from app.adapters.broker import broker_from_settings

        return broker_from_settings(self.settings, self.broker_url,
                                    middleware=self._consumer_middleware() if self._consumer else [],
                                    answer_deadline=self._answer_deadline)

    def _consumer_middleware(self) -> list:
        from dramatiq.middleware import (
            CurrentMessage,
            Retries,
            ShutdownNotifications,
            TimeLimit,
        )

        from app.adapters.broker.dead_letter_recorder import DeadLetterRecorder
        from app.adapters.broker.worker_stopping import WorkerStopping

        return [
            TimeLimit(time_limit=int((self.settings.step_time_limit_seconds
                                      + step_interrupt_grace(self.settings.step_time_limit_seconds)) * 1000)),
            ShutdownNotifications(),
            WorkerStopping(self.stopping),
            CurrentMessage(),
            # Dramatiq runs after_* hooks in reverse order: listed before Retries,
            # the recorder runs after it and sees its verdict (message.failed).
            DeadLetterRecorder(self.engine),
            Retries(max_retries=self.settings.broker_retries, min_backoff=self.settings.broker_min_backoff_ms,
                    max_backoff=60_000),
        ]

    @cached_property
    def stopping(self) -> threading.Event:
        """Set when the worker begins to shut down (a consumer's middleware sets it)."""
        return threading.Event()

    @cached_property
    def publisher(self):
        from app.core.outbox import OutboxPublisher

        return OutboxPublisher(self.engine, self.broker)

    @cached_property
    def unit_of_work(self):
        """Commit, then publish; the web's publishes its uploads behind their answer (a thread of its own)."""
        from app.core.background_publisher import BackgroundPublisher
        from app.core.unit_of_work import UnitOfWork

        background = BackgroundPublisher(self.publisher) if self._process == "web" else None
        return UnitOfWork(self.engine, self.publisher, background)

    @cached_property
    def dead_letters(self):
        from app.adapters.broker import dead_letters_from_settings
        from app.core.steps import Step

        return dead_letters_from_settings(self.settings, self.broker_url, self.engine,
                                          queues=[step.queue for step in Step])

    def close(self) -> None:
        """Stop what this object started: the publisher thread (given a moment to finish), then the broker's
        connections and the engine's pool."""
        if "unit_of_work" in self.__dict__ and self.unit_of_work.background is not None:
            self.unit_of_work.background.close()
        if "broker" in self.__dict__:
            self.broker.close()
        if "engine" in self.__dict__:
            self.engine.dispose()

    @cached_property
    def limits(self):
        from app.adapters.imaging import Limits

        return Limits(max_pixels=self.settings.max_pixels, max_dimension=self.settings.max_dimension,
                      formats=self.settings.accepted_formats, max_decode_bytes=self.settings.max_decode_bytes)
